//! `DISKSPEC` of `mako fs create -d`: `NAME[:POOL[:FAILUREGROUP[:USAGE]]]`, naming a
//! disk of cluster.toml and optionally overriding its pool, failure group and usage
//! (empty fields keep the disk's own value: `d1::3` sets only the failure group).

use anyhow::{bail, Result};
use mako_control::DISK_USAGES;

/// One parsed `DISKSPEC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSpecArg {
    pub name: String,
    pub pool: Option<String>,
    pub failure_group: Option<i32>,
    /// Canonical usage name (one of `DISK_USAGES`).
    pub usage: Option<String>,
}

/// Reads one `DISKSPEC`.
pub fn parse_disk_spec(text: &str) -> Result<DiskSpecArg> {
    let form = "expected NAME[:POOL[:FAILUREGROUP[:USAGE]]], e.g. d1:system:2:dataAndMetadata";
    let fields: Vec<&str> = text.trim().split(':').collect();
    if fields.len() > 4 {
        bail!("-d {text}: too many `:` fields; {form}");
    }
    let name = fields[0].trim();
    if name.is_empty() {
        bail!("-d {text}: the disk name is missing; {form}");
    }
    if let Err(problem) = mako_control::cluster::validate_name("disk name", name) {
        bail!("-d {text}: {problem}");
    }
    let field = |i: usize| fields.get(i).map(|f| f.trim()).filter(|f| !f.is_empty());
    let pool = match field(1) {
        Some(pool) => {
            if let Err(problem) = mako_control::cluster::validate_name("pool name", pool) {
                bail!("-d {text}: {problem}");
            }
            Some(pool.to_string())
        }
        None => None,
    };
    let failure_group = match field(2) {
        Some(fg) => match fg.parse::<i32>() {
            Ok(n) if n >= 0 => Some(n),
            _ => bail!(
                "-d {text}: failure group `{fg}` must be a whole number from 0 to {}",
                i32::MAX
            ),
        },
        None => None,
    };
    let usage = match field(3) {
        Some(usage) => match DISK_USAGES.iter().find(|u| u.eq_ignore_ascii_case(usage)) {
            Some(canonical) => Some(canonical.to_string()),
            None => bail!(
                "-d {text}: usage `{usage}` is not one of {}",
                DISK_USAGES.join(", ")
            ),
        },
        None => None,
    };
    Ok(DiskSpecArg {
        name: name.to_string(),
        pool,
        failure_group,
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(
            parse_disk_spec("d1").unwrap(),
            DiskSpecArg {
                name: "d1".into(),
                pool: None,
                failure_group: None,
                usage: None
            }
        );
        assert_eq!(
            parse_disk_spec("d1:data:3:dataonly").unwrap(),
            DiskSpecArg {
                name: "d1".into(),
                pool: Some("data".into()),
                failure_group: Some(3),
                usage: Some("dataOnly".into())
            }
        );
        let only_fg = parse_disk_spec("d1::7").unwrap();
        assert_eq!(only_fg.pool, None);
        assert_eq!(only_fg.failure_group, Some(7));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            ("", "the disk name is missing"),
            (":system", "the disk name is missing"),
            ("d1:a:1:dataOnly:x", "too many `:` fields"),
            ("d1:system:x", "failure group `x` must be a whole number"),
            ("d1:system:-1", "failure group `-1`"),
            (
                "d1:system:1:everything",
                "usage `everything` is not one of dataAndMetadata",
            ),
            ("bad name", "disk name `bad name` is not valid"),
            ("d1:sys tem", "pool name `sys tem` is not valid"),
        ];
        for (text, expected) in cases {
            let message = parse_disk_spec(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{text}: {message}");
            assert!(message.starts_with(&format!("-d {text}")), "{message}");
        }
    }
}
