//! Setup: the root check, the helper programs' paths, keeping test traffic on this machine, and
//! the small things every test needs (unique names, free ports, commands that must succeed,
//! temporary directories).
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
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

/// Panics unless the effective user is root; then keeps test traffic on this machine.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "lifeline's integration tests load eBPF programs and create network namespaces and \
         cgroups: run them as root (e.g. `sudo -E cargo test -p lifeline-integration`)"
    );
    contain_test_traffic();
}

/// The address ranges the suites give their namespaces. The agent probes every endpoint it
/// watches from the host's namespace; where the host has no route of its own to a test
/// namespace, that probe must fail here rather than leave the machine by the default route.
pub const TEST_RANGES: [&str; 4] = ["10.250.0.0/16", "10.251.0.0/16", "10.252.0.0/16", "fd00:250::/32"];

/// Keeps test traffic on this machine (once per process): blackhole routes for [`TEST_RANGES`]
/// (more specific routes a test adds, like a topology's link to the host, still win), and a
/// REJECT for any 10.0.0.0/8 packet that would leave by the default route's interface without
/// having been translated — a ClusterIP (10.96.0.0/12) that kube-proxy translates to a local
/// address passes, one probed while no kube-proxy runs does not leave the machine.
pub fn contain_test_traffic() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for range in TEST_RANGES {
            let family = if range.contains(':') { "-6" } else { "-4" };
            run(Command::new("ip").args([family, "route", "replace", "blackhole", range]));
        }
        let routes = run(Command::new("ip").args(["-4", "route", "show", "default"]));
        let text = String::from_utf8_lossy(&routes.stdout).into_owned();
        let dev = text
            .split_whitespace()
            .skip_while(|w| *w != "dev")
            .nth(1)
            .map(str::to_owned);
        if let Some(dev) = dev {
            // Exempt what NAT rewrote (kube-proxy's DNAT of a ClusterIP to a local address is
            // still 10.x and, to this hook, still bound for the default interface).
            let rule = [
                "OUTPUT",
                "-o",
                dev.as_str(),
                "-d",
                "10.0.0.0/8",
                "-m",
                "conntrack",
                "!",
                "--ctstate",
                "DNAT",
                "-j",
                "REJECT",
            ];
            let present = Command::new("iptables")
                .args(["-w", "-C"])
                .args(rule)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !present {
                run(Command::new("iptables").args(["-w", "-I"]).args(rule));
            }
        }
    });
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

/// A free TCP port on 127.0.0.1 (free when returned; for the agent's `--listen`).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
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
