//! Network namespaces: identify them by nsfs inode, list the live ones, and run
//! code inside one on a dedicated thread (so the caller's namespace never changes).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Directory where `ip netns add` bind-mounts named namespaces.
const NAMED_NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("stat of netns file {path}", path = .path.display())]
    Stat { path: PathBuf, source: io::Error },
    #[error("opening netns file {path}", path = .path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("setns(CLONE_NEWNET) into {path}", path = .path.display())]
    Setns { path: PathBuf, source: io::Error },
    #[error("spawning a thread to enter netns {path}", path = .path.display())]
    SpawnThread { path: PathBuf, source: io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Inode number of the network namespace that `path` (e.g. `/proc/<pid>/ns/net`
/// or a bind mount under `/run/netns`) refers to; it identifies the namespace.
pub fn netns_inode(path: &Path) -> Result<u64> {
    Ok(stat(path)?.ino())
}

/// Every distinct network namespace that has at least one process or is
/// bind-mounted under `/run/netns`, as `(inode, path that opens it)`, one entry
/// per inode, sorted by inode. Named mounts are preferred as the path because
/// they outlive processes. Entries that vanish or cannot be read are skipped.
pub fn enumerate() -> Vec<(u64, PathBuf)> {
    // All nsfs files share one device; this filters out stale /run/netns files
    // whose bind mount is gone (they are then plain files on tmpfs).
    let nsfs_dev = stat(Path::new("/proc/self/ns/net")).ok().map(|m| m.dev());
    let named = fs::read_dir(NAMED_NETNS_DIR)
        .into_iter()
        .flatten()
        .filter_map(|entry| Some(entry.ok()?.path()));
    let per_process = fs::read_dir("/proc").into_iter().flatten().filter_map(|entry| {
        let pid = entry.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
        Some(pid_netns_path(pid))
    });
    let mut found = BTreeMap::new();
    for path in named.chain(per_process) {
        match stat(&path) {
            Ok(meta) if nsfs_dev.is_none_or(|dev| dev == meta.dev()) => {
                found.entry(meta.ino()).or_insert(path);
            }
            Ok(_) => tracing::debug!(path = %path.display(), "not an nsfs file, skipped"),
            Err(error) => tracing::trace!(%error, "netns skipped"),
        }
    }
    found.into_iter().collect()
}

/// Runs `f` on a short-lived thread that first enters the network namespace
/// opened from `ns_path`, and returns its result. A panic in `f` is propagated.
/// Sockets created by `f` stay in that namespace after the thread exits.
///
/// When `ns_path` is the caller's own namespace, `f` runs right here: entering a namespace
/// takes `CAP_SYS_ADMIN`, and an agent without it still sees its own (the host's) namespace.
pub fn run_in_netns<T: Send, F: FnOnce() -> T + Send>(ns_path: &Path, f: F) -> Result<T> {
    let path = || ns_path.to_path_buf();
    let ns = File::open(ns_path).map_err(|source| Error::Open { path: path(), source })?;
    let same = |a: &fs::Metadata, b: &fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
    if let (Ok(target), Ok(own)) = (ns.metadata(), stat(Path::new("/proc/thread-self/ns/net"))) {
        if same(&target, &own) {
            return Ok(f());
        }
    }
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("netns-enter".into())
            .spawn_scoped(scope, || {
                // SAFETY: `ns` is an open fd for the whole call; setns only changes
                // this dedicated thread's network namespace.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let source = io::Error::last_os_error();
                    return Err(Error::Setns { path: path(), source });
                }
                Ok(f())
            })
            .map_err(|source| Error::SpawnThread { path: path(), source })?;
        thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn pid_netns_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

fn stat(path: &Path) -> Result<fs::Metadata> {
    fs::metadata(path).map_err(|source| Error::Stat {
        path: path.to_path_buf(),
        source,
    })
}

/// A fresh named network namespace (`ip netns add`) with `lo` up, deleted on drop.
#[cfg(test)]
pub(crate) struct TestNetns {
    pub name: String,
    pub path: PathBuf,
}

#[cfg(test)]
impl TestNetns {
    pub fn new() -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "lltest-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ns = TestNetns {
            path: Path::new(NAMED_NETNS_DIR).join(&name),
            name,
        };
        ns.ip(&["netns", "add", &ns.name]);
        ns.ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let status = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("running `ip {}`: {e}", args.join(" ")));
        assert!(status.success(), "`ip {}` failed: {status}", args.join(" "));
    }
}

#[cfg(test)]
impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_netns_is_enumerated() {
        let own = netns_inode(&pid_netns_path(std::process::id())).expect("netns of own pid");
        assert!(
            enumerate().iter().any(|(ino, _)| *ino == own),
            "own netns {own} not enumerated"
        );
    }

    #[test]
    fn missing_path_names_it() {
        let err = netns_inode(Path::new("/nonexistent/ns")).expect_err("stat must fail");
        assert!(err.to_string().contains("/nonexistent/ns"), "{err}");
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn run_in_netns_enters_only_the_helper_thread() {
        let ns = TestNetns::new();
        let target = netns_inode(&ns.path).expect("inode of test netns");
        let own = netns_inode(Path::new("/proc/thread-self/ns/net")).expect("own netns");
        assert_ne!(own, target);
        // /proc/self would name the main thread: the helper must look at itself.
        let inside = run_in_netns(&ns.path, || netns_inode(Path::new("/proc/thread-self/ns/net")))
            .expect("run_in_netns")
            .expect("netns inside helper thread");
        assert_eq!(inside, target);
        assert_eq!(
            netns_inode(Path::new("/proc/thread-self/ns/net")).expect("own netns"),
            own
        );
        let listed = enumerate();
        let entry = listed
            .iter()
            .find(|(ino, _)| *ino == target)
            .expect("test netns enumerated");
        assert_eq!(entry.1, ns.path, "named mount should be the preferred path");
    }
}
