//! Which clients' streams are followed: the Go-client uprobes (`uprobes.rs`) go on the binary
//! of every client process that is a Go program (Go 1.17 or later: arguments in registers),
//! found in it by `host::gobin`; they come off when no client has run the binary for
//! [`LINGER`]. A
//! process that is not a client pays nothing, and every other client keeps the
//! connection-level judgement, with the reason in the API.
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    programs::Probes,
    uprobes::{Links, Sites},
};
use crate::host::gobin;

/// Functions probed, by the names Go's runtime gives them. The HTTP/2 transport is either the
/// copy bundled in `net/http` or `golang.org/x/net/http2` (module builds), vendored under an
/// import path prefix in GOPATH-style builds such as Kubernetes' own.
const TLS_WRITE: &str = "crypto/tls.(*Conn).Write";
const TLS_READ: &str = "crypto/tls.(*Conn).Read";
const WRITE_HEADER: [&str; 3] = [
    "net/http.(*http2ClientConn).writeHeader",
    "golang.org/x/net/http2.(*ClientConn).writeHeader",
    "k8s.io/kubernetes/vendor/golang.org/x/net/http2.(*ClientConn).writeHeader",
];
const READ_FRAME_HEADER: [&str; 3] = [
    "net/http.http2readFrameHeader",
    "golang.org/x/net/http2.readFrameHeader",
    "k8s.io/kubernetes/vendor/golang.org/x/net/http2.readFrameHeader",
];

/// Probes stay on a binary this long after its last client went away: tools that run again
/// and again (a `kubectl` in a script) are followed from their first request.
const LINGER: Duration = Duration::from_secs(300);

/// A binary that could not be traced is looked at again after this long (it may be replaced
/// on disk by a newer one, under the same inode only if it is the same file).
const RETRY_UNTRACEABLE: Duration = Duration::from_secs(600);

/// How a client is seen (SPEC "Streams": `visibility`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visibility {
    /// Its streams are followed: its binary (or TLS library) is probed; `client` says which
    /// kind of client it is ("Go HTTP/2 client (go1.23.4)").
    Streams { client: String },
    /// Only its connections: why.
    Connection { why: String },
}

impl Visibility {
    pub fn as_str(&self) -> &'static str {
        match self {
            Visibility::Streams { .. } => "streams",
            Visibility::Connection { .. } => "connection",
        }
    }
}

/// A binary, by device and inode (the same file in every container that runs it).
type BinaryId = (u64, u64);

enum Binary {
    Traced {
        links: Links,
        go_version: String,
        sites: usize,
        /// When the last client running it went away (None while one runs it).
        unused_since: Option<Instant>,
    },
    Untraceable {
        why: String,
        since: Instant,
    },
}

/// The probed binaries and the clients that run them.
#[derive(Default)]
pub struct GoTracer {
    binaries: HashMap<BinaryId, Binary>,
    /// Each client's binary, by pid and start time (pids are reused).
    clients: HashMap<(u32, u64), BinaryId>,
}

impl GoTracer {
    /// Makes the probes follow `clients` (their pids): attaches to binaries new among them,
    /// detaches from binaries none of them runs any more.
    pub fn reconcile(
        &mut self,
        probes: &std::sync::Mutex<Probes>,
        clients: &HashSet<(u32, u64)>,
        now: Instant,
    ) {
        self.clients.retain(|key, _| clients.contains(key));
        let unavailable = probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .go_unavailable()
            .map(str::to_owned);
        for &key in clients {
            if self.clients.contains_key(&key) {
                continue;
            }
            let pid = key.0;
            let exe = PathBuf::from(format!("/proc/{pid}/exe"));
            let Ok(meta) = std::fs::metadata(&exe) else {
                continue;
            };
            let id = (meta.dev(), meta.ino());
            self.clients.insert(key, id);
            let retry = matches!(self.binaries.get(&id), Some(Binary::Untraceable { since, .. }) if now.saturating_duration_since(*since) >= RETRY_UNTRACEABLE);
            if self.binaries.contains_key(&id) && !retry {
                continue;
            }
            if let Some(why) = &unavailable {
                self.binaries.insert(
                    id,
                    Binary::Untraceable {
                        why: format!("the kernel refused the Go-client programs: {why}"),
                        since: now,
                    },
                );
                continue;
            }
            match trace(probes, &exe, pid, now) {
                Some(binary) => {
                    if matches!(binary, Binary::Traced { .. }) {
                        self.binaries.insert(id, binary);
                        tracing::info!(
                            binaries = self.traced(),
                            uprobes = self.sites(),
                            "Go binaries probed"
                        );
                    } else {
                        self.binaries.insert(id, binary);
                    }
                }
                // The process went away while its binary was read: the next client that runs
                // it brings it back.
                None => {
                    self.clients.remove(&key);
                }
            }
        }
        let used: HashSet<BinaryId> = self.clients.values().copied().collect();
        let mut gone = Vec::new();
        for (id, binary) in &mut self.binaries {
            if let Binary::Traced { unused_since, .. } = binary {
                if used.contains(id) {
                    *unused_since = None;
                } else if now.saturating_duration_since(*unused_since.get_or_insert(now)) >= LINGER {
                    gone.push(*id);
                }
            } else if !used.contains(id) {
                gone.push(*id);
            }
        }
        for id in gone {
            if let Some(Binary::Traced { links, .. }) = self.binaries.remove(&id) {
                probes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .detach_go(links);
                tracing::info!(binary = ?id, "no client has run this Go binary for {}s: its probes are detached", LINGER.as_secs());
            }
        }
    }

    /// How client `key` (pid, start time) is seen.
    pub fn visibility(&self, key: (u32, u64)) -> Visibility {
        let binary = self.clients.get(&key).and_then(|id| self.binaries.get(id));
        match binary {
            Some(Binary::Traced { go_version, .. }) => Visibility::Streams {
                client: format!("Go HTTP/2 client ({go_version})"),
            },
            Some(Binary::Untraceable { why, .. }) => Visibility::Connection { why: why.clone() },
            None => Visibility::Connection {
                why: "its binary has not been looked at yet".into(),
            },
        }
    }

    /// Probed binaries and their sites (for logs and the bench).
    pub fn traced(&self) -> usize {
        self.binaries
            .values()
            .filter(|b| matches!(b, Binary::Traced { .. }))
            .count()
    }

    /// Attached uprobes in all.
    pub fn sites(&self) -> usize {
        self.binaries
            .values()
            .map(|b| match b {
                Binary::Traced { sites, .. } => *sites,
                Binary::Untraceable { .. } => 0,
            })
            .sum()
    }
}

/// Reads the binary of `pid` and attaches the probes to it; None when the process went away
/// meanwhile (nothing is concluded about its binary).
fn trace(probes: &std::sync::Mutex<Probes>, exe: &std::path::Path, pid: u32, now: Instant) -> Option<Binary> {
    let gone = || !exe.exists();
    let untraceable = |why: String| {
        tracing::info!(pid, "streams not followed for this client: {why}");
        Some(Binary::Untraceable { why, since: now })
    };
    let mut wanted = vec![TLS_WRITE, TLS_READ];
    wanted.extend(WRITE_HEADER);
    wanted.extend(READ_FRAME_HEADER);
    let inspection = match gobin::inspect(exe, &wanted) {
        Ok(i) => i,
        Err(_) if gone() => return None,
        Err(err) => {
            let why = match &err.problem {
                gobin::Problem::NotGo(_) | gobin::Problem::NotElf => "not a Go program".to_string(),
                _ => format!("its binary could not be read: {err}"),
            };
            return untraceable(why);
        }
    };
    if !register_abi(&inspection.go_version) {
        return untraceable(format!(
            "built with {}: Go 1.17 or later is needed (arguments in registers)",
            inspection.go_version
        ));
    }
    let find = |names: &[&str]| -> Vec<&gobin::Function> {
        inspection
            .functions
            .iter()
            .filter(|f| names.contains(&f.name.as_str()))
            .collect()
    };
    let sites = Sites {
        write_header: find(&WRITE_HEADER).iter().map(|f| f.entry_offset).collect(),
        tls_write: find(&[TLS_WRITE]).iter().map(|f| f.entry_offset).collect(),
        tls_read: find(&[TLS_READ]).iter().map(|f| f.entry_offset).collect(),
        frame_header_returns: find(&READ_FRAME_HEADER)
            .iter()
            .flat_map(|f| f.returns.iter().copied())
            .collect(),
    };
    if sites.tls_write.is_empty() || sites.tls_read.is_empty() {
        return untraceable(format!("{} does not use crypto/tls", inspection.go_version));
    }
    if sites.write_header.is_empty() || sites.frame_header_returns.is_empty() {
        return untraceable(format!(
            "{}: no HTTP/2 client functions found (an HTTP/1.1-only client)",
            inspection.go_version
        ));
    }
    let count = sites.count();
    let attached = probes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .attach_go(exe, &sites);
    match attached {
        Ok(links) => {
            tracing::info!(
                pid,
                go = %inspection.go_version,
                sites = count,
                "following this Go client's HTTP/2 streams"
            );
            Some(Binary::Traced {
                links,
                go_version: inspection.go_version,
                sites: count,
                unused_since: None,
            })
        }
        Err(_) if gone() => None,
        Err(err) => untraceable(format!(
            "its probes could not be attached: {}",
            crate::error::chain(&err)
        )),
    }
}

/// Go 1.17 and later pass arguments in registers on amd64.
fn register_abi(version: &str) -> bool {
    let Some(rest) = version.strip_prefix("go1.") else {
        // "devel +abc": a development build, newer than any release.
        return version.starts_with("devel");
    };
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    minor.parse::<u32>().is_ok_and(|m| m >= 17)
}

#[cfg(test)]
mod tests {
    use super::register_abi;

    #[test]
    fn go_versions_with_arguments_in_registers() {
        assert!(register_abi("go1.19.8"));
        assert!(register_abi("go1.17"));
        assert!(register_abi("go1.22rc1"));
        assert!(register_abi("devel go1.23-abc"));
        assert!(!register_abi("go1.16.15"));
        assert!(!register_abi("go1.9"));
        assert!(!register_abi("gccgo"));
    }
}
