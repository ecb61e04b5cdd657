//! Size parsing and human-readable formatting shared by `perf` and `bench`.
//!
//! Sizes follow gpfsperf's convention: suffixes are binary (`4k` = 4096, `1g` = 2^30),
//! so `-r 16m -n 200g` means the same thing here as in the admins' old scripts.

/// Parses a size such as `47008`, `4k`, `1m`, `16M`, `1g`, `2t`, `4KiB`.
///
/// Returns a message that says what was wrong, because the text comes straight from
/// the command line.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty size; give a number such as 4k, 1m, 47008 or 1g".to_string());
    }
    let lower = trimmed.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (number, suffix) = lower.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "size '{text}' does not start with a number; use e.g. 4k, 1m, 47008, 1g"
        ));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| format!("size '{text}' is too large"))?;
    let shift = match suffix {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => {
            return Err(format!(
                "size '{text}' has an unknown suffix '{suffix}'; use k, m, g, t or p (binary: 1k = 1024)"
            ))
        }
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size '{text}' does not fit in 64 bits"))
}

/// Formats a byte count the way gpfsperf prints `recSize 16M`: the largest binary unit
/// that divides it exactly, otherwise the plain number (`47008`).
pub fn format_size_exact(bytes: u64) -> String {
    const UNITS: [(u32, &str); 5] = [(50, "P"), (40, "T"), (30, "G"), (20, "M"), (10, "K")];
    for (shift, unit) in UNITS {
        let unit_bytes = 1u64 << shift;
        if bytes >= unit_bytes && bytes % unit_bytes == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Formats a byte count approximately with a binary unit (`1.50 GiB`), for totals.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
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
