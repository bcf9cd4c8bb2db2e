//! `cargo xtask bench`: what the agent costs, in figures measured in one run, printed as one
//! table and written to `docs/benchmarks.md` with the machine it ran on. Nothing is asserted.
//!
//! 1. **Unrelated churn.** A loopback connect/close loop (`ll-load churn`, the server closes
//!    first, like HTTP with `Connection: close`) in a namespace of its own, observed in turn by
//!    nobody, by lifeline (watching a port that sees no traffic), by bpftrace on the same
//!    tracepoint with a one-comparison port filter, and by an `ss` polling loop; rounds are
//!    interleaved so that machine noise hits every observer alike. Printed: connections per
//!    second against no observer, the observer's CPU, and the kernel's own cost per call of
//!    each program (`kernel.bpf_stats_enabled`), also with lifeline and bpftrace attached side
//!    by side on the same events (both attach orders: the first program on a tracepoint pays
//!    a little more).
//!    **Unrelated segments** (`bench/segments.rs`): the same for a loopback ping-pong, whose
//!    segments each fire `tcp_probe`, against bpftrace's filter on two tracepoints.
//! 2. **Tracked connections.** The agent's CPU per second and RSS with 100, 1,000 and 10,000
//!    idle connections to a watched endpoint (quiet once unchanged for 10 s: then sampled
//!    every 5 s).
//! 3. **Bursts.** 1,000, 5,000 and 10,000 connects at once: kernel events lost, and how many of
//!    the connections the agent lists.
//! 4. **Busy connections** (`bench/busy.rs`): 3,000 connections that each receive payload every
//!    5 s, against idle ones, as the sampler pays for them.
//! 5. **What a uprobe hit costs** (`bench/traps.rs`), by the instruction it replaces: emulated
//!    or single-stepped. **Go clients' streams** (`bench/streams.rs`): the Go-client uprobes'
//!    cost in the kernel, in the agent and to the client, against the connection-only agent,
//!    and nothing for a process that runs no probed binary. **Go clients' own writes**
//!    (`bench/writes.rs`): the write probes per call, on clients that write what a controller
//!    writes (requests and their resets). **A process that is no client**
//!    (`bench/libssl.rs`), hammering TLS through a followed client's libssl: its rate, and the
//!    probes' runs.
//! 6. **Connect storm.** One process connecting to a refusing endpoint as fast as it can for
//!    10 s: the slowest `/healthz` answer meanwhile, events lost, failures counted against
//!    refusals seen, RSS growth.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{cargo, run, workspace, Failed, Result};

mod busy;
mod controller;
mod libssl;
mod neighbours;
mod segments;
mod streams;
mod traps;
mod uprobe_sites;
mod writes;

/// Seconds of churn per observer and round.
const CHURN_SECONDS: u64 = 5;
/// Interleaved rounds of [none, lifeline, bpftrace, ss].
const ROUNDS: usize = 5;
/// The watched endpoint's port (no churn goes there). Not the 16443 of the README's examples:
/// an agent someone runs by hand on this machine watches every namespace's 16443, and would
/// observe (and probe) the bench's clients.
const WATCHED_PORT: u16 = 26443;
const CHURN_PORT: u16 = 18080;
/// Where benchmark agents listen (not the README's 19477, for the same reason).
const AGENT_ADDR: &str = "127.0.0.1:29477";
/// Issue 26's goal for each Go probe, per call in the kernel (bpf_stats): the streams and
/// writes sections.
const PER_CALL_GOAL_NS: f64 = 1000.0;
const BPFTRACE_PROGRAM: &str =
    "tracepoint:sock:inet_sock_set_state /args->dport == 26443/ { @hits = count(); }";

/// Everything started by the bench: killed, and the namespace and sysctl restored, on drop.
struct Lab {
    ns: String,
    children: Vec<Child>,
    stats_before: Option<String>,
}

impl Lab {
    fn new() -> Result<Self> {
        let ns = format!("llbench-{}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &ns]))?;
        let lab = Lab {
            ns,
            children: Vec::new(),
            stats_before: fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok(),
        };
        run(lab.in_ns("ip").args(["link", "set", "lo", "up"]))?;
        fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
            .map_err(|e| Failed(format!("enabling kernel.bpf_stats_enabled: {e}")))?;
        Ok(lab)
    }

    fn in_ns(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }

    /// Starts `cmd` (output discarded) and keeps it until [`Lab::stop`] or the end.
    fn spawn(&mut self, cmd: &mut Command) -> Result<u32> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| Failed(format!("{}: {e}", crate::show(cmd))))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    fn stop(&mut self, pid: u32) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.remove(i);
            // SIGTERM first: the agent detaches its programs on the way out.
            // SAFETY: plain syscall on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for pid in self
            .children
            .iter()
            .map(Child::id)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            self.stop(pid);
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        if let Some(v) = &self.stats_before {
            let _ = fs::write("/proc/sys/kernel/bpf_stats_enabled", v);
        }
    }
}

struct Bins {
    lifeline: PathBuf,
    load: PathBuf,
}

/// CPU time of `pid`, in seconds: its threads' run time from `schedstat` (nanoseconds), plus
/// the time of the children it waited for (clock ticks; the `ss` loop's `ss` runs).
fn cpu_seconds(pid: u32) -> f64 {
    threads_cpu_seconds(pid).values().sum::<f64>() + children_seconds(pid)
}

/// CPU time of `pid`'s threads (`schedstat`), in seconds, summed per thread name (`comm`).
fn threads_cpu_seconds(pid: u32) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    for thread in crate::schedstat::threads(pid) {
        let Ok(name) = fs::read_to_string(thread.dir.join("comm")) else {
            continue;
        };
        *by_name.entry(name.trim().to_owned()).or_insert(0.0) += thread.ran_ns as f64 / 1e9;
    }
    by_name
}

/// cutime + cstime of `pid`, in seconds.
fn children_seconds(pid: u32) -> f64 {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap_or(0) + 2..]
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[13..15]
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// `(run_time_ns, run_cnt)` of every eBPF program `pid` holds, by program id.
fn prog_stats(pid: u32) -> BTreeMap<u32, (u64, u64)> {
    let mut found = BTreeMap::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return found;
    };
    for entry in dir.flatten() {
        let text = fs::read_to_string(entry.path()).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(ns), Some(cnt)) = (field("prog_id:"), field("run_time_ns:"), field("run_cnt:"))
        {
            found.insert(id as u32, (ns, cnt));
        }
    }
    found
}

/// The kernel's name of program `id` (`bpftool prog show`).
fn prog_name(id: u32) -> String {
    let out = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.split_whitespace()
        .skip_while(|w| *w != "name")
        .nth(1)
        .unwrap_or("?")
        .to_owned()
}

/// Per-call cost of each program of `pid` between two [`prog_stats`] readings, busiest first:
/// `(name, calls, ns per call)`.
fn per_call(
    before: &BTreeMap<u32, (u64, u64)>,
    after: &BTreeMap<u32, (u64, u64)>,
) -> Vec<(String, u64, f64)> {
    let mut rows: Vec<(String, u64, f64)> = after
        .iter()
        .filter_map(|(id, (ns, cnt))| {
            let (ns0, cnt0) = before.get(id).copied().unwrap_or((0, 0));
            let calls = cnt - cnt0;
            (calls > 0).then(|| (prog_name(*id), calls, (ns - ns0) as f64 / calls as f64))
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    rows
}

/// Minimal HTTP/1.1 GET: `(status, body)`.
fn http_get(addr: &str, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let addr: SocketAddr = addr.parse().expect("valid address");
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// A counter from the agent's `/metrics` (summed over label sets containing all of `with`).
fn metric(name: &str, with: &[&str]) -> f64 {
    let body = http_get(AGENT_ADDR, "/metrics", Duration::from_secs(5))
        .map(|(_, b)| b)
        .unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Connections the agent lists (`"local"` keys in `/api/v1/clients`).
fn listed_connections() -> usize {
    http_get(AGENT_ADDR, "/api/v1/clients", Duration::from_secs(30))
        .map(|(_, b)| b.matches("\"local\"").count())
        .unwrap_or(0)
}

impl Lab {
    /// A release agent watching 127.0.0.1:WATCHED_PORT; returns once `/readyz` answers.
    fn agent(&mut self, bins: &Bins, extra: &[&str]) -> Result<u32> {
        self.agent_logging(bins, extra, None)
    }

    /// [`Lab::agent`], with `log` (if any) receiving its stderr, the sampler at debug level.
    fn agent_logging(&mut self, bins: &Bins, extra: &[&str], log: Option<&Path>) -> Result<u32> {
        let endpoint = format!("127.0.0.1:{WATCHED_PORT}");
        let mut cmd = Command::new(&bins.lifeline);
        cmd.args(["run", "--endpoint", &endpoint, "--listen", AGENT_ADDR])
            .args(extra);
        let pid = match log {
            None => self.spawn(&mut cmd)?,
            Some(path) => {
                let file = fs::File::create(path).map_err(|e| Failed(format!("{}: {e}", path.display())))?;
                cmd.env("RUST_LOG", "info,lifeline::table::sampler=debug")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(file);
                let child = cmd
                    .spawn()
                    .map_err(|e| Failed(format!("{}: {e}", crate::show(&cmd))))?;
                let pid = child.id();
                self.children.push(child);
                pid
            }
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if matches!(
                http_get(AGENT_ADDR, "/readyz", Duration::from_secs(1)),
                Ok((200, _))
            ) {
                return Ok(pid);
            }
            thread::sleep(Duration::from_millis(100));
        }
        Err(Failed("the benchmark agent did not become ready in 20 s".into()))
    }

    /// bpftrace with the one-comparison filter; returns once its program is attached.
    fn bpftrace(&mut self) -> Result<u32> {
        self.bpftrace_running(BPFTRACE_PROGRAM)
    }

    /// bpftrace running `program`; returns once its program is attached.
    fn bpftrace_running(&mut self, program: &str) -> Result<u32> {
        self.bpftrace_with(&[], program)
    }

    /// bpftrace running `program` with `--unsafe`, which it asks for a uprobe on an address of
    /// a stripped binary (it cannot check the instruction boundary: the address must be one).
    fn bpftrace_unsafe(&mut self, program: &str) -> Result<u32> {
        self.bpftrace_with(&["--unsafe"], program)
    }

    fn bpftrace_with(&mut self, options: &[&str], program: &str) -> Result<u32> {
        let pid = self.spawn(Command::new("bpftrace").args(options).args(["-e", program]))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !prog_stats(pid).is_empty() {
                thread::sleep(Duration::from_millis(300));
                return Ok(pid);
            }
            thread::sleep(Duration::from_millis(100));
        }
        Err(Failed("bpftrace attached no program within 30 s".into()))
    }

    /// `ss` once a second inside the namespace, as a polling monitor would.
    fn ss_loop(&mut self) -> Result<u32> {
        let script = format!(
            "while :; do ss -tni state established '( dport = :{WATCHED_PORT} )' >/dev/null; sleep 1; done"
        );
        let mut cmd = self.in_ns("sh");
        cmd.args(["-c", &script]);
        self.spawn(&mut cmd)
    }

    /// Runs `ll-load ARGS` in the namespace to completion; returns its last line.
    fn load(&self, bins: &Bins, args: &[&str]) -> Result<String> {
        let out = self
            .in_ns(&bins.load)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Failed(format!("ll-load: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().last().unwrap_or_default().to_owned())
    }

    /// `ll-load serve --listen 127.0.0.1:PORT FLAG` in the namespace, given time to listen.
    fn serve(&mut self, bins: &Bins, port: u16, flag: &str) -> Result {
        let listen = format!("127.0.0.1:{port}");
        let mut server = self.in_ns(&bins.load);
        server.args(["serve", "--listen", &listen, flag]);
        self.spawn(&mut server)?;
        thread::sleep(Duration::from_millis(500));
        Ok(())
    }

    /// One churn of CHURN_SECONDS: connections per second.
    fn churn(&self, bins: &Bins) -> Result<f64> {
        self.repeat(bins, "churn", CHURN_PORT)
    }

    /// `ll-load MODE` (`churn`, `pingpong`) against 127.0.0.1:`port` for CHURN_SECONDS, two
    /// threads: connections per second.
    fn repeat(&self, bins: &Bins, mode: &str, port: u16) -> Result<f64> {
        let target = format!("127.0.0.1:{port}");
        let secs = CHURN_SECONDS.to_string();
        let last = self.load(
            bins,
            &[mode, "--connect", &target, "--seconds", &secs, "--threads", "2"],
        )?;
        let done: f64 = last
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Failed(format!("ll-load {mode} said {last:?}")))?;
        Ok(done / CHURN_SECONDS as f64)
    }
}

/// A running `ll-load hold`, whose connections stay open until it is dropped.
struct Hold {
    child: Child,
}

impl Hold {
    fn start(lab: &Lab, bins: &Bins, count: usize) -> Result<(Hold, String)> {
        Hold::start_with(lab, bins, count, &[])
    }

    fn start_with(lab: &Lab, bins: &Bins, count: usize, extra: &[&str]) -> Result<(Hold, String)> {
        let target = format!("127.0.0.1:{WATCHED_PORT}");
        let mut child = lab
            .in_ns(&bins.load)
            .args([
                "hold",
                "--connect",
                &target,
                "--count",
                &count.to_string(),
                "--threads",
                "4",
            ])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failed(format!("ll-load hold: {e}")))?;
        let stdout = child.stdout.take().expect("piped");
        let held = BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
            .find(|l| l.starts_with("held"))
            .unwrap_or_default();
        Ok((Hold { child }, held))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Waits until the agent lists at least `n` connections (or `timeout`); returns how many.
fn wait_listed(n: usize, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let listed = listed_connections();
        if listed >= n || Instant::now() > deadline {
            return listed;
        }
        thread::sleep(Duration::from_millis(500));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What the run found, section by section, as markdown.
#[derive(Default)]
struct Report {
    text: String,
}

impl Report {
    fn line(&mut self, line: impl AsRef<str>) {
        println!("{}", line.as_ref());
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }
}

fn machine() -> String {
    let uname = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let cores = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let mem = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "Linux {uname}, {cores} × {model}, {} GiB; load average at start {}; lifeline {rev}",
        mem / (1024 * 1024),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

pub fn bench(only: &[String]) -> Result {
    crate::require_root("the benchmark")?;
    const SECTIONS: [&str; 13] = [
        "churn",
        "segments",
        "tracked",
        "busy",
        "traps",
        "streams",
        "writes",
        "libssl",
        "controller",
        "burst",
        "storm",
        "neighbours",
        "detection",
    ];
    if let Some(unknown) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
        return Err(Failed(format!(
            "--only {unknown}: no such section (sections: {})",
            SECTIONS.join(", ")
        )));
    }
    let chosen = |name: &str| only.is_empty() || only.iter().any(|s| s == name);
    run(cargo().args(["build", "--release", "-p", "lifeline"]))?;
    // The same set of packages as the test workflow, so that dependencies are built once.
    run(cargo().args(["build", "-p", "lifeline", "-p", "lifeline-integration", "--bins"]))?;
    for tool in ["bpftrace", "bpftool", "ss"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(Failed(format!(
                "{tool} is not installed: run `cargo xtask setup`"
            )));
        }
    }
    let bins = Bins {
        lifeline: workspace().join("target/release/lifeline"),
        load: workspace().join("target/debug/ll-load"),
    };
    let mut report = Report::default();
    report.line("# Benchmarks");
    report.line("");
    report.line(format!(
        "Measured by `cargo xtask bench` in one run on: {}.",
        machine()
    ));
    report.line("");
    if chosen("churn") {
        churn_section(&bins, &mut report)?;
    }
    if chosen("segments") {
        segments::segments_section(&bins, &mut report)?;
    }
    if chosen("tracked") {
        tracked_section(&bins, &mut report)?;
    }
    if chosen("busy") {
        busy::busy_section(&bins, &mut report)?;
    }
    if chosen("traps") {
        traps::traps_section(&mut report)?;
    }
    if chosen("streams") {
        streams::streams_section(&bins, &mut report)?;
    }
    if chosen("writes") {
        writes::writes_section(&bins, &mut report)?;
    }
    if chosen("libssl") {
        libssl::libssl_section(&bins, &mut report)?;
    }
    if chosen("controller") {
        controller::controller_section(&bins, &mut report)?;
    }
    if chosen("burst") {
        burst_section(&bins, &mut report)?;
    }
    if chosen("storm") {
        storm_section(&bins, &mut report)?;
    }
    if chosen("neighbours") {
        neighbours::neighbours_section(&mut report)?;
    }
    if chosen("detection") {
        detection_section(&bins, &mut report)?;
    }
    if !only.is_empty() {
        eprintln!("(some sections only: docs/benchmarks.md left as it is)");
        return Ok(());
    }
    let path = workspace().join("docs/benchmarks.md");
    write_report(&path, &report.text)?;
    eprintln!("written to {}", path.display());
    Ok(())
}

/// Runs `cmd`, its stdout and stderr together; fails with them when it fails.
pub(super) fn run_captured(mut cmd: Command) -> Result<String> {
    let out = cmd.output().map_err(|e| Failed(format!("{cmd:?}: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(Failed(format!("{cmd:?} failed ({}):\n{text}", out.status)));
    }
    Ok(text)
}

fn write_report(path: &Path, text: &str) -> Result {
    fs::create_dir_all(path.parent().expect("docs/"))
        .and_then(|()| fs::write(path, text))
        .map_err(|e| Failed(format!("{}: {e}", path.display())))
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Observer {
    None,
    Lifeline,
    Bpftrace,
    Ss,
}

impl Observer {
    fn label(self) -> &'static str {
        match self {
            Observer::None => "no observer",
            Observer::Lifeline => "lifeline",
            Observer::Bpftrace => "bpftrace, one-comparison filter",
            Observer::Ss => "`ss` once a second",
        }
    }
}

/// What interleaved rounds measured, per observer: work done per second, that rate against no
/// observer's in the same round, the observer's programs' time per unit of work (bpf_stats,
/// all its programs) and their per-call costs (of the last round).
struct Tally<O> {
    /// No observer's rate in the current round (recorded first in each round).
    baseline: f64,
    rates: BTreeMap<O, Vec<f64>>,
    ratios: BTreeMap<O, Vec<f64>>,
    programs_ns: BTreeMap<O, Vec<f64>>,
    calls: BTreeMap<O, Vec<(String, u64, f64)>>,
}

impl<O: Ord + Copy> Tally<O> {
    fn new() -> Self {
        Self {
            baseline: f64::NAN,
            rates: BTreeMap::new(),
            ratios: BTreeMap::new(),
            programs_ns: BTreeMap::new(),
            calls: BTreeMap::new(),
        }
    }

    /// One window of `seconds` at `rate`, and the observer's programs' per-call costs over it
    /// (None: no observer, whose rate is the round's baseline: record it first).
    fn record(&mut self, observer: O, rate: f64, seconds: f64, rows: Option<Vec<(String, u64, f64)>>) {
        if rows.is_none() {
            self.baseline = rate;
        }
        if let Some(rows) = rows {
            let total: f64 = rows.iter().map(|(_, c, ns)| *c as f64 * ns).sum();
            self.programs_ns
                .entry(observer)
                .or_default()
                .push(total / (rate * seconds));
            self.calls.insert(observer, rows);
        }
        self.rates.entry(observer).or_default().push(rate);
        self.ratios
            .entry(observer)
            .or_default()
            .push(rate / self.baseline);
    }

    fn rate(&self, o: O) -> f64 {
        median(self.rates[&o].clone())
    }

    fn ratio(&self, o: O) -> f64 {
        median(self.ratios[&o].clone())
    }

    fn programs_ns(&self, o: O) -> Option<f64> {
        self.programs_ns.get(&o).map(|v| median(v.clone()))
    }

    /// `name: ns × calls; ...`, busiest first, or `—`.
    fn per_call_text(&self, o: O) -> String {
        self.calls
            .get(&o)
            .map(|rows| {
                rows.iter()
                    .map(|(n, c, ns)| format!("{n}: {ns:.1} ns × {c}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "—".into())
    }

    /// ns per call of program `name` of observer `o`.
    fn per_call(&self, o: O, name: &str) -> f64 {
        self.calls
            .get(&o)
            .and_then(|rows| rows.iter().find(|r| r.0 == name))
            .map_or(f64::NAN, |r| r.2)
    }
}

/// Runs `work` (it returns a rate) with observer `pid` attached (None: nobody): the rate, and
/// the observer's CPU seconds and its programs' per-call costs over the work; stops it.
#[allow(clippy::type_complexity)]
fn observed(
    lab: &mut Lab,
    pid: Option<u32>,
    work: impl FnOnce(&Lab) -> Result<f64>,
) -> Result<(f64, Option<(f64, Vec<(String, u64, f64)>)>)> {
    let (cpu0, stats0) = pid.map_or((0.0, BTreeMap::new()), |p| (cpu_seconds(p), prog_stats(p)));
    let rate = work(lab)?;
    let seen = pid.map(|p| {
        let seen = (cpu_seconds(p) - cpu0, per_call(&stats0, &prog_stats(p)));
        lab.stop(p);
        seen
    });
    Ok((rate, seen))
}

fn churn_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    lab.serve(bins, CHURN_PORT, "--close")?;
    lab.churn(bins)?; // warm-up

    let order = [
        Observer::None,
        Observer::Lifeline,
        Observer::Bpftrace,
        Observer::Ss,
    ];
    let mut tally = Tally::new();
    let mut cpu: BTreeMap<Observer, Vec<f64>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        for observer in order {
            let pid = match observer {
                Observer::None => None,
                Observer::Lifeline => Some(lab.agent(bins, &[])?),
                Observer::Bpftrace => Some(lab.bpftrace()?),
                Observer::Ss => Some(lab.ss_loop()?),
            };
            let (rate, seen) = observed(&mut lab, pid, |lab| lab.churn(bins))?;
            let rows = seen.map(|(cpu_s, rows)| {
                cpu.entry(observer)
                    .or_default()
                    .push(cpu_s / CHURN_SECONDS as f64);
                rows
            });
            eprintln!("{:<32} {rate:8.0} connections/s", observer.label());
            tally.record(observer, rate, CHURN_SECONDS as f64, rows);
        }
    }

    // Side by side: both attached, the same events, both attach orders.
    let mut side = Vec::new();
    for lifeline_first in [true, false] {
        let (a, b) = if lifeline_first {
            let a = lab.agent(bins, &[])?;
            (a, lab.bpftrace()?)
        } else {
            let b = lab.bpftrace()?;
            (lab.agent(bins, &[])?, b)
        };
        let (sa, sb) = (prog_stats(a), prog_stats(b));
        lab.churn(bins)?;
        let la = per_call(&sa, &prog_stats(a));
        let lb = per_call(&sb, &prog_stats(b));
        lab.stop(a);
        lab.stop(b);
        side.push((lifeline_first, la, lb));
    }

    report.line("## Unrelated churn");
    report.line("");
    report.line(format!(
        "A loopback connect/close loop (`ll-load churn`, 2 threads, the server closes first) for \
         {CHURN_SECONDS} s per observer, {ROUNDS} interleaved rounds (medians). Every connection \
         is unrelated: lifeline and bpftrace watch port {WATCHED_PORT}. ~10 \
         `inet_sock_set_state` calls per connection."
    ));
    report.line("");
    report.line(
        "| observer | connections/s | vs no observer | observer CPU | kernel cost per call (bpf_stats) |",
    );
    report.line("| --- | ---: | ---: | ---: | --- |");
    for observer in order {
        let cpu_text = cpu
            .get(&observer)
            .map(|v| format!("{:.1} ms/s", median(v.clone()) * 1000.0))
            .unwrap_or_else(|| "—".into());
        report.line(format!(
            "| {} | {:.0} | {:.3} | {} | {} |",
            observer.label(),
            tally.rate(observer),
            tally.ratio(observer),
            cpu_text,
            tally.per_call_text(observer),
        ));
    }
    report.line("");
    let programs = |o: Observer| tally.programs_ns(o).unwrap_or(f64::NAN);
    report.line(format!(
        "Programs' time per unrelated connection (bpf_stats, every program of the observer): \
         lifeline {:.1} ns, bpftrace {:.1} ns: {:.2}× (goal ≤ 1.1×).",
        programs(Observer::Lifeline),
        programs(Observer::Bpftrace),
        programs(Observer::Lifeline) / programs(Observer::Bpftrace)
    ));
    report.line("");
    report.line("Side by side (both attached to the same events; the first program on a tracepoint pays a little more):");
    report.line("");
    report.line("| attached first | lifeline first test | bpftrace | ratio |");
    report.line("| --- | ---: | ---: | ---: |");
    for (lifeline_first, la, lb) in &side {
        let first = |rows: &Vec<(String, u64, f64)>| rows.first().map_or(f64::NAN, |r| r.2);
        let (x, y) = (first(la), first(lb));
        report.line(format!(
            "| {} | {} {x:.1} ns | {y:.1} ns | {:.2} |",
            if *lifeline_first { "lifeline" } else { "bpftrace" },
            la.first().map_or("?", |r| r.0.as_str()),
            x / y
        ));
    }
    report.line("");
    Ok(())
}

fn tracked_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    let listen = format!("127.0.0.1:{WATCHED_PORT}");
    let mut server = lab.in_ns(&bins.load);
    server.args(["serve", "--listen", &listen]);
    lab.spawn(&mut server)?;
    let log = std::env::temp_dir().join(format!("llbench-{}-agent.log", std::process::id()));
    let agent = lab.agent_logging(bins, &[], Some(&log))?;
    thread::sleep(Duration::from_secs(2));
    report.line("## Tracked connections");
    report.line("");
    report.line(
        "Idle connections to the watched endpoint, all of one process, in one namespace (quiet: \
         sampled every 5 s, a connection with anything pending every second); agent CPU over \
         10 s after the table is complete. *Sampling* is the sampler's share of it (sock_diag \
         and merging the samples, timed by the agent itself, per connection and second); the \
         rest is the per-second judgement, views and metrics, and the event pump.",
    );
    report.line("");
    report.line(
        "| tracked | agent CPU | per connection | sampling per connection | RSS | anonymous / file-backed |",
    );
    report.line("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let idle0 = cpu_seconds(agent);
    thread::sleep(Duration::from_secs(10));
    let idle = (cpu_seconds(agent) - idle0) / 10.0;
    report.line(format!(
        "| 0 | {:.2} ms/s | — | — | {} MiB | {} / {} MiB |",
        idle * 1000.0,
        status_kib(agent, "VmRSS") / 1024,
        status_kib(agent, "RssAnon") / 1024,
        (status_kib(agent, "RssFile") + status_kib(agent, "RssShmem")) / 1024
    ));
    for n in [100usize, 1000, 10_000] {
        let (hold, held) = Hold::start(&lab, bins, n)?;
        let listed = wait_listed(n, Duration::from_secs(60));
        // Idle: past the agent's QUIET_AFTER (10 s unchanged), and a little more.
        thread::sleep(Duration::from_secs(13));
        let c0 = cpu_seconds(agent);
        let log_size = || fs::metadata(&log).map_or(0, |m| m.len());
        let log_from = log_size();
        thread::sleep(Duration::from_secs(10));
        let per_second = (cpu_seconds(agent) - c0) / 10.0;
        let sampling = sampling_us_per_socket(&log, (log_from, log_size()), 10.0, n);
        report.line(format!(
            "| {n} | {:.2} ms/s | {:.2} µs/s | {} | {} MiB | {} / {} MiB |",
            per_second * 1000.0,
            per_second * 1e6 / n as f64,
            sampling.map_or("?".into(), |us| format!("{us:.2} µs/s")),
            status_kib(agent, "VmRSS") / 1024,
            status_kib(agent, "RssAnon") / 1024,
            (status_kib(agent, "RssFile") + status_kib(agent, "RssShmem")) / 1024
        ));
        if listed < n {
            report.line(format!("(only {listed} of {n} listed; ll-load: {held})"));
        }
        drop(hold);
        wait_listed_at_most(0, Duration::from_secs(30));
    }
    report.line(format!(
        "\nPeak RSS (VmHWM) of the agent over the section: {} MiB.\n",
        status_kib(agent, "VmHWM") / 1024
    ));
    Ok(())
}

/// The sampler's CPU time per tracked socket and second, in µs: the rounds logged between
/// bytes `from` and `to` of `log` over `seconds` (the agent logs `tracked=N sampled=M
/// cpu_us=..` for each round, the sampling thread's CPU time: sock_diag, merging the samples,
/// owners and liveness; quiet connections are sampled every few seconds, so rounds differ,
/// and all of them count). None if no round tracked `n` sockets.
fn sampling_us_per_socket(log: &Path, (from, to): (u64, u64), seconds: f64, n: usize) -> Option<f64> {
    let text = fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(from as usize..to as usize)?);
    let field = |line: &str, name: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let rounds: Vec<f64> = text
        .lines()
        .filter(|l| l.contains("sampling round") && field(l, "tracked") == Some(n as f64))
        .filter_map(|l| field(l, "cpu_us"))
        .collect();
    (!rounds.is_empty()).then(|| rounds.iter().sum::<f64>() / seconds / n as f64)
}

fn wait_listed_at_most(n: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while listed_connections() > n && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(500));
    }
}

fn burst_section(bins: &Bins, report: &mut Report) -> Result {
    report.line("## Bursts");
    report.line("");
    report.line("N connects at once (4 threads of one process), a fresh agent each time.");
    report.line("");
    report.line("| connects | kernel events lost | listed |");
    report.line("| ---: | ---: | ---: |");
    for n in [1000usize, 5000, 10_000] {
        let mut lab = Lab::new()?;
        let listen = format!("127.0.0.1:{WATCHED_PORT}");
        let mut server = lab.in_ns(&bins.load);
        server.args(["serve", "--listen", &listen]);
        lab.spawn(&mut server)?;
        let agent = lab.agent(bins, &[])?;
        let (hold, _held) = Hold::start(&lab, bins, n)?;
        let listed = wait_listed(n, Duration::from_secs(30));
        let lost = metric("lifeline_ebpf_events_lost_total", &[]);
        report.line(format!("| {n} | {lost:.0} | {listed} |"));
        drop(hold);
        lab.stop(agent);
    }
    report.line("");
    Ok(())
}

fn storm_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    let agent = lab.agent(bins, &[])?;
    thread::sleep(Duration::from_secs(2));
    let rss0 = status_kib(agent, "VmRSS");
    let stop = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(Mutex::new((Duration::ZERO, 0u32, 0u32)));
    let poller = {
        let (stop, worst) = (stop.clone(), worst.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = matches!(
                    http_get(AGENT_ADDR, "/healthz", Duration::from_secs(10)),
                    Ok((200, _))
                );
                let mut w = worst.lock().expect("lock");
                w.0 = w.0.max(t.elapsed());
                w.1 += 1;
                w.2 += u32::from(!ok);
                drop(w);
                thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Nothing listens on the watched port in this namespace: every connect is refused.
    let target = format!("127.0.0.1:{WATCHED_PORT}");
    let mut storm = lab
        .in_ns(&bins.load)
        .args([
            "refuse",
            "--connect",
            &target,
            "--seconds",
            "10",
            "--threads",
            "2",
            "--linger",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Failed(format!("ll-load refuse: {e}")))?;
    let done = BufReader::new(storm.stdout.take().expect("piped"))
        .lines()
        .map_while(std::result::Result::ok)
        .find(|l| l.starts_with("done"))
        .unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    let _ = poller.join();
    thread::sleep(Duration::from_secs(3));
    let refused: f64 = done
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let counted = metric("lifeline_client_connect_failures_total", &["comm=\"ll-load\""]);
    let lost = metric("lifeline_ebpf_events_lost_total", &[]);
    let sent = metric("lifeline_ebpf_events_total", &[]);
    let rss1 = status_kib(agent, "VmRSS");
    drop(storm.stdin.take());
    let _ = storm.wait();
    let (slowest, polls, failed) = *worst.lock().expect("lock");
    report.line("## Connect storm");
    report.line("");
    report.line("One process connecting to a refusing endpoint as fast as it can for 10 s (2 threads).");
    report.line("");
    report.line("| refused connects | counted by lifeline | events sent | events lost | slowest `/healthz` (of n, failed) | RSS growth |");
    report.line("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut line = String::new();
    let _ = write!(
        line,
        "| {refused:.0} | {counted:.0} | {sent:.0} | {lost:.0} | {} ms ({polls}, {failed}) | {} KiB |",
        slowest.as_millis(),
        rss1 as i64 - rss0 as i64
    );
    report.line(line);
    report.line("");
    Ok(())
}

/// Thresholds for the detection runs, shortened (the defaults take minutes); each run may
/// override one.
const DETECTION_FLAGS: [(&str, &str); 4] = [
    ("--disconnect-grace", "5s"),
    ("--stale-after", "10s"),
    ("--blackhole-after", "10s"),
    ("--min-client-age", "2s"),
];

/// What the agent reports for `pid`, if it lists it.
fn client(pid: u32) -> Option<serde_json::Value> {
    let (_, body) = http_get(AGENT_ADDR, "/api/v1/clients", Duration::from_secs(5)).ok()?;
    let clients: serde_json::Value = serde_json::from_str(&body).ok()?;
    clients
        .as_array()?
        .iter()
        .find(|c| c["pid"].as_u64() == Some(u64::from(pid)))
        .cloned()
}

/// Polls until `pid` is judged to be in `state` (a process listed as `healthy` because it is
/// not judged yet, before `--min-client-age`, is not); the time since `since`, or None after
/// `timeout`.
fn wait_state(pid: u32, state: &str, since: Instant, timeout: Duration) -> Option<Duration> {
    while since.elapsed() < timeout {
        let judged = client(pid).is_some_and(|c| {
            c["state"] == state
                && !c["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("not judged yet")
        });
        if judged {
            return Some(since.elapsed());
        }
        thread::sleep(Duration::from_millis(100));
    }
    None
}

/// The detection flags with `override_` (flag, value) replacing its default.
fn detection_flags(override_: Option<(&'static str, &'static str)>) -> Vec<&'static str> {
    DETECTION_FLAGS
        .iter()
        .map(|&(flag, value)| match override_ {
            Some((f, v)) if f == flag => (flag, v),
            _ => (flag, value),
        })
        .flat_map(|(f, v)| [f, v])
        .collect()
}

fn detection_section(bins: &Bins, report: &mut Report) -> Result {
    report.line("## Detection latency");
    report.line("");
    report.line(format!(
        "Each signature provoked once, with shortened thresholds ({}): the time from the fault \
         to the state change in `/api/v1/clients` (polled every 100 ms), against the threshold.",
        DETECTION_FLAGS.map(|(f, v)| format!("`{f} {v}`")).join(", ")
    ));
    report.line("");
    report.line("| signature | fault | threshold | detected after |");
    report.line("| --- | --- | ---: | ---: |");
    let listen = format!("127.0.0.1:{WATCHED_PORT}");
    let timeout = Duration::from_secs(90);
    let shown =
        |d: Option<Duration>| d.map_or("not within 90 s".into(), |d| format!("{:.1} s", d.as_secs_f64()));

    // disconnected: the server goes away, the client never dials again.
    {
        let mut lab = Lab::new()?;
        let mut server = lab.in_ns(&bins.load);
        server.args(["serve", "--listen", &listen]);
        let server = lab.spawn(&mut server)?;
        lab.agent(bins, &detection_flags(None))?;
        let (hold, _) = Hold::start(&lab, bins, 1)?;
        let pid = hold.child.id();
        let ready = wait_state(pid, "healthy", Instant::now(), Duration::from_secs(30)).is_some();
        let t0 = Instant::now();
        lab.stop(server);
        let took = ready
            .then(|| wait_state(pid, "disconnected", t0, timeout))
            .flatten();
        report.line(format!(
            "| disconnected | the server exits (FIN), the client never re-dials | disconnect_grace 5 s | {} |",
            shown(took)
        ));
    }
    // stale: requests sent, nothing ever answered.
    {
        let mut lab = Lab::new()?;
        let mut server = lab.in_ns(&bins.load);
        server.args(["serve", "--listen", &listen]);
        lab.spawn(&mut server)?;
        lab.agent(bins, &detection_flags(None))?;
        let t0 = Instant::now();
        // Every 3 s: requests in consecutive one-second samples are an upload, not a wait.
        let (hold, _) = Hold::start_with(&lab, bins, 1, &["--send-every", "3"])?;
        let took = wait_state(hold.child.id(), "stale", t0, timeout);
        report.line(format!(
            "| stale | a 200-byte request every 3 s, never answered | stale_after 10 s | {} |",
            shown(took)
        ));
    }
    // blackholed: the path drops everything while the client sends.
    {
        let mut lab = Lab::new()?;
        let mut server = lab.in_ns(&bins.load);
        server.args(["serve", "--listen", &listen]);
        lab.spawn(&mut server)?;
        lab.agent(bins, &detection_flags(Some(("--stale-after", "300s"))))?;
        let (hold, _) = Hold::start_with(&lab, bins, 1, &["--send-every", "1"])?;
        let pid = hold.child.id();
        let ready = wait_state(pid, "healthy", Instant::now(), Duration::from_secs(30)).is_some();
        let port = WATCHED_PORT.to_string();
        run(lab
            .in_ns("iptables")
            .args(["-A", "INPUT", "-p", "tcp", "--dport", &port, "-j", "DROP"]))?;
        let t0 = Instant::now();
        let took = ready
            .then(|| wait_state(pid, "blackholed", t0, timeout))
            .flatten();
        report.line(format!(
            "| blackholed | every segment to the server dropped (iptables) | blackhole_after 10 s | {} |",
            shown(took)
        ));
    }
    // unreachable: nothing listens; one connect a second, each refused.
    {
        let mut lab = Lab::new()?;
        lab.agent(bins, &detection_flags(None))?;
        let target = format!("127.0.0.1:{WATCHED_PORT}");
        let mut refuse = lab.in_ns(&bins.load);
        refuse.args([
            "refuse",
            "--connect",
            &target,
            "--rate",
            "1",
            "--threads",
            "1",
            "--seconds",
            "120",
            "--linger",
        ]);
        let t0 = Instant::now();
        let pid = lab.spawn(&mut refuse)?;
        let took = wait_state(pid, "unreachable", t0, timeout);
        report.line(format!(
            "| unreachable | one refused connect a second | 3 failures: ~2 s | {} |",
            shown(took)
        ));
    }
    report.line("");
    Ok(())
}
