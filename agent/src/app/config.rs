//! The config file (YAML, SPEC.md) and its merge with the command line. Unknown keys and bad
//! values are errors that name the key (with line and column) and the reason. An empty file is
//! an error too (`{}` is the file with every default): a ConfigMap key emptied by mistake must
//! not silently drop every configured endpoint and receiver. [`Watch`] notices when the file
//! changes, for a reload without SIGHUP.
use std::{
    net::SocketAddr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use lifeline_common::MAX_ENDPOINTS;

use serde::Deserialize;

use crate::{
    act::alerts::receivers::{Receiver, UrlTarget},
    act::remediate::{self, RemediationMode},
    endpoint::{self, Endpoint, EndpointSet, Source},
    health::judge::Select,
    health::Thresholds,
};

pub const DEFAULT_LISTEN: &str = "0.0.0.0:9477";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is empty (write `{{}}` for a file with every default)")]
    Empty { path: PathBuf },
    /// `KEY: reason at line L, column C` (see [`from_yaml`]).
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: {source}")]
    Endpoint { path: PathBuf, source: endpoint::Error },
    #[error("config file {path}: {key}: {reason}")]
    Invalid {
        path: PathBuf,
        key: String,
        reason: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The file as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub endpoints: Vec<String>,
    pub listen: Option<SocketAddr>,
    #[serde(default)]
    pub thresholds: ThresholdsFile,
    #[serde(default)]
    pub select: Select,
    #[serde(default)]
    pub receivers: Vec<Receiver>,
    #[serde(default)]
    pub remediation: Remediation,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ThresholdsFile {
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub disconnect_grace: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub stale_after: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub silence_floor: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub silence_max: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub blackhole_after: Option<Duration>,
    pub connect_failures: Option<u32>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub connect_window: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub min_client_age: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub outage_after: Option<Duration>,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub watch_grace: Option<Duration>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Remediation {
    #[serde(default)]
    pub mode: RemediationMode,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(
        default = "default_cooldown",
        deserialize_with = "crate::times::required_duration"
    )]
    pub cooldown: Duration,
    #[serde(default = "default_budget")]
    pub budget_per_hour: u32,
}

impl Remediation {
    /// The settings in force: this section, with `--dry-run` (`dry_run_flag`) forcing a dry
    /// run.
    pub fn settings(&self, dry_run_flag: bool) -> remediate::Settings {
        remediate::Settings {
            mode: self.mode,
            dry_run: self.dry_run || dry_run_flag,
            cooldown: self.cooldown,
            budget_per_hour: self.budget_per_hour,
        }
    }
}

impl Default for Remediation {
    fn default() -> Self {
        Self {
            mode: RemediationMode::None,
            dry_run: false,
            cooldown: default_cooldown(),
            budget_per_hour: default_budget(),
        }
    }
}

fn default_cooldown() -> Duration {
    Duration::from_secs(600)
}

fn default_budget() -> u32 {
    3
}

/// `text` as a `T`, or one line naming the key (a dotted path, as `thresholds.stale_after`)
/// and the reason, with the line and column: `KEY: reason at line L, column C`. serde-saphyr
/// gives the reason and where; serde_path_to_error, the key.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> std::result::Result<T, String> {
    let mut options = serde_saphyr::Options::default();
    // The source excerpt under the message spans several lines; a log line is one.
    options.with_snippet = false;
    let mut key = None;
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|err| {
            key = Some(err.path().to_string());
            err.into_inner()
        })
    })
    .map_err(|err| match key.filter(|k| k != ".") {
        Some(key) => format!("{key}: {err}"),
        None => err.to_string(),
    })
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let blank = |line: &str| {
            let line = line.trim();
            line.is_empty() || line.starts_with('#') || line == "---" || line == "..."
        };
        if text.lines().all(blank) {
            return Err(Error::Empty { path: path.into() });
        }
        let file: ConfigFile = from_yaml(text).map_err(|message| Error::Parse {
            path: path.into(),
            message,
        })?;
        file.validate(path)?;
        Ok(file)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let invalid = |key: &str, reason: &str| Error::Invalid {
            path: path.into(),
            key: key.into(),
            reason: reason.into(),
        };
        let t = &self.thresholds;
        for (key, value) in [
            ("thresholds.disconnect_grace", t.disconnect_grace),
            ("thresholds.stale_after", t.stale_after),
            ("thresholds.silence_floor", t.silence_floor),
            ("thresholds.silence_max", t.silence_max),
            ("thresholds.blackhole_after", t.blackhole_after),
            ("thresholds.connect_window", t.connect_window),
            ("thresholds.outage_after", t.outage_after),
            ("thresholds.watch_grace", t.watch_grace),
        ] {
            if value == Some(Duration::ZERO) {
                return Err(invalid(key, "must be longer than 0s"));
            }
        }
        if t.connect_failures == Some(0) {
            return Err(invalid("thresholds.connect_failures", "must be at least 1"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, r) in self.receivers.iter().enumerate() {
            let key = format!("receivers[{i}]");
            if !names.insert(r.name.as_str()) {
                return Err(invalid(&key, &format!("duplicate receiver name {:?}", r.name)));
            }
            let target = match (&r.alertmanager, &r.webhook) {
                (Some(t), None) | (None, Some(t)) => t,
                _ => return Err(invalid(&key, "needs exactly one of alertmanager or webhook")),
            };
            check_url(&target.url).map_err(|reason| invalid(&format!("{key}.url"), &reason))?;
            let kind = if r.alertmanager.is_some() {
                "alertmanager"
            } else {
                "webhook"
            };
            check_target(target)
                .map_err(|(what, reason)| invalid(&format!("{key}.{kind}.{what}"), &reason))?;
        }
        let endpoints = self.endpoint_list(path)?;
        if endpoints.len() > MAX_ENDPOINTS as usize {
            return Err(invalid(
                "endpoints",
                &format!(
                    "{} endpoints (after resolving names); the kernel map holds at most {MAX_ENDPOINTS}",
                    endpoints.len()
                ),
            ));
        }
        Ok(())
    }

    /// The file's endpoints, parsed (names resolved).
    pub fn endpoint_list(&self, path: &Path) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        for text in &self.endpoints {
            out.extend(Endpoint::parse_all(text).map_err(|source| Error::Endpoint {
                path: path.into(),
                source,
            })?);
        }
        Ok(out)
    }

    /// Thresholds in force: `overrides` (flags) over the file over the defaults.
    pub fn thresholds(&self, overrides: &ThresholdsFile) -> Thresholds {
        let d = Thresholds::default();
        let t = ThresholdsFile {
            disconnect_grace: overrides.disconnect_grace.or(self.thresholds.disconnect_grace),
            stale_after: overrides.stale_after.or(self.thresholds.stale_after),
            silence_floor: overrides.silence_floor.or(self.thresholds.silence_floor),
            silence_max: overrides.silence_max.or(self.thresholds.silence_max),
            blackhole_after: overrides.blackhole_after.or(self.thresholds.blackhole_after),
            connect_failures: overrides.connect_failures.or(self.thresholds.connect_failures),
            connect_window: overrides.connect_window.or(self.thresholds.connect_window),
            min_client_age: overrides.min_client_age.or(self.thresholds.min_client_age),
            outage_after: overrides.outage_after.or(self.thresholds.outage_after),
            watch_grace: overrides.watch_grace.or(self.thresholds.watch_grace),
        };
        Thresholds {
            disconnect_grace: t.disconnect_grace.unwrap_or(d.disconnect_grace),
            stale_after: t.stale_after.unwrap_or(d.stale_after),
            silence_floor: t.silence_floor.unwrap_or(d.silence_floor),
            silence_max: t.silence_max.unwrap_or(d.silence_max),
            blackhole_after: t.blackhole_after.unwrap_or(d.blackhole_after),
            connect_failures: t.connect_failures.unwrap_or(d.connect_failures),
            connect_window: t.connect_window.unwrap_or(d.connect_window),
            min_client_age: t.min_client_age.unwrap_or(d.min_client_age),
            outage_after: t.outage_after.unwrap_or(d.outage_after),
            watch_grace: t.watch_grace.unwrap_or(d.watch_grace),
        }
    }
}

/// Only http(s) URLs with a host (messages show the URL redacted).
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    let shown = crate::host::redact::redact(url);
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{shown:?} is not an http:// or https:// URL"))?;
    if rest.split('/').next().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host"));
    }
    Ok(())
}

/// A receiver's TLS and authentication keys: `(key, reason)` of the first problem.
fn check_target(target: &UrlTarget) -> std::result::Result<(), (&'static str, String)> {
    let https = target.url.starts_with("https://");
    if target.tls_config.is_some() && !https {
        return Err((
            "tls_config",
            format!("only for https:// URLs, not {:?}", target.url),
        ));
    }
    if let Some(auth) = &target.authorization {
        if auth.kind != "Bearer" {
            return Err((
                "authorization.type",
                format!("{:?}: only Bearer is supported", auth.kind),
            ));
        }
        if target.basic_auth.is_some() {
            return Err((
                "authorization",
                "give authorization or basic_auth, not both".into(),
            ));
        }
    }
    if target.basic_auth.as_ref().is_some_and(|b| b.username.is_empty()) {
        return Err(("basic_auth.username", "must not be empty".into()));
    }
    Ok(())
}

/// The endpoint set in force: flags ∪ file (∪ discovery, later).
pub fn endpoint_set(flags: &[Endpoint], file: &[Endpoint]) -> EndpointSet {
    let mut set = EndpointSet::default();
    for e in flags {
        set.insert(*e, Source::Flag);
    }
    for e in file {
        set.insert(*e, Source::Config);
    }
    set
}

/// How often [`Watch`] looks at the config file.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Notices when the config file changes, without inotify: a Kubernetes ConfigMap volume swaps
/// a `..data` symlink (the file's path resolves to a new inode), an editor rewrites or renames,
/// `kubectl cp` writes in place. Each [`Watch::poll`] compares the resolved file's identity,
/// size and times; only when they differ is the file read, and only a different content counts
/// as a change (a `touch` does not reload).
#[derive(Debug)]
pub struct Watch {
    path: PathBuf,
    stamp: Option<Stamp>,
    content: Option<Vec<u8>>,
}

/// What `stat` says about the file the path resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

impl Watch {
    /// Starts watching `path` as it is now.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            stamp: Stamp::of(path),
            content: std::fs::read(path).ok(),
        }
    }

    /// True when the file's content differs from the last poll's (or it became readable or
    /// unreadable): time to reload.
    pub fn poll(&mut self) -> bool {
        let stamp = Stamp::of(&self.path);
        if stamp == self.stamp && stamp.is_some() {
            return false;
        }
        self.stamp = stamp;
        let content = std::fs::read(&self.path).ok();
        if content == self.content {
            return false;
        }
        self.content = content;
        true
    }
}

#[cfg(test)]
mod tests;
