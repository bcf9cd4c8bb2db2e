//! Go clients' streams: what the uprobes on a Go client's `crypto/tls` and HTTP/2 framer cost.
//! Several Go clients watch the fixture apiserver's pods, which it changes every 10 ms: a DATA
//! frame per event on every watch, one output line per event; first `kubectl get pods -w` of
//! kubectl 1.20 (Go 1.19, stripped, as built for Kubernetes 1.20), then the image's kubectl 1.32
//! (Go 1.23), then the client-go 0.32 informer of the real-cluster tier built with go1.24
//! (`tests/clients/informer --pods`). The same processes run through each one's rounds; in
//! interleaved rounds nobody observes them, the connection-only agent (`--no-go-probes`)
//! does, or the agent with its Go probes does.
//! Beside them, as a control group, as many watches run a copy of the same binary (a file of
//! its own: the uprobes the agent attaches to the original's inode do not fire in them)
//! against a second fixture on CONTROL_PORT, which no agent watches: this machine's speed
//! drifts between windows by more than issue 26's 3 %, and the copies, measured in the same
//! windows, drift with it.
//! Printed: the clients' events per second and CPU per event against no observer, the copies'
//! CPU per event, issue 26 item 2 (the clients' CPU per event over the copies', against the
//! same ratio in the round's no-agent window, with the connection-only agent's as the noise
//! floor), the kernel's cost per probed call (`kernel.bpf_stats_enabled`) beside the copies
//! and alone (the copies stopped), the agent's CPU per stream record over the connection-only
//! agent's; then a client that runs no probed Go binary (python's OpenSSL, while the kubectl
//! 1.20 watches and their copies are stopped, the probes still attached) against no observer:
//! the Go probes' calls meanwhile, and its own OpenSSL probes' runs and cost per request.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use super::{
    cpu_seconds, http_get, median, metric, per_call, prog_stats, Bins, Lab, Report, AGENT_ADDR,
    PER_CALL_GOAL_NS, WATCHED_PORT,
};
use crate::setup::{KUBECTL_1_20, KUBECTL_1_32_ITSELF};
use crate::{informer, workspace, Failed, Result};

/// A Go client whose watch of pods is measured.
struct Client {
    path: &'static str,
    /// What it is, for the report.
    label: &'static str,
    /// How it is run: `kubectl get pods -w`, or the informer with `--pods`.
    kind: ClientKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ClientKind {
    Kubectl,
    Informer,
}

impl ClientKind {
    /// What it runs, for the report.
    fn command(self) -> &'static str {
        match self {
            ClientKind::Kubectl => "kubectl get pods -w",
            ClientKind::Informer => "informer --pods",
        }
    }
}

/// Issue 26 item 2: the kubectl of Kubernetes 1.20, the image's kubectl 1.32, and a client-go
/// 0.32 informer built with go1.24.
const CLIENTS: [Client; 3] = [
    Client {
        path: KUBECTL_1_20,
        label: "kubectl 1.20: Go 1.19, stripped",
        kind: ClientKind::Kubectl,
    },
    Client {
        path: KUBECTL_1_32_ITSELF,
        label: "the image's kubectl 1.32: Go 1.23",
        kind: ClientKind::Kubectl,
    },
    Client {
        path: informer::BIN,
        label: "a client-go 0.32 informer: Go 1.24, stripped",
        kind: ClientKind::Informer,
    },
];
/// Watches at once (each its own client process and connection).
const WATCHES: usize = 4;
/// The control group's fixture: not WATCHED_PORT, the one endpoint the bench's agents watch
/// (`Lab::agent`), so the copies' connections are not even tracked.
const CONTROL_PORT: u16 = WATCHED_PORT + 1;
const EVENT_INTERVAL: &str = "10ms";
/// Issue 26 item 2's goal: the probed clients' CPU per event, against no observer.
const CLIENT_CPU_GOAL: f64 = 1.03;
/// Seconds measured per observer and round.
const SECONDS: u64 = 10;
const ROUNDS: usize = 8;
/// Seconds of the kernel's cost per probed call measured with the copies stopped.
const ALONE_SECONDS: u64 = 5;
/// Seconds of the python client per observer.
const PYTHON_SECONDS: &str = "5";
/// Keep-alive HTTPS GETs over one connection for ARGV[3] seconds; prints `done N`.
pub(super) const PYTHON_CLIENT: &str = r#"
import http.client, ssl, sys, time
c = http.client.HTTPSConnection(sys.argv[1], int(sys.argv[2]), context=ssl._create_unverified_context())
n, end = 0, time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.request("GET", "/api/v1/namespaces/default/pods/web-0", headers={"Authorization": "Bearer x"})
    c.getresponse().read()
    n += 1
print("done", n)
"#;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Observer {
    None,
    Connections,
    Streams,
}

impl Observer {
    fn label(self) -> &'static str {
        match self {
            Observer::None => "no agent",
            Observer::Connections => "agent, connection-only (`--no-go-probes`)",
            Observer::Streams => "agent with the Go probes",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Observer::Connections => &["--no-go-probes"],
            _ => &[],
        }
    }
}

/// One client's watch, its output lines (one per event) counted.
pub(super) struct Watch {
    pub(super) child: Child,
    pub(super) lines: Arc<AtomicU64>,
}

impl Watch {
    /// Starts `binary`, a `client`, against `fixture`.
    fn start(lab: &Lab, client: &Client, binary: &Path, fixture: &Fixture) -> Result<Watch> {
        let server = format!("https://127.0.0.1:{}", fixture.port);
        let mut command = lab.in_ns(binary);
        match client.kind {
            ClientKind::Kubectl => command
                .args(["--server", &server, "--insecure-skip-tls-verify", "--token", "x"])
                .args(["get", "pods", "-w"]),
            ClientKind::Informer => command.arg("--pods").arg("--kubeconfig").arg(&fixture.kubeconfig),
        };
        Watch::spawn(command, binary)
    }

    /// Starts `command`, which runs `binary`, its output lines counted.
    pub(super) fn spawn(mut command: std::process::Command, binary: &Path) -> Result<Watch> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failed(format!("{}: {e}", binary.display())))?;
        let lines = Arc::new(AtomicU64::new(0));
        let out = child.stdout.take().expect("piped");
        let counted = lines.clone();
        thread::spawn(move || {
            for _ in BufReader::new(out).lines().map_while(std::result::Result::ok) {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(Watch { child, lines })
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// WATCHES watches of `binary`, a `client`, against `fixture`; those started are killed if one
/// fails to start.
fn start_watches(lab: &Lab, client: &Client, binary: &Path, fixture: &Fixture) -> Result<Vec<Watch>> {
    (0..WATCHES)
        .map(|_| Watch::start(lab, client, binary, fixture))
        .collect()
}

fn signal_all(watches: &[Watch], sig: i32) {
    for w in watches {
        w.signal(sig);
    }
}

/// A copy of `client`'s binary in `dir`: a file of its own, so that the uprobes the agent
/// attaches to the original (by inode) do not fire in the processes that run it. `fs::copy`
/// copies the permission bits too: it stays executable.
fn copy_binary(client: &Client, dir: &Path) -> Result<PathBuf> {
    let from = Path::new(client.path);
    let to = dir.join(from.file_name().expect("a binary's file name"));
    fs::copy(from, &to).map_err(|e| Failed(format!("copying {} to {}: {e}", client.path, to.display())))?;
    Ok(to)
}

/// A fixture apiserver in the lab: its port, and a kubeconfig for it.
pub(super) struct Fixture {
    pub(super) port: u16,
    kubeconfig: PathBuf,
}

impl Fixture {
    /// Starts one on 127.0.0.1:`port` with its certificates and kubeconfig in `dir`, changing
    /// a pod every EVENT_INTERVAL.
    pub(super) fn start(lab: &mut Lab, port: u16, dir: &Path) -> Result<Fixture> {
        fs::create_dir_all(dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        let listen = format!("127.0.0.1:{port}");
        let mut server = lab.in_ns(workspace().join("target/debug/ll-apiserver"));
        server.args(["--listen", &listen, "--cert-dir"]).arg(dir);
        // The fixture ends a watch after 60 s by default, and `kubectl get -w` exits then.
        server.args(["--event-interval", EVENT_INTERVAL, "--watch-timeout", "1h"]);
        lab.spawn(&mut server)?;
        let kubeconfig = dir.join("kubeconfig");
        fs::write(&kubeconfig, fixture_kubeconfig(&format!("https://{listen}")))
            .map_err(|e| Failed(format!("{}: {e}", kubeconfig.display())))?;
        Ok(Fixture { port, kubeconfig })
    }
}

/// A directory of the bench's own (the fixtures' certificates, the copies), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("llbench-{}-streams", std::process::id()));
        fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The output lines and CPU seconds of a group of watches, read at one moment.
#[derive(Clone, Copy)]
struct Tally {
    lines: u64,
    cpu: f64,
}

impl Tally {
    fn of(watches: &[Watch]) -> Tally {
        Tally {
            lines: watches.iter().map(|w| w.lines.load(Ordering::Relaxed)).sum(),
            cpu: watches.iter().map(|w| cpu_seconds(w.child.id())).sum(),
        }
    }

    /// Events per second and CPU µs per event from `before` to this one, `secs` apart.
    fn since(self, before: Tally, secs: f64) -> (f64, f64) {
        let events = self.lines - before.lines;
        (
            events as f64 / secs,
            (self.cpu - before.cpu) * 1e6 / events.max(1) as f64,
        )
    }
}

/// What one window measured.
#[derive(Default)]
struct Window {
    events_per_second: f64,
    client_us_per_event: f64,
    /// The copies', in the same window: the machine's speed at the time.
    copies_events_per_second: f64,
    copies_us_per_event: f64,
    agent_cpu: f64,
    records: f64,
    /// Frames the agent could not place in their stream (`lost_place`): evidence lost on a
    /// healthy client, which makes its judgement incomplete while it lasts.
    lost_place: f64,
    calls: Vec<Call>,
}

impl Window {
    /// The probed clients' CPU per event over the copies': what the probes cost them, times
    /// the same for both groups (the machine's speed), which drifts from window to window.
    fn over_copies(&self) -> f64 {
        self.client_us_per_event / self.copies_us_per_event
    }
}

/// One probe program's calls in a window, and its kernel run time per call in ns.
type Call = (String, u64, f64);

/// The Go probes' calls between two `prog_stats` readings.
fn go_calls(before: &BTreeMap<u32, (u64, u64)>, after: &BTreeMap<u32, (u64, u64)>) -> Vec<Call> {
    calls_of("go_", before, after)
}

/// The calls of the programs whose names start with `prefix` between two `prog_stats`
/// readings.
fn calls_of(
    prefix: &str,
    before: &BTreeMap<u32, (u64, u64)>,
    after: &BTreeMap<u32, (u64, u64)>,
) -> Vec<Call> {
    per_call(before, after)
        .into_iter()
        .filter(|c| c.0.starts_with(prefix))
        .collect()
}

/// Whether the agent says every watch's process has `visibility: streams`.
pub(super) fn all_streams(pids: &[u32]) -> bool {
    let Ok((_, body)) = http_get(AGENT_ADDR, "/api/v1/clients", Duration::from_secs(5)) else {
        return false;
    };
    let Ok(serde_json::Value::Array(clients)) = serde_json::from_str(&body) else {
        return false;
    };
    pids.iter().all(|pid| {
        clients
            .iter()
            .any(|c| c["pid"].as_u64() == Some(u64::from(*pid)) && c["visibility"] == "streams")
    })
}

/// One window of the probed `watches` and their `copies`, with `agent` (if any) observing.
fn measure(watches: &[Watch], copies: &[Watch], agent: Option<u32>) -> Window {
    let records = || metric("lifeline_ebpf_events_total", &["kind=\"stream\""]);
    let lost_place = || metric("lifeline_ebpf_records_dropped_total", &["cause=\"lost_place\""]);
    let (w0, c0, t0) = (Tally::of(watches), Tally::of(copies), Instant::now());
    let (a0, s0, r0, p0) = agent.map_or((0.0, BTreeMap::new(), 0.0, 0.0), |p| {
        (cpu_seconds(p), prog_stats(p), records(), lost_place())
    });
    thread::sleep(Duration::from_secs(SECONDS));
    let (w1, c1, secs) = (Tally::of(watches), Tally::of(copies), t0.elapsed().as_secs_f64());
    let (events_per_second, client_us_per_event) = w1.since(w0, secs);
    let (copies_events_per_second, copies_us_per_event) = c1.since(c0, secs);
    let mut w = Window {
        events_per_second,
        client_us_per_event,
        copies_events_per_second,
        copies_us_per_event,
        ..Window::default()
    };
    if let Some(p) = agent {
        w.agent_cpu = (cpu_seconds(p) - a0) / secs;
        w.records = records() - r0;
        w.lost_place = lost_place() - p0;
        w.calls = go_calls(&s0, &prog_stats(p));
    }
    w
}

/// The Go probes' kernel cost per call with the copies stopped (SIGSTOP) for ALONE_SECONDS:
/// the probed watches alone on the CPUs, as when the copies did not run.
fn calls_alone(lab: &mut Lab, bins: &Bins, copies: &[Watch], pids: &[u32]) -> Result<Vec<Call>> {
    let agent = observe(lab, bins, Observer::Streams, pids)?.expect("the Go probes' agent");
    signal_all(copies, libc::SIGSTOP);
    let before = prog_stats(agent);
    thread::sleep(Duration::from_secs(ALONE_SECONDS));
    let calls = go_calls(&before, &prog_stats(agent));
    signal_all(copies, libc::SIGCONT);
    lab.stop(agent);
    Ok(calls)
}

/// Runs the python client in the namespace: requests per second.
fn python(lab: &Lab) -> Result<f64> {
    python_rate(lab, PYTHON_CLIENT, WATCHED_PORT, PYTHON_SECONDS)
}

/// Runs `script` (keep-alive requests to 127.0.0.1:`port` for `seconds`, printing `done N`)
/// with python3 in the namespace: requests per second.
pub(super) fn python_rate(lab: &Lab, script: &str, port: u16, seconds: &str) -> Result<f64> {
    let port = port.to_string();
    let out = lab
        .in_ns("python3")
        .args(["-c", script, "127.0.0.1", &port, seconds])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failed(format!("python3: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let n: f64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Failed(format!("the python client said {text:?}")))?;
    Ok(n / seconds.parse::<f64>().expect("seconds"))
}

/// Starts an agent for `observer` (None for no agent) and waits until it follows the watches
/// (every one `visibility: streams` with the probes; a few seconds otherwise).
fn observe(lab: &mut Lab, bins: &Bins, observer: Observer, pids: &[u32]) -> Result<Option<u32>> {
    if observer == Observer::None {
        thread::sleep(Duration::from_secs(3));
        return Ok(None);
    }
    let agent = lab.agent(bins, observer.flags())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    thread::sleep(Duration::from_secs(3));
    while observer == Observer::Streams && !all_streams(pids) {
        if Instant::now() > deadline {
            return Err(Failed(
                "the watches were not followed by streams within 30 s".into(),
            ));
        }
        thread::sleep(Duration::from_millis(500));
    }
    Ok(Some(agent))
}

/// What the rounds of one client measured, per observer: its windows, and each window
/// against the round's no-agent window.
struct Measured {
    windows: BTreeMap<Observer, Vec<Window>>,
    ratios: BTreeMap<Observer, Ratios>,
}

/// One observer's windows, round by round, each over its round's no-agent window.
#[derive(Default)]
struct Ratios {
    /// The clients' events per second.
    rate: Vec<f64>,
    /// The clients' CPU per event.
    cpu: Vec<f64>,
    /// Issue 26 item 2: the clients' CPU per event over the copies' ([`Window::over_copies`]):
    /// the machine's drift, shared by both groups, divides out.
    item2: Vec<f64>,
}

/// The python client's requests/s beside one observer, the Go probes' calls meanwhile, the
/// OpenSSL probes' runs per request (python is a client of the watched endpoint: the agent
/// follows it through its libssl), and whether kubectl's binary was still probed (None: no
/// agent).
type PythonRow = (Observer, f64, u64, f64, Option<bool>);

const ORDER: [Observer; 3] = [Observer::None, Observer::Connections, Observer::Streams];

pub(super) fn streams_section(bins: &Bins, report: &mut Report) -> Result {
    if let Some(missing) = CLIENTS.iter().find(|k| !Path::new(k.path).is_file()) {
        return Err(Failed(format!(
            "{} is missing: run `cargo xtask setup`",
            missing.path
        )));
    }
    let mut lab = Lab::new()?;
    let scratch = Scratch::new()?;
    let watched = Fixture::start(&mut lab, WATCHED_PORT, &scratch.0.join("watched"))?;
    let control = Fixture::start(&mut lab, CONTROL_PORT, &scratch.0.join("control"))?;
    thread::sleep(Duration::from_secs(2));

    report.line("## Go clients' streams");
    report.line("");
    let mut python_rows = Vec::new();
    for (index, client) in CLIENTS.iter().enumerate() {
        let copy = copy_binary(client, &scratch.0)?;
        let watches = start_watches(&lab, client, Path::new(client.path), &watched)?;
        let copies = start_watches(&lab, client, &copy, &control)?;
        let pids: Vec<u32> = watches.iter().map(|w| w.child.id()).collect();
        thread::sleep(Duration::from_secs(3));
        let measured = rounds(&mut lab, bins, client, (&watches, &copies), &pids)?;
        let alone = calls_alone(&mut lab, bins, &copies, &pids)?;
        report_rounds(report, client, &measured, &alone);
        if index == 0 {
            python_rows = python_beside(&mut lab, bins, (&watches, &copies), &pids)?;
        }
    }
    report_python(report, python_rows);
    Ok(())
}

/// A kubeconfig for the fixture at `server`: any bearer token, its certificate not verified.
fn fixture_kubeconfig(server: &str) -> String {
    [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- name: fixture",
        "  cluster:",
        &format!("    server: {server}"),
        "    insecure-skip-tls-verify: true",
        "users:",
        "- name: bench",
        "  user:",
        "    token: x",
        "contexts:",
        "- name: fixture",
        "  context:",
        "    cluster: fixture",
        "    user: bench",
        "current-context: fixture",
        "",
    ]
    .join("\n")
}

/// The probed watches and their copies.
type Groups<'a> = (&'a [Watch], &'a [Watch]);

/// The interleaved rounds of one client's watches, and of their copies in the same windows.
fn rounds(lab: &mut Lab, bins: &Bins, client: &Client, groups: Groups, pids: &[u32]) -> Result<Measured> {
    let mut windows: BTreeMap<Observer, Vec<Window>> = BTreeMap::new();
    let mut ratios: BTreeMap<Observer, Ratios> = BTreeMap::new();
    for round in 0..ROUNDS {
        // Each round starts with another observer: a client whose cost per event drifts (its
        // heap grows, the machine's other work comes and goes) favours no observer.
        let mut order = ORDER;
        order.rotate_left(round % ORDER.len());
        let mut measured = BTreeMap::new();
        for observer in order {
            let agent = observe(lab, bins, observer, pids)?;
            let w = measure(groups.0, groups.1, agent);
            if let Some(a) = agent {
                lab.stop(a);
            }
            if w.events_per_second < 1.0 || w.copies_events_per_second < 1.0 {
                return Err(Failed(format!(
                    "{}, round {round}, {}: the watches or their copies printed no event (did they exit?)",
                    client.path,
                    observer.label()
                )));
            }
            eprintln!(
                "{}, round {round}: {:<44} {:6.0} events/s, client {:6.1} µs/event, copies {:6.1} µs/event, agent {:.2} ms/s, {:.0} stream records, {:.0} lost place",
                client.label,
                observer.label(),
                w.events_per_second,
                w.client_us_per_event,
                w.copies_us_per_event,
                w.agent_cpu * 1000.0,
                w.records,
                w.lost_place
            );
            measured.insert(observer, w);
        }
        let baseline = &measured[&Observer::None];
        let (rate, cpu, item2) = (
            baseline.events_per_second,
            baseline.client_us_per_event,
            baseline.over_copies(),
        );
        for (observer, w) in measured {
            let r = ratios.entry(observer).or_default();
            r.rate.push(w.events_per_second / rate);
            r.cpu.push(w.client_us_per_event / cpu);
            r.item2.push(w.over_copies() / item2);
            windows.entry(observer).or_default().push(w);
        }
    }
    Ok(Measured { windows, ratios })
}

/// A client that runs no probed Go binary: the kubectls and their copies stopped (still
/// connected, the original binary still probed), a python OpenSSL client's requests against
/// each observer (the agent follows it through its libssl: its own probes' runs are counted).
fn python_beside(lab: &mut Lab, bins: &Bins, groups: Groups, pids: &[u32]) -> Result<Vec<PythonRow>> {
    signal_all(groups.0, libc::SIGSTOP);
    signal_all(groups.1, libc::SIGSTOP);
    let mut python_rows = Vec::new();
    for observer in ORDER {
        let agent = match observer {
            Observer::None => None,
            // Probes still attached to kubectl's binary while it is stopped.
            _ => observe(lab, bins, observer, &[])?,
        };
        if observer == Observer::Streams {
            // The stopped kubectls are followed (their probes attached) before python runs.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !all_streams(pids) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(500));
            }
        }
        let before = agent.map(prog_stats);
        let rate = python(lab)?;
        let (calls, ssl_runs): (u64, u64) = match (agent, before) {
            (Some(a), Some(b)) => {
                let after = prog_stats(a);
                let sum = |calls: Vec<Call>| calls.iter().map(|c| c.1).sum();
                (sum(go_calls(&b, &after)), sum(calls_of("ssl_", &b, &after)))
            }
            _ => (0, 0),
        };
        let requests = rate * PYTHON_SECONDS.parse::<f64>().expect("seconds");
        let ssl_per_request = ssl_runs as f64 / requests.max(1.0);
        let attached = agent.map(|_| all_streams(pids));
        if let Some(a) = agent {
            lab.stop(a);
        }
        eprintln!(
            "python with {:<44} {rate:6.0} requests/s, go_* calls {calls}, ssl_* runs per \
             request {ssl_per_request:.1}",
            observer.label()
        );
        python_rows.push((observer, rate, calls, ssl_per_request, attached));
    }
    signal_all(groups.0, libc::SIGCONT);
    signal_all(groups.1, libc::SIGCONT);
    Ok(python_rows)
}

/// One client's table, issue 26 item 2, the agent's CPU and the kernel's cost per probed call
/// (`alone`: the Go probes' calls with the copies stopped).
fn report_rounds(report: &mut Report, client: &Client, measured: &Measured, alone: &[Call]) {
    let Measured { windows, ratios } = measured;
    report.line(format!(
        "{WATCHES} `{}` ({}) on the fixture \
         apiserver, which changes a pod every {EVENT_INTERVAL} (a DATA frame per event on every \
         watch, one output line per event); the same processes throughout, {SECONDS} s per \
         observer, {ROUNDS} interleaved rounds, each starting with another observer (medians; \
         ratios against the round's no-agent window). Client CPU is the clients' own (all threads) per event they printed. \
         In the same windows, {WATCHES} copies of the binary (a file of their own, which the \
         probes are not attached to) watch a second fixture, on port {CONTROL_PORT}, which no \
         agent watches, changing a pod as often: the machine's speed at the time.",
        client.kind.command(),
        client.label
    ));
    report.line("");
    report.line("| observer | events/s | vs no agent | client CPU per event | vs no agent | copies' CPU per event | agent CPU | stream records/s | frames that lost their place (all windows) |");
    report.line("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let med = |o: Observer, f: fn(&Window) -> f64| median(windows[&o].iter().map(f).collect());
    for observer in ORDER {
        let r = &ratios[&observer];
        report.line(format!(
            "| {} | {:.0} | {:.3} | {:.1} µs | {:.3} | {:.1} µs | {} | {} | {} |",
            observer.label(),
            med(observer, |w| w.events_per_second),
            median(r.rate.clone()),
            med(observer, |w| w.client_us_per_event),
            median(r.cpu.clone()),
            med(observer, |w| w.copies_us_per_event),
            if observer == Observer::None {
                "—".to_owned()
            } else {
                format!("{:.2} ms/s", med(observer, |w| w.agent_cpu) * 1000.0)
            },
            if observer == Observer::None {
                "—".to_owned()
            } else {
                format!("{:.0}", med(observer, |w| w.records) / SECONDS as f64)
            },
            if observer == Observer::Streams {
                format!(
                    "{:.0} of {:.0} records",
                    windows[&observer].iter().map(|w| w.lost_place).sum::<f64>(),
                    windows[&observer].iter().map(|w| w.records).sum::<f64>()
                )
            } else {
                "—".to_owned()
            },
        ));
    }
    report_item2(report, ratios);
    report_agent_cost(report, windows);
    report_per_call(report, &windows[&Observer::Streams], alone);
}

/// Issue 26 item 2 for the Go probes against its goal, and for the connection-only agent
/// (which costs the client nothing): the noise floor.
fn report_item2(report: &mut Report, ratios: &BTreeMap<Observer, Ratios>) {
    let rounds = |o: Observer| {
        let values = &ratios[&o].item2;
        let each: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
        (median(values.clone()), each.join(", "))
    };
    report.line("");
    report.line(format!(
        "Issue 26 item 2, the clients' CPU per event over their copies' in the same window, \
         against that ratio in the round's no-agent window (median of {ROUNDS} rounds; each \
         round's in order):"
    ));
    report.line("");
    let (streams, each) = rounds(Observer::Streams);
    report.line(format!(
        "- {}: {streams:.3} ({each}); goal ≤ {CLIENT_CPU_GOAL:.2}: {}",
        Observer::Streams.label(),
        if streams <= CLIENT_CPU_GOAL {
            "met"
        } else {
            "not met"
        }
    ));
    let (floor, each) = rounds(Observer::Connections);
    report.line(format!(
        "- the noise floor, {}: {floor:.3} ({each})",
        Observer::Connections.label()
    ));
}

/// The agent's CPU per stream record and per probed call, over the connection-only agent's.
fn report_agent_cost(report: &mut Report, windows: &BTreeMap<Observer, Vec<Window>>) {
    let med = |o: Observer, f: fn(&Window) -> f64| median(windows[&o].iter().map(f).collect());
    let extra = med(Observer::Streams, |w| w.agent_cpu) - med(Observer::Connections, |w| w.agent_cpu);
    let records = med(Observer::Streams, |w| w.records) / SECONDS as f64;
    let gross = med(Observer::Streams, |w| {
        w.agent_cpu / (w.records / SECONDS as f64).max(1.0)
    });
    let calls = med(Observer::Streams, |w| {
        w.calls.iter().map(|c| c.1).sum::<u64>() as f64
    }) / SECONDS as f64;
    report.line("");
    report.line(format!(
        "Agent CPU per stream record (`lifeline_ebpf_events_total{{kind=\"stream\"}}`): {:.1} µs \
         over the connection-only agent's CPU ({:.2} ms/s more for {records:.0} records/s); \
         {:.1} µs counting all of the agent's CPU. Per probed call ({calls:.0} calls/s; DATA \
         frames of a stream are coalesced in the kernel, so most calls send no record): {:.2} µs \
         of agent CPU over the connection-only agent's.",
        extra * 1e6 / records.max(1.0),
        extra * 1000.0,
        gross * 1e6,
        extra * 1e6 / calls.max(1.0)
    ));
}

/// Calls and kernel run time (ns) summed by program.
fn by_program<'a>(calls: impl IntoIterator<Item = &'a Call>) -> BTreeMap<String, (u64, f64)> {
    let mut sums: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for (name, calls, ns) in calls {
        let s = sums.entry(name.clone()).or_default();
        s.0 += calls;
        s.1 += *calls as f64 * ns;
    }
    sums
}

/// The kernel's cost per probed call in the Streams windows, beside the copies, and `alone`
/// (the copies stopped), to which the goal applies: the copies add other processes' work to
/// the same CPUs (caches, preemption), which a probe's run time then counts.
fn report_per_call(report: &mut Report, streams: &[Window], alone: &[Call]) {
    report.line("");
    report.line(format!(
        "Kernel cost per probed call (`kernel.bpf_stats`): beside the copies, the probes' \
         windows summed; alone, {ALONE_SECONDS} s of the agent with the Go probes while the \
         copies are stopped (SIGSTOP):"
    ));
    report.line("");
    report.line(format!(
        "| program | calls/s | ns per call beside the copies | ns per call alone | goal ≤ {PER_CALL_GOAL_NS:.0} ns (alone) |"
    ));
    report.line("| --- | ---: | ---: | ---: | --- |");
    let alone = by_program(alone);
    let total_seconds = (SECONDS as usize * streams.len()) as f64;
    for (name, (calls, ns)) in &by_program(streams.iter().flat_map(|w| &w.calls)) {
        let (alone_text, goal) = match alone.get(name) {
            Some((n, ns)) => {
                let per_call = ns / *n as f64;
                let met = if per_call <= PER_CALL_GOAL_NS {
                    "met"
                } else {
                    "not met"
                };
                (format!("{per_call:.0}"), met)
            }
            None => ("no calls".to_owned(), "—"),
        };
        report.line(format!(
            "| {name} | {:.0} | {:.0} | {alone_text} | {goal} |",
            *calls as f64 / total_seconds,
            ns / (*calls).max(1) as f64,
        ));
    }
}

fn report_python(report: &mut Report, python_rows: Vec<PythonRow>) {
    report.line("");
    report.line(format!(
        "A client that runs no probed Go binary: python's `http.client` over OpenSSL, keep-alive \
         GETs to the watched endpoint for {PYTHON_SECONDS} s, while the kubectls and their copies \
         are stopped (SIGSTOP: still connected, kubectl's binary still probed while the agent \
         runs). Python is a client too: with its client probes the agent follows it through its \
         libssl. The last column is one window's time per request over no agent's: at this size \
         its noise (±20 % here) is larger than the probes' cost."
    ));
    report.line("");
    report.line(
        "| observer | python requests/s | vs no agent | go_* probe calls meanwhile | OpenSSL probe runs per request | kubectl still probed | per request over no agent |",
    );
    report.line("| --- | ---: | ---: | ---: | ---: | --- | ---: |");
    let base = python_rows.first().map_or(f64::NAN, |r| r.1);
    for (observer, rate, calls, ssl_per_request, attached) in python_rows {
        let none = observer == Observer::None;
        report.line(format!(
            "| {} | {rate:.0} | {:.3} | {} | {} | {} | {} |",
            observer.label(),
            rate / base,
            if none { "—".into() } else { calls.to_string() },
            if none {
                "—".into()
            } else {
                format!("{ssl_per_request:.1}")
            },
            match attached {
                None => "—",
                Some(true) => "yes",
                Some(false) => "no",
            },
            if none {
                "—".into()
            } else {
                format!("{:+.1} µs", (1.0 / rate - 1.0 / base) * 1e6)
            }
        ));
    }
    report.line("");
}
