//! Setup: the root check, the helper programs' paths, keeping test traffic on this machine, and
//! the small things every test needs (unique names, free ports, commands that must succeed,
//! temporary directories).
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread;

/// Paths of the helper programs, set by [`init!`](crate::init!).
static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();

/// What [`init!`](crate::init!) expands to.
pub fn init_with(client: &str, server: &str) {
    require_root();
    let _ = BINS.set((client.into(), server.into()));
}

/// Panics unless the effective user is root; then keeps test traffic on this machine
/// ([`containment`](crate::containment): undone when the suite ends).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "lifeline's integration tests load eBPF programs and create network namespaces and \
         cgroups: run them as root (e.g. `sudo -E cargo test -p lifeline-integration`)"
    );
    crate::containment::contain();
}

pub(crate) fn bins() -> &'static (PathBuf, PathBuf) {
    BINS.get()
        .expect("call lifeline_integration::init!() at the start of the test")
}

/// The agent binary: `$LIFELINE_BIN`, else `<workspace>/target/debug/lifeline`.
pub fn lifeline_bin() -> PathBuf {
    let bin = match std::env::var_os("LIFELINE_BIN") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
            .join("target/debug/lifeline"),
    };
    assert!(
        bin.is_file(),
        "agent binary {} not found: run `cargo build -p lifeline` first (or set LIFELINE_BIN)",
        bin.display()
    );
    bin
}

/// A name unique to this process and call: `<pid>-<counter>`.
pub fn unique() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Where [`free_port`] looks: below the kernel's ephemeral range (32768–60999 by default) and
/// the NodePort range (30000–32767), above every port a real-cluster component is given.
const FREE_PORTS: std::ops::Range<u32> = 20000..30000;

/// A free TCP port (free on every IPv4 address when returned; for a server a test starts,
/// such as the agent's `--listen`). Outside the ephemeral range: a port the kernel handed out
/// for bind(0) could be taken, between this call and the server's bind, by any connection a
/// parallel test opens (an agent failed so: "Address already in use"). Each call of a process
/// takes the next port of [`FREE_PORTS`] from a start of its own, skipping ports in use.
pub fn free_port() -> u16 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        AtomicU32::new(std::process::id().wrapping_mul(7919).wrapping_add(nanos))
    });
    let span = FREE_PORTS.end - FREE_PORTS.start;
    for _ in 0..span {
        let port = (FREE_PORTS.start + next.fetch_add(1, Ordering::Relaxed) % span) as u16;
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port in {FREE_PORTS:?}")
}

/// Runs a command to completion, panicking with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `ip ARGS`, panicking unless it succeeds.
pub(crate) fn ip(args: &[&str]) -> Output {
    run(Command::new("ip").args(args))
}

/// A temporary directory under /tmp, removed on drop unless the test panicked.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!("lltest-{}", unique()));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("(kept {} for inspection)", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}
