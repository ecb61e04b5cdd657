//! Membership proof: both ends of a connection prove they hold the cluster key with a
//! keyed BLAKE3 hash over a transcript of the handshake, without sending the key.
//!
//! The transcript binds the negotiated version, both node ids, both fresh nonces and
//! the lane class, and each side's proof carries its role, so a proof can be neither
//! replayed on another connection nor reflected back as the other side's.

use crate::wire::{LaneClass, NONCE_BYTES};
use std::fmt;

/// Bytes in a cluster key.
pub const CLUSTER_KEY_BYTES: usize = 32;

/// The secret every member of a cluster holds (made by `mako cluster create`).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; CLUSTER_KEY_BYTES]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret, not even in a debug log.
        f.write_str("ClusterKey(<secret>)")
    }
}

impl ClusterKey {
    pub fn from_bytes(bytes: [u8; CLUSTER_KEY_BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// A new random key (from the operating system's generator, through `rand`).
    pub fn random() -> ClusterKey {
        ClusterKey(rand::random())
    }

    /// Parses the key's 64 hexadecimal digits (the form a key file holds).
    pub fn from_hex(text: &str) -> Result<ClusterKey, String> {
        let text = text.trim();
        if text.len() != 2 * CLUSTER_KEY_BYTES || !text.is_ascii() {
            return Err(format!(
                "a cluster key is {} hexadecimal digits, this is {} characters",
                2 * CLUSTER_KEY_BYTES,
                text.chars().count()
            ));
        }
        let mut key = [0u8; CLUSTER_KEY_BYTES];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| {
                format!(
                    "cluster key: {:?} is not hexadecimal",
                    &text[2 * i..2 * i + 2]
                )
            })?;
        }
        Ok(ClusterKey(key))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Which end of the connection a proof is from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client = 1,
    Server = 2,
}

/// What both proofs cover.
pub struct Transcript {
    pub version: u16,
    pub client_node: u32,
    pub server_node: u32,
    pub lane: LaneClass,
    pub client_nonce: [u8; NONCE_BYTES],
    pub server_nonce: [u8; NONCE_BYTES],
}

/// `role`'s proof of `key` over `transcript`.
pub fn proof(key: &ClusterKey, role: Role, t: &Transcript) -> [u8; NONCE_BYTES] {
    let mut h = blake3::Hasher::new_keyed(&key.0);
    h.update(b"mako-rpc membership proof v1");
    h.update(&[role as u8, t.lane as u8]);
    h.update(&t.version.to_le_bytes());
    h.update(&t.client_node.to_le_bytes());
    h.update(&t.server_node.to_le_bytes());
    h.update(&t.client_nonce);
    h.update(&t.server_nonce);
    *h.finalize().as_bytes()
}

/// Whether `claimed` is `role`'s proof of `key` (compared in constant time).
pub fn verify(key: &ClusterKey, role: Role, t: &Transcript, claimed: &[u8; NONCE_BYTES]) -> bool {
    blake3::Hash::from_bytes(proof(key, role, t)) == blake3::Hash::from_bytes(*claimed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            version: 1,
            client_node: 1,
            server_node: 2,
            lane: LaneClass::Small,
            client_nonce: [1; NONCE_BYTES],
            server_nonce: [2; NONCE_BYTES],
        }
    }

    #[test]
    fn proofs_depend_on_key_role_and_every_transcript_field() {
        let key = ClusterKey::random();
        let t = transcript();
        let p = proof(&key, Role::Client, &t);
        assert!(verify(&key, Role::Client, &t, &p));
        assert!(!verify(&key, Role::Server, &t, &p), "reflected");
        assert!(
            !verify(&ClusterKey::random(), Role::Client, &t, &p),
            "other key"
        );
        let changes: [&dyn Fn(&mut Transcript); 6] = [
            &|t| t.version = 2,
            &|t| t.client_node = 9,
            &|t| t.server_node = 9,
            &|t| t.lane = LaneClass::Bulk,
            &|t| t.client_nonce[5] ^= 1,
            &|t| t.server_nonce[31] ^= 1,
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut t2 = transcript();
            change(&mut t2);
            assert!(!verify(&key, Role::Client, &t2, &p), "change {i} accepted");
        }
    }

    #[test]
    fn keys_round_trip_through_hex_and_never_print() {
        let key = ClusterKey::random();
        assert_eq!(ClusterKey::from_hex(&key.to_hex()).unwrap(), key);
        assert!(!format!("{key:?}").contains(&key.to_hex()[..8]));
        assert!(ClusterKey::from_hex("abcd").unwrap_err().contains("64"));
        assert!(ClusterKey::from_hex(&"zz".repeat(32))
            .unwrap_err()
            .contains("hexadecimal"));
    }
}
