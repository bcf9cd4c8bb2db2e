//! Helper programs: `ll-client` and `ll-server`, driven line by line over stdin/stdout.
use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::netns::{command_in, NetNs};
use crate::setup::bins;
use crate::wait::POLL;

/// How long a test waits for a helper program to answer a command.
const PROC_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// The outcome of a connect, which must have succeeded.
    fn read_connected(&mut self) -> Conn {
        self.connected()
            .unwrap_or_else(|outcome| panic!("ll-client: {outcome}"))
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

    /// This client's row of a [`Table`](crate::Table).
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

/// Resident set size of process `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// CPU seconds process `pid` has used (user + system, all threads).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("comm")
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The CPU time of each thread of process `pid` now (`/proc/PID/task/*/schedstat`, in
/// nanoseconds): where [`cpu_seconds`] counts clock ticks of 10 ms, which over a 15 s window
/// of a process at 5 % of a core is ±2 % of it.
#[derive(Clone, Debug, Default)]
pub struct ThreadsCpu(std::collections::BTreeMap<u32, u64>);

impl ThreadsCpu {
    pub fn of(pid: u32) -> ThreadsCpu {
        let tasks = fs::read_dir(format!("/proc/{pid}/task")).expect("read the threads");
        ThreadsCpu(
            tasks
                .flatten()
                .filter_map(|t| {
                    let tid = t.file_name().to_str()?.parse().ok()?;
                    let schedstat = fs::read_to_string(t.path().join("schedstat")).ok()?;
                    Some((tid, schedstat.split_whitespace().next()?.parse().ok()?))
                })
                .collect(),
        )
    }

    /// Seconds of CPU between `earlier` and this reading, or `None` if a thread of `earlier`
    /// has exited since (its time went with it).
    pub fn since(&self, earlier: &ThreadsCpu) -> Option<f64> {
        let mut ns = 0u64;
        for (tid, before) in &earlier.0 {
            ns += self.0.get(tid)?.saturating_sub(*before);
        }
        let born: u64 = self
            .0
            .iter()
            .filter(|(tid, _)| !earlier.0.contains_key(tid))
            .map(|(_, ns)| ns)
            .sum();
        Some((ns + born) as f64 / 1e9)
    }
}
