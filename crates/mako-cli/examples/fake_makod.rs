//! A stand-in for `makod` that speaks the control protocol without mounting anything,
//! for trying `mako up`, `status`, `fs mount`, `diag` and `down` where the real daemon
//! or FUSE is not available. Copy it as `makod` next to `mako`.
//!
//! It reads `DIR/cluster.toml`, reports every automount file system as mounted, and
//! answers diagnostics with a few synthetic records.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mako_control::*;

struct Fake {
    data_dir: PathBuf,
    started: Instant,
    mounted: Mutex<Vec<String>>,
    stop: Arc<AtomicBool>,
}

impl ControlHandler for Fake {
    fn handle(&self, request: Request) -> Response {
        let cluster = match ClusterConfig::load(&self.data_dir) {
            Ok(c) => c,
            Err(e) => return Response::error(e.to_string()),
        };
        match request {
            Request::Status => {
                let mounted = self.mounted.lock().unwrap();
                Response::Status(DaemonStatus {
                    node_name: cluster.node_name.clone(),
                    node_id: cluster.node_id,
                    pid: std::process::id(),
                    data_dir: self.data_dir.display().to_string(),
                    uptime_secs: self.started.elapsed().as_secs(),
                    version: "fake".into(),
                    filesystems: cluster
                        .filesystems
                        .iter()
                        .map(|fs| {
                            let disks: Vec<DiskStatusView> = cluster
                                .disks_of(fs)
                                .into_iter()
                                .map(|d| DiskStatusView {
                                    name: d.name.clone(),
                                    path: d.path.display().to_string(),
                                    size_bytes: d.size_bytes,
                                    free_bytes: d.size_bytes / 10 * 9,
                                    pool: d.pool.clone(),
                                    failure_group: d.failure_group,
                                    usage: d.usage.clone(),
                                    status: "ready".into(),
                                })
                                .collect();
                            let total: u64 = disks.iter().map(|d| d.size_bytes).sum();
                            FsStatus {
                                name: fs.name.clone(),
                                mountpoint: fs.mountpoint.display().to_string(),
                                mounted: mounted.contains(&fs.name),
                                block_bytes: 4 << 20,
                                subblock_bytes: 8 << 10,
                                inode_bytes: 4096,
                                total_bytes: total,
                                free_bytes: total / 10 * 9,
                                inodes_used: 3,
                                inodes_max: 1 << 20,
                                pagepool_bytes: 1 << 30,
                                pagepool_used_bytes: 12 << 20,
                                pagepool_dirty_bytes: 1 << 20,
                                read_only: false,
                                mounts: Vec::new(),
                                disks,
                            }
                        })
                        .collect(),
                })
            }
            Request::Mount { fs, .. } => match cluster.filesystem(&fs) {
                Some(def) => {
                    self.mounted.lock().unwrap().push(fs.clone());
                    Response::ok(format!("{fs} mounted on {}", def.mountpoint.display()))
                }
                None => Response::error(format!("no file system `{fs}` in cluster.toml")),
            },
            Request::Unmount { fs, .. } => {
                self.mounted.lock().unwrap().retain(|m| *m != fs);
                Response::ok(format!("{fs} unmounted"))
            }
            Request::Shutdown => {
                self.stop.store(true, Ordering::SeqCst);
                Response::ok("makod shutting down")
            }
            Request::Sync => Response::ok("synced 0 dirty blocks"),
            Request::Fsck { fs, threads } => Response::Fsck(mako_control::FsckView {
                exit_code: 4,
                text: format!(
                    "mako fsck {fs}: check only (-n) with {threads} threads (fake makod)\n"
                ),
                json: format!("{{\"fs_name\":\"{fs}\"}}"),
            }),
            Request::ClearCache { .. } => Response::ok("cache cleared"),
            Request::ConfigSet { name, value, .. } => {
                Response::ok(format!("{name} = {value} applied"))
            }
            Request::DiagIohist { last } => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_micros() as u64;
                Response::Iohist(
                    (0..last.min(5))
                        .map(|i| IoRecordView {
                            start_unix_micros: now - 1000 * i as u64,
                            write: i % 2 == 0,
                            buffer_type: "data".into(),
                            disk: i as u32 % 4,
                            sector: 8192 * i as u64,
                            sectors: 8192,
                            service_ms: 1.5,
                            queue_ms: 0.1,
                            thread: format!("worker-{i}"),
                            ino: Some(100 + i as u64),
                            ok: true,
                        })
                        .collect(),
                )
            }
            Request::DiagWaiters { .. } => Response::Waiters(vec![WaiterView {
                thread: "fuse-3".into(),
                waiting_ms: 12.5,
                what: "token fs1 inode 101 mode wx".into(),
            }]),
            Request::DiagCounters => Response::Counters(vec![LockCounterView {
                name: "pagepool".into(),
                acquisitions: 1000,
                contended: 12,
                wait_total_ms: 3.5,
                wait_max_ms: 0.9,
            }]),
            Request::DiagStats => Response::Stats(StatsView {
                filesystems: vec![FsCountersView {
                    name: "fs1".into(),
                    counters: vec![("reads".into(), 10), ("writes".into(), 20)],
                }],
                disks: vec![DiskCountersView {
                    name: "d0".into(),
                    reads: 10,
                    writes: 20,
                    read_bytes: 40 << 20,
                    write_bytes: 80 << 20,
                    read_ms_avg: 1.2,
                    write_ms_avg: 2.3,
                    errors: 0,
                }],
            }),
            Request::DiagTokens => Response::Tokens(vec![TokenView {
                resource: "fs1 inode 101".into(),
                manager: String::new(),
                holders: vec![format!("{} wx", cluster.node_name)],
            }]),
            Request::DiagConfig => Response::Config(vec![ConfigRowView {
                name: "pagepool".into(),
                value: "1G".into(),
                source: "cluster config".into(),
                default: "4G".into(),
                range: "64M..256G".into(),
                apply: "restart".into(),
            }]),
            Request::ClusterShow
            | Request::ClusterParam { .. }
            | Request::ClusterDeleteDisk { .. }
            | Request::ClusterDeleteFs { .. }
            | Request::ClusterAddNode { .. }
            | Request::ClusterRemoveNode { .. } => {
                Response::error("the fake makod is the whole cluster: no replicated configuration")
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data_dir = match args.iter().position(|a| a == "--data-dir") {
        Some(i) if i + 1 < args.len() => PathBuf::from(&args[i + 1]),
        _ => {
            eprintln!("usage: makod --data-dir DIR");
            std::process::exit(2);
        }
    };
    let cluster = ClusterConfig::load(&data_dir).unwrap_or_else(|e| {
        eprintln!("fake makod: {e}");
        std::process::exit(1);
    });
    let stop = Arc::new(AtomicBool::new(false));
    let fake = Arc::new(Fake {
        data_dir: data_dir.clone(),
        started: Instant::now(),
        mounted: Mutex::new(
            cluster
                .filesystems
                .iter()
                .filter(|f| f.automount)
                .map(|f| f.name.clone())
                .collect(),
        ),
        stop: Arc::clone(&stop),
    });
    eprintln!(
        "fake makod: serving {}",
        DataDir::new(&data_dir).socket_file().display()
    );
    let handle = serve(
        &DataDir::new(&data_dir).socket_file(),
        fake,
        Arc::clone(&stop),
    )
    .unwrap_or_else(|e| {
        eprintln!("fake makod: {e}");
        std::process::exit(1);
    });
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    handle.join().unwrap();
    eprintln!("fake makod: stopped");
}
