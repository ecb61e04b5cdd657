//! `mako`: the administration command of a Mako cluster (the `mm*` commands of
//! IBM Storage Scale folded into one tool): start and stop the node, create and show
//! file systems and disks, change configuration, read diagnostics, run benchmarks.
//!
//! Every command works on one data directory (`--data-dir`, default from
//! `mako_control::default_data_dir`) holding `cluster.toml`, `config.toml`, the disks
//! of `mako up`, `makod.log`, `makod.pid` and the control socket `makod.sock`.
//! Started as `mount.fuse.mako` (`mako install-helper`), it is the mount helper of
//! mount(8) (`mount_helper`).

mod cli;
mod cluster_cmd;
mod config_cmd;
mod daemon;
mod diag;
mod diskspec;
mod fs_cmd;
mod fsck_cmd;
mod mount_helper;
mod nodes_cmd;
mod status;
mod table;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Benchmarks re-execute this binary as their worker processes.
    if let Some(code) = mako_bench::maybe_run_worker() {
        return ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1));
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Linked as /sbin/mount.fuse.mako, this program is the mount helper of mount(8).
    if args
        .first()
        .is_some_and(|a| mount_helper::invoked_as_helper(a))
    {
        let rest: Vec<String> = args
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return mount_helper::run(&rest);
    }
    // gpfsperf's single-dash options (`-th 16`) only mean something to `mako perf`.
    let args = if args.iter().any(|a| a == "perf") {
        mako_bench::normalize_args(args)
    } else {
        args
    };
    // fsck's usage errors exit 16, as e2fsck's do; every other command keeps clap's 2.
    let is_fsck = args.iter().skip(1).any(|a| a == "fsck");
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) if is_fsck && error.use_stderr() => {
            let _ = error.print();
            return ExitCode::from(mako_fsck::EXIT_USAGE as u8);
        }
        Err(error) => error.exit(),
    };
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("mako: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
