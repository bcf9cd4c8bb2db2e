//! Harness for lifeline's root-only integration suites.
//!
//! Every test runs the real `lifeline` binary as a child process ([`Agent`]), opens real TCP
//! connections with the `ll-client` / `ll-server` helper programs ([`Client`], [`Server`]),
//! possibly inside throw-away network namespaces ([`NetNs`], [`VethPair`]) and cgroups
//! ([`ContainerCgroup`]), and checks what `/api/v1/clients` reports. Every resource is a guard
//! that cleans up on drop, also when the test panics.
//!
//! Start every test with [`init!`]: it checks for root and records where cargo put the helper
//! programs.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The fake kube-apiserver (`ll-apiserver`) and the real clients run against it.
pub mod kube_fixture;
/// A real Kubernetes 1.20 cluster (control plane, node, real clients): the real-cluster tier.
pub mod real_cluster;
pub mod scenario;
pub use kube_fixture::*;

/// How long a test waits for a helper program to answer a command.
const PROC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent gets to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of every polling loop.
const POLL: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------------
// Setup

/// Paths of the helper programs, set by [`init!`].
static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();

/// Checks that the test runs as root and records the helper programs' paths. Call it first in
/// every test: `lifeline_integration::init!();`
#[macro_export]
macro_rules! init {
    () => {
        $crate::init_with(env!("CARGO_BIN_EXE_ll-client"), env!("CARGO_BIN_EXE_ll-server"))
    };
}

/// What [`init!`] expands to.
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

fn bins() -> &'static (PathBuf, PathBuf) {
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

fn ip(args: &[&str]) -> Output {
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

// ---------------------------------------------------------------------------------------------
// Waiting

/// Calls `poll` every 50 ms until it returns `Ok`, for at most `timeout`. On timeout, panics
/// naming `what` and showing the last value `poll` observed (its `Err`).
pub fn wait_until<T, S: fmt::Debug>(
    timeout: Duration,
    what: &str,
    mut poll: impl FnMut() -> Result<T, S>,
) -> T {
    let start = Instant::now();
    loop {
        match poll() {
            Ok(v) => return v,
            Err(last) if start.elapsed() >= timeout => {
                panic!("timed out after {timeout:?} waiting for {what}; last observed:\n{last:?}")
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Calls `poll` every 50 ms for `duration`, panicking at the first `Err` (showing it).
pub fn hold<S: fmt::Debug>(duration: Duration, what: &str, mut poll: impl FnMut() -> Result<(), S>) {
    let start = Instant::now();
    while start.elapsed() < duration {
        if let Err(seen) = poll() {
            panic!(
                "{what} stopped holding after {:?}; observed:\n{seen:?}",
                start.elapsed()
            );
        }
        thread::sleep(POLL);
    }
}

/// JSON shown pretty-printed in panic messages.
pub struct Pretty<'a>(pub &'a [Value]);

impl fmt::Debug for Pretty<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_string_pretty(self.0).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

// ---------------------------------------------------------------------------------------------
// Namespaces, links and cgroups

/// A network namespace `ll-<pid>-<n>` with `lo` up; deleted on drop after killing whatever
/// still runs in it.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new() -> NetNs {
        let name = format!("ll-{}", unique());
        ip(&["netns", "add", &name]);
        let ns = NetNs { name };
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`, which execs in
    /// place: the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `args` inside the namespace, panicking unless it succeeds.
    pub fn run(&self, args: &[&str]) -> Output {
        run(self.command(args[0]).args(&args[1..]))
    }

    /// Inode of the namespace (what `stat -L -c %i /proc/PID/ns/net` shows for its members).
    pub fn inode(&self) -> u64 {
        fs::metadata(format!("/run/netns/{}", self.name))
            .expect("stat netns")
            .ino()
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.name]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: plain syscall; the pid belongs to a process this test started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The command running `program` in `ns`, or in the test's own namespace for `None`.
pub fn command_in(ns: Option<&NetNs>, program: &Path) -> Command {
    match ns {
        Some(ns) => ns.command(program),
        None => Command::new(program),
    }
}

/// Two fresh namespaces linked by a veth pair: `a` has 10.250.N.1/24 and fd00:250:N::1/64, `b`
/// 10.250.N.2/24 and fd00:250:N::2/64, with N unique per call. Traffic only ever flows between
/// these two namespaces.
pub struct VethPair {
    pub a: NetNs,
    pub b: NetNs,
    pub a_ip: IpAddr,
    pub b_ip: IpAddr,
    pub a_ip6: IpAddr,
    pub b_ip6: IpAddr,
    /// `10.250.N.0/24`
    pub cidr: String,
    /// `fd00:250:N::/64`
    pub cidr6: String,
}

impl VethPair {
    pub fn new() -> VethPair {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Offset by pid so concurrently running test processes are unlikely to share a subnet.
        let n = 1 + (std::process::id() + NEXT.fetch_add(1, Ordering::Relaxed)) % 254;
        let (a, b) = (NetNs::new(), NetNs::new());
        let (if_a, if_b) = (format!("llv{n}a"), format!("llv{n}b"));
        ip(&[
            "-n", &a.name, "link", "add", &if_a, "type", "veth", "peer", "name", &if_b, "netns", &b.name,
        ]);
        let v4 = |host| IpAddr::from([10, 250, n as u8, host]);
        let v6 = |host| IpAddr::from([0xfd00, 0x250, n as u16, 0, 0, 0, 0, host]);
        for (ns, ifname, host) in [(&a, &if_a, 1), (&b, &if_b, 2)] {
            ns.run(&["ip", "addr", "add", &format!("{}/24", v4(host)), "dev", ifname]);
            let addr6 = format!("{}/64", v6(host as u16));
            ns.run(&["ip", "-6", "addr", "add", &addr6, "dev", ifname, "nodad"]);
            ns.run(&["ip", "link", "set", ifname, "up"]);
        }
        VethPair {
            a,
            b,
            a_ip: v4(1),
            b_ip: v4(2),
            a_ip6: v6(1),
            b_ip6: v6(2),
            cidr: format!("10.250.{n}.0/24"),
            cidr6: format!("{}/64", v6(0)),
        }
    }
}

impl Default for VethPair {
    fn default() -> Self {
        Self::new()
    }
}

/// Root of the cgroup v2 hierarchy (`/sys/fs/cgroup/unified` on hybrid hosts).
pub fn cgroup2_root() -> PathBuf {
    let hybrid = Path::new("/sys/fs/cgroup/unified");
    if hybrid.join("cgroup.procs").exists() {
        hybrid.into()
    } else {
        "/sys/fs/cgroup".into()
    }
}

/// `<root>/lltest-<pid>-<n>/cri-containerd-<64 hex>.scope`, named like a containerd
/// container's cgroup. Removed on drop (any process still inside is moved back to the root).
pub struct ContainerCgroup {
    parent: PathBuf,
    pub dir: PathBuf,
    /// The 64-hex container id in the scope's name.
    pub id: String,
    /// The path as `/proc/PID/cgroup` shows it on the `0::` line.
    pub path: String,
}

impl ContainerCgroup {
    pub fn new() -> ContainerCgroup {
        use std::hash::{BuildHasher, Hasher};
        let mut id = String::new();
        for i in 0..4u64 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write(unique().as_bytes());
            h.write_u64(i);
            id.push_str(&format!("{:016x}", h.finish()));
        }
        let name = format!("lltest-{}", unique());
        let parent = cgroup2_root().join(&name);
        let dir = parent.join(format!("cri-containerd-{id}.scope"));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let path = format!("/{name}/cri-containerd-{id}.scope");
        ContainerCgroup {
            parent,
            dir,
            id,
            path,
        }
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }
}

impl Default for ContainerCgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        let root_procs = cgroup2_root().join("cgroup.procs");
        for _ in 0..40 {
            for pid in fs::read_to_string(self.dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                let _ = fs::write(&root_procs, pid);
            }
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            thread::sleep(POLL);
        }
        let _ = fs::remove_dir(&self.parent);
    }
}

/// Inode of the network namespace of process `pid`.
pub fn netns_inode(pid: u32) -> u64 {
    fs::metadata(format!("/proc/{pid}/ns/net"))
        .expect("stat /proc/PID/ns/net")
        .ino()
}

/// The cgroup v2 path of process `pid` (the `0::` line of `/proc/PID/cgroup`).
pub fn cgroup_path(pid: u32) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read /proc/PID/cgroup");
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("no 0:: line in /proc/PID/cgroup")
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Helper programs

/// A child process spoken to line by line over stdin/stdout (its stderr lines arrive prefixed
/// with `stderr: `). Killed on drop.
pub struct Proc {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for (stream, prefix) in [
            (Box::new(out) as Box<dyn Read + Send>, ""),
            (Box::new(err), "stderr: "),
        ] {
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(format!("{prefix}{line}"));
                }
            });
        }
        Proc {
            what,
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").unwrap_or_else(|e| panic!("write to {}: {e}", self.what));
    }

    /// Waits for the next line starting with one of `prefixes` (skipping others); returns the
    /// prefix and the rest of the line.
    pub fn expect(&mut self, prefixes: &[&'static str]) -> (&'static str, String) {
        let deadline = Instant::now() + PROC_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(p) = prefixes.iter().find(|p| line.starts_with(**p)) {
                        return (p, line[p.len()..].trim().to_string());
                    }
                }
                Err(e) => {
                    let status = self.child.try_wait().ok().flatten();
                    let why = match e {
                        RecvTimeoutError::Timeout => "timed out",
                        RecvTimeoutError::Disconnected => "output closed",
                    };
                    panic!(
                        "{} {why} waiting for {prefixes:?} (exit status {status:?}); its output:\n{}",
                        self.what,
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// Closes stdin and waits for a clean exit.
    fn finish(&mut self) -> ExitStatus {
        self.stdin = None;
        let deadline = Instant::now() + PROC_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit", self.what);
            thread::sleep(POLL);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One TCP connection as the client saw it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Conn {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}", self.local, self.remote)
    }
}

/// A running `ll-client` (comm `ll-client`), holding the connections in [`Client::conns`].
pub struct Client {
    proc: Proc,
    pending: usize,
    pub conns: Vec<Conn>,
}

impl Client {
    /// Starts a client in `ns` (or the test's namespace) that connects to every target, and
    /// returns once all connections are established.
    pub fn spawn(ns: Option<&NetNs>, targets: &[SocketAddr]) -> Client {
        let mut client = Client::spawn_paused(ns, targets);
        client.go();
        client
    }

    /// Starts a client that opens no socket until [`Client::go`] (so it can be moved into a
    /// cgroup first).
    pub fn spawn_paused(ns: Option<&NetNs>, targets: &[SocketAddr]) -> Client {
        Client::spawn_with(ns, targets, &[])
    }

    /// [`Client::spawn_paused`] with extra `ll-client` arguments (e.g. `--connect-timeout`).
    pub fn spawn_with(ns: Option<&NetNs>, targets: &[SocketAddr], extra: &[&str]) -> Client {
        let mut cmd = command_in(ns, &bins().0);
        cmd.arg("--wait-go").args(extra);
        for t in targets {
            cmd.arg("--connect").arg(t.to_string());
        }
        let mut proc = Proc::spawn(cmd);
        proc.expect(&["waiting"]);
        let pid = proc.child.id();
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        assert_eq!(comm.trim(), "ll-client", "pid {pid} is not the client itself");
        Client {
            proc,
            pending: targets.len(),
            conns: Vec::new(),
        }
    }

    /// Lets a paused client connect; returns once every connection is established.
    pub fn go(&mut self) {
        self.proc.send("go");
        for _ in 0..std::mem::take(&mut self.pending) {
            self.read_connected();
        }
        self.proc.expect(&["ready"]);
    }

    /// Opens one more connection; returns once it is established.
    pub fn connect(&mut self, target: SocketAddr) -> Conn {
        self.proc.send(&format!("connect {target}"));
        self.read_connected()
    }

    fn read_connected(&mut self) -> Conn {
        let (kind, rest) = self.proc.expect(&["connected ", "failed ", "error "]);
        assert_eq!(kind, "connected ", "ll-client: {kind}{rest}");
        let mut addrs = rest.split_whitespace().map(|a| a.parse().expect("address"));
        let conn = Conn {
            local: addrs.next().expect("local"),
            remote: addrs.next().expect("remote"),
        };
        self.conns.push(conn);
        conn
    }

    /// Starts a connect to `target` without waiting for its outcome (read it with
    /// [`Client::connected`]).
    pub fn start_connect(&mut self, target: SocketAddr) {
        self.proc.send(&format!("connect {target}"));
    }

    /// The outcome of a connect started with [`Client::start_connect`]: `Ok(conn)` or the
    /// client's error text.
    pub fn connected(&mut self) -> Result<Conn, String> {
        let (kind, rest) = self.proc.expect(&["connected ", "failed ", "error "]);
        if kind != "connected " {
            return Err(format!("{kind}{rest}"));
        }
        let mut addrs = rest.split_whitespace().map(|a| a.parse().expect("address"));
        let conn = Conn {
            local: addrs.next().expect("local"),
            remote: addrs.next().expect("remote"),
        };
        self.conns.push(conn);
        Ok(conn)
    }

    /// Writes `n` bytes on one of its connections (a request the server may or may not
    /// answer).
    pub fn send(&mut self, conn: Conn, n: usize) {
        self.proc.send(&format!("send {} {n}", conn.local.port()));
        let (kind, rest) = self.proc.expect(&["sent ", "error "]);
        assert_eq!(kind, "sent ", "ll-client: {kind}{rest}");
    }

    /// Closes one of the client's connections (the process keeps running).
    pub fn close(&mut self, conn: Conn) {
        self.proc.send(&format!("close {}", conn.local.port()));
        let (kind, rest) = self.proc.expect(&["closed ", "error "]);
        assert_eq!(kind, "closed ", "ll-client: {kind}{rest}");
        self.conns.retain(|c| *c != conn);
    }

    /// Makes the client exit on its own and waits for it.
    pub fn exit(mut self) {
        self.proc.send("exit");
        let status = self.proc.finish();
        assert!(status.success(), "ll-client exited with {status}");
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// The full command line as `/proc/PID/cmdline` has it, joined by spaces.
    pub fn cmdline(&self) -> String {
        let raw = fs::read(format!("/proc/{}/cmdline", self.pid())).expect("read cmdline");
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// This client's row of a [`Table`].
    pub fn row(&self) -> (u32, BTreeSet<Conn>) {
        (self.pid(), self.conns.iter().copied().collect())
    }
}

/// A running `ll-server`.
pub struct Server {
    proc: Proc,
    /// The bound address as the server reports it (may be `0.0.0.0:PORT`).
    pub addr: SocketAddr,
}

impl Server {
    /// Starts a server listening on `listen` (e.g. `127.0.0.1:0`, `[::1]:0`, `0.0.0.0:0`) in
    /// `ns` or the test's namespace.
    pub fn spawn(ns: Option<&NetNs>, listen: &str) -> Server {
        let mut cmd = command_in(ns, &bins().1);
        cmd.args(["--listen", listen]);
        let mut proc = Proc::spawn(cmd);
        let (_, addr) = proc.expect(&["listening "]);
        Server {
            proc,
            addr: addr.parse().expect("listening address"),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The server's port at address `ip` (for a server bound to a wildcard address).
    pub fn at(&self, ip: impl Into<IpAddr>) -> SocketAddr {
        SocketAddr::new(ip.into(), self.port())
    }

    /// Sends `n` bytes to every accepted connection; returns how many connections got them.
    pub fn send(&mut self, n: usize) -> usize {
        self.proc.send(&format!("send {n}"));
        let (_, rest) = self.proc.expect(&["sent "]);
        rest.rsplit(' ').next().unwrap().parse().expect("count")
    }
}

// ---------------------------------------------------------------------------------------------
// The agent

/// Rows of `/api/v1/clients` reduced to what identifies them: pid → its (local, remote) pairs.
pub type Table = BTreeMap<u32, BTreeSet<Conn>>;

/// The [`Table`] of a `/api/v1/clients` answer (panics on objects without pid or addresses).
pub fn table(clients: &[Value]) -> Table {
    clients
        .iter()
        .map(|c| {
            let conns = connections(c)
                .iter()
                .map(|k| Conn {
                    local: addr_field(k, "local"),
                    remote: addr_field(k, "remote"),
                })
                .collect();
            (pid_of(c), conns)
        })
        .collect()
}

/// The [`Table`] the given clients should produce.
pub fn expected(clients: &[&Client]) -> Table {
    clients.iter().map(|c| c.row()).collect()
}

pub fn pid_of(client: &Value) -> u32 {
    client["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("client without numeric pid: {client}")) as u32
}

/// The client object of process `pid`, if listed.
pub fn find_pid(clients: &[Value], pid: u32) -> Option<&Value> {
    clients.iter().find(|c| pid_of(c) == pid)
}

pub fn connections(client: &Value) -> &[Value] {
    client["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("client without connections array: {client}"))
}

/// The connection object of `conn` within client `client`.
pub fn find_conn(client: &Value, conn: Conn) -> &Value {
    connections(client)
        .iter()
        .find(|k| addr_field(k, "local") == conn.local && addr_field(k, "remote") == conn.remote)
        .unwrap_or_else(|| panic!("{conn:?} not in {client:#}"))
}

fn addr_field(v: &Value, key: &str) -> SocketAddr {
    v[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("`{key}` is not an address: {v}"))
}

/// True for `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !(digits(0..4)
            && digits(5..7)
            && digits(8..10)
            && digits(11..13)
            && digits(14..16)
            && digits(17..19))
        || (b[4], b[7], b[13], b[16]) != (b'-', b'-', b':', b':')
        || !matches!(b[10], b'T' | b't')
    {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    rest.eq_ignore_ascii_case("z")
        || (rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest.as_bytes()[3] == b':'
            && rest[1..3]
                .bytes()
                .chain(rest[4..6].bytes())
                .all(|d| d.is_ascii_digit()))
}

/// Checks every field of a `/api/v1/clients` object for the type the contract gives it.
pub fn assert_client_schema(c: &Value) {
    let ok = |cond: bool, what: &str| assert!(cond, "client object: {what}: {c:#}");
    ok(c["pid"].is_u64(), "pid must be an unsigned integer");
    ok(c["comm"].is_string(), "comm must be a string");
    ok(c["cmdline"].is_string(), "cmdline must be a string");
    ok(c["netns"].is_u64(), "netns must be an unsigned integer");
    ok(c["cgroup"].is_string(), "cgroup must be a string");
    ok(
        c["container_id"].is_null()
            || c["container_id"]
                .as_str()
                .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())),
        "container_id must be null or 64 hex digits",
    );
    for key in ["namespace", "pod", "container"] {
        let v = c.get(key);
        ok(
            v.is_some_and(|v| v.is_null() || v.is_string()),
            &format!("{key} must be present, null or a string"),
        );
    }
    ok(
        c["state"].as_str().is_some_and(|s| !s.is_empty()),
        "state must be a non-empty string",
    );
    ok(
        c["state_since"].as_str().is_some_and(is_rfc3339),
        "state_since must be RFC3339",
    );
    ok(c["reason"].is_string(), "reason must be a string");
    ok(
        c["connect_failures"].is_u64(),
        "connect_failures must be an unsigned integer",
    );
    for k in connections(c) {
        ok(
            k["local"]
                .as_str()
                .is_some_and(|s| s.parse::<SocketAddr>().is_ok()),
            "connection local must be ADDR:PORT",
        );
        ok(
            k["remote"]
                .as_str()
                .is_some_and(|s| s.parse::<SocketAddr>().is_ok()),
            "connection remote must be ADDR:PORT",
        );
        ok(k["endpoint"].is_string(), "connection endpoint must be a string");
        ok(
            k["tcp_state"].as_str().is_some_and(|s| !s.is_empty()),
            "tcp_state must be a string",
        );
        ok(
            k["established_at"].is_null() || k["established_at"].as_str().is_some_and(is_rfc3339),
            "established_at must be null or RFC3339",
        );
        ok(
            k["last_receive_age_seconds"].is_null()
                || k["last_receive_age_seconds"].is_f64()
                || k["last_receive_age_seconds"].is_u64(),
            "last_receive_age_seconds must be null or a number",
        );
        ok(
            k["bytes_received"].is_u64(),
            "bytes_received must be an unsigned integer",
        );
        ok(
            k["retransmits"].is_u64(),
            "retransmits must be an unsigned integer",
        );
    }
}

/// Minimal HTTP/1.1 GET (`Connection: close`): returns the status code and body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad response: {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
    if !chunked {
        return Ok((status, body.to_string()));
    }
    let (mut out, mut rest) = (String::new(), body);
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or_else(bad)?;
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).map_err(|_| bad())?;
        if size == 0 {
            return Ok((status, out));
        }
        out.push_str(after.get(..size).ok_or_else(bad)?);
        rest = after[size..].strip_prefix("\r\n").ok_or_else(bad)?;
    }
}

/// Runs `lifeline ARGS` to completion (killing it after 10 s, which fails the test).
pub fn lifeline(args: &[&str]) -> Output {
    let mut child = Command::new(lifeline_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lifeline");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "`lifeline {}` still running after 10 s; stderr:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(POLL);
    }
    child.wait_with_output().expect("wait")
}

/// A running `lifeline run`, listening on a free 127.0.0.1 port. On drop it gets SIGTERM (and
/// SIGKILL if it lingers); if the test panicked, its stderr is printed then (so panic messages
/// about the agent need not include it).
pub struct Agent {
    child: Child,
    /// Where its HTTP API listens.
    pub addr: SocketAddr,
    dir: TempDir,
}

impl Agent {
    /// `lifeline run --endpoint E...`
    pub fn start(endpoints: &[impl AsRef<str>]) -> Agent {
        let args: Vec<String> = endpoints
            .iter()
            .flat_map(|e| ["--endpoint".to_string(), e.as_ref().to_string()])
            .collect();
        Agent::start_with(&args)
    }

    /// `lifeline run ARGS --listen 127.0.0.1:PORT`; returns once `/readyz` answers 200.
    pub fn start_with(args: &[String]) -> Agent {
        Agent::launch(&[], args, IpAddr::from([127, 0, 0, 1]), true)
    }

    /// `WRAPPER... lifeline run ARGS --listen LISTEN_IP:PORT`, where the wrapper execs its
    /// arguments (`sh -c 'ulimit -Sn 1024; exec "$0" "$@"'`, `capsh --drop=... -- -c 'exec "$0"
    /// "$@"'`), so the agent keeps the child's pid. Returns once `/readyz` answers 200, or only
    /// `/healthz` unless `ready` (an agent expected to run degraded). An unspecified
    /// `listen_ip` (`0.0.0.0`) is reached at 127.0.0.1.
    pub fn launch(wrapper: &[&str], args: &[String], listen_ip: IpAddr, ready: bool) -> Agent {
        let dir = TempDir::new();
        let port = free_port();
        let addr = match listen_ip {
            ip if ip.is_unspecified() => SocketAddr::from(([127, 0, 0, 1], port)),
            ip => SocketAddr::new(ip, port),
        };
        let stderr = fs::File::create(dir.path().join("agent.stderr")).expect("stderr file");
        let mut cmd = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut cmd = Command::new(program);
                cmd.args(wrapper_args).arg(lifeline_bin());
                cmd
            }
            None => Command::new(lifeline_bin()),
        };
        cmd.arg("run")
            .args(args)
            .args(["--listen", &SocketAddr::new(listen_ip, port).to_string()]);
        let shown = format!("{cmd:?}");
        let probe = if ready { "/readyz" } else { "/healthz" };
        let child = cmd
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(stderr.try_clone().expect("dup"))
            .stderr(stderr)
            .spawn()
            .expect("spawn lifeline");
        let mut agent = Agent { child, addr, dir };
        let start = Instant::now();
        loop {
            if let Some(status) = agent.child.try_wait().expect("try_wait") {
                panic!("{shown} exited with {status} before becoming ready");
            }
            if matches!(http_get(addr, probe), Ok((200, _))) {
                return agent;
            }
            if start.elapsed() > READY_TIMEOUT {
                panic!("{shown}: {probe} not 200 within {READY_TIMEOUT:?}");
            }
            thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A scratch directory that lives as long as the agent (for config files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the agent wrote to stderr (and stdout) so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("agent.stderr")).unwrap_or_default()
    }

    /// GET `path`; panics unless the agent answers.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET `path`, asserting 200 and a JSON array body.
    pub fn get_array(&self, path: &str) -> Vec<Value> {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        match serde_json::from_str(&body) {
            Ok(Value::Array(items)) => items,
            _ => panic!("GET {path}: not a JSON array: {body}"),
        }
    }

    /// `/api/v1/clients`
    pub fn clients(&self) -> Vec<Value> {
        self.get_array("/api/v1/clients")
    }

    /// `/api/v1/endpoints` as a sorted list of (endpoint, source).
    /// `/api/v1/endpoints` → `endpoints[]` as (endpoint, source), sorted.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        let (status, body) = self.get("/api/v1/endpoints");
        assert_eq!(status, 200, "GET /api/v1/endpoints: {body}");
        let doc: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("endpoints JSON: {e}: {body}"));
        let entries = doc["endpoints"]
            .as_array()
            .unwrap_or_else(|| panic!("no endpoints array: {doc}"))
            .clone();
        let mut list: Vec<_> = entries
            .iter()
            .map(|e| match (e["endpoint"].as_str(), e["source"].as_str()) {
                (Some(ep), Some(src)) => (ep.to_string(), src.to_string()),
                _ => panic!("malformed endpoint object: {e}"),
            })
            .collect();
        list.sort();
        list
    }

    /// Polls `/api/v1/clients` until `check` returns `Some`, for at most `timeout` (panics
    /// showing the last answer).
    pub fn wait_clients<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&[Value]) -> Option<T>,
    ) -> T {
        wait_until(timeout, what, || {
            let c = self.clients();
            check(&c).ok_or_else(|| Shown(format!("{:?}", Pretty(&c))))
        })
    }

    /// Waits until the clients' [`Table`] is exactly `want`; returns that answer.
    pub fn wait_table(&self, timeout: Duration, want: &Table) -> Vec<Value> {
        let what = format!("exactly these clients (pid -> connections): {want:#?}");
        self.wait_clients(timeout, &what, |c| (table(c) == *want).then(|| c.to_vec()))
    }

    /// Asserts that the clients' [`Table`] stays exactly `want` for `duration`.
    pub fn hold_table(&self, duration: Duration, want: &Table) {
        let what = format!("the client table {want:#?}");
        hold(duration, &what, || {
            let c = self.clients();
            if table(&c) == *want {
                Ok(())
            } else {
                Err(Shown(format!("{:?}", Pretty(&c))))
            }
        });
    }

    /// Sends signal `sig` to the agent.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, sig) }, 0, "kill");
    }

    /// Stops the agent with SIGTERM and asserts it exits 0 within 10 s.
    pub fn stop(self) {
        self.stop_with(libc::SIGTERM)
    }

    /// Stops the agent with `sig` and asserts it exits 0 within 10 s.
    pub fn stop_with(mut self, sig: i32) {
        self.signal(sig);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent still running 10 s after signal {sig}"
            );
            thread::sleep(POLL);
        };
        assert_eq!(
            status.code(),
            Some(0),
            "agent exited with {status} after signal {sig}"
        );
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal(libc::SIGTERM);
            let start = Instant::now();
            while self.child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5) {
                thread::sleep(POLL);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            let text = self.stderr();
            let cut = (text.len().saturating_sub(16 * 1024)..=text.len())
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            let tail = &text[cut..];
            eprintln!(
                "----- lifeline stderr (last 16 KiB) -----\n{tail}\n----- end of lifeline stderr -----"
            );
        }
    }
}

/// Writes `endpoints: [...]` to the YAML config file `path` (atomically, by rename).
pub fn write_config(path: &Path, endpoints: &[impl AsRef<str>]) {
    let list: Vec<String> = endpoints.iter().map(|e| format!("\"{}\"", e.as_ref())).collect();
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format!("endpoints: [{}]\n", list.join(", "))).expect("write config");
    fs::rename(&tmp, path).expect("rename config");
}

/// A string shown as is (not quoted) in panic messages.
pub struct Shown(pub String);

impl fmt::Debug for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        for ok in [
            "2025-01-02T03:04:05Z",
            "2025-01-02T03:04:05.123456789Z",
            "2025-01-02T03:04:05+02:00",
        ] {
            assert!(is_rfc3339(ok), "{ok}");
        }
        for bad in [
            "2025-01-02 03:04:05",
            "2025-01-02T03:04:05",
            "2025-01-02T03:04:05.Z",
            "",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }

    #[test]
    fn http_get_decodes_chunked_bodies() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for reply in [
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n",
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno",
            ] {
                let (s, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(s);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap() > 2 {
                    line.clear();
                }
                let mut s = reader.into_inner();
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
        assert_eq!(http_get(addr, "/").unwrap(), (200, "[1,2]".into()));
        assert_eq!(http_get(addr, "/").unwrap(), (503, "no".into()));
    }
}
