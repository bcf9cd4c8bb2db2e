//! Packages of other Debian releases (bullseye's 5.10 kernel, trixie's 6.12, sid's kubectl,
//! the Go toolchains), fetched without touching the system: a private APT configuration per
//! suite under [`ROOT`], whose entries are the machine's own deb822 `Types: deb` entries with
//! the suite replaced (the same mirror, the same `Signed-By` keyring), then `apt-get download`
//! and `dpkg-deb -x`. Nothing is installed; the machine's own lists stay untouched.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use crate::{run, show, Failed, Result};

/// Where each suite's private APT state and downloads are kept.
pub const ROOT: &str = "/var/tmp/lifeline-debian";
/// Lists older than this are fetched again before a download.
const LISTS_FRESH: Duration = Duration::from_secs(24 * 3600);

/// One Debian suite (`bullseye`, `trixie`, `sid`, ...) reached through a private APT_CONFIG.
pub struct Release {
    suite: String,
    apt: PathBuf,
}

impl Release {
    /// The suite's private configuration, written from the machine's `*.sources`; its lists are
    /// fetched when missing or older than a day.
    pub fn open(suite: &str) -> Result<Release> {
        let apt = Path::new(ROOT).join(suite);
        for sub in [
            "sources.list.d",
            "lists/partial",
            "cache/archives/partial",
            "debs",
        ] {
            let d = apt.join(sub);
            fs::create_dir_all(&d).map_err(|e| Failed(format!("{}: {e}", d.display())))?;
        }
        let parts = Path::new("/etc/apt/sources.list.d");
        let stanzas = from_sources(parts, |text| stanzas(text, "deb", Some(suite)))?;
        let write = |path: PathBuf, text: &str| {
            fs::write(&path, text).map_err(|e| Failed(format!("{}: {e}", path.display())))
        };
        write(apt.join("sources.list.d/lifeline.sources"), &stanzas)?;
        write(apt.join("sources.list"), "")?;
        // An empty dpkg status: what the machine has installed (the image's own kubectl) must
        // not stand as a candidate of this suite.
        write(apt.join("status"), "")?;
        write(
            apt.join("apt.conf"),
            &format!(
                "Dir::Etc::sourcelist \"{a}/sources.list\";\nDir::Etc::sourceparts \"{a}/sources.list.d\";\n\
Dir::State::Lists \"{a}/lists\";\nDir::State::status \"{a}/status\";\nDir::Cache \"{a}/cache\";\nAPT::Sandbox::User \"root\";\n",
                a = apt.display()
            ),
        )?;
        let release = Release {
            suite: suite.to_owned(),
            apt,
        };
        if !release.lists_fresh() {
            run(release.apt("apt-get").args(["update", "-qq"]))?;
            let stamp = release.apt.join("lists/lifeline-updated");
            fs::write(&stamp, "").map_err(|e| Failed(format!("{}: {e}", stamp.display())))?;
        }
        Ok(release)
    }

    fn lists_fresh(&self) -> bool {
        fs::metadata(self.apt.join("lists/lifeline-updated"))
            .and_then(|m| m.modified())
            .is_ok_and(|t| {
                SystemTime::now()
                    .duration_since(t)
                    .is_ok_and(|age| age < LISTS_FRESH)
            })
    }

    /// `program` (apt-get, apt-cache) with this suite's configuration.
    pub fn apt(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("APT_CONFIG", self.apt.join("apt.conf"));
        cmd
    }

    /// What `apt-cache ARGS` prints for this suite.
    pub fn cache(&self, args: &[&str]) -> Result<String> {
        let mut cmd = self.apt("apt-cache");
        cmd.args(args);
        let out = cmd.output().map_err(|e| Failed(format!("{}: {e}", show(&cmd))))?;
        if !out.status.success() {
            return Err(Failed(format!(
                "{} ({}): {}",
                show(&cmd),
                self.suite,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The version `apt-get download PACKAGE` would fetch.
    pub fn candidate(&self, package: &str) -> Result<String> {
        let policy = self.cache(&["policy", package])?;
        policy
            .lines()
            .find_map(|l| l.trim().strip_prefix("Candidate: "))
            .filter(|v| *v != "(none)")
            .map(str::to_owned)
            .ok_or_else(|| Failed(format!("{}: no package {package}", self.suite)))
    }

    /// The `.deb` of `spec` (`NAME` or `NAME=VERSION`), downloaded once and kept.
    pub fn download(&self, spec: &str) -> Result<PathBuf> {
        let (name, version) = match spec.split_once('=') {
            Some((n, v)) => (n.to_owned(), v.to_owned()),
            None => (spec.to_owned(), self.candidate(spec)?),
        };
        let debs = self.apt.join("debs");
        // apt-get names the file NAME_VERSION_ARCH.deb, with an epoch's ':' as "%3a".
        let prefix = format!("{name}_{}_", version.replace(':', "%3a"));
        let kept = |dir: &Path| {
            fs::read_dir(dir).ok().and_then(|entries| {
                entries.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
                    p.file_name()
                        .and_then(|f| f.to_str())
                        .is_some_and(|f| f.starts_with(&prefix) && f.ends_with(".deb"))
                })
            })
        };
        if let Some(deb) = kept(&debs) {
            return Ok(deb);
        }
        run(self
            .apt("apt-get")
            .current_dir(&debs)
            .args(["download", "-q", &format!("{name}={version}")]))?;
        kept(&debs).ok_or_else(|| {
            Failed(format!(
                "apt-get download {name}={version} ({}) left no {prefix}*.deb in {}",
                self.suite,
                debs.display()
            ))
        })
    }

    /// Downloads `spec` and extracts it into `into` (`dpkg-deb -x`: not installed).
    pub fn extract(&self, spec: &str, into: &Path) -> Result<PathBuf> {
        let deb = self.download(spec)?;
        fs::create_dir_all(into).map_err(|e| Failed(format!("{}: {e}", into.display())))?;
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(into))?;
        Ok(deb)
    }
}

/// The stanzas `rewrite` makes of each deb822 file (`*.sources`) in `parts`, in name order;
/// fails when they make none.
pub fn from_sources(parts: &Path, rewrite: impl Fn(&str) -> String) -> Result<String> {
    let mut files: Vec<PathBuf> = fs::read_dir(parts)
        .map_err(|e| Failed(format!("{}: {e}", parts.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sources"))
        .collect();
    files.sort();
    let mut out = String::new();
    for file in &files {
        let text = fs::read_to_string(file).map_err(|e| Failed(format!("{}: {e}", file.display())))?;
        out.push_str(&rewrite(&text));
    }
    if out.is_empty() {
        return Err(Failed(format!(
            "no `Types: deb` entry of the machine's Debian release in {}/*.sources ({} files) to derive entries from",
            parts.display(),
            files.len()
        )));
    }
    Ok(out)
}

/// The enabled deb822 stanzas of `text` whose `Types` include `deb`, as stanzas of `types`
/// with the same other fields (comments dropped). With `suite`, only the stanzas that list a
/// plain release codename (not `-security`, `-updates`) are kept, with `Suites` set to it.
pub fn stanzas(text: &str, types: &str, suite: Option<&str>) -> String {
    let mut out = String::new();
    for stanza in text.split("\n\n") {
        let fields: Vec<(&str, &str, &str)> = stanza
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let (k, v) = l.split_once(':').unwrap_or((l, ""));
                (l, k.trim(), v.trim())
            })
            .collect();
        let field = |name: &str| {
            fields
                .iter()
                .find(|(_, k, _)| k.eq_ignore_ascii_case(name))
                .map(|f| f.2)
        };
        let is_deb = field("Types").is_some_and(|v| v.split_whitespace().any(|t| t == "deb"));
        let enabled = !field("Enabled").is_some_and(|v| v.eq_ignore_ascii_case("no"));
        let plain = field("Suites").is_some_and(|v| v.split_whitespace().any(|s| !s.contains('-')));
        if !is_deb || !enabled || (suite.is_some() && !plain) {
            continue;
        }
        out.push_str(&format!("Types: {types}\n"));
        for (line, key, _) in fields {
            if key.eq_ignore_ascii_case("Types") {
                continue;
            }
            match suite {
                Some(s) if key.eq_ignore_ascii_case("Suites") => out.push_str(&format!("Suites: {s}\n")),
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::stanzas;

    const MACHINE: &str =
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
Types: deb-src\nURIs: http://x\nSuites: s\nComponents: main\n\n\
Types: deb\nEnabled: no\nURIs: http://off\nSuites: s\nComponents: main\n";

    #[test]
    fn source_entries_keep_every_deb_entry() {
        assert_eq!(
            stanzas(MACHINE, "deb-src", None),
            "Types: deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
Types: deb-src\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        );
        assert_eq!(stanzas("# nothing\n", "deb-src", None), "");
    }

    #[test]
    fn another_suite_takes_the_release_entries_only() {
        assert_eq!(
            stanzas(MACHINE, "deb", Some("bullseye")),
            "Types: deb\nURIs: http://mirror.example/debian\nSuites: bullseye\n\
Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        );
    }
}
