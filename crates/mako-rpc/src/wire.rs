//! The wire format: every message is a frame, a fixed 32-byte header followed by a
//! body of `body_len` bytes.
//!
//! The header is little-endian and checksummed (crc32c over its first 28 bytes), so a
//! damaged or foreign stream is recognised before its length is trusted. Control
//! bodies (hello, authentication, errors) are postcard; request and reply bodies are
//! the caller's bytes, carried as they are (a block payload is never re-serialised).
//!
//! Header layout (offsets in bytes):
//!
//! | off | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 4 | magic | `MKRP` |
//! | 4 | 2 | version | protocol version the frame is encoded in |
//! | 6 | 1 | kind | [`Kind`] |
//! | 7 | 1 | flags | [`FLAG_BULK`], [`FLAG_RESENT`] (version 2); other bits must be zero |
//! | 8 | 2 | service | `ServiceId` number (requests), else 0 |
//! | 10 | 2 | acked | version 2 requests: every request of this client to this server with an id below `request id - acked` has been answered or given up (the server may forget it); zero in version 1 |
//! | 12 | 8 | request id | matches a reply to its request |
//! | 20 | 4 | deadline ms | time the caller still waits (requests), else 0 |
//! | 24 | 4 | body length | bytes after the header |
//! | 28 | 4 | header crc32c | over bytes 0..28 |

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::fmt;
use tokio::io::{AsyncRead, AsyncReadExt};
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"MKRP";
/// Oldest protocol version this build speaks. A hello frame is always encoded in this
/// version's header layout, so any two versions can at least refuse each other clearly.
pub const VERSION_MIN: u16 = 1;
/// Newest protocol version this build speaks.
pub const VERSION_MAX: u16 = 2;
/// First version with resent requests: the client names its incarnation at
/// authentication ([`AuthV2`]), request ids are unique per incarnation, requests carry
/// `acked`, and a request whose connection closed before its answer came is sent again
/// with [`FLAG_RESENT`] under the same id; the server runs each id once and answers a
/// copy from what it remembers (docs/coherence.md section 1).
pub const VERSION_RESEND: u16 = 2;
/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 32;
/// Largest body of a handshake frame: nothing before authentication may make the
/// server reserve more than this.
pub const CONTROL_BODY_MAX: usize = 4096;
/// Bytes of an authentication nonce and of a proof.
pub const NONCE_BYTES: usize = 32;

/// Flag: the body is a bulk payload (informational: lanes are chosen by the sender).
pub const FLAG_BULK: u8 = 1;
/// Flag (version 2 requests): a copy of a request sent before on a connection that
/// closed before its answer came (informational: the server recognises copies by id).
pub const FLAG_RESENT: u8 = 2;
const FLAGS_KNOWN: u8 = FLAG_BULK | FLAG_RESENT;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client → server, first frame: who I am, versions I speak, my nonce.
    Hello = 1,
    /// Server → client: chosen version, my nonce, my proof of the cluster key.
    HelloAck = 2,
    /// Client → server: my proof of the cluster key.
    Auth = 3,
    /// Server → client: authenticated, requests may follow.
    AuthOk = 4,
    /// Either way: the connection is refused (body: [`Refuse`]), then closed.
    Refuse = 5,
    /// A request to a service (body: the caller's bytes).
    Request = 6,
    /// A reply to a request (body: the service's bytes).
    Reply = 7,
    /// A request could not be answered (body: [`WireError`]).
    Error = 8,
}

impl Kind {
    fn from_wire(n: u8) -> Option<Kind> {
        Some(match n {
            1 => Kind::Hello,
            2 => Kind::HelloAck,
            3 => Kind::Auth,
            4 => Kind::AuthOk,
            5 => Kind::Refuse,
            6 => Kind::Request,
            7 => Kind::Reply,
            8 => Kind::Error,
            _ => return None,
        })
    }
}

/// The header as it lies on the wire.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawHeader {
    magic: [u8; 4],
    version: U16,
    kind: u8,
    flags: u8,
    service: U16,
    reserved: U16,
    request_id: U64,
    deadline_ms: U32,
    body_len: U32,
    crc: U32,
}

const _: () = assert!(std::mem::size_of::<RawHeader>() == HEADER_BYTES);
const CRC_OFFSET: usize = HEADER_BYTES - 4;

/// A decoded, checked frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub kind: Kind,
    pub flags: u8,
    pub service: u16,
    pub request_id: u64,
    pub deadline_ms: u32,
    pub body_len: u32,
    /// Version 2 requests: ids below `request_id - acked` are done (see the layout).
    pub acked: u16,
}

impl Header {
    /// A header of `kind` for a body of `body_len` bytes, everything else zero.
    pub fn new(version: u16, kind: Kind, body_len: usize) -> Header {
        Header {
            version,
            kind,
            flags: 0,
            service: 0,
            request_id: 0,
            deadline_ms: 0,
            acked: 0,
            // Bodies are bounded by the frame limit (at most u32::MAX) before they are
            // sent; saturating keeps an impossible length visible to the receiver.
            body_len: u32::try_from(body_len).unwrap_or(u32::MAX),
        }
    }

    /// The header's bytes, checksum included.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let raw = RawHeader {
            magic: MAGIC,
            version: U16::new(self.version),
            kind: self.kind as u8,
            flags: self.flags,
            service: U16::new(self.service),
            reserved: U16::new(self.acked),
            request_id: U64::new(self.request_id),
            deadline_ms: U32::new(self.deadline_ms),
            body_len: U32::new(self.body_len),
            crc: U32::new(0),
        };
        let mut bytes = [0u8; HEADER_BYTES];
        bytes.copy_from_slice(raw.as_bytes());
        let crc = crc32c::crc32c(&bytes[..CRC_OFFSET]);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Checks and decodes a header. `max_body` is the largest body the receiver
    /// accepts at this point of the connection. The checks go from the outside in:
    /// magic, checksum, then the fields the checksum vouches for.
    pub fn decode(bytes: &[u8; HEADER_BYTES], max_body: usize) -> Result<Header, FrameError> {
        let raw = RawHeader::ref_from_bytes(&bytes[..])
            .unwrap_or_else(|_| unreachable!("RawHeader is unaligned and HEADER_BYTES long"));
        if raw.magic != MAGIC {
            return Err(FrameError::BadMagic(raw.magic));
        }
        let computed = crc32c::crc32c(&bytes[..CRC_OFFSET]);
        if raw.crc.get() != computed {
            return Err(FrameError::BadChecksum {
                stored: raw.crc.get(),
                computed,
            });
        }
        let version = raw.version.get();
        if !(VERSION_MIN..=VERSION_MAX).contains(&version) {
            return Err(FrameError::UnknownVersion(version));
        }
        let kind = Kind::from_wire(raw.kind).ok_or(FrameError::UnknownKind(raw.kind))?;
        let acked_allowed = version >= VERSION_RESEND && kind == Kind::Request;
        if raw.flags & !FLAGS_KNOWN != 0 || (raw.reserved.get() != 0 && !acked_allowed) {
            return Err(FrameError::UnknownFlags {
                flags: raw.flags,
                reserved: raw.reserved.get(),
            });
        }
        let body_len = raw.body_len.get();
        if body_len as usize > max_body {
            return Err(FrameError::Oversized {
                len: body_len as u64,
                max: max_body as u64,
            });
        }
        Ok(Header {
            version,
            kind,
            flags: raw.flags,
            service: raw.service.get(),
            request_id: raw.request_id.get(),
            deadline_ms: raw.deadline_ms.get(),
            body_len,
            acked: raw.reserved.get(),
        })
    }
}

/// Why a frame was refused. Each one closes the connection it arrived on.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?} (not a Mako RPC stream)")]
    BadMagic([u8; 4]),
    #[error("bad header checksum (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("unknown protocol version {0} (this node speaks {VERSION_MIN}..={VERSION_MAX})")]
    UnknownVersion(u16),
    #[error("frame in protocol version {got}, but the connection negotiated {negotiated}")]
    WrongVersion { got: u16, negotiated: u16 },
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown header flags {flags:#04x} or reserved field {reserved:#06x}")]
    UnknownFlags { flags: u8, reserved: u16 },
    #[error("frame body of {len} bytes exceeds the limit of {max} bytes")]
    Oversized { len: u64, max: u64 },
    #[error("truncated frame: the stream ended after {got} of {expected} {what} bytes")]
    Truncated {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("unexpected {got:?} frame {when}")]
    Unexpected { got: Kind, when: &'static str },
    #[error("bad {what} body: {reason}")]
    Body { what: &'static str, reason: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame. `Ok(None)` is a clean end of stream at a frame boundary; an end
/// inside a frame is [`FrameError::Truncated`]. The body is read straight into its
/// own buffer, never zero-filled first and never copied again: a bulk payload costs
/// one copy out of the kernel, and turns into a `Vec<u8>` without a copy.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_body: usize,
) -> Result<Option<(Header, Bytes)>, FrameError> {
    let mut bytes = [0u8; HEADER_BYTES];
    let mut got = 0;
    while got < HEADER_BYTES {
        let n = reader.read(&mut bytes[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                what: "header",
                got,
                expected: HEADER_BYTES,
            });
        }
        got += n;
    }
    let header = Header::decode(&bytes, max_body)?;
    let len = header.body_len as usize;
    let mut body = BytesMut::with_capacity(len);
    while body.len() < len {
        let want = (len - body.len()) as u64;
        let n = (&mut *reader).take(want).read_buf(&mut body).await?;
        if n == 0 {
            return Err(FrameError::Truncated {
                what: "body",
                got: body.len(),
                expected: len,
            });
        }
    }
    Ok(Some((header, body.freeze())))
}

/// Which lanes a connection serves, said in the hello so the server can give small
/// messages their own handler threads too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LaneClass {
    /// Reserved for small messages (`tscSmallMsgTcpConnPct`).
    Small,
    /// Large messages and bulk-priority calls.
    Bulk,
    /// Everything (no connections are reserved).
    Shared,
}

impl fmt::Display for LaneClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LaneClass::Small => "small",
            LaneClass::Bulk => "bulk",
            LaneClass::Shared => "shared",
        })
    }
}

/// First frame of a connection, client → server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub node: u32,
    pub min_version: u16,
    pub max_version: u16,
    pub lane: LaneClass,
    pub nonce: [u8; NONCE_BYTES],
}

/// Server → client: the chosen version and the server's proof of the cluster key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAck {
    pub node: u32,
    pub version: u16,
    pub nonce: [u8; NONCE_BYTES],
    pub proof: [u8; NONCE_BYTES],
}

/// Client → server: the client's proof of the cluster key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    pub proof: [u8; NONCE_BYTES],
}

/// Client → server, version 2: the proof and the client transport's incarnation (a
/// random number drawn when it started), under which its request ids are unique. A
/// version 2 server also accepts a plain [`Auth`]; that client's requests are then not
/// recognised when resent (it does not resend).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthV2 {
    pub proof: [u8; NONCE_BYTES],
    pub incarnation: u64,
}

/// Either way: why the connection is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refuse {
    pub reason: String,
}

/// Why a request got no reply from its service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    /// The node offers no such service (not started, or not registered).
    NoService,
    /// The service number is unknown to this node (a newer peer).
    UnknownService(u16),
    /// The request waited for a handler longer than its caller's deadline.
    Expired,
    /// The handler panicked (a bug; the server logged it).
    HandlerPanicked(String),
    /// The handler's reply is larger than the server's frame limit, so it was not sent.
    ReplyTooLarge { len: u64, max: u64 },
    /// The server does not serve the caller (`Registry::admit`: e.g. it was expelled).
    Refused(String),
    /// A resent request that was run, whose answer the server no longer has (too large
    /// to keep, or over its memory for answers): it ran once, its answer is lost.
    ReplyLost,
}

/// Encodes a control body.
pub fn encode_body<T: Serialize>(value: &T) -> Vec<u8> {
    // Control bodies are plain structs of integers, arrays and short strings: postcard
    // cannot fail on them (it fails only on unsupported serde features).
    postcard::to_stdvec(value).unwrap_or_else(|e| unreachable!("postcard control body: {e}"))
}

/// Decodes a control body.
pub fn decode_body<T: serde::de::DeserializeOwned>(
    what: &'static str,
    body: &[u8],
) -> Result<T, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Body {
        what,
        reason: e.to_string(),
    })
}

/// A whole frame as bytes (header then body): for tests and tools that speak the
/// protocol over a plain blocking socket.
pub fn frame_bytes(header: &Header, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            version: VERSION_MIN,
            kind: Kind::Request,
            flags: FLAG_BULK,
            service: 3,
            request_id: 0x0102_0304_0506_0708,
            deadline_ms: 1500,
            body_len: 77,
            acked: 0,
        }
    }

    #[test]
    fn acked_is_carried_by_version_2_requests_only() {
        let mut h = header();
        h.version = VERSION_RESEND;
        h.acked = 513;
        h.flags |= FLAG_RESENT;
        assert_eq!(Header::decode(&h.encode(), 1000).unwrap(), h);
        // A version 1 frame, or a reply, with the field set is refused.
        let mut v1 = h;
        v1.version = VERSION_MIN;
        v1.flags = FLAG_BULK;
        let e = Header::decode(&v1.encode(), 1000).unwrap_err();
        assert!(
            matches!(e, FrameError::UnknownFlags { reserved: 513, .. }),
            "{e}"
        );
        let mut reply = h;
        reply.kind = Kind::Reply;
        assert!(Header::decode(&reply.encode(), 1000).is_err());
    }

    #[test]
    fn header_round_trips() {
        let h = header();
        assert_eq!(Header::decode(&h.encode(), 1000).unwrap(), h);
    }

    #[test]
    fn every_damaged_header_byte_is_refused() {
        let bytes = header().encode();
        for i in 0..HEADER_BYTES {
            for bit in 0..8 {
                let mut b = bytes;
                b[i] ^= 1 << bit;
                assert!(
                    Header::decode(&b, 1000).is_err(),
                    "byte {i} bit {bit} flipped was accepted"
                );
            }
        }
    }

    #[test]
    fn refusals_name_their_reason() {
        let mut h = header();
        h.version = 99;
        let e = Header::decode(&h.encode(), 1000).unwrap_err();
        assert!(matches!(e, FrameError::UnknownVersion(99)), "{e}");
        let e = Header::decode(&header().encode(), 10).unwrap_err();
        assert!(
            matches!(e, FrameError::Oversized { len: 77, max: 10 }),
            "{e}"
        );
        let mut b = header().encode();
        b[0] = b'X';
        assert!(matches!(
            Header::decode(&b, 1000),
            Err(FrameError::BadMagic(_))
        ));
        let mut b = header().encode();
        b[13] ^= 0xff;
        assert!(matches!(
            Header::decode(&b, 1000),
            Err(FrameError::BadChecksum { .. })
        ));
    }

    #[test]
    fn truncated_frames_are_told_from_a_clean_end() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut empty: &[u8] = &[];
            assert!(read_frame(&mut empty, 100).await.unwrap().is_none());
            let frame = frame_bytes(&header(), &[7u8; 77]);
            let mut whole: &[u8] = &frame;
            let (h, body) = read_frame(&mut whole, 100).await.unwrap().unwrap();
            assert_eq!(h, header());
            assert_eq!(&body[..], &[7u8; 77][..]);
            for cut in [1, HEADER_BYTES - 1, HEADER_BYTES + 1, frame.len() - 1] {
                let mut part: &[u8] = &frame[..cut];
                let e = read_frame(&mut part, 100).await.unwrap_err();
                assert!(matches!(e, FrameError::Truncated { .. }), "cut {cut}: {e}");
            }
        });
    }
}
