//! The NSD protocol: the bodies of `ServiceId::Nsd` requests and replies.
//!
//! A request is a fixed 24-byte little-endian header, the disk's NSD name, then (for a
//! write) the block payload as raw bytes. Disks are named, not numbered, so a server
//! that serves a different set of disks than the client expects refuses the request
//! instead of writing to the wrong disk.
//!
//! | off | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 1 | version | [`VERSION`] |
//! | 1 | 1 | op | [`Op`] |
//! | 2 | 1 | buffer type | what the I/O carries (the server's I/O history) |
//! | 3 | 1 | name length | 1..=255 bytes of UTF-8 after the header (0 for a list) |
//! | 4 | 8 | inode | the file the I/O is for (I/O history), else 0 |
//! | 12 | 8 | offset | byte offset on the disk, a multiple of 512 |
//! | 20 | 4 | length | read: bytes to read; write: payload bytes; else 0 |
//!
//! A reply is one status byte; on success the server's boot id (u64: a random number
//! drawn when the server started, so a client can tell that a server restarted and
//! may have lost writes it acknowledged before), then: for a read, exactly the bytes
//! asked for; for an info request, the disk's size (u64); for a write or a sync,
//! nothing. A failure is status 1 and a postcard [`Failure`] (errors are small; only
//! payloads are raw).
//! The RPC frame around the body carries its length, so a payload needs none of its
//! own, and the body is never re-serialised: the server reads a write's payload in
//! place from the received frame, and a read's payload is the reply frame's body.

use mako_disk::{BufferType, DiskError};
use serde::{Deserialize, Serialize};
use std::io;

/// Version of the request layout (the RPC frame has its own).
pub const VERSION: u8 = 1;
/// Bytes of the fixed request header.
pub const HEADER_BYTES: usize = 24;
/// Offsets and lengths of disk I/O are multiples of this.
pub const SECTOR: u64 = mako_format::SECTOR_BYTES;
/// Status byte of a reply that succeeded.
pub const STATUS_OK: u8 = 0;
/// Status byte of a reply that carries a [`Failure`].
pub const STATUS_FAILED: u8 = 1;

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// The disk's size (and whether the server serves it at all).
    Info = 1,
    Read = 2,
    Write = 3,
    /// Durability barrier: every write the server acknowledged on this disk before
    /// the sync was asked is durable when it succeeds.
    Sync = 4,
    /// The disks the server serves, with their sizes (postcard `Vec<(String, u64)>`).
    /// Its disk name is empty.
    List = 5,
}

impl Op {
    fn from_wire(n: u8) -> Option<Op> {
        Some(match n {
            1 => Op::Info,
            2 => Op::Read,
            3 => Op::Write,
            4 => Op::Sync,
            5 => Op::List,
            _ => return None,
        })
    }
}

/// Every buffer type, in wire order (its index is its number on the wire).
const BUFFER_TYPES: [BufferType; 10] = [
    BufferType::Data,
    BufferType::Inode,
    BufferType::Indirect,
    BufferType::Directory,
    BufferType::Xattr,
    BufferType::Log,
    BufferType::AllocMap,
    BufferType::InodeMap,
    BufferType::Descriptor,
    BufferType::DiskHeader,
];

fn buffer_type_to_wire(t: BufferType) -> u8 {
    // Exhaustive, so a new buffer type fails to compile until it has a number.
    match t {
        BufferType::Data => 0,
        BufferType::Inode => 1,
        BufferType::Indirect => 2,
        BufferType::Directory => 3,
        BufferType::Xattr => 4,
        BufferType::Log => 5,
        BufferType::AllocMap => 6,
        BufferType::InodeMap => 7,
        BufferType::Descriptor => 8,
        BufferType::DiskHeader => 9,
    }
}

/// A decoded request; `payload` borrows the write's bytes from the received body.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub op: Op,
    pub buffer_type: BufferType,
    pub ino: u64,
    pub disk: &'a str,
    pub offset: u64,
    pub len: u32,
    pub payload: &'a [u8],
}

/// Encodes a request into a new buffer: the header, the name, then `payload` (the one
/// copy of a write's bytes on the client, from the caller's buffer into the frame).
pub fn encode_request(
    op: Op,
    disk: &str,
    offset: u64,
    len: u32,
    buffer_type: BufferType,
    ino: u64,
    payload: &[u8],
) -> Vec<u8> {
    let name = disk.as_bytes();
    let mut out = Vec::with_capacity(HEADER_BYTES + name.len() + payload.len());
    out.push(VERSION);
    out.push(op as u8);
    out.push(buffer_type_to_wire(buffer_type));
    // Names are checked to fit when a route is made (`check_name`).
    out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&name[..name.len().min(255)]);
    out.extend_from_slice(payload);
    out
}

/// Encodes the reply of a list request: every served disk with its size.
pub fn encode_list(boot: u64, disks: &[(String, u64)]) -> Vec<u8> {
    let mut out = ok_reply(boot, 0);
    // Strings and integers: postcard cannot fail on them.
    out.extend(postcard::to_stdvec(disks).unwrap_or_default());
    out
}

/// Decodes the payload of a list reply.
pub fn decode_list(payload: &[u8]) -> Result<Vec<(String, u64)>, String> {
    postcard::from_bytes(payload).map_err(|e| format!("its disk list could not be decoded: {e}"))
}

/// A disk name can be sent: 1..=255 bytes.
pub fn check_name(disk: &str) -> Result<(), String> {
    if disk.is_empty() || disk.len() > 255 {
        return Err(format!(
            "NSD name {disk:?} must be 1 to 255 bytes long to be served over the network"
        ));
    }
    Ok(())
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Decodes a request, checking everything that does not need the disk. The error
/// says what is wrong, for the client's `Refused` error.
pub fn decode_request(body: &[u8], max_io_bytes: usize) -> Result<Request<'_>, String> {
    if body.len() < HEADER_BYTES {
        return Err(format!(
            "request of {} bytes is shorter than the {HEADER_BYTES}-byte NSD header",
            body.len()
        ));
    }
    if body[0] != VERSION {
        return Err(format!(
            "NSD request version {} is not spoken here (this server speaks {VERSION})",
            body[0]
        ));
    }
    let op = Op::from_wire(body[1]).ok_or_else(|| format!("unknown NSD operation {}", body[1]))?;
    let buffer_type = *BUFFER_TYPES
        .get(usize::from(body[2]))
        .ok_or_else(|| format!("unknown buffer type {}", body[2]))?;
    let name_len = usize::from(body[3]);
    let ino = le_u64(&body[4..12]);
    let offset = le_u64(&body[12..20]);
    let mut len4 = [0u8; 4];
    len4.copy_from_slice(&body[20..24]);
    let len = u32::from_le_bytes(len4);
    let Some(name) = body.get(HEADER_BYTES..HEADER_BYTES + name_len) else {
        return Err(format!(
            "request ends inside its {name_len}-byte disk name ({} bytes in all)",
            body.len()
        ));
    };
    let disk = std::str::from_utf8(name).map_err(|_| "the disk name is not UTF-8".to_string())?;
    if disk.is_empty() != (op == Op::List) {
        return Err(format!(
            "a {op:?} request must {} a disk",
            if op == Op::List { "not name" } else { "name" }
        ));
    }
    let payload = &body[HEADER_BYTES + name_len..];
    if offset % SECTOR != 0 {
        return Err(format!(
            "offset {offset} on disk {disk} is not a multiple of {SECTOR} bytes"
        ));
    }
    match op {
        Op::Read | Op::Write if len as usize > max_io_bytes => {
            return Err(format!(
                "an I/O of {len} bytes exceeds this server's limit of {max_io_bytes} bytes"
            ))
        }
        Op::Write if payload.len() != len as usize => {
            return Err(format!(
                "write of {len} bytes on disk {disk} carries {} payload bytes",
                payload.len()
            ))
        }
        Op::Info | Op::Read | Op::Sync | Op::List if !payload.is_empty() => {
            return Err(format!(
                "{op:?} request carries {} unexpected payload bytes",
                payload.len()
            ))
        }
        _ => {}
    }
    Ok(Request {
        op,
        buffer_type,
        ino,
        disk,
        offset,
        len,
        payload,
    })
}

/// Why a server could not do what it was asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Failure {
    /// The server serves no disk of this name.
    UnknownDisk { disk: String, served: Vec<String> },
    /// The request is malformed or asks what the protocol forbids.
    BadRequest(String),
    /// The disk itself failed (or refused the range).
    Disk(WireDiskError),
    /// The server's fence refused the sender (expelled from the cluster, or at an old
    /// lease epoch): nothing was read or written. (Last: postcard numbers variants.)
    Fenced(String),
}

/// A `DiskError` as it travels: enough to rebuild the same variant on the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireDiskError {
    Io {
        disk: String,
        op: String,
        offset: u64,
        len: u64,
        errno: Option<i32>,
        message: String,
    },
    OutOfRange {
        disk: String,
        op: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    Injected {
        disk: String,
        what: String,
    },
    Crashed {
        disk: String,
        op: String,
        crash: String,
    },
    /// Any other disk error, by its message.
    Other {
        disk: String,
        message: String,
    },
}

impl WireDiskError {
    pub fn from_error(disk: &str, e: &DiskError) -> WireDiskError {
        match e {
            DiskError::Io {
                disk,
                op,
                offset,
                len,
                source,
            } => WireDiskError::Io {
                disk: disk.clone(),
                op: op.to_string(),
                offset: *offset,
                len: *len as u64,
                errno: source.raw_os_error(),
                message: source.to_string(),
            },
            DiskError::OutOfRange {
                disk,
                op,
                offset,
                len,
                size,
            } => WireDiskError::OutOfRange {
                disk: disk.clone(),
                op: op.to_string(),
                offset: *offset,
                len: *len as u64,
                size: *size,
            },
            DiskError::Injected { disk, what } => WireDiskError::Injected {
                disk: disk.clone(),
                what: what.clone(),
            },
            DiskError::Crashed { disk, op, crash } => WireDiskError::Crashed {
                disk: disk.clone(),
                op: op.to_string(),
                crash: crash.clone(),
            },
            other => WireDiskError::Other {
                disk: disk.to_string(),
                message: other.to_string(),
            },
        }
    }

    /// The error as the client's `DiskError`, saying which server reported it.
    pub fn into_error(self, server: &str) -> DiskError {
        match self {
            WireDiskError::Io {
                disk,
                op,
                offset,
                len,
                errno,
                message,
            } => {
                let kind = errno.map_or(io::ErrorKind::Other, |e| {
                    io::Error::from_raw_os_error(e).kind()
                });
                DiskError::Io {
                    disk,
                    op: static_op(&op),
                    offset,
                    len: usize::try_from(len).unwrap_or(usize::MAX),
                    source: io::Error::new(kind, format!("{message}, on NSD server {server}")),
                }
            }
            WireDiskError::OutOfRange {
                disk,
                op,
                offset,
                len,
                size,
            } => DiskError::OutOfRange {
                disk,
                op: static_op(&op),
                offset,
                len: usize::try_from(len).unwrap_or(usize::MAX),
                size,
            },
            WireDiskError::Injected { disk, what } => DiskError::Injected {
                disk,
                what: format!("{what}, on NSD server {server}"),
            },
            WireDiskError::Crashed { disk, op, crash } => DiskError::Crashed {
                disk,
                op: static_op(&op),
                crash,
            },
            WireDiskError::Other { disk, message } => DiskError::Io {
                disk,
                op: "I/O",
                offset: 0,
                len: 0,
                source: io::Error::other(format!("{message}, on NSD server {server}")),
            },
        }
    }
}

/// `DiskError` names its operation with a static string.
fn static_op(op: &str) -> &'static str {
    match op {
        "read" => "read",
        "write" => "write",
        "sync" => "sync",
        _ => "I/O",
    }
}

/// Bytes before the payload of a successful reply: status and boot id.
pub const OK_PREFIX: usize = 9;

/// A reply that succeeded with `payload_len` bytes to follow at [`OK_PREFIX`], zeroed
/// (the server fills them in place).
pub fn ok_reply(boot: u64, payload_len: usize) -> Vec<u8> {
    let mut out = vec![0u8; OK_PREFIX + payload_len];
    out[0] = STATUS_OK;
    out[1..OK_PREFIX].copy_from_slice(&boot.to_le_bytes());
    out
}

pub fn failed_reply(f: &Failure) -> Vec<u8> {
    let mut out = vec![STATUS_FAILED];
    // A failure is a plain enum of strings and integers: postcard cannot fail on it.
    out.extend(postcard::to_stdvec(f).unwrap_or_default());
    out
}

/// A decoded reply: the server's boot id and the payload, or the server's failure.
pub fn decode_reply(reply: &[u8]) -> Result<Result<(u64, &[u8]), Failure>, String> {
    match reply.first() {
        Some(&STATUS_OK) if reply.len() >= OK_PREFIX => {
            Ok(Ok((le_u64(&reply[1..]), &reply[OK_PREFIX..])))
        }
        Some(&STATUS_OK) => Err(format!("its reply of {} bytes is too short", reply.len())),
        Some(&STATUS_FAILED) => postcard::from_bytes(&reply[1..])
            .map(Err)
            .map_err(|e| format!("its failure could not be decoded: {e}")),
        Some(s) => Err(format!("its reply has unknown status {s}")),
        None => Err("its reply is empty".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for (i, t) in BUFFER_TYPES.iter().enumerate() {
            assert_eq!(buffer_type_to_wire(*t) as usize, i);
        }
        let body = encode_request(Op::Write, "d7", 4096, 3, BufferType::Log, 9, b"abc");
        let r = decode_request(&body, 1 << 20).unwrap();
        assert_eq!(
            r,
            Request {
                op: Op::Write,
                buffer_type: BufferType::Log,
                ino: 9,
                disk: "d7",
                offset: 4096,
                len: 3,
                payload: b"abc",
            }
        );
    }

    /// Every malformed request is refused with a reason, never a panic: every
    /// truncation of a valid request and every value of each header byte.
    #[test]
    fn malformed_requests_are_refused() {
        let body = encode_request(Op::Write, "d7", 4096, 3, BufferType::Log, 9, b"abc");
        for cut in 0..body.len() {
            assert!(decode_request(&body[..cut], 1 << 20).is_err(), "cut {cut}");
        }
        for at in 0..HEADER_BYTES {
            for v in 0..=255u8 {
                let mut b = body.clone();
                b[at] = v;
                let _ = decode_request(&b, 1 << 20);
            }
        }
        let e = decode_request(&body, 2).unwrap_err();
        assert!(e.contains("exceeds this server's limit"), "{e}");
        let odd = encode_request(Op::Read, "d7", 100, 512, BufferType::Data, 0, &[]);
        let e = decode_request(&odd, 1 << 20).unwrap_err();
        assert!(e.contains("not a multiple of 512"), "{e}");
        let list = encode_request(Op::List, "", 0, 0, BufferType::Data, 0, &[]);
        assert_eq!(decode_request(&list, 1 << 20).unwrap().op, Op::List);
        let named = encode_request(Op::List, "d0", 0, 0, BufferType::Data, 0, &[]);
        assert!(decode_request(&named, 1 << 20).is_err());
        let unnamed = encode_request(Op::Read, "", 0, 512, BufferType::Data, 0, &[]);
        let e = decode_request(&unnamed, 1 << 20).unwrap_err();
        assert!(e.contains("must name a disk"), "{e}");
        let mut short = body.clone();
        short.pop();
        let e = decode_request(&short, 1 << 20).unwrap_err();
        assert!(e.contains("carries 2 payload bytes"), "{e}");
    }

    #[test]
    fn disk_errors_keep_their_variant() {
        let e = DiskError::Io {
            disk: "d1".into(),
            op: "write",
            offset: 512,
            len: 4096,
            source: io::Error::from_raw_os_error(libc_eio()),
        };
        let back = WireDiskError::from_error("d1", &e).into_error("node 2");
        match back {
            DiskError::Io {
                disk, op, source, ..
            } => {
                assert_eq!((disk.as_str(), op), ("d1", "write"));
                assert!(source.to_string().contains("node 2"), "{source}");
            }
            other => panic!("{other}"),
        }
        let f = Failure::UnknownDisk {
            disk: "x".into(),
            served: vec!["d0".into()],
        };
        assert_eq!(decode_reply(&failed_reply(&f)).unwrap(), Err(f));
        assert!(decode_reply(&[7]).is_err());
        assert!(decode_reply(&[STATUS_OK, 1, 2]).is_err());
        let ok = ok_reply(0xabcd, 3);
        assert_eq!(decode_reply(&ok).unwrap(), Ok((0xabcd, &[0u8, 0, 0][..])));
        assert!(decode_reply(&[]).is_err());
        assert!(decode_reply(&[STATUS_FAILED, 200]).is_err());
    }

    fn libc_eio() -> i32 {
        5
    }
}
