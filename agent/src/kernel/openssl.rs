//! Which OpenSSL clients' requests are followed: the OpenSSL-client uprobes (`ssl_probes.rs`)
//! go on the libssl file every client process maps (python-kubernetes through Python's `ssl`,
//! curl), by device and inode like the Go binaries of `golang.rs`; they come off when no
//! client has mapped the file for [`LINGER`]. Clients that link OpenSSL statically (node) or
//! use another TLS stack keep the connection-level judgement.
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    golang::Visibility,
    programs::Probes,
    ssl_probes::{Links, SyscallLinks},
};

/// Probes stay on a library this long after its last client went away.
const LINGER: Duration = Duration::from_secs(300);

/// A library that could not be probed is tried again after this long.
const RETRY_UNTRACEABLE: Duration = Duration::from_secs(600);

/// A library file, by device and inode (the same file in every container that maps it).
type LibraryId = (u64, u64);

enum Library {
    Traced {
        links: Links,
        /// Its file name ("libssl.so.3").
        name: String,
        unused_since: Option<Instant>,
    },
    Untraceable {
        why: String,
        since: Instant,
    },
}

/// What one client maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mapped {
    Library(LibraryId),
    /// No libssl: not an OpenSSL client (or a static one).
    Nothing,
}

/// The probed libssl files and the clients that map them.
#[derive(Default)]
pub struct SslTracer {
    libraries: HashMap<LibraryId, Library>,
    /// Each client's libssl, by pid and start time (pids are reused).
    clients: HashMap<(u32, u64), Mapped>,
    /// The system-call tracepoints, attached while any library is probed.
    syscalls: Option<SyscallLinks>,
}

impl SslTracer {
    /// Makes the probes follow `clients` (pid, start time): attaches to libssl files new among
    /// them, detaches from files none of them maps any more.
    pub fn reconcile(
        &mut self,
        probes: &std::sync::Mutex<Probes>,
        clients: &HashSet<(u32, u64)>,
        now: Instant,
    ) {
        self.clients.retain(|key, _| clients.contains(key));
        let lock = || probes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let unavailable = lock().ssl_unavailable().map(str::to_owned);
        for &key in clients {
            if self.clients.contains_key(&key) {
                continue;
            }
            let pid = key.0;
            let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
                continue;
            };
            let Some(mapped) = libssl(&maps) else {
                self.clients.insert(key, Mapped::Nothing);
                continue;
            };
            // Through the process's own root: the file its container sees.
            let file = PathBuf::from(format!("/proc/{pid}/root{}", mapped.display()));
            let Ok(meta) = std::fs::metadata(&file) else {
                continue;
            };
            let id = (meta.dev(), meta.ino());
            self.clients.insert(key, Mapped::Library(id));
            let retry = matches!(self.libraries.get(&id), Some(Library::Untraceable { since, .. }) if now.saturating_duration_since(*since) >= RETRY_UNTRACEABLE);
            if self.libraries.contains_key(&id) && !retry {
                continue;
            }
            let name = mapped
                .file_name()
                .map_or_else(|| "libssl".into(), |n| n.to_string_lossy().into_owned());
            let library = match &unavailable {
                Some(why) => Library::Untraceable {
                    why: format!("the kernel refused the OpenSSL-client programs: {why}"),
                    since: now,
                },
                None if self.syscalls.is_none() && !self.bind_syscalls(probes) => Library::Untraceable {
                    why: "the system-call tracepoints that bind its connections could not be attached".into(),
                    since: now,
                },
                None => match lock().attach_ssl(&file) {
                    Ok(links) => {
                        tracing::info!(pid, library = %mapped.display(), uprobes = links.len(), "following this OpenSSL client's HTTP/1.1 requests");
                        Library::Traced {
                            links,
                            name,
                            unused_since: None,
                        }
                    }
                    Err(_) if !file.exists() => {
                        self.clients.remove(&key);
                        continue;
                    }
                    Err(err) => {
                        let why = format!("its {name} could not be probed: {}", crate::error::chain(&err));
                        tracing::info!(pid, "requests not followed for this client: {why}");
                        Library::Untraceable { why, since: now }
                    }
                },
            };
            self.libraries.insert(id, library);
        }
        let used: HashSet<LibraryId> = self
            .clients
            .values()
            .filter_map(|m| match m {
                Mapped::Library(id) => Some(*id),
                Mapped::Nothing => None,
            })
            .collect();
        let mut gone = Vec::new();
        for (id, library) in &mut self.libraries {
            match library {
                Library::Traced { unused_since, .. } => {
                    if used.contains(id) {
                        *unused_since = None;
                    } else if now.saturating_duration_since(*unused_since.get_or_insert(now)) >= LINGER {
                        gone.push(*id);
                    }
                }
                Library::Untraceable { .. } if !used.contains(id) => gone.push(*id),
                Library::Untraceable { .. } => {}
            }
        }
        for id in gone {
            if let Some(Library::Traced { links, .. }) = self.libraries.remove(&id) {
                lock().detach_ssl(links);
                tracing::info!(library = ?id, "no client has mapped this libssl for {}s: its probes are detached", LINGER.as_secs());
            }
        }
        let traced = self
            .libraries
            .values()
            .any(|l| matches!(l, Library::Traced { .. }));
        if !traced {
            if let Some(links) = self.syscalls.take() {
                lock().detach_ssl_syscalls(links);
            }
        }
    }

    /// Attaches the system-call tracepoints; false (logged) when the kernel refuses them.
    fn bind_syscalls(&mut self, probes: &std::sync::Mutex<Probes>) -> bool {
        let attached = probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .attach_ssl_syscalls();
        match attached {
            Ok(links) => {
                self.syscalls = Some(links);
                true
            }
            Err(err) => {
                tracing::warn!(
                    "OpenSSL clients' requests are not followed: {}",
                    crate::error::chain(&err)
                );
                false
            }
        }
    }

    /// How client `key` is seen, when it maps a libssl; None for other clients.
    pub fn visibility(&self, key: (u32, u64)) -> Option<Visibility> {
        let Some(Mapped::Library(id)) = self.clients.get(&key) else {
            return None;
        };
        Some(match self.libraries.get(id)? {
            Library::Traced { name, .. } => Visibility::Streams {
                client: format!("OpenSSL HTTP/1.1 client ({name})"),
            },
            Library::Untraceable { why, .. } => Visibility::Connection { why: why.clone() },
        })
    }
}

/// The libssl a process maps, from its `/proc/<pid>/maps`: the path of the first mapping of a
/// file named `libssl.so*` (not deleted).
fn libssl(maps: &str) -> Option<&Path> {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|path| {
            path.is_absolute()
                && path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libssl.so"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libssl_a_process_maps() {
        let maps = "\
7f1c2a000000-7f1c2a0b0000 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libcrypto.so.3
7f1c2b000000-7f1c2b020000 r--p 00000000 08:01 1240 /usr/lib/x86_64-linux-gnu/libssl.so.3
7f1c2b020000-7f1c2b080000 r-xp 00020000 08:01 1240 /usr/lib/x86_64-linux-gnu/libssl.so.3
7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]
";
        assert_eq!(
            libssl(maps),
            Some(Path::new("/usr/lib/x86_64-linux-gnu/libssl.so.3"))
        );
        let none = "7f1c2a000000-7f1c2a0b0000 r--p 00000000 08:01 1234 /usr/lib/libssl3.so\n55d0-55e0 r-xp 0 08:01 9 /usr/bin/java\n";
        assert_eq!(libssl(none), None, "NSS's libssl3.so is not OpenSSL");
    }
}
