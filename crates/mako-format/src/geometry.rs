//! Block and subblock geometry: the table of DESIGN.md 3.2 and the sizes derived from it.

/// Smallest and largest block sizes (`-B`).
pub const BLOCK_BYTES_MIN: u32 = 64 * 1024;
pub const BLOCK_BYTES_MAX: u32 = 16 * 1024 * 1024;
/// Default block size.
pub const BLOCK_BYTES_DEFAULT: u32 = 4 * 1024 * 1024;
/// Largest directory block (DESIGN 3.5: 256 KiB, or the block size if smaller).
pub const DIR_BLOCK_BYTES_MAX: u32 = 256 * 1024;
/// Default indirect block size (`-I`).
pub const INDIRECT_BYTES_DEFAULT: u32 = 32 * 1024;
/// Inode sizes accepted by `-i`.
pub const INODE_SIZES: [u32; 3] = [512, 1024, 4096];

/// Default subblocks per full block for a block size (DESIGN.md 3.2, from the seeds).
pub fn default_subblocks(block_bytes: u32) -> Option<u32> {
    Some(match block_bytes {
        b if b == 64 << 10 || b == 128 << 10 || b == 256 << 10 => 32,
        b if b == 512 << 10 => 64,
        b if b == 1 << 20 => 128,
        b if b == 2 << 20 => 256,
        b if b == 4 << 20 || b == 8 << 20 => 512,
        b if b == 16 << 20 => 1024,
        _ => return None,
    })
}

/// Geometry of one file system, derived from the descriptor's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u32,
    pub subblocks_per_block: u32,
    pub inode_bytes: u32,
    pub indirect_bytes: u32,
}

impl Geometry {
    pub fn subblock_bytes(&self) -> u32 {
        self.block_bytes / self.subblocks_per_block
    }
    pub fn dir_block_bytes(&self) -> u32 {
        self.block_bytes.min(DIR_BLOCK_BYTES_MAX)
    }
    /// Subblocks that hold one directory block.
    pub fn dir_block_subblocks(&self) -> u32 {
        self.dir_block_bytes() / self.subblock_bytes()
    }
    pub fn indirect_subblocks(&self) -> u32 {
        self.indirect_bytes.div_ceil(self.subblock_bytes())
    }
    /// Bytes of an xattr index or xattr block (`xattr`): 4 KiB, or a subblock when
    /// subblocks are larger (the smallest allocation).
    pub fn xattr_block_bytes(&self) -> u32 {
        self.subblock_bytes().max(4096)
    }
    /// Subblocks that hold one xattr index or xattr block.
    pub fn xattr_block_subblocks(&self) -> u32 {
        self.xattr_block_bytes() / self.subblock_bytes()
    }
    /// Block pointers one indirect block holds.
    pub fn pointers_per_indirect(&self) -> u64 {
        ((self.indirect_bytes as usize - crate::indirect::INDIRECT_HEADER_BYTES) / 8) as u64
    }
    pub fn sectors_per_block(&self) -> u64 {
        self.block_bytes as u64 / crate::SECTOR_BYTES
    }
    pub fn sectors_per_subblock(&self) -> u64 {
        self.subblock_bytes() as u64 / crate::SECTOR_BYTES
    }
    /// Check a geometry a user asked for; the error names the parameter and its range.
    pub fn validate(&self) -> Result<(), String> {
        let b = self.block_bytes;
        if !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&b) || !b.is_power_of_two() {
            return Err(format!(
                "block size (-B) {b} must be a power of two from 64K to 16M"
            ));
        }
        if !INODE_SIZES.contains(&self.inode_bytes) {
            return Err(format!(
                "inode size (-i) {} must be one of 512, 1K, 4K",
                self.inode_bytes
            ));
        }
        let s = self.subblocks_per_block;
        if s == 0 || !s.is_power_of_two() || b / s < 512 || !b.is_multiple_of(s) {
            return Err(format!("subblocks per block {s} must be a power of two leaving subblocks of at least 512 bytes"));
        }
        let ind = self.indirect_bytes;
        if !ind.is_power_of_two() || ind < 4096 || ind > b.min(256 * 1024) {
            return Err(format!(
                "indirect block size (-I) {ind} must be a power of two from 4K to the block size (at most 256K)"
            ));
        }
        if ind < self.subblock_bytes() {
            return Err(format!(
                "indirect block size (-I) {ind} is smaller than a subblock ({}); use at least {}",
                self.subblock_bytes(),
                self.subblock_bytes()
            ));
        }
        if self.inode_bytes as u64 > b as u64 {
            return Err("inode larger than a block".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn design_table() {
        let table = [
            (64u32 << 10, 32u32, 2u32 << 10),
            (128 << 10, 32, 4 << 10),
            (256 << 10, 32, 8 << 10),
            (512 << 10, 64, 8 << 10),
            (1 << 20, 128, 8 << 10),
            (2 << 20, 256, 8 << 10),
            (4 << 20, 512, 8 << 10),
            (8 << 20, 512, 16 << 10),
            (16 << 20, 1024, 16 << 10),
        ];
        for (b, s, sb) in table {
            let g = Geometry {
                block_bytes: b,
                subblocks_per_block: default_subblocks(b).unwrap(),
                inode_bytes: 4096,
                indirect_bytes: 32768.min(b),
            };
            assert_eq!(g.subblocks_per_block, s);
            assert_eq!(g.subblock_bytes(), sb, "block {b}");
        }
        assert_eq!(default_subblocks(3 << 20), None);
    }
    #[test]
    fn validation_names_parameter() {
        let g = Geometry {
            block_bytes: 3 << 20,
            subblocks_per_block: 512,
            inode_bytes: 4096,
            indirect_bytes: 32768,
        };
        assert!(g.validate().unwrap_err().contains("-B"));
        let g = Geometry {
            block_bytes: 4 << 20,
            subblocks_per_block: 512,
            inode_bytes: 2048,
            indirect_bytes: 32768,
        };
        assert!(g.validate().unwrap_err().contains("-i"));
        let g = Geometry {
            block_bytes: 4 << 20,
            subblocks_per_block: 512,
            inode_bytes: 4096,
            indirect_bytes: 4096,
        };
        assert!(g.validate().unwrap_err().contains("-I"));
    }
}
