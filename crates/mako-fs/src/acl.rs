//! POSIX ACLs in the kernel's xattr encoding (`system.posix_acl_access` and
//! `system.posix_acl_default`). The kernel enforces them (FUSE_POSIX_ACL); the file
//! system keeps them consistent with the mode (chmod) and inherits default ACLs at
//! create time, as `posix_acl_create` and `posix_acl_chmod` do in the kernel.

pub const ACCESS: &[u8] = b"system.posix_acl_access";
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

pub fn decode(bytes: &[u8]) -> Option<Vec<AclEntry>> {
    if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(8) {
        return None;
    }
    if u32::from_le_bytes(bytes[0..4].try_into().ok()?) != VERSION {
        return None;
    }
    let mut out = Vec::new();
    for c in bytes[4..].chunks(8) {
        out.push(AclEntry {
            tag: u16::from_le_bytes([c[0], c[1]]),
            perm: u16::from_le_bytes([c[2], c[3]]),
            id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        });
    }
    let valid_tags = out.iter().all(|e| {
        matches!(e.tag, USER_OBJ | USER | GROUP_OBJ | GROUP | MASK | OTHER) && e.perm <= 7
    });
    valid_tags.then_some(out)
}

pub fn encode(entries: &[AclEntry]) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    for e in entries {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        out.extend_from_slice(&e.id.to_le_bytes());
    }
    out
}

/// True if the ACL says no more than the mode bits (only the three base entries).
pub fn is_minimal(entries: &[AclEntry]) -> bool {
    entries
        .iter()
        .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
}

/// Apply `mode`'s permission bits to an ACL (chmod): owner, other, and the mask (or
/// the owning group when there is no mask).
pub fn chmod(entries: &mut [AclEntry], mode: u32) {
    let has_mask = entries.iter().any(|e| e.tag == MASK);
    for e in entries.iter_mut() {
        match e.tag {
            USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
            OTHER => e.perm = (mode & 7) as u16,
            MASK => e.perm = ((mode >> 3) & 7) as u16,
            GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
            _ => {}
        }
    }
}

/// The mode bits an access ACL implies (for setxattr of an access ACL).
pub fn mode_from(entries: &[AclEntry]) -> Option<u32> {
    let get = |t: u16| entries.iter().find(|e| e.tag == t).map(|e| e.perm as u32);
    let group = get(MASK).or_else(|| get(GROUP_OBJ))?;
    Some((get(USER_OBJ)? << 6) | (group << 3) | get(OTHER)?)
}

/// Inherit a parent's default ACL into a new inode of `mode`: returns the new mode and
/// the access ACL (and, for directories, the default ACL to copy).
pub fn inherit(default_acl: &[u8], mode: u32) -> Option<(u32, Option<Vec<u8>>)> {
    let mut entries = decode(default_acl)?;
    // posix_acl_create: the ACL's entries are masked by the requested mode.
    let has_mask = entries.iter().any(|e| e.tag == MASK);
    for e in entries.iter_mut() {
        match e.tag {
            USER_OBJ => e.perm &= ((mode >> 6) & 7) as u16,
            OTHER => e.perm &= (mode & 7) as u16,
            MASK => e.perm &= ((mode >> 3) & 7) as u16,
            GROUP_OBJ if !has_mask => e.perm &= ((mode >> 3) & 7) as u16,
            _ => {}
        }
    }
    let new_mode = (mode & !0o777) | mode_from(&entries)?;
    let access = if is_minimal(&entries) {
        None
    } else {
        Some(encode(&entries))
    };
    Some((new_mode, access))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn inherit_masks_with_mode() {
        let acl = vec![
            AclEntry {
                tag: USER_OBJ,
                perm: 7,
                id: u32::MAX,
            },
            AclEntry {
                tag: USER,
                perm: 7,
                id: 1000,
            },
            AclEntry {
                tag: GROUP_OBJ,
                perm: 5,
                id: u32::MAX,
            },
            AclEntry {
                tag: MASK,
                perm: 7,
                id: u32::MAX,
            },
            AclEntry {
                tag: OTHER,
                perm: 0,
                id: u32::MAX,
            },
        ];
        let (mode, access) = inherit(&encode(&acl), 0o100640).unwrap();
        assert_eq!(mode, 0o100640);
        let a = decode(&access.unwrap()).unwrap();
        assert_eq!(a.iter().find(|e| e.tag == MASK).unwrap().perm, 4);
        assert!(decode(b"junk").is_none());
    }
}
