//! Which OpenSSL clients' requests are followed: the OpenSSL-client uprobes (`ssl_probes.rs`)
//! go on the libssl file a client process maps (python-kubernetes through Python's `ssl`,
//! curl), attached for each client process alone, from when the agent sees it connected until
//! it exits or has held no connection for `probed::LINGER` (at most [`MAX_FOLLOWED`] at once).
//! A libssl is shared by every process of the node that speaks TLS: the kernel puts a
//! process's breakpoints in that process's memory only, so the others run the library
//! untouched (issue 26). `probed.rs` keeps which files are probed.
//! Clients that link OpenSSL statically (node) or use another TLS stack keep the
//! connection-level judgement.
use std::{
    collections::{HashMap, HashSet},
    num::NonZeroU32,
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::{
    probed::{Client, Inspections, ProbedFiles, Runtime, Seen, Visibility},
    programs::Probes,
    uprobes::Links,
};

/// A client's binding probe stays this long after its probes go on...
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

/// A probed libssl file: its probes fire for its client processes alone, each attached on its
/// own (`uprobes::Scope::Process`), so the other processes that map the same file (every
/// process on the node that speaks TLS, or every container of one base image) run it
/// untouched.
pub struct Library {
    /// Its file name ("libssl.so.3").
    name: String,
    /// Each client process followed through it, or why it is not.
    clients: HashMap<u32, Result<Follow, String>>,
}

/// One client process followed through its libssl.
struct Follow {
    /// Its own probes on the library.
    links: Links,
    /// The libc it maps (through its root), where the binding probe goes; None: none found.
    libc: Option<PathBuf>,
    /// The probe that binds its `SSL *`s older than its probes, on its libc's `read` and
    /// `write`: attached while `bind_until` is ahead.
    binding: Option<Links>,
    bind_until: Instant,
}

impl Follow {
    fn sites(&self) -> usize {
        self.links.len() + self.binding.as_ref().map_or(0, Links::len)
    }

    fn detach(self, probes: &mut Probes) {
        if let Some(binding) = self.binding {
            probes.detach_uprobes(binding);
        }
        probes.detach_ssl(self.links);
    }
}

/// Client processes followed through their libssl at once on a node: each has
/// [`SITES`](super::ssl_probes::SITES) uprobes of its own (6 to 9: fewer where the library's
/// internal read and write functions take them, and 2 on its libc while its
/// older connections are bound), so the node's uprobes and the agent's descriptors stay
/// bounded (2,816). A client past it keeps the connection-level judgement and is followed as
/// soon as another goes.
pub const MAX_FOLLOWED: usize = 256;

/// Follows client `pid` through `file`: its binding probe first (its connections are older
/// than its probes: their first SSL calls are bound by their reads and writes), then its own
/// probes. None when the process went away meanwhile, or when [`MAX_FOLLOWED`] clients are
/// followed (tried again on the next reconcile).
fn follow(probes: &Mutex<Probes>, file: &Path, pid: u32, name: &str) -> Option<Result<Follow, String>> {
    let Some(target) = NonZeroU32::new(pid) else {
        return Some(Err("pid 0".into()));
    };
    let libc = libc_of(pid);
    let mut probes = probes.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(why) = probes.ssl_unavailable() {
        return Some(Err(format!(
            "the kernel refused the OpenSSL-client programs: {why}"
        )));
    }
    if probes.ssl_processes() >= MAX_FOLLOWED {
        return None;
    }
    let binding = libc
        .as_ref()
        .and_then(|libc| match probes.attach_ssl_binding(libc, target) {
            Ok(links) => Some(links),
            Err(err) => {
                // Its connections opened after its probes are still followed.
                tracing::warn!(
                    pid,
                    libc = %libc.display(),
                    "this OpenSSL client's connections older than its probes are not followed: {}",
                    crate::error::chain(&err)
                );
                None
            }
        });
    match probes.attach_ssl(file, target) {
        Ok(links) => {
            tracing::info!(pid, library = %file.display(), uprobes = links.len(), "following this OpenSSL client's HTTP/1.1 requests");
            Some(Ok(Follow {
                links,
                libc,
                binding,
                bind_until: Instant::now() + BIND_WINDOW,
            }))
        }
        Err(err) => {
            if let Some(binding) = binding {
                probes.detach_uprobes(binding);
            }
            if !file.exists() {
                return None;
            }
            Some(Err(format!(
                "its {name} could not be probed: {}",
                crate::error::chain(&err)
            )))
        }
    }
}

/// The libc process `pid` maps, through its root: None when it maps none (static) or is gone.
fn libc_of(pid: u32) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    mapped(&maps, "libc.so").map(|path| PathBuf::from(format!("/proc/{pid}/root{}", path.display())))
}

impl Runtime for OpenSsl {
    type Probed = Library;
    type Kernel = Probes;
    const FILE: &'static str = "libssl";
    const PER_PROCESS: bool = true;

    fn file_of(pid: u32) -> std::io::Result<Option<PathBuf>> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        // Through the process's own root: the file its container sees.
        Ok(libssl(&maps).map(|mapped| PathBuf::from(format!("/proc/{pid}/root{}", mapped.display()))))
    }

    fn probe(probes: &Mutex<Probes>, file: &Path, pid: u32) -> Option<Result<Library, String>> {
        let name = file
            .file_name()
            .map_or_else(|| "libssl".into(), |n| n.to_string_lossy().into_owned());
        let followed = match follow(probes, file, pid, &name)? {
            Ok(followed) => followed,
            Err(why) => return Some(Err(why)),
        };
        Some(Ok(Library {
            name,
            clients: HashMap::from([(pid, Ok(followed))]),
        }))
    }

    fn join(probes: &Mutex<Probes>, library: &mut Library, pid: u32) -> bool {
        let full = || {
            probes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .ssl_processes()
                >= MAX_FOLLOWED
        };
        if library.clients.contains_key(&pid) || full() {
            return false;
        }
        // Gone, or no libssl mapped any more: nothing to follow.
        let Ok(Some(file)) = Self::file_of(pid) else {
            return false;
        };
        match follow(probes, &file, pid, &library.name) {
            Some(followed) => {
                let joined = followed.is_ok();
                if let Err(why) = &followed {
                    tracing::info!(pid, "streams not followed for this client: {why}");
                }
                library.clients.insert(pid, followed);
                joined
            }
            None => false,
        }
    }

    fn leave(probes: &Mutex<Probes>, library: &mut Library, pid: u32) {
        if let Some(Ok(followed)) = library.clients.remove(&pid) {
            followed.detach(&mut probes.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }

    fn sites(library: &Library) -> usize {
        library.clients.values().flatten().map(Follow::sites).sum()
    }

    fn unprobe(probes: &mut Probes, library: Library) {
        for followed in library.clients.into_values().flatten() {
            followed.detach(probes);
        }
    }
}

/// The probed libssl files and the client processes followed through them.
#[derive(Default)]
pub struct SslTracer {
    libraries: ProbedFiles<OpenSsl>,
}

impl SslTracer {
    /// Makes the probes follow `clients`: probes libssl files new among them, attaches each
    /// new client's own probes, detaches those of clients gone. Returns what it did with new
    /// libraries.
    pub fn reconcile(
        &mut self,
        probes: &Mutex<Probes>,
        clients: &HashSet<Client>,
        now: Instant,
    ) -> Inspections {
        let done = self.libraries.reconcile(probes, clients, now);
        self.bind_when_needed(probes, now);
        done
    }

    /// Probed libraries, and libraries refused for a bound.
    pub fn counts(&self) -> (usize, usize) {
        self.libraries.counts()
    }

    /// A client's binding probe costs it a trap per `read` and `write`: it is attached for
    /// [`BIND_WINDOW`] after the client's probes go on (its connections are older than its
    /// probes), then only while its calls on unbound `SSL *`s are recent (a client idle during
    /// the window, or one that binds its descriptors another way than `SSL_set_fd`).
    fn bind_when_needed(&mut self, probes: &Mutex<Probes>, now: Instant) {
        let mut followed = self
            .libraries
            .probed_mut()
            .flat_map(|library| library.clients.iter_mut())
            .filter_map(|(pid, f)| Some((*pid, f.as_mut().ok()?)))
            .peekable();
        if followed.peek().is_none() {
            return;
        }
        let mut probes = probes.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = monotonic_ns().saturating_sub(UNBOUND_RECENT.as_nanos() as u64);
        let unbound = probes.ssl_unbound_since(recent);
        for (pid, follow) in followed {
            if unbound.contains(&pid) {
                follow.bind_until = follow.bind_until.max(now + BIND_LINGER);
            }
            let wanted = now < follow.bind_until;
            match (wanted, follow.binding.take(), &follow.libc) {
                (true, None, Some(libc)) => {
                    let Some(target) = NonZeroU32::new(pid) else {
                        continue;
                    };
                    match probes.attach_ssl_binding(libc, target) {
                        Ok(links) => follow.binding = Some(links),
                        Err(err) => {
                            tracing::warn!(
                                pid,
                                "this OpenSSL client's connections older than its probes are not followed: {}",
                                crate::error::chain(&err)
                            );
                            follow.libc = None;
                        }
                    }
                }
                (false, Some(links), _) => probes.detach_uprobes(links),
                (_, binding, _) => follow.binding = binding,
            }
        }
    }

    /// How client `key` is seen, when it maps a libssl; None for other clients.
    pub fn visibility(&self, key: Client) -> Option<Visibility> {
        match self.libraries.seen(key) {
            Seen::Probed(library) => Some(match library.clients.get(&key.0) {
                Some(Ok(_)) => Visibility::Streams {
                    client: format!("OpenSSL HTTP/1.1 client ({})", library.name),
                },
                Some(Err(why)) => Visibility::Connection { why: why.clone() },
                None => Visibility::Connection {
                    why: format!(
                        "not followed yet: its {}'s probes go on for each client process as it is seen, \
                         for at most {MAX_FOLLOWED} on the node (bound)",
                        library.name
                    ),
                },
            }),
            Seen::Unprobed(why) => Some(Visibility::Connection { why: why.to_owned() }),
            Seen::Nothing => None,
        }
    }
}

/// The libssl a process maps, from its `/proc/<pid>/maps`: the path of the first mapping of a
/// file named `libssl.so*` (not deleted).
fn libssl(maps: &str) -> Option<&Path> {
    mapped(maps, "libssl.so")
}

/// The first file mapped whose name starts with `prefix`.
fn mapped<'a>(maps: &'a str, prefix: &str) -> Option<&'a Path> {
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|path| {
            path.is_absolute()
                && path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
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
