//! The encoding of everything this crate keeps on disk (raft log entries, vote,
//! committed and purged log ids, the applied state, snapshots): a 16-byte
//! little-endian header — magic `MKCL`, format version, kind, body length, crc32c of
//! header and body — then the body in postcard. As in mako-format, a version only
//! grows when the layout does, a decoder refuses versions it does not know, and
//! nothing read from disk is trusted before its checksum and length are checked; a
//! decode never panics.

use serde::de::DeserializeOwned;
use serde::Serialize;

const MAGIC: [u8; 4] = *b"MKCL";
/// The current layout of every kind. Version 2: the configuration gained its lease
/// records (`ClusterConfig::leases`); log entries of version 1 still decode (commands
/// were only added after the last), applied states and snapshots of version 1 do not.
pub const VERSION: u16 = 2;
/// The oldest version of the kinds that hold a whole configuration.
const STATE_VERSION_MIN: u16 = 2;
const HEADER_BYTES: usize = 16;
const CRC_OFFSET: usize = 12;

/// What a stored value is; a value decoded as the wrong kind is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    LogEntry = 1,
    Vote = 2,
    LogId = 3,
    Applied = 4,
    Snapshot = 5,
    Config = 6,
}

/// Why stored bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("{what}: only {bytes} bytes, shorter than a {HEADER_BYTES}-byte header")]
    Short { what: String, bytes: usize },
    #[error("{what}: bad magic {found:02x?} (not written by Mako's cluster store)")]
    BadMagic { what: String, found: [u8; 4] },
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the file is damaged")]
    BadChecksum {
        what: String,
        stored: u32,
        computed: u32,
    },
    #[error("{what}: format version {found} is newer than this Mako understands ({VERSION}); upgrade Mako on this node")]
    NewerVersion { what: String, found: u16 },
    #[error("{what}: format version {found} was written by a Mako before leases (version {STATE_VERSION_MIN}); this pre-release store cannot be upgraded: make the cluster again (`mako cluster create`)")]
    OlderVersion { what: String, found: u16 },
    #[error("{what}: stored as kind {found}, expected {expected:?}")]
    WrongKind {
        what: String,
        found: u16,
        expected: Kind,
    },
    #[error("{what}: body length {stated} does not match the {actual} bytes stored")]
    BadLength {
        what: String,
        stated: u32,
        actual: usize,
    },
    #[error("{what}: {reason}")]
    Body { what: String, reason: String },
}

/// Encodes `value` as a stored value of `kind`.
pub fn encode<T: Serialize>(kind: Kind, value: &T) -> Result<Vec<u8>, CodecError> {
    let body = postcard::to_stdvec(value).map_err(|e| CodecError::Body {
        what: format!("{kind:?}"),
        reason: format!("cannot encode: {e}"),
    })?;
    let length = u32::try_from(body.len()).map_err(|_| CodecError::Body {
        what: format!("{kind:?}"),
        reason: format!("{} bytes is too large to store", body.len()),
    })?;
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(kind as u16).to_le_bytes());
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out);
    out[CRC_OFFSET..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Decodes a stored value of `kind`; `what` names it in errors (e.g. "log entry 17").
pub fn decode<T: DeserializeOwned>(kind: Kind, what: &str, bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() < HEADER_BYTES {
        return Err(CodecError::Short {
            what: what.to_string(),
            bytes: bytes.len(),
        });
    }
    let le16 = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let le32 =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if magic != MAGIC {
        return Err(CodecError::BadMagic {
            what: what.to_string(),
            found: magic,
        });
    }
    let stored = le32(CRC_OFFSET);
    // The checksum was computed with its own field zeroed.
    let computed = crc32c::crc32c(&bytes[..CRC_OFFSET]);
    let computed = crc32c::crc32c_append(computed, &[0; 4]);
    let computed = crc32c::crc32c_append(computed, &bytes[HEADER_BYTES..]);
    if stored != computed {
        return Err(CodecError::BadChecksum {
            what: what.to_string(),
            stored,
            computed,
        });
    }
    let version = le16(4);
    if version > VERSION || version == 0 {
        return Err(CodecError::NewerVersion {
            what: what.to_string(),
            found: version,
        });
    }
    let found_kind = le16(6);
    if found_kind != kind as u16 {
        return Err(CodecError::WrongKind {
            what: what.to_string(),
            found: found_kind,
            expected: kind,
        });
    }
    if version < STATE_VERSION_MIN && matches!(kind, Kind::Applied | Kind::Snapshot | Kind::Config)
    {
        return Err(CodecError::OlderVersion {
            what: what.to_string(),
            found: version,
        });
    }
    let stated = le32(8);
    if stated as usize != bytes.len() - HEADER_BYTES {
        return Err(CodecError::BadLength {
            what: what.to_string(),
            stated,
            actual: bytes.len() - HEADER_BYTES,
        });
    }
    postcard::from_bytes(&bytes[HEADER_BYTES..]).map_err(|e| CodecError::Body {
        what: what.to_string(),
        reason: format!("cannot decode: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterConfig, Command};

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let mut config = ClusterConfig::default();
        config
            .apply(&Command::CreateCluster {
                name: "c1".into(),
                uuid: [3; 16],
            })
            .unwrap();
        let bytes = encode(Kind::Config, &config).unwrap();
        let back: ClusterConfig = decode(Kind::Config, "config", &bytes).unwrap();
        assert_eq!(back, config);

        // Every single-byte change is caught (by the checksum, or before it).
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(
                decode::<ClusterConfig>(Kind::Config, "config", &bad).is_err(),
                "byte {at}"
            );
        }
        for len in 0..bytes.len() {
            assert!(decode::<ClusterConfig>(Kind::Config, "config", &bytes[..len]).is_err());
        }
        let e = decode::<ClusterConfig>(Kind::Vote, "vote", &bytes).unwrap_err();
        assert!(matches!(e, CodecError::WrongKind { .. }), "{e}");

        // A newer version with a valid checksum is refused by name.
        let mut newer = bytes.clone();
        newer[4..6].copy_from_slice(&(VERSION + 1).to_le_bytes());
        newer[CRC_OFFSET..HEADER_BYTES].copy_from_slice(&[0; 4]);
        let crc = crc32c::crc32c(&newer);
        newer[CRC_OFFSET..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        let e = decode::<ClusterConfig>(Kind::Config, "config", &newer).unwrap_err();
        assert!(e.to_string().contains("upgrade Mako"), "{e}");
    }
}
