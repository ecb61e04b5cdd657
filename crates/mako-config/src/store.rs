//! `ConfigStore`: the parameters an administrator has set, persisted as a flat TOML file
//! (`pagepool = "4G"`) at a path chosen by the caller, such as the cluster config
//! directory.
//!
//! Only explicitly set parameters are stored; everything else is its default. Loading
//! validates every entry and reports the file and line of the first bad one. Saving is
//! atomic: a complete new file is written beside the old one, synced, renamed over it,
//! and the directory is synced, so a crash leaves either the old or the new file.
//! Comments and key order are not preserved; the file is rewritten in registry order.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use toml::Spanned;

use crate::error::{ConfigError, Result};
use crate::relations;
use crate::spec::{lookup, suggest, Apply, ParamId, ParamSpec, PARAMS};
use crate::value::{parse_for, Value};

/// What a successful `set` changed and when it takes effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetOutcome {
    /// The parameter.
    pub param: ParamId,
    /// The new stored value.
    pub value: Value,
    /// The previously stored value, `None` if the parameter was at its default.
    pub previous: Option<Value>,
    /// Whether a running daemon can take the change with `-i`.
    pub apply: Apply,
}

impl SetOutcome {
    /// True when the change reaches running daemons only after `mako down`/`mako up`.
    pub fn needs_restart(&self) -> bool {
        self.apply == Apply::Restart
    }
}

/// The explicitly set parameters of one config file.
#[derive(Clone, Debug)]
pub struct ConfigStore {
    path: PathBuf,
    values: BTreeMap<ParamId, Value>,
}

impl ConfigStore {
    /// An empty store that will be saved at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ConfigStore {
            path: path.into(),
            values: BTreeMap::new(),
        }
    }

    /// Loads the store from `path`; a missing file is an error.
    pub fn load(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let text = fs::read_to_string(&path).map_err(|cause| ConfigError::Io {
            action: "read",
            path: path.clone(),
            cause,
        })?;
        Self::from_toml(path, &text)
    }

    /// Loads the store from `path`, or returns an empty store if the file does not exist
    /// yet (a new cluster has set nothing).
    pub fn load_or_default(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        match fs::read_to_string(&path) {
            Ok(text) => Self::from_toml(path, &text),
            Err(cause) if cause.kind() == std::io::ErrorKind::NotFound => Ok(Self::new(path)),
            Err(cause) => Err(ConfigError::Io {
                action: "read",
                path,
                cause,
            }),
        }
    }

    /// Parses the text of a config file; `path` is used in errors and for saving.
    pub fn from_toml(path: impl Into<PathBuf>, text: &str) -> Result<Self> {
        let path = path.into();
        let table: BTreeMap<Spanned<String>, Spanned<toml::Value>> =
            toml::from_str(text).map_err(|e| ConfigError::FileSyntax {
                path: path.clone(),
                detail: e.to_string().trim_end().to_string(),
            })?;
        let mut values = BTreeMap::new();
        // Report problems in file order, not key order.
        let mut entries: Vec<_> = table.iter().collect();
        entries.sort_by_key(|(key, _)| key.span().start);
        for (key, value) in entries {
            let line = line_of(text, key.span().start);
            let Some(spec) = crate::spec::find(key.get_ref()) else {
                return Err(ConfigError::FileUnknownKey {
                    path,
                    line,
                    key: key.get_ref().clone(),
                    suggestion: suggest(key.get_ref()),
                });
            };
            let value_line = line_of(text, value.span().start);
            let value_text = match value.get_ref() {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => (if *b { "yes" } else { "no" }).to_string(),
                other => {
                    return Err(ConfigError::FileNotScalar {
                        path,
                        line: value_line,
                        key: spec.name.to_string(),
                        found: match other {
                            toml::Value::Array(_) => "an array",
                            toml::Value::Table(_) => "a table",
                            _ => "a date",
                        },
                    })
                }
            };
            let parsed = parse_for(spec, &value_text).map_err(|error| ConfigError::FileValue {
                path: path.clone(),
                line: value_line,
                error: Box::new(error),
            })?;
            values.insert(spec.id, parsed);
        }
        Ok(ConfigStore { path, values })
    }

    /// The file this store loads from and saves to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Validates `text` for parameter `name` and stores it (in memory; call `save`).
    pub fn set(&mut self, name: &str, text: &str) -> Result<SetOutcome> {
        let spec = lookup(name)?;
        let value = parse_for(spec, text)?;
        let previous = self.values.insert(spec.id, value.clone());
        Ok(SetOutcome {
            param: spec.id,
            value,
            previous,
            apply: spec.apply,
        })
    }

    /// Returns parameter `name` to its default; gives the value it had, if any.
    pub fn unset(&mut self, name: &str) -> Result<Option<Value>> {
        let spec = lookup(name)?;
        Ok(self.values.remove(&spec.id))
    }

    /// The stored value of `name`, `None` if it is at its default.
    pub fn get(&self, name: &str) -> Result<Option<&Value>> {
        let spec = lookup(name)?;
        Ok(self.values.get(&spec.id))
    }

    /// The stored value of a parameter, `None` if it is at its default.
    pub fn get_id(&self, id: ParamId) -> Option<&Value> {
        self.values.get(&id)
    }

    /// Every stored parameter with its value, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static ParamSpec, &Value)> {
        self.values.iter().map(|(id, value)| (id.spec(), value))
    }

    /// True if nothing is set.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Checks the relations between parameters for the stored values over the defaults.
    pub fn check(&self) -> Result<()> {
        let values: Vec<Value> = PARAMS
            .iter()
            .map(|p| {
                self.values
                    .get(&p.id)
                    .cloned()
                    .unwrap_or_else(|| p.default.value())
            })
            .collect();
        relations::check(&values)
    }

    /// The file's text: a header comment, then one `name = value` line per stored
    /// parameter in registry order. Whole numbers are TOML integers; everything else is
    /// a string in the administrator's notation.
    pub fn to_toml(&self) -> String {
        let mut text = String::from(
            "# Mako configuration, written by `mako config set`.\n\
             # One `name = value` per line; `mako config explain NAME` describes each.\n",
        );
        for (spec, value) in self.iter() {
            let rendered = match value {
                Value::Int(i) => i.to_string(),
                other => toml::Value::String(other.to_string()).to_string(),
            };
            text.push_str(&format!("{} = {rendered}\n", spec.name));
        }
        text
    }

    /// Atomically replaces the file with the current contents, after checking the
    /// relations between parameters.
    ///
    /// 1. Write the whole file to a temporary name in the same directory.
    /// 2. fsync the temporary file, so its contents are durable before it has the name.
    /// 3. Rename it over the old file (atomic within a directory).
    /// 4. fsync the directory, so the rename itself is durable.
    pub fn save(&self) -> Result<()> {
        self.check()?;
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |cause| ConfigError::Io {
                action,
                path,
                cause,
            }
        };
        let directory = match self.path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = self.path.file_name().ok_or_else(|| ConfigError::Io {
            action: "name",
            path: self.path.clone(),
            cause: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the path has no file name",
            ),
        })?;
        let mut temporary_name = std::ffi::OsString::from(".");
        temporary_name.push(file_name);
        temporary_name.push(format!(".tmp.{}", std::process::id()));
        let temporary = directory.join(temporary_name);

        let written = (|| {
            // 1.
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&temporary)
                .map_err(io("create the temporary", &temporary))?;
            file.write_all(self.to_toml().as_bytes())
                .map_err(io("write the temporary", &temporary))?;
            // 2.
            file.sync_all()
                .map_err(io("fsync the temporary", &temporary))?;
            // 3.
            fs::rename(&temporary, &self.path).map_err(io("rename the new", &self.path))
        })();
        if written.is_err() {
            // Best effort: do not leave a half-written temporary behind.
            let _ = fs::remove_file(&temporary);
            return written;
        }
        // 4.
        File::open(&directory)
            .and_then(|dir| dir.sync_all())
            .map_err(io("fsync the directory of the", &self.path))
    }
}

/// 1-based line number of a byte offset in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{GIB, MIB};

    fn temp_path() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mako.toml");
        (dir, path)
    }

    #[test]
    fn round_trip_through_a_file() {
        let (_dir, path) = temp_path();
        let mut store = ConfigStore::new(&path);
        let outcome = store.set("pagepool", "1.5G").unwrap();
        assert!(outcome.needs_restart());
        assert_eq!(outcome.previous, None);
        let outcome = store.set("maxMBpS", "4096").unwrap();
        assert!(!outcome.needs_restart());
        store.set("avoidDirFragments", "on").unwrap();
        store.set("allToAllConnection", "REMOTE").unwrap();
        store.set("failureDetectionTime", "60").unwrap();
        store.set("prometheusAddress", "0.0.0.0").unwrap();
        store.set("prefetchAggressivenessRead", "-1").unwrap();
        store.save().unwrap();

        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("pagepool = \"1536M\"\n"), "{text}");
        assert!(text.contains("maxMBpS = 4096\n"), "{text}");
        assert!(text.contains("failureDetectionTime = \"1m\"\n"), "{text}");

        let loaded = ConfigStore::load(&path).unwrap();
        assert_eq!(
            loaded.get("pagepool").unwrap(),
            Some(&Value::Bytes(1536 * MIB))
        );
        assert_eq!(
            loaded.get("avoidDirFragments").unwrap(),
            Some(&Value::Bool(true))
        );
        assert_eq!(
            loaded.get("allToAllConnection").unwrap(),
            Some(&Value::Text("remote".into()))
        );
        assert_eq!(loaded.get("workerThreads").unwrap(), None);
        assert_eq!(loaded.values, store.values);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn unset_returns_to_default_and_overwrite_reports_previous() {
        let (_dir, path) = temp_path();
        let mut store = ConfigStore::new(&path);
        store.set("pagepool", "2G").unwrap();
        let outcome = store.set("pagepool", "3G").unwrap();
        assert_eq!(outcome.previous, Some(Value::Bytes(2 * GIB)));
        assert_eq!(
            store.unset("pagepool").unwrap(),
            Some(Value::Bytes(3 * GIB))
        );
        assert_eq!(store.unset("pagepool").unwrap(), None);
        assert!(store.is_empty());
        store.save().unwrap();
        assert!(ConfigStore::load(&path).unwrap().is_empty());
    }

    #[test]
    fn set_refuses_bad_values_and_names() {
        let mut store = ConfigStore::new("unused.toml");
        let message = store.set("pagepool", "1K").unwrap_err().to_string();
        assert!(message.contains("allowed 64M..256G"), "{message}");
        let message = store
            .set("maxfilestocache", "1000")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("did you mean `maxFilesToCache`?"),
            "{message}"
        );
        assert!(store.unset("nope").is_err());
        assert!(store.get("nope").is_err());
        assert!(store.is_empty());
    }

    #[test]
    fn save_refuses_inconsistent_values() {
        let (_dir, path) = temp_path();
        let mut store = ConfigStore::new(&path);
        store.set("prefetchPartitions", "64").unwrap();
        let message = store.save().unwrap_err().to_string();
        assert!(
            message.contains("prefetchPartitions (64) must be at most"),
            "{message}"
        );
        assert!(!path.exists());
    }

    #[test]
    fn missing_file() {
        let (_dir, path) = temp_path();
        let message = ConfigStore::load(&path).unwrap_err().to_string();
        assert!(message.starts_with("cannot read config file"), "{message}");
        assert!(message.contains("mako.toml"), "{message}");
        assert!(ConfigStore::load_or_default(&path).unwrap().is_empty());
    }

    #[test]
    fn unknown_key_names_file_line_and_suggestion() {
        let text = "# comment\npagepool = \"4G\"\n\nmaxFileToCache = 100\n";
        let message = ConfigStore::from_toml("/etc/mako/mako.toml", text)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "/etc/mako/mako.toml:4: unknown configuration parameter `maxFileToCache` \
             (did you mean `maxFilesToCache`?); fix the name or remove the line"
        );
    }

    #[test]
    fn bad_value_names_file_line_and_range() {
        let text = "pagepool = \"4G\"\nworkerThreads = 0\n";
        let message = ConfigStore::from_toml("c.toml", text)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "c.toml:2: workerThreads: 0 is below the minimum 1 (allowed 1..8192)"
        );
    }

    #[test]
    fn corrupted_files_are_errors_not_panics() {
        let cases = [
            "pagepool = ",
            "pagepool = \"4G\"\npagepool = \"8G\"\n",
            "[section]\npagepool = \"4G\"\n",
            "pagepool = [1, 2]\n",
            "pagepool = 1979-05-27\n",
            "\u{0}\u{1}binary",
            "pagepool = \"4G",
            "= 3",
            "pagepool = true\n",
        ];
        for text in cases {
            let error = ConfigStore::from_toml("bad.toml", text).unwrap_err();
            let message = error.to_string();
            assert!(message.contains("bad.toml"), "{text:?}: {message}");
        }
        let message = ConfigStore::from_toml("bad.toml", "[section]\nx = 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("bad.toml:1: unknown configuration parameter `section`"),
            "{message}"
        );
        let message = ConfigStore::from_toml("bad.toml", "pagepool = [1]\n")
            .unwrap_err()
            .to_string();
        assert!(message.contains("found an array"), "{message}");
    }

    #[test]
    fn scalar_forms_are_accepted() {
        let text =
            "avoidDirFragments = true\nmaxFilesToCache = \"128K\"\nfailureDetectionTime = 60\n\
                    pagepool = 1073741824\n";
        let store = ConfigStore::from_toml("ok.toml", text).unwrap();
        assert_eq!(
            store.get_id(ParamId::AvoidDirFragments),
            Some(&Value::Bool(true))
        );
        assert_eq!(
            store.get_id(ParamId::MaxFilesToCache),
            Some(&Value::Int(131_072))
        );
        assert_eq!(
            store.get_id(ParamId::FailureDetectionTime),
            Some(&Value::Millis(60_000))
        );
        assert_eq!(store.get_id(ParamId::Pagepool), Some(&Value::Bytes(GIB)));
    }

    #[test]
    fn save_into_a_missing_directory_is_an_error() {
        let (_dir, path) = temp_path();
        let store = ConfigStore::new(path.join("no/such/dir/mako.toml"));
        let message = store.save().unwrap_err().to_string();
        assert!(
            message.starts_with("cannot create the temporary config file"),
            "{message}"
        );
    }
}
