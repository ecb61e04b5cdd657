//! Reading sizes and counts from the command line (errors name the flag) and printing
//! sizes, durations and times for people.

use anyhow::{bail, Result};

/// Reads a size like `8G`, `512M`, `64K`, `1.5G` or `4096` given to `flag`.
pub fn parse_size_flag(flag: &str, text: &str) -> Result<u64> {
    match mako_config::value::parse_size(text) {
        Ok(bytes) => Ok(bytes),
        Err(problem) => bail!(
            "{flag} {text}: cannot read a size ({problem}); use a number with an optional \
             suffix K, M, G or T, like 8G, 512M or 64K"
        ),
    }
}

/// Reads a count like `1000000` or `1M` (binary suffixes) given to `flag`.
pub fn parse_count_flag(flag: &str, text: &str) -> Result<u64> {
    match mako_config::value::parse_whole(text) {
        Ok(n) if n >= 0 => Ok(n.unsigned_abs()),
        Ok(_) => bail!("{flag} {text}: must not be negative"),
        Err(problem) => {
            bail!("{flag} {text}: cannot read a number ({problem}); use e.g. 1000000 or 1M")
        }
    }
}

/// `4.0 GiB`, `512 B`, `1.5 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Compact exact size for flags and tables: `4M`, `8K`, `1536M`, `4097`.
pub fn short_bytes(bytes: u64) -> String {
    mako_config::value::format_bytes(bytes)
}

/// `3d 4h`, `1h 02m`, `5m 07s`, `42s`.
pub fn human_duration(secs: u64) -> String {
    let (days, hours, minutes, seconds) =
        (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {minutes:02}m")
    } else if minutes > 0 {
        format!("{minutes}m {seconds:02}s")
    } else {
        format!("{seconds}s")
    }
}

/// Percentage of `part` in `whole`, rounded up so that any use shows as at least 1%.
pub fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        0
    } else {
        ((part as u128 * 100).div_ceil(whole as u128)) as u64
    }
}

/// Local wall-clock time of a Unix time in microseconds: `2024-05-01 13:04:05.123456`
/// when `with_date`, else `13:04:05.123456`.
pub fn local_time_micros(unix_micros: u64, with_date: bool) -> String {
    let secs = (unix_micros / 1_000_000) as libc::time_t;
    let micros = unix_micros % 1_000_000;
    // SAFETY: `tm` is plain data; localtime_r writes it and we read it only on success.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if !ok {
        return format!("{unix_micros}us");
    }
    let time = format!(
        "{:02}:{:02}:{:02}.{micros:06}",
        tm.tm_hour, tm.tm_min, tm.tm_sec
    );
    if with_date {
        format!(
            "{:04}-{:02}-{:02} {time}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday
        )
    } else {
        time
    }
}

/// Local date and time of a Unix time in seconds: `2024-05-01 13:04:05 CEST`.
pub fn local_date_time(unix_secs: i64) -> String {
    let secs = unix_secs as libc::time_t;
    // SAFETY: as in `local_time_micros`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if !ok {
        return format!("@{unix_secs}");
    }
    let zone = if tm.tm_zone.is_null() {
        String::new()
    } else {
        // SAFETY: localtime_r points tm_zone at a static NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(tm.tm_zone) };
        format!(" {}", name.to_string_lossy())
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}{zone}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_flag("--disk-size", "8G").unwrap(), 8 << 30);
        assert_eq!(parse_size_flag("-B", "64K").unwrap(), 64 << 10);
        let message = parse_size_flag("--disk-size", "8Q")
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("--disk-size 8Q: cannot read a size"),
            "{message}"
        );
        let message = parse_size_flag("--pagepool", "lots")
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("--pagepool lots:"), "{message}");
        assert_eq!(parse_count_flag("--inodes", "1M").unwrap(), 1 << 20);
        assert!(parse_count_flag("--inodes", "-5")
            .unwrap_err()
            .to_string()
            .starts_with("--inodes -5"));
    }

    #[test]
    fn human_forms() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(4 << 30), "4.0 GiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_duration(3725), "1h 02m");
        assert_eq!(human_duration(42), "42s");
        assert_eq!(human_duration(90_000), "1d 1h");
        assert_eq!(percent(1, 1000), 1);
        assert_eq!(percent(0, 0), 0);
        assert_eq!(percent(50, 100), 50);
    }
}
