//! The crash-test disk backend: in-memory disks that keep the *durable* image apart
//! from what was written but not yet synced, and that can "crash" at a chosen moment
//! (the redb `CrashBackend` idea). Crash-consistency tests run a file system on these
//! disks, crash it, build the disk images a real crash could have left, and mount
//! those images to check what recovery makes of them.
//!
//! # Fault model
//!
//! What a crash may do to the disks, and how each item is injected here:
//!
//! 1. **A crash between any two writes, or at any sync.** Several disks of one file
//!    system share one [`CrashController`], so a crash is one moment across all of
//!    them. The controller numbers every [`Disk::write_at`] (one global, 0-based write
//!    index) and every [`Disk::sync`] on any of its disks (one global, 0-based sync
//!    point). [`CrashAt::Sync`]`(k)` crashes at the start of the k-th sync (that sync
//!    does not happen); [`CrashAt::Write`] crashes at the k-th write (that write does
//!    not complete); [`CrashController::crash_now`] crashes between two I/Os.
//! 2. **Lost unsynced writes, in any order.** A write is durable once a later `sync`
//!    of *its* disk has returned. Writes not yet synced at the crash may each have
//!    reached the medium or not, independently of each other and of their order (a
//!    disk cache reorders freely). [`LossPolicy`] chooses which: all kept, all
//!    dropped, or each one kept or dropped by a seeded coin. Kept writes are applied in
//!    write order, so when two unsynced writes overlap and both are kept the later
//!    one wins.
//! 3. **Torn writes.** The write in flight at a crash at a write may have reached the
//!    medium only in part: with a torn seed, a seeded non-empty proper subset of its
//!    512-byte sectors (one sector is atomic: it is either written or not) joins the
//!    unsynced writes, subject to the loss policy like any of them.
//! 4. **Nothing after the crash.** Once crashed, every read, write and sync on every
//!    disk of the controller fails with [`DiskError::Crashed`]; nothing more reaches
//!    the images.
//!
//! Not modelled here: bit flips, misdirected writes and failed reads are
//! [`crate::MemDisk`]'s faults; a write that reaches the medium *after* a later sync
//! of the same disk returned cannot happen (sync is a barrier).
//!
//! Memory: each disk holds one image (the written view, what reads see) plus, for each
//! unsynced write, its bytes and the bytes it replaced; the durable image is the
//! written view with the unsynced writes undone. Crash-test disks are meant to be
//! small (tens of MiB): every image handed out is a full copy.

use crate::disk::{check_range, Disk};
use crate::DiskError;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;

/// The unit a disk writes atomically: a torn write keeps or loses whole sectors.
pub const CRASH_SECTOR_BYTES: u64 = 512;

/// Where an armed controller crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashAt {
    /// At the start of the k-th sync (0-based, counted over every disk of the
    /// controller); that sync does not happen.
    Sync(u64),
    /// At the k-th write (0-based, counted over every disk). The write does not
    /// complete; with `torn_seed` a seeded non-empty proper subset of its sectors
    /// reached the disk (unsynced: the loss policy may still drop them).
    Write { index: u64, torn_seed: Option<u64> },
}

impl fmt::Display for CrashAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashAt::Sync(k) => write!(f, "sync:{k}"),
            CrashAt::Write {
                index,
                torn_seed: None,
            } => write!(f, "write:{index}"),
            CrashAt::Write {
                index,
                torn_seed: Some(s),
            } => write!(f, "torn:{index}:{s}"),
        }
    }
}

impl std::str::FromStr for CrashAt {
    type Err = String;
    /// `sync:K`, `write:K` or `torn:K:SEED` (the form `Display` prints).
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |p: &str| {
            p.parse::<u64>()
                .map_err(|e| format!("crash point {s:?}: {p:?} is not a number: {e}"))
        };
        match parts.as_slice() {
            ["sync", k] => Ok(CrashAt::Sync(num(k)?)),
            ["write", k] => Ok(CrashAt::Write {
                index: num(k)?,
                torn_seed: None,
            }),
            ["torn", k, seed] => Ok(CrashAt::Write {
                index: num(k)?,
                torn_seed: Some(num(seed)?),
            }),
            _ => Err(format!(
                "crash point {s:?}: expected sync:K, write:K or torn:K:SEED"
            )),
        }
    }
}

/// Which unsynced writes survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossPolicy {
    /// Every unsynced write reached the medium.
    KeepAll,
    /// None did: the images are exactly the durable state.
    DropAll,
    /// Each unsynced write independently kept or dropped by a coin seeded with
    /// `seed` and the write's index.
    Random { seed: u64 },
}

impl fmt::Display for LossPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossPolicy::KeepAll => write!(f, "keep-all"),
            LossPolicy::DropAll => write!(f, "drop-all"),
            LossPolicy::Random { seed } => write!(f, "random:{seed}"),
        }
    }
}

impl std::str::FromStr for LossPolicy {
    type Err = String;
    /// `keep-all`, `drop-all` or `random:SEED` (the form `Display` prints).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "keep-all" => Ok(LossPolicy::KeepAll),
            "drop-all" => Ok(LossPolicy::DropAll),
            _ => match s.strip_prefix("random:").map(str::parse::<u64>) {
                Some(Ok(seed)) => Ok(LossPolicy::Random { seed }),
                _ => Err(format!(
                    "loss policy {s:?}: expected keep-all, drop-all or random:SEED"
                )),
            },
        }
    }
}

/// What happened at the crash, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashPoint {
    Sync {
        index: u64,
        disk: String,
    },
    Write {
        index: u64,
        disk: String,
        offset: u64,
        len: usize,
        torn_sectors_written: Option<(usize, usize)>,
    },
    Immediate,
}

/// The crash: where, and the counters at that moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashRecord {
    pub point: CrashPoint,
    /// Writes completed before the crash.
    pub writes: u64,
    /// Syncs completed before the crash.
    pub sync_points: u64,
    /// Writes not yet synced at the crash (including a torn one).
    pub unsynced_writes: usize,
}

impl fmt::Display for CrashRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.point {
            CrashPoint::Sync { index, disk } => write!(f, "crash at sync point {index} (a sync of disk {disk})")?,
            CrashPoint::Write { index, disk, offset, len, torn_sectors_written: None } => {
                write!(f, "crash at write {index} ({len} bytes at byte {offset} of disk {disk}, not written)")?
            }
            CrashPoint::Write { index, disk, offset, len, torn_sectors_written: Some((kept, all)) } => {
                write!(f, "crash at write {index} ({len} bytes at byte {offset} of disk {disk}, torn: {kept} of {all} sectors written)")?
            }
            CrashPoint::Immediate => write!(f, "crash between two I/Os")?,
        }
        write!(
            f,
            " after {} writes and {} syncs, {} writes unsynced",
            self.writes, self.sync_points, self.unsynced_writes
        )
    }
}

/// One disk.
struct DiskImage {
    name: String,
    /// What reads see: the durable image plus this disk's unsynced writes, in write
    /// order.
    written: Vec<u8>,
}

/// A write not (yet) made durable by a sync of its disk.
struct Unsynced {
    index: u64,
    disk: usize,
    offset: u64,
    data: Vec<u8>,
    /// The bytes the write replaced in the written view (undoing the unsynced writes
    /// newest first gives the durable image). `None` for the torn write of a crash,
    /// which never reached the written view.
    replaced: Option<Vec<u8>>,
    /// For a torn write: which sectors (aligned to the disk, first one possibly
    /// partial) reached the medium. `None`: the whole write.
    sectors: Option<Vec<bool>>,
}

struct State {
    disks: Vec<DiskImage>,
    unsynced: Vec<Unsynced>,
    writes: u64,
    sync_points: u64,
    armed: Option<CrashAt>,
    crashed: Option<CrashRecord>,
    /// Running hash of the I/O positions (see `io_shape_hash`).
    shape: u64,
}

/// The moment of a crash for a set of disks: counts their writes and syncs, crashes
/// when armed, and builds the crash images. Shared (`Arc`) by the disks of one file
/// system.
pub struct CrashController {
    state: Mutex<State>,
}

/// A disk of a [`CrashController`].
pub struct CrashDisk {
    controller: Arc<CrashController>,
    index: usize,
    name: String,
    size: u64,
}

/// A stateless 64-bit mixer (splitmix64): seeded coins that do not depend on the
/// order in which they are asked.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Sector spans of a write at `offset`: (start within the buffer, length), split at
/// the disk's sector boundaries.
fn sector_spans(offset: u64, len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < len {
        let abs = offset + pos as u64;
        let to_boundary = (CRASH_SECTOR_BYTES - abs % CRASH_SECTOR_BYTES) as usize;
        let n = to_boundary.min(len - pos);
        out.push((pos, n));
        pos += n;
    }
    out
}

/// Which sectors of a torn write reached the medium: a non-empty proper subset when
/// the write spans two sectors or more; a single sector is atomic (all or nothing).
fn torn_mask(seed: u64, index: u64, sectors: usize) -> Vec<bool> {
    let base = mix(seed ^ mix(index));
    let mut mask: Vec<bool> = (0..sectors)
        .map(|i| mix(base ^ i as u64) & 1 == 1)
        .collect();
    if sectors >= 2 {
        let pick = (mix(base ^ 0xdead_beef) % sectors as u64) as usize;
        if mask.iter().all(|&k| k) {
            mask[pick] = false;
        } else if mask.iter().all(|&k| !k) {
            mask[pick] = true;
        }
    }
    mask
}

impl Unsynced {
    fn apply_to(&self, image: &mut [u8]) {
        let off = self.offset as usize;
        match &self.sectors {
            None => image[off..off + self.data.len()].copy_from_slice(&self.data),
            Some(mask) => {
                for (&(start, n), &kept) in
                    sector_spans(self.offset, self.data.len()).iter().zip(mask)
                {
                    if kept {
                        image[off + start..off + start + n]
                            .copy_from_slice(&self.data[start..start + n]);
                    }
                }
            }
        }
    }
}

impl CrashController {
    pub fn new() -> Arc<CrashController> {
        Arc::new(CrashController {
            state: Mutex::new(State {
                disks: Vec::new(),
                unsynced: Vec::new(),
                writes: 0,
                sync_points: 0,
                armed: None,
                crashed: None,
                shape: 0,
            }),
        })
    }

    /// Crash at `at`. Arming a point already passed is a bug of the test.
    pub fn arm(&self, at: CrashAt) {
        let mut s = self.state.lock();
        assert!(
            s.crashed.is_none(),
            "arming a crash controller that already crashed ({})",
            s.crashed.as_ref().expect("crashed")
        );
        match at {
            CrashAt::Sync(k) => assert!(
                k >= s.sync_points,
                "crash at sync point {k} armed after {} syncs",
                s.sync_points
            ),
            CrashAt::Write { index, .. } => assert!(
                index >= s.writes,
                "crash at write {index} armed after {} writes",
                s.writes
            ),
        }
        s.armed = Some(at);
    }

    /// Crash now, between two I/Os. A second crash is a no-op: the first one stands.
    pub fn crash_now(&self) {
        let mut s = self.state.lock();
        if s.crashed.is_none() {
            let unsynced = s.unsynced.len();
            s.crashed = Some(CrashRecord {
                point: CrashPoint::Immediate,
                writes: s.writes,
                sync_points: s.sync_points,
                unsynced_writes: unsynced,
            });
        }
    }

    pub fn is_crashed(&self) -> bool {
        self.state.lock().crashed.is_some()
    }

    pub fn crash_record(&self) -> Option<CrashRecord> {
        self.state.lock().crashed.clone()
    }

    /// Syncs completed so far (the index of the next sync point).
    pub fn sync_points(&self) -> u64 {
        self.state.lock().sync_points
    }

    /// Writes completed so far (the index of the next write).
    pub fn writes(&self) -> u64 {
        self.state.lock().writes
    }

    /// Writes not yet made durable by a sync of their disk.
    pub fn unsynced_writes(&self) -> usize {
        self.state.lock().unsynced.len()
    }

    /// A hash of where every completed write went (disk, offset, length) and of every
    /// sync (disk), in order — not of the bytes written. Two runs with equal hashes
    /// issued the same I/Os in the same order, so a crash point means the same moment
    /// in both (the determinism a replayed crash case relies on).
    pub fn io_shape_hash(&self) -> u64 {
        self.state.lock().shape
    }

    /// Names of the disks, in the order they were attached (the order of the images).
    pub fn disk_names(&self) -> Vec<String> {
        self.state
            .lock()
            .disks
            .iter()
            .map(|d| d.name.clone())
            .collect()
    }

    /// The durable images (what survives with [`LossPolicy::DropAll`]); any time.
    pub fn durable_images(&self) -> Vec<Vec<u8>> {
        Self::durable_of(&self.state.lock())
    }

    /// The written views with every unsynced write undone, newest first.
    fn durable_of(s: &State) -> Vec<Vec<u8>> {
        let mut images: Vec<Vec<u8>> = s.disks.iter().map(|d| d.written.clone()).collect();
        for w in s.unsynced.iter().rev() {
            if let Some(old) = &w.replaced {
                let off = w.offset as usize;
                images[w.disk][off..off + old.len()].copy_from_slice(old);
            }
        }
        images
    }

    /// What reads see (durable plus every completed unsynced write); any time.
    pub fn written_images(&self) -> Vec<Vec<u8>> {
        self.state
            .lock()
            .disks
            .iter()
            .map(|d| d.written.clone())
            .collect()
    }

    /// The disk images after the crash, one per disk in attach order: the durable
    /// image plus the unsynced writes `policy` keeps, applied in write order.
    ///
    /// Panics when called before a crash: without a crash there is no crash image
    /// (use [`CrashController::durable_images`]).
    pub fn crash_images(&self, policy: LossPolicy) -> Vec<Vec<u8>> {
        let s = self.state.lock();
        assert!(
            s.crashed.is_some(),
            "crash_images before a crash: arm the controller or call crash_now first"
        );
        let mut images = Self::durable_of(&s);
        for w in &s.unsynced {
            let keep = match policy {
                LossPolicy::KeepAll => true,
                LossPolicy::DropAll => false,
                LossPolicy::Random { seed } => mix(seed ^ mix(w.index ^ 0x5eed)) & 1 == 1,
            };
            if keep {
                w.apply_to(&mut images[w.disk]);
            }
        }
        images
    }

    fn attach(self: &Arc<Self>, name: &str, image: Vec<u8>) -> CrashDisk {
        let size = image.len() as u64;
        let mut s = self.state.lock();
        assert!(
            s.crashed.is_none(),
            "attaching disk {name} to a crash controller that already crashed"
        );
        let index = s.disks.len();
        s.disks.push(DiskImage {
            name: name.to_string(),
            written: image,
        });
        CrashDisk {
            controller: self.clone(),
            index,
            name: name.to_string(),
            size,
        }
    }

    fn crashed_error(s: &State, disk: &str, op: &'static str) -> DiskError {
        let crash = s
            .crashed
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default();
        DiskError::Crashed {
            disk: disk.to_string(),
            op,
            crash,
        }
    }
}

impl CrashDisk {
    /// A zeroed disk of `size_bytes`, attached to `controller`.
    pub fn new(controller: &Arc<CrashController>, name: &str, size_bytes: u64) -> CrashDisk {
        controller.attach(name, vec![0u8; size_bytes as usize])
    }

    /// A disk whose durable content is `image` (a crash image, a formatted image).
    pub fn from_image(controller: &Arc<CrashController>, name: &str, image: Vec<u8>) -> CrashDisk {
        controller.attach(name, image)
    }

    /// Position of this disk's image in the controller's image lists.
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn controller(&self) -> &Arc<CrashController> {
        &self.controller
    }
}

impl Disk for CrashDisk {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let s = self.controller.state.lock();
        if s.crashed.is_some() {
            return Err(CrashController::crashed_error(&s, &self.name, "read"));
        }
        check_range(&self.name, "read", offset, buf.len(), self.size)?;
        let off = offset as usize;
        buf.copy_from_slice(&s.disks[self.index].written[off..off + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        let mut guard = self.controller.state.lock();
        let s = &mut *guard;
        if s.crashed.is_some() {
            return Err(CrashController::crashed_error(s, &self.name, "write"));
        }
        check_range(&self.name, "write", offset, buf.len(), self.size)?;
        let index = s.writes;
        if let Some(CrashAt::Write {
            index: k,
            torn_seed,
        }) = s.armed
        {
            if k == index {
                // The crash happens during this write: it does not complete. A torn
                // write left some of its sectors on the medium, unsynced.
                let torn = torn_seed.map(|seed| {
                    let nsect = sector_spans(offset, buf.len()).len();
                    let mask = torn_mask(seed, index, nsect);
                    let kept = mask.iter().filter(|&&k| k).count();
                    s.unsynced.push(Unsynced {
                        index,
                        disk: self.index,
                        offset,
                        data: buf.to_vec(),
                        replaced: None,
                        sectors: Some(mask),
                    });
                    (kept, nsect)
                });
                s.armed = None;
                s.crashed = Some(CrashRecord {
                    point: CrashPoint::Write {
                        index,
                        disk: self.name.clone(),
                        offset,
                        len: buf.len(),
                        torn_sectors_written: torn,
                    },
                    writes: s.writes,
                    sync_points: s.sync_points,
                    unsynced_writes: s.unsynced.len(),
                });
                return Err(CrashController::crashed_error(s, &self.name, "write"));
            }
        }
        let off = offset as usize;
        let view = &mut s.disks[self.index].written[off..off + buf.len()];
        let replaced = view.to_vec();
        view.copy_from_slice(buf);
        s.unsynced.push(Unsynced {
            index,
            disk: self.index,
            offset,
            data: buf.to_vec(),
            replaced: Some(replaced),
            sectors: None,
        });
        s.writes += 1;
        s.shape = mix(s.shape ^ mix(self.index as u64 ^ mix(offset ^ mix(buf.len() as u64))));
        Ok(())
    }

    fn sync(&self) -> Result<(), DiskError> {
        let mut guard = self.controller.state.lock();
        let s = &mut *guard;
        if s.crashed.is_some() {
            return Err(CrashController::crashed_error(s, &self.name, "sync"));
        }
        let index = s.sync_points;
        if s.armed == Some(CrashAt::Sync(index)) {
            s.armed = None;
            s.crashed = Some(CrashRecord {
                point: CrashPoint::Sync {
                    index,
                    disk: self.name.clone(),
                },
                writes: s.writes,
                sync_points: s.sync_points,
                unsynced_writes: s.unsynced.len(),
            });
            return Err(CrashController::crashed_error(s, &self.name, "sync"));
        }
        // This disk's completed writes become durable (the written view already holds
        // them); other disks' stay unsynced. Undo records of other disks never cover
        // this disk's bytes, so dropping these keeps the others exact.
        let me = self.index;
        s.unsynced.retain(|w| w.disk != me);
        s.sync_points += 1;
        s.shape = mix(s.shape ^ mix(u64::MAX - self.index as u64));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disks(n: usize, bytes: u64) -> (Arc<CrashController>, Vec<CrashDisk>) {
        let c = CrashController::new();
        let d = (0..n)
            .map(|i| CrashDisk::new(&c, &format!("d{i}"), bytes))
            .collect();
        (c, d)
    }

    fn read(d: &CrashDisk, offset: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        d.read_at(&mut b, offset).unwrap();
        b
    }

    const ALL_POLICIES: [LossPolicy; 5] = [
        LossPolicy::KeepAll,
        LossPolicy::DropAll,
        LossPolicy::Random { seed: 1 },
        LossPolicy::Random { seed: 2 },
        LossPolicy::Random { seed: 99 },
    ];

    #[test]
    fn reads_see_unsynced_writes_in_order() {
        let (_c, d) = disks(1, 1 << 16);
        d[0].write_at(&[1u8; 1024], 0).unwrap();
        d[0].write_at(&[2u8; 512], 512).unwrap();
        let got = read(&d[0], 0, 1024);
        assert_eq!(&got[..512], &[1u8; 512][..]);
        assert_eq!(
            &got[512..],
            &[2u8; 512][..],
            "the later write wins in the written view"
        );
    }

    #[test]
    fn synced_data_survives_every_policy() {
        for policy in ALL_POLICIES {
            let (c, d) = disks(2, 1 << 16);
            d[0].write_at(&[0xaa; 4096], 0).unwrap();
            d[1].write_at(&[0xbb; 512], 8192).unwrap();
            d[0].sync().unwrap();
            d[1].sync().unwrap();
            // Unsynced overwrites of the synced data, on both disks.
            d[0].write_at(&[0xcc; 4096], 0).unwrap();
            d[1].write_at(&[0xdd; 512], 8192).unwrap();
            d[0].write_at(&[0xee; 512], 4096).unwrap();
            c.crash_now();
            let img = c.crash_images(policy);
            assert_eq!(img.len(), 2);
            assert!(
                img[0][..4096].iter().all(|&b| b == 0xaa || b == 0xcc),
                "{policy}: synced range holds old or new data only"
            );
            assert!(
                img[1][8192..8704].iter().all(|&b| b == 0xbb || b == 0xdd),
                "{policy}"
            );
            let durable = c.durable_images();
            assert!(
                durable[0][..4096].iter().all(|&b| b == 0xaa),
                "{policy}: the durable image holds the synced data"
            );
            assert!(
                durable[1][8192..8704].iter().all(|&b| b == 0xbb),
                "{policy}"
            );
        }
        // A synced write that was not overwritten survives every policy byte for byte.
        for policy in ALL_POLICIES {
            let (c, d) = disks(1, 1 << 16);
            d[0].write_at(&[7u8; 2048], 1024).unwrap();
            d[0].sync().unwrap();
            d[0].write_at(&[8u8; 512], 8192).unwrap();
            c.crash_now();
            assert_eq!(
                &c.crash_images(policy)[0][1024..3072],
                &[7u8; 2048][..],
                "{policy}"
            );
        }
    }

    #[test]
    fn unsynced_data_survives_keep_all_and_not_drop_all() {
        let (c, d) = disks(2, 1 << 16);
        d[0].write_at(&[1u8; 512], 0).unwrap();
        d[0].sync().unwrap();
        d[0].write_at(&[2u8; 512], 0).unwrap();
        d[1].write_at(&[3u8; 1024], 4096).unwrap();
        // A sync of disk 0 does not make disk 1's write durable.
        d[0].write_at(&[4u8; 512], 512).unwrap();
        d[0].sync().unwrap();
        assert_eq!(c.unsynced_writes(), 1);
        d[0].write_at(&[5u8; 512], 1024).unwrap();
        c.crash_now();
        let keep = c.crash_images(LossPolicy::KeepAll);
        assert_eq!(keep, c.written_images(), "keep-all is the written view");
        assert_eq!(&keep[1][4096..5120], &[3u8; 1024][..]);
        assert_eq!(&keep[0][1024..1536], &[5u8; 512][..]);
        let drop = c.crash_images(LossPolicy::DropAll);
        assert_eq!(drop, c.durable_images(), "drop-all is the durable image");
        assert!(drop[1].iter().all(|&b| b == 0), "disk 1 was never synced");
        assert_eq!(
            &drop[0][..512],
            &[2u8; 512][..],
            "synced by the second sync"
        );
        assert_eq!(&drop[0][512..1024], &[4u8; 512][..]);
        assert!(drop[0][1024..1536].iter().all(|&b| b == 0));
    }

    #[test]
    fn random_policy_keeps_some_drops_some_in_write_order_and_is_seeded() {
        let (c, d) = disks(1, 1 << 20);
        // 64 unsynced writes to distinct sectors, then 2 overlapping writes per sector
        // of a second range: old (9) then new (10).
        for i in 0..64u64 {
            d[0].write_at(&[i as u8 + 1; 512], i * 512).unwrap();
        }
        for i in 0..64u64 {
            d[0].write_at(&[9u8; 512], 65536 + i * 512).unwrap();
        }
        for i in 0..64u64 {
            d[0].write_at(&[10u8; 512], 65536 + i * 512).unwrap();
        }
        c.crash_now();
        let a = c.crash_images(LossPolicy::Random { seed: 42 });
        assert_eq!(
            a,
            c.crash_images(LossPolicy::Random { seed: 42 }),
            "same seed, same images"
        );
        assert_ne!(
            a,
            c.crash_images(LossPolicy::Random { seed: 43 }),
            "another seed, other images"
        );
        let kept = (0..64usize)
            .filter(|&i| a[0][i * 512] == i as u8 + 1)
            .count();
        let dropped = (0..64usize).filter(|&i| a[0][i * 512] == 0).count();
        assert_eq!(kept + dropped, 64, "a write is kept or dropped whole");
        assert!(
            kept > 10 && dropped > 10,
            "both outcomes occur ({kept} kept)"
        );
        let mut seen = [false; 3];
        for i in 0..64usize {
            let v = a[0][65536 + i * 512];
            assert!(a[0][65536 + i * 512..65536 + (i + 1) * 512]
                .iter()
                .all(|&b| b == v));
            seen[match v {
                0 => 0,
                9 => 1,
                10 => 2,
                other => panic!("sector {i} holds {other}: never written there"),
            }] = true;
        }
        // Dropping the new write and keeping the old one is a legal outcome (the disk
        // cache reordered them); keeping both must show the new one.
        assert!(
            seen.iter().all(|&s| s),
            "none, old only, new (alone or over old) all occur: {seen:?}"
        );
    }

    #[test]
    fn torn_write_leaves_a_sector_granular_mixture() {
        let (c, d) = disks(2, 1 << 16);
        d[0].write_at(&[0xaa; 8192], 0).unwrap();
        d[0].sync().unwrap();
        d[1].sync().unwrap();
        c.arm(CrashAt::Write {
            index: 1,
            torn_seed: Some(5),
        });
        let err = d[0].write_at(&[0xbb; 8192], 0).unwrap_err();
        assert!(matches!(err, DiskError::Crashed { .. }), "{err}");
        let rec = c.crash_record().unwrap();
        let CrashPoint::Write {
            index: 1,
            torn_sectors_written: Some((kept, 16)),
            ..
        } = rec.point
        else {
            panic!("{rec}")
        };
        assert!(
            kept > 0 && kept < 16,
            "a proper subset of the 16 sectors: {kept}"
        );
        assert_eq!(c.writes(), 1, "the torn write did not complete");
        let img = c.crash_images(LossPolicy::KeepAll);
        let mut new = 0;
        for s in 0..16 {
            let sector = &img[0][s * 512..(s + 1) * 512];
            assert!(
                sector.iter().all(|&b| b == sector[0]),
                "sector {s} is one write's data, not a mix"
            );
            assert!(sector[0] == 0xaa || sector[0] == 0xbb);
            new += (sector[0] == 0xbb) as usize;
        }
        assert_eq!(new, kept, "exactly the recorded sectors reached the disk");
        assert!(
            c.crash_images(LossPolicy::DropAll)[0][..8192]
                .iter()
                .all(|&b| b == 0xaa),
            "drop-all loses the torn write"
        );
        // Another seed tears differently; the same seed the same way.
        let mask = |seed| torn_mask(seed, 1, 16);
        assert_eq!(mask(5), mask(5));
        assert!((0..20).any(|s| mask(s) != mask(5)));
    }

    #[test]
    fn torn_write_splits_at_disk_sector_boundaries() {
        let (c, d) = disks(1, 1 << 16);
        c.arm(CrashAt::Write {
            index: 0,
            torn_seed: Some(3),
        });
        // 1024 bytes at byte 256: spans 256..512, 512..1024, 1024..1280.
        assert!(d[0].write_at(&[1u8; 1024], 256).is_err());
        let img = &c.crash_images(LossPolicy::KeepAll)[0];
        let pieces = [(256, 512), (512, 1024), (1024, 1280)];
        let written: Vec<bool> = pieces
            .iter()
            .map(|&(a, b)| img[a..b].iter().all(|&x| x == 1))
            .collect();
        for (&(a, b), &w) in pieces.iter().zip(&written) {
            assert!(
                w || img[a..b].iter().all(|&x| x == 0),
                "bytes {a}..{b} are all or nothing"
            );
        }
        assert!(
            written.iter().any(|&w| w) && !written.iter().all(|&w| w),
            "torn: {written:?}"
        );
        assert!(img[..256].iter().all(|&x| x == 0) && img[1280..].iter().all(|&x| x == 0));
    }

    #[test]
    fn single_sector_torn_write_is_atomic() {
        for seed in 0..16 {
            let (c, d) = disks(1, 4096);
            c.arm(CrashAt::Write {
                index: 0,
                torn_seed: Some(seed),
            });
            assert!(d[0].write_at(&[3u8; 512], 512).is_err());
            let img = &c.crash_images(LossPolicy::KeepAll)[0];
            let s = &img[512..1024];
            assert!(s.iter().all(|&b| b == 3) || s.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn after_the_crash_every_io_fails_and_nothing_reaches_the_images() {
        let (c, d) = disks(2, 1 << 16);
        d[0].write_at(&[1u8; 512], 0).unwrap();
        c.crash_now();
        let before = (c.crash_images(LossPolicy::KeepAll), c.durable_images());
        for disk in &d {
            let mut b = [0u8; 512];
            assert!(matches!(
                disk.read_at(&mut b, 0),
                Err(DiskError::Crashed { op: "read", .. })
            ));
            let e = disk.write_at(&[9u8; 512], 0).unwrap_err();
            assert!(matches!(e, DiskError::Crashed { op: "write", .. }), "{e}");
            assert!(
                e.to_string().contains(disk.name()),
                "the error names the disk: {e}"
            );
            assert!(matches!(
                disk.sync(),
                Err(DiskError::Crashed { op: "sync", .. })
            ));
        }
        assert_eq!(
            (c.crash_images(LossPolicy::KeepAll), c.durable_images()),
            before
        );
        assert_eq!(c.writes(), 1);
        assert_eq!(c.sync_points(), 0);
        assert_eq!(c.crash_record().unwrap().point, CrashPoint::Immediate);
    }

    #[test]
    fn crash_at_sync_k_happens_exactly_at_the_kth_sync() {
        for k in 0..6u64 {
            let (c, d) = disks(2, 1 << 16);
            c.arm(CrashAt::Sync(k));
            let mut completed = 0u64;
            // Syncs alternate between the disks; before each, a write to that disk.
            for i in 0..6u64 {
                let disk = &d[(i % 2) as usize];
                disk.write_at(&[i as u8 + 1; 512], i * 512).unwrap();
                assert_eq!(c.sync_points(), i);
                match disk.sync() {
                    Ok(()) => completed += 1,
                    Err(e) => {
                        assert!(matches!(e, DiskError::Crashed { op: "sync", .. }), "{e}");
                        break;
                    }
                }
            }
            assert_eq!(completed, k, "syncs 0..{k} happen, sync {k} does not");
            assert_eq!(c.sync_points(), k);
            let rec = c.crash_record().unwrap();
            assert_eq!(
                rec.point,
                CrashPoint::Sync {
                    index: k,
                    disk: format!("d{}", k % 2)
                }
            );
            let img = c.crash_images(LossPolicy::DropAll);
            for i in 0..=k {
                let got = img[(i % 2) as usize][i as usize * 512];
                if i < k {
                    assert_eq!(got, i as u8 + 1, "write {i} was synced by sync {i}");
                } else {
                    assert_eq!(
                        got, 0,
                        "write {i} waited for sync {k}, which did not happen"
                    );
                }
            }
        }
    }

    #[test]
    fn crash_at_write_k_stops_exactly_there() {
        let (c, d) = disks(1, 1 << 16);
        c.arm(CrashAt::Write {
            index: 3,
            torn_seed: None,
        });
        for i in 0..3u64 {
            d[0].write_at(&[1u8; 512], i * 512).unwrap();
        }
        assert!(!c.is_crashed());
        assert!(d[0].write_at(&[1u8; 512], 3 * 512).is_err());
        assert!(c.is_crashed());
        assert_eq!(c.writes(), 3);
        let img = &c.crash_images(LossPolicy::KeepAll)[0];
        assert!(img[..3 * 512].iter().all(|&b| b == 1));
        assert!(
            img[3 * 512..].iter().all(|&b| b == 0),
            "an untorn crashed write leaves nothing"
        );
    }

    /// Random overlapping writes and syncs on three disks against a reference that keeps
    /// two full images per disk and the unsynced writes as they came.
    #[test]
    fn images_match_a_two_copy_reference() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..50 {
            let (c, d) = disks(3, 8192);
            let mut durable = vec![vec![0u8; 8192]; 3];
            let mut written = vec![vec![0u8; 8192]; 3];
            let mut pending: Vec<(u64, usize, usize, Vec<u8>)> = Vec::new();
            for _ in 0..40 {
                let disk = next(3) as usize;
                if next(5) == 0 {
                    d[disk].sync().unwrap();
                    for (_, dk, off, data) in pending.iter().filter(|p| p.1 == disk) {
                        durable[*dk][*off..*off + data.len()].copy_from_slice(data);
                    }
                    pending.retain(|p| p.1 != disk);
                } else {
                    let off = next(8000) as usize;
                    let len = 1 + next((8192 - off) as u64) as usize;
                    let data = vec![1 + next(250) as u8; len];
                    let index = c.writes();
                    d[disk].write_at(&data, off as u64).unwrap();
                    written[disk][off..off + len].copy_from_slice(&data);
                    pending.push((index, disk, off, data));
                }
            }
            assert_eq!(c.durable_images(), durable, "round {round}: durable images");
            assert_eq!(c.written_images(), written, "round {round}: written views");
            c.crash_now();
            let seed = round as u64;
            let mut expect = durable.clone();
            for (index, dk, off, data) in &pending {
                if mix(seed ^ mix(index ^ 0x5eed)) & 1 == 1 {
                    expect[*dk][*off..*off + data.len()].copy_from_slice(data);
                }
            }
            assert_eq!(
                c.crash_images(LossPolicy::Random { seed }),
                expect,
                "round {round}: random policy"
            );
            assert_eq!(
                c.crash_images(LossPolicy::KeepAll),
                written,
                "round {round}: keep-all"
            );
        }
    }

    #[test]
    fn io_shape_hash_follows_positions_not_content() {
        let run = |second_offset: u64, byte: u8| {
            let (c, d) = disks(2, 1 << 16);
            d[0].write_at(&[byte; 512], 0).unwrap();
            d[1].write_at(&[byte; 512], second_offset).unwrap();
            d[1].sync().unwrap();
            c.io_shape_hash()
        };
        assert_eq!(run(512, 1), run(512, 2), "content does not count");
        assert_ne!(run(512, 1), run(1024, 1), "positions do");
    }

    #[test]
    fn out_of_range_io_is_refused_and_not_counted() {
        let (c, d) = disks(1, 4096);
        assert!(matches!(
            d[0].write_at(&[0u8; 512], 4096),
            Err(DiskError::OutOfRange { .. })
        ));
        assert_eq!(c.writes(), 0);
    }

    #[test]
    fn disks_start_from_their_image() {
        let c = CrashController::new();
        let d = CrashDisk::from_image(&c, "x", vec![5u8; 2048]);
        assert_eq!(d.size_bytes(), 2048);
        assert_eq!(read(&d, 1024, 512), vec![5u8; 512]);
        c.crash_now();
        assert_eq!(c.crash_images(LossPolicy::DropAll), vec![vec![5u8; 2048]]);
    }

    #[test]
    fn crash_points_print_and_parse() {
        for at in [
            CrashAt::Sync(7),
            CrashAt::Write {
                index: 12,
                torn_seed: None,
            },
            CrashAt::Write {
                index: 3,
                torn_seed: Some(99),
            },
        ] {
            assert_eq!(at.to_string().parse::<CrashAt>().unwrap(), at);
        }
        for p in [
            LossPolicy::KeepAll,
            LossPolicy::DropAll,
            LossPolicy::Random { seed: 5 },
        ] {
            assert_eq!(p.to_string().parse::<LossPolicy>().unwrap(), p);
        }
        assert!("sync:x".parse::<CrashAt>().is_err());
        assert!("random:".parse::<LossPolicy>().is_err());
    }
}
