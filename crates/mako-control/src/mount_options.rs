//! Mount options as `mount -o`, `/etc/fstab` and `mako fs mount -o` give them, parsed
//! once here for the mount helper, the CLI and makod.
//!
//! Mako takes the standard options a local Linux file system takes: `ro`/`rw`,
//! `remount`, `noatime`/`relatime`/`strictatime` (and `atime`, which is `relatime`, as
//! the kernel treats it), `nosuid`/`suid`, `nodev`/`dev`, `noexec`/`exec`, plus the
//! options mount(8) itself consumes or passes on without meaning to the file system
//! (`defaults`, `auto`, `noauto`, `nofail`, `_netdev`, `user`, `nouser`, `users`,
//! `owner`, `group`, `async`, `x-…`, `comment=…`), and the FUSE options makod sets
//! itself, which mount(8) passes back with a remount (`user_id=`, `allow_other`, …). Anything else is an error that names
//! the option, and nothing is mounted.

use serde::{Deserialize, Serialize};
use std::fmt;

/// When reads update a file's atime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AtimeOption {
    /// Only when atime is not after mtime/ctime or is a day old (Linux's default).
    #[default]
    Relatime,
    /// At every read.
    Strictatime,
    /// Never.
    Noatime,
}

/// The options of one mount point.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountOptions {
    pub read_only: bool,
    pub atime: AtimeOption,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

/// What a `-o` list asks for: a new mount with these options, or a change of the
/// options of an existing mount (`remount`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountRequestOptions {
    pub options: MountOptions,
    pub remount: bool,
    /// The options the list named, for a remount: only those change. Kept as the
    /// canonical words (`ro`, `noexec`, …) in the order given.
    pub named: Vec<String>,
}

/// Options mount(8) consumes itself or that carry no meaning for Mako.
fn ignored(word: &str) -> bool {
    matches!(
        word,
        "defaults"
            | "auto"
            | "noauto"
            | "nofail"
            | "_netdev"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "async"
            | "nodiratime"
            | "diratime"
            | "lazytime"
            | "nolazytime"
    ) || word.starts_with("x-")
        || word.starts_with("comment=")
        || fuse_own(word)
}

/// The FUSE kernel options makod sets itself at every mount. mount(8) reads them back
/// from the mount table and passes them to the helper with a remount
/// (`ro,nosuid,remount,user_id=0,group_id=0,default_permissions,allow_other,max_read=…`),
/// so they are accepted and left to makod.
fn fuse_own(word: &str) -> bool {
    matches!(word, "default_permissions" | "allow_other")
        || [
            "user_id=",
            "group_id=",
            "max_read=",
            "rootmode=",
            "blksize=",
        ]
        .iter()
        .any(|p| word.starts_with(p))
}

impl MountOptions {
    /// Applies one option word; false if it is not a mount option of Mako's.
    fn apply(&mut self, word: &str) -> bool {
        match word {
            "ro" => self.read_only = true,
            "rw" => self.read_only = false,
            "atime" | "relatime" | "norelatime" | "nostrictatime" => {
                self.atime = AtimeOption::Relatime
            }
            "strictatime" => self.atime = AtimeOption::Strictatime,
            "noatime" => self.atime = AtimeOption::Noatime,
            "nosuid" => self.nosuid = true,
            "suid" => self.nosuid = false,
            "nodev" => self.nodev = true,
            "dev" => self.nodev = false,
            "noexec" => self.noexec = true,
            "exec" => self.noexec = false,
            _ => return false,
        }
        true
    }

    /// Parses a `-o` list for a new mount (no `remount`).
    pub fn parse(list: &str) -> Result<MountOptions, String> {
        let r = MountRequestOptions::parse(list, &MountOptions::default())?;
        if r.remount {
            return Err(
                "`remount` changes the options of a mount that exists: use `mount -o remount,…` \
                 on its mount point"
                    .to_string(),
            );
        }
        Ok(r.options)
    }
}

impl MountRequestOptions {
    /// Parses a `-o` list (comma-separated). A remount starts from `current`, the
    /// options of the mount it changes; a new mount from the defaults.
    pub fn parse(list: &str, current: &MountOptions) -> Result<MountRequestOptions, String> {
        let words: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .collect();
        let remount = words.contains(&"remount");
        let mut options = if remount {
            current.clone()
        } else {
            MountOptions::default()
        };
        let mut named = Vec::new();
        let mut unknown = Vec::new();
        for w in words {
            if w == "remount" || ignored(w) {
                continue;
            }
            if options.apply(w) {
                named.push(w.to_string());
            } else {
                unknown.push(w);
            }
        }
        if !unknown.is_empty() {
            return Err(format!(
                "unknown mount option{} {} in `{list}`: Mako takes ro, rw, remount, noatime, \
                 relatime, strictatime, atime, nosuid, suid, nodev, dev, noexec, exec (and \
                 defaults, auto, noauto, nofail, _netdev, x-* from fstab); nothing was mounted",
                if unknown.len() > 1 { "s" } else { "" },
                unknown.join(", ")
            ));
        }
        Ok(MountRequestOptions {
            options,
            remount,
            named,
        })
    }
}

impl fmt::Display for MountOptions {
    /// The canonical list, as `mako status` shows it and mountinfo would: `rw,relatime`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.read_only { "ro" } else { "rw" })?;
        if self.nosuid {
            f.write_str(",nosuid")?;
        }
        if self.nodev {
            f.write_str(",nodev")?;
        }
        if self.noexec {
            f.write_str(",noexec")?;
        }
        f.write_str(match self.atime {
            AtimeOption::Relatime => ",relatime",
            AtimeOption::Strictatime => ",strictatime",
            AtimeOption::Noatime => ",noatime",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_options_parse_and_print() {
        let o = MountOptions::parse("ro,noatime,nosuid,nodev,noexec").unwrap();
        assert_eq!(o.to_string(), "ro,nosuid,nodev,noexec,noatime");
        let o = MountOptions::parse("defaults,_netdev,x-systemd.automount,strictatime").unwrap();
        assert_eq!(o.to_string(), "rw,strictatime");
        assert_eq!(MountOptions::parse("").unwrap(), MountOptions::default());
        assert!(!MountOptions::parse("ro,rw").unwrap().read_only);
    }

    #[test]
    fn unknown_options_are_named() {
        let e = MountOptions::parse("rw,bogus,sync").unwrap_err();
        assert!(e.contains("bogus, sync"), "{e}");
        assert!(e.contains("nothing was mounted"), "{e}");
        assert!(MountOptions::parse("remount,ro").is_err());
    }

    #[test]
    fn remount_changes_only_what_it_names() {
        let current = MountOptions::parse("noexec,noatime").unwrap();
        let r = MountRequestOptions::parse(
            "ro,nosuid,remount,user_id=0,group_id=0,default_permissions,allow_other,max_read=1048576",
            &current,
        )
        .unwrap();
        assert_eq!(r.options.to_string(), "ro,nosuid,noexec,noatime");
        let r = MountRequestOptions::parse("remount,ro", &current).unwrap();
        assert!(r.remount);
        assert_eq!(r.options.to_string(), "ro,noexec,noatime");
        let back = MountRequestOptions::parse("remount,rw", &r.options).unwrap();
        assert_eq!(back.options.to_string(), "rw,noexec,noatime");
    }
}
