//! Which OpenSSL clients' requests are followed: the OpenSSL-client uprobes (`ssl_probes.rs`)
//! go on the libssl file every client process maps (python-kubernetes through Python's `ssl`,
//! curl), for as long as `probed.rs` keeps a file probed. Clients that link OpenSSL
//! statically (node) or use another TLS stack keep the connection-level judgement.
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::{
    probed::{Client, Inspections, ProbedFiles, Runtime, Seen, Visibility},
    programs::Probes,
    ssl_probes::SyscallLinks,
    uprobes::Links,
};

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

/// OpenSSL clients, probed in the libssl they map.
pub struct OpenSsl;

/// A probed libssl file.
pub struct Library {
    links: Links,
    /// Its file name ("libssl.so.3").
    name: String,
}

impl Runtime for OpenSsl {
    type Probed = Library;
    type Kernel = Probes;
    const FILE: &'static str = "libssl";

    fn file_of(pid: u32) -> std::io::Result<Option<PathBuf>> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        // Through the process's own root: the file its container sees.
        Ok(libssl(&maps).map(|mapped| PathBuf::from(format!("/proc/{pid}/root{}", mapped.display()))))
    }

    fn probe(probes: &Mutex<Probes>, file: &Path, pid: u32) -> Option<Result<Library, String>> {
        let name = file
            .file_name()
            .map_or_else(|| "libssl".into(), |n| n.to_string_lossy().into_owned());
        let mut probes = probes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = probes.ssl_unavailable() {
            return Some(Err(format!(
                "the kernel refused the OpenSSL-client programs: {why}"
            )));
        }
        match probes.attach_ssl(file) {
            Ok(links) => {
                tracing::info!(pid, library = %file.display(), uprobes = links.len(), "following this OpenSSL client's HTTP/1.1 requests");
                Some(Ok(Library { links, name }))
            }
            Err(_) if !file.exists() => None,
            Err(err) => Some(Err(format!(
                "its {name} could not be probed: {}",
                crate::error::chain(&err)
            ))),
        }
    }

    fn sites(library: &Library) -> usize {
        library.links.len()
    }

    fn unprobe(probes: &mut Probes, library: Library) {
        probes.detach_uprobes(library.links);
    }
}

/// The probed libssl files, the clients that map them, and the system-call tracepoints that
/// bind connections older than the probes.
#[derive(Default)]
pub struct SslTracer {
    libraries: ProbedFiles<OpenSsl>,
    /// The system-call tracepoints, attached while [`bind_until`](Self::bind_until).
    syscalls: Option<SyscallLinks>,
    /// Until when the system-call tracepoints are wanted.
    bind_until: Option<Instant>,
}

impl SslTracer {
    /// Makes the probes follow `clients`: probes libssl files new among them, detaches from
    /// files none of them maps any more. Returns what it did with new libraries.
    pub fn reconcile(
        &mut self,
        probes: &Mutex<Probes>,
        clients: &HashSet<Client>,
        now: Instant,
    ) -> Inspections {
        let done = self.libraries.reconcile(probes, clients, now);
        if done.probed > 0 {
            // Its clients' connections are older than the probes: bind them.
            self.bind_until = Some(now + BIND_WINDOW);
        }
        self.bind_when_needed(probes, now);
        done
    }

    /// Probed libraries, and libraries refused for a bound.
    pub fn counts(&self) -> (usize, usize) {
        self.libraries.counts()
    }

    /// The system-call tracepoints cost every read and write on the node: they are attached
    /// for [`BIND_WINDOW`] after a library is probed (its clients' connections are older than
    /// the probes), then only while calls on unbound `SSL *`s are recent (a process idle
    /// during the window, or one that binds its descriptors another way than `SSL_set_fd`).
    fn bind_when_needed(&mut self, probes: &Mutex<Probes>, now: Instant) {
        let traced = self.libraries.probed().next().is_some();
        if !traced && self.syscalls.is_none() {
            return;
        }
        let mut probes = probes.lock().unwrap_or_else(PoisonError::into_inner);
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
    pub fn visibility(&self, key: Client) -> Option<Visibility> {
        match self.libraries.seen(key) {
            Seen::Probed(library) => Some(Visibility::Streams {
                client: format!("OpenSSL HTTP/1.1 client ({})", library.name),
            }),
            Seen::Unprobed(why) => Some(Visibility::Connection { why: why.to_owned() }),
            Seen::Nothing => None,
        }
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
