//! Sizes and durations as `perf` and `bench` read and print them.
//!
//! Sizes follow gpfsperf's convention: suffixes are binary (`4k` = 4096, `1g` = 2^30),
//! so `-r 16m -n 200g` means the same thing here as in the admins' old scripts. They are
//! parsed and printed by Mako's one implementation, `mako_config::value`; this module
//! only gives the benchmarks' wording of errors and their two print forms names.

/// Parses a size such as `47008`, `4k`, `1m`, `16M`, `1g`, `2t`, `4KiB`, `1.5g`, with
/// Mako's one size notation (`mako_config::value::parse_size`).
///
/// Returns a message that says what was wrong, because the text comes straight from
/// the command line.
pub fn parse_size(text: &str) -> Result<u64, String> {
    mako_config::value::parse_size(text).map_err(|problem| {
        format!(
            "size '{text}': {problem}; use e.g. 4k, 1m, 47008 or 1g (binary suffixes k, m, g, \
             t, p: 1k = 1024)"
        )
    })
}

/// Formats a byte count the way gpfsperf prints `recSize 16M`: the largest binary unit
/// that divides it exactly, otherwise the plain number (`47008`).
pub fn format_size_exact(bytes: u64) -> String {
    mako_config::value::format_bytes(bytes)
}

/// Formats a byte count approximately with a binary unit (`1.50 GiB`), for totals.
pub fn format_bytes(bytes: u64) -> String {
    mako_config::value::human_bytes(bytes, 2)
}

/// Formats a duration in nanoseconds with a unit that keeps 3–4 significant digits.
pub fn format_nanos(nanos: f64) -> String {
    if nanos < 1_000.0 {
        format!("{nanos:.0} ns")
    } else if nanos < 1_000_000.0 {
        format!("{:.1} us", nanos / 1e3)
    } else if nanos < 1_000_000_000.0 {
        format!("{:.3} ms", nanos / 1e6)
    } else {
        format!("{:.3} s", nanos / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gpfsperf_sizes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("47008"), Ok(47008));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("200g"), Ok(214_748_364_800));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert!(parse_size("").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("4x").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("100000p").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size_exact(16 << 20), "16M");
        assert_eq!(format_size_exact(47008), "47008");
        assert_eq!(format_size_exact(4096), "4K");
        assert_eq!(format_size_exact(0), "0");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
    }
}
