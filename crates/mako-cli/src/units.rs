//! Reading sizes and counts from the command line (errors name the flag) and printing
//! sizes, durations and times for people.

use anyhow::{bail, Result};
use jiff::tz::TimeZone;

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

/// `4.0 GiB`, `512 B`, `1.5 MiB` (Mako's one size printer, `mako_config::value`).
pub fn human_bytes(bytes: u64) -> String {
    mako_config::value::human_bytes(bytes, 1)
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
    local_time_micros_in(unix_micros, with_date, &TimeZone::system())
}

fn local_time_micros_in(unix_micros: u64, with_date: bool, zone: &TimeZone) -> String {
    let micros = unix_micros % 1_000_000;
    let Some(time) = zoned(i64::try_from(unix_micros / 1_000_000).ok(), zone) else {
        return format!("{unix_micros}us");
    };
    let format = if with_date {
        "%Y-%m-%d %H:%M:%S"
    } else {
        "%H:%M:%S"
    };
    format!("{}.{micros:06}", time.strftime(format))
}

/// Local date and time of a Unix time in seconds: `2024-05-01 13:04:05 CEST`.
pub fn local_date_time(unix_secs: i64) -> String {
    local_date_time_in(unix_secs, &TimeZone::system())
}

fn local_date_time_in(unix_secs: i64, zone: &TimeZone) -> String {
    match zoned(Some(unix_secs), zone) {
        Some(time) => time.strftime("%Y-%m-%d %H:%M:%S %Z").to_string(),
        None => format!("@{unix_secs}"),
    }
}

/// The time `unix_secs` in `zone` (the system's: `TZ`, else `/etc/localtime`, as the C
/// library reads them); `None` outside the range of dates jiff represents.
fn zoned(unix_secs: Option<i64>, zone: &TimeZone) -> Option<jiff::ZonedDateTime> {
    let instant = jiff::Timestamp::from_second(unix_secs?).ok()?;
    Some(instant.to_zoned_datetime(zone.clone()))
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

    /// Local times as the C library's `localtime_r` printed them before the switch to
    /// jiff (recorded with `TZ=… date -d @… '+%Y-%m-%d %H:%M:%S %Z'`, which uses it).
    #[test]
    fn local_times_as_localtime_r_printed_them() {
        let cases = [
            ("UTC", 0, "1970-01-01 00:00:00 UTC"),
            ("UTC", 1714561445, "2024-05-01 11:04:05 UTC"),
            ("Europe/Berlin", 0, "1970-01-01 01:00:00 CET"),
            ("Europe/Berlin", 1714561445, "2024-05-01 13:04:05 CEST"),
            ("Europe/Berlin", 1700000000, "2023-11-14 23:13:20 CET"),
            ("Europe/Berlin", 1711846800, "2024-03-31 03:00:00 CEST"),
            ("America/New_York", 0, "1969-12-31 19:00:00 EST"),
            ("America/New_York", 1711846800, "2024-03-30 21:00:00 EDT"),
            ("Asia/Kolkata", 1700000000, "2023-11-15 03:43:20 IST"),
            (
                "Australia/Lord_Howe",
                1714561445,
                "2024-05-01 21:34:05 +1030",
            ),
            ("Australia/Lord_Howe", 1700000000, "2023-11-15 09:13:20 +11"),
        ];
        for (name, unix, expected) in cases {
            let zone = TimeZone::get(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(local_date_time_in(unix, &zone), expected, "{name} {unix}");
        }
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        assert_eq!(
            local_time_micros_in(1_714_561_445_000_042, true, &berlin),
            "2024-05-01 13:04:05.000042"
        );
        assert_eq!(
            local_time_micros_in(1_714_561_445_123_456, false, &berlin),
            "13:04:05.123456"
        );
    }

    /// In the zone of this machine (and of this process's `TZ`), the same text as the
    /// C library's `date`.
    #[test]
    fn local_time_matches_the_c_library_here() {
        for unix in [0i64, 1_714_561_445, 1_700_000_000, 2_000_000_000] {
            let out = std::process::Command::new("date")
                .arg("-d")
                .arg(format!("@{unix}"))
                .arg("+%Y-%m-%d %H:%M:%S %Z")
                .output()
                .expect("date(1) is part of coreutils");
            assert!(out.status.success());
            let expected = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!(local_date_time(unix), expected, "{unix}");
        }
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
