//! copy_file_range is done inside makod: a sparse source copies as a sparse destination
//! (the kernel's own fallback, a read and write through the page cache, would write the
//! holes out as zeros), with the same bytes.

use mako_tests::cluster::{require_fuse, ClusterOptions, TestCluster};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

#[test]
fn copy_file_range_keeps_holes() {
    if !require_fuse("copy_file_range_keeps_holes") {
        return;
    }
    let cl = TestCluster::up(ClusterOptions {
        disks: 2,
        disk_size: "2G".into(),
        pagepool: "128M".into(),
        block_size: None,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    const MIB: u64 = 1 << 20;
    let src_path = cl.mount().join("sparse");
    let src = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&src_path)
        .unwrap();
    src.write_all_at(b"head", 0).unwrap();
    src.write_all_at(b"tail", 40 * MIB).unwrap();
    src.sync_all().unwrap();
    let dst = std::fs::File::create(cl.mount().join("copy")).unwrap();
    let len = 40 * MIB + 4;
    let mut done = 0u64;
    while done < len {
        let (mut i, mut o) = (done as i64, done as i64);
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut i,
                dst.as_raw_fd(),
                &mut o,
                (len - done) as usize,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        done += n as u64;
    }
    dst.sync_all().unwrap();
    let got = std::fs::read(cl.mount().join("copy")).unwrap();
    let want = std::fs::read(&src_path).unwrap();
    assert!(got == want, "the copy has the source's bytes");
    let (s, d) = (src.metadata().unwrap(), dst.metadata().unwrap());
    use std::os::unix::fs::MetadataExt;
    assert!(
        d.blocks() <= s.blocks(),
        "the copy allocates no more than the sparse source: {} blocks of 512 bytes, source {}",
        d.blocks(),
        s.blocks()
    );
    assert!(
        d.blocks() * 512 < 16 * MIB,
        "holes stayed holes ({} bytes allocated for 40 MiB)",
        d.blocks() * 512
    );
    let data_after_head = unsafe { libc::lseek(dst.as_raw_fd(), 8 * MIB as i64, libc::SEEK_DATA) };
    assert!(
        data_after_head as u64 >= 36 * MIB,
        "SEEK_DATA past the head finds only the tail, at {data_after_head}"
    );
}
