//! The stat cache (`maxStatCache`): inodes evicted from the full inode cache
//! (`maxFilesToCache`) keep their attributes here, so a later `stat` or lookup is
//! answered from memory (`FileSystem::getattr`) without loading the full inode. An
//! entry holds attributes only: the inode without its content (inline data, inline
//! directory, block pointers) and without its extended attributes, so an entry costs
//! about the same whatever the file (a 3,901-byte file held in its inode would
//! otherwise keep its data here). An operation that needs the whole inode reads it
//! again (`Core::get`, from the cached inode-file chunk or the disk) and drops the entry.
//! A bounded LRU: its memory is at most `maxStatCache` entries, whatever the workload.
//! Every entry is covered by the inode's token, which this node keeps while the entry
//! lives: a revoke removes the entry (`remove`), and an entry pushed out of the LRU
//! hands back its inode number so the caller can release the token.

use lru::LruCache;
use mako_format::inode::{Inode, InodeContent};
use std::hash::BuildHasherDefault;
use std::num::NonZeroUsize;

type Hasher = BuildHasherDefault<rustc_hash::FxHasher>;

/// What the stat cache keeps of an inode: enough to answer `stat`.
#[derive(Clone, Debug)]
pub struct StatEntry {
    /// The inode with empty content and no extended attributes.
    pub inode: Inode,
    /// Bytes of data held in the inode (they count in `st_blocks`).
    pub inline_data_bytes: u64,
}

impl StatEntry {
    /// The attributes of `inode`, without what only a full inode needs.
    pub fn of(mut inode: Inode) -> StatEntry {
        let inline_data_bytes = match &inode.content {
            InodeContent::InlineData(d) => d.len() as u64,
            _ => 0,
        };
        inode.content = InodeContent::Pointers(Vec::new());
        inode.xattrs = Vec::new();
        StatEntry {
            inode,
            inline_data_bytes,
        }
    }
}

pub struct StatCache {
    /// `None` while the capacity is 0 (the cache is off).
    lru: Option<LruCache<u64, StatEntry, Hasher>>,
}

impl StatCache {
    pub fn new(capacity: usize) -> StatCache {
        StatCache {
            lru: NonZeroUsize::new(capacity).map(|c| LruCache::with_hasher(c, Hasher::default())),
        }
    }

    pub fn len(&self) -> usize {
        self.lru.as_ref().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.lru.as_ref().map_or(0, |l| l.cap().get())
    }

    pub fn contains(&self, ino: u64) -> bool {
        self.lru.as_ref().is_some_and(|l| l.contains(&ino))
    }

    /// The entry's attributes (a use: it becomes the most recently used).
    pub fn get(&mut self, ino: u64) -> Option<StatEntry> {
        self.lru.as_mut()?.get(&ino).cloned()
    }

    /// Keep `inode`'s attributes. Returns the inode numbers that no longer have an
    /// entry because of it (pushed out of the LRU, or `inode` itself when the cache is
    /// off): their tokens are the caller's to release.
    pub fn insert(&mut self, inode: Inode) -> Vec<u64> {
        let ino = inode.ino;
        match self.lru.as_mut() {
            None => vec![ino],
            Some(l) => match l.push(ino, StatEntry::of(inode)) {
                Some((old, _)) if old != ino => vec![old],
                _ => Vec::new(),
            },
        }
    }

    /// Drop the entry (its token is going away).
    pub fn remove(&mut self, ino: u64) -> bool {
        self.lru.as_mut().is_some_and(|l| l.pop(&ino).is_some())
    }

    /// Change the capacity (`mako config set maxStatCache -i`). Returns the inode
    /// numbers pushed out.
    pub fn set_capacity(&mut self, capacity: usize) -> Vec<u64> {
        let mut out = Vec::new();
        match (NonZeroUsize::new(capacity), self.lru.as_mut()) {
            (None, Some(l)) => {
                while let Some((ino, _)) = l.pop_lru() {
                    out.push(ino);
                }
                self.lru = None;
            }
            (None, None) => {}
            (Some(c), None) => self.lru = Some(LruCache::with_hasher(c, Hasher::default())),
            (Some(c), Some(l)) => {
                while l.len() > c.get() {
                    if let Some((ino, _)) = l.pop_lru() {
                        out.push(ino);
                    }
                }
                l.resize(c);
            }
        }
        out
    }

    /// Every inode number with an entry (token housekeeping).
    pub fn inos(&self) -> Vec<u64> {
        self.lru
            .as_ref()
            .map(|l| l.iter().map(|(k, _)| *k).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_pushes_out_the_least_recently_used() {
        let mut c = StatCache::new(3);
        for i in 10..13 {
            assert!(c.insert(Inode::new(i, 0o100644)).is_empty());
        }
        assert!(c.remove(10), "a full inode takes the entry out");
        assert!(c.insert(Inode::new(10, 0o100644)).is_empty());
        // 11 is now the least recently used.
        assert_eq!(c.insert(Inode::new(13, 0o100644)), vec![11]);
        assert_eq!(c.len(), 3);
        assert!(c.remove(12));
        assert!(!c.contains(12));
        assert_eq!(c.set_capacity(1).len(), 1);
        assert_eq!(c.len(), 1);
        assert_eq!(c.set_capacity(0).len(), 1);
        assert_eq!(
            c.insert(Inode::new(99, 0o100644)),
            vec![99],
            "off: nothing kept"
        );
    }

    /// An entry keeps the attributes (and the size of inline data, which counts in
    /// `st_blocks`), never the content or the extended attributes.
    #[test]
    fn entries_hold_attributes_only() {
        let mut c = StatCache::new(4);
        let mut inode = Inode::new(7, 0o100644);
        inode.size = 3901;
        inode.nlink = 1;
        inode.content = InodeContent::InlineData(vec![0xab; 3901]);
        inode.xattrs = vec![(b"user.a".to_vec(), vec![1; 100])];
        assert!(c.insert(inode).is_empty());
        let e = c.get(7).expect("kept");
        assert_eq!(e.inode.size, 3901);
        assert_eq!(e.inode.nlink, 1);
        assert_eq!(e.inline_data_bytes, 3901);
        assert!(matches!(&e.inode.content, InodeContent::Pointers(p) if p.is_empty()));
        assert!(e.inode.xattrs.is_empty());
    }

    /// The old cache kept an order queue that grew by one per evict-and-reuse cycle
    /// and could evict a newer entry for the same inode. Cycling ten times the
    /// capacity, many times over, must keep the entry count and the queue bounded.
    #[test]
    fn memory_stays_bounded_by_the_capacity_under_churn() {
        let cap = 100;
        let mut c = StatCache::new(cap);
        let mut released = 0usize;
        for round in 0..50u64 {
            for i in 0..(10 * cap as u64) {
                let ino = 1000 + i;
                if round % 2 == 1 {
                    // Reuse: a full load takes the entry out, then it is evicted again.
                    c.remove(ino);
                }
                released += c.insert(Inode::new(ino, 0o100644)).len();
                assert!(c.len() <= cap);
            }
        }
        assert_eq!(c.len(), cap);
        assert!(released > 0);
        // The most recent `cap` inodes are the ones kept.
        for i in (10 * cap as u64 - cap as u64)..(10 * cap as u64) {
            assert!(c.contains(1000 + i), "inode {} missing", 1000 + i);
        }
    }
}
