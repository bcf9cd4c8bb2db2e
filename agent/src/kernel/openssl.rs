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

/// The system-call tracepoints stay this long after a library is probed...
const BIND_WINDOW: Duration = Duration::from_secs(60);
/// ... and this long after a call on an unbound `SSL *` that began within [`UNBOUND_RECENT`].
const BIND_LINGER: Duration = Duration::from_secs(10);
const UNBOUND_RECENT: Duration = Duration::from_secs(3);

/// CLOCK_MONOTONIC in nanoseconds, the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

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
    /// The system-call tracepoints, attached while [`bind_until`](Self::bind_until).
    syscalls: Option<SyscallLinks>,
    /// Until when the system-call tracepoints are wanted.
    bind_until: Option<Instant>,
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
                None => match lock().attach_ssl(&file) {
                    Ok(links) => {
                        // Its clients' connections are older than the probes: bind them.
                        self.bind_until = Some(now + BIND_WINDOW);
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
        self.bind_when_needed(probes, now);
    }

    /// The system-call tracepoints cost every read and write on the node: they are attached
    /// for [`BIND_WINDOW`] after a library is probed (its clients' connections are older than
    /// the probes), then only while calls on unbound `SSL *`s are recent (a process idle
    /// during the window, or one that binds its descriptors another way than `SSL_set_fd`).
    fn bind_when_needed(&mut self, probes: &std::sync::Mutex<Probes>, now: Instant) {
        let mut probes = probes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let traced = self
            .libraries
            .values()
            .any(|l| matches!(l, Library::Traced { .. }));
        let recent = monotonic_ns().saturating_sub(UNBOUND_RECENT.as_nanos() as u64);
        if traced && probes.ssl_unbound_since(recent) {
            self.bind_until = self.bind_until.max(Some(now + BIND_LINGER));
        }
        let wanted = traced && self.bind_until.is_some_and(|until| now < until);
        match (wanted, self.syscalls.take()) {
            (true, None) => match probes.attach_ssl_syscalls() {
                Ok(links) => {
                    tracing::debug!("binding OpenSSL connections older than their probes");
                    self.syscalls = Some(links);
                }
                Err(err) => {
                    // Connections bound by SSL_set_fd after the probes are still followed.
                    tracing::warn!(
                        "OpenSSL connections older than their probes are not followed: {}",
                        crate::error::chain(&err)
                    );
                    self.bind_until = None;
                }
            },
            (false, Some(links)) => probes.detach_ssl_syscalls(links),
            (_, links) => self.syscalls = links,
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
