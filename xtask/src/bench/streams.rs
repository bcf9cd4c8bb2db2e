//! Go clients' streams: what the uprobes on a Go client's `crypto/tls` and HTTP/2 framer cost.
//! Several Go clients watch the fixture apiserver's pods, which it changes every 10 ms: a DATA
//! frame per event on every watch, one output line per event; first `kubectl get pods -w` of
//! kubectl 1.20 (Go 1.19, stripped, as built for Kubernetes 1.20), then the image's kubectl 1.32
//! (Go 1.23), then the client-go 0.32 informer of the real-cluster tier built with go1.24
//! (`tests/clients/informer --pods`). The same processes run through each one's rounds; in
//! interleaved rounds nobody observes them, the connection-only agent (`--no-go-probes`)
//! does, or the agent with its Go probes does.
//! Printed: the clients' events per second and CPU per event against no observer, the kernel's
//! cost per probed call (`kernel.bpf_stats_enabled`), the agent's CPU per stream record over
//! the connection-only agent's; then a client that runs no probed binary (python's OpenSSL,
//! while the kubectl 1.20 watches are stopped, their probes still attached) against no
//! observer, and the probes' calls meanwhile.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use super::{
    cpu_seconds, http_get, median, metric, per_call, prog_stats, Bins, Lab, Report, AGENT_ADDR, WATCHED_PORT,
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
const EVENT_INTERVAL: &str = "10ms";
/// Issue 26's goal for each probe, per call in the kernel (bpf_stats).
const PER_CALL_GOAL_NS: f64 = 1000.0;
/// Seconds measured per observer and round.
const SECONDS: u64 = 10;
const ROUNDS: usize = 6;
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
struct Watch {
    child: Child,
    lines: Arc<AtomicU64>,
}

impl Watch {
    /// Starts `client` against the fixture; the informer reads `kubeconfig`.
    fn start(lab: &Lab, client: &Client, kubeconfig: &Path) -> Result<Watch> {
        let server = format!("https://127.0.0.1:{WATCHED_PORT}");
        let mut command = lab.in_ns(client.path);
        match client.kind {
            ClientKind::Kubectl => command
                .args(["--server", &server, "--insecure-skip-tls-verify", "--token", "x"])
                .args(["get", "pods", "-w"]),
            ClientKind::Informer => command.arg("--pods").arg("--kubeconfig").arg(kubeconfig),
        };
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failed(format!("{}: {e}", client.path)))?;
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

/// What one window measured.
#[derive(Default)]
struct Window {
    events_per_second: f64,
    client_us_per_event: f64,
    agent_cpu: f64,
    records: f64,
    /// Frames the agent could not place in their stream (`lost_place`): evidence lost on a
    /// healthy client, which makes its judgement incomplete while it lasts.
    lost_place: f64,
    calls: Vec<(String, u64, f64)>,
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

fn measure(watches: &[Watch], agent: Option<u32>) -> Window {
    let lines = || {
        watches
            .iter()
            .map(|w| w.lines.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let client_cpu = || watches.iter().map(|w| cpu_seconds(w.child.id())).sum::<f64>();
    let records = || metric("lifeline_ebpf_events_total", &["kind=\"stream\""]);
    let lost_place = || metric("lifeline_ebpf_records_dropped_total", &["cause=\"lost_place\""]);
    let (l0, c0, t0) = (lines(), client_cpu(), Instant::now());
    let (a0, s0, r0, p0) = agent.map_or((0.0, BTreeMap::new(), 0.0, 0.0), |p| {
        (cpu_seconds(p), prog_stats(p), records(), lost_place())
    });
    thread::sleep(Duration::from_secs(SECONDS));
    let (l1, c1, secs) = (lines(), client_cpu(), t0.elapsed().as_secs_f64());
    let mut w = Window {
        events_per_second: (l1 - l0) as f64 / secs,
        client_us_per_event: (c1 - c0) * 1e6 / (l1 - l0).max(1) as f64,
        ..Window::default()
    };
    if let Some(p) = agent {
        w.agent_cpu = (cpu_seconds(p) - a0) / secs;
        w.records = records() - r0;
        w.lost_place = lost_place() - p0;
        w.calls = per_call(&s0, &prog_stats(p))
            .into_iter()
            .filter(|c| c.0.starts_with("go_"))
            .collect();
    }
    w
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

/// What the rounds of one client measured, per observer: its windows, and each window's
/// events/s and client CPU per event against the round's no-agent window.
struct Measured {
    windows: BTreeMap<Observer, Vec<Window>>,
    ratios: BTreeMap<Observer, (Vec<f64>, Vec<f64>)>,
}

/// The python client's requests/s beside one observer, the Go probes' calls meanwhile, and
/// whether kubectl's binary was still probed (None: no agent).
type PythonRow = (Observer, f64, u64, Option<bool>);

const ORDER: [Observer; 3] = [Observer::None, Observer::Connections, Observer::Streams];

pub(super) fn streams_section(bins: &Bins, report: &mut Report) -> Result {
    if let Some(missing) = CLIENTS.iter().find(|k| !Path::new(k.path).is_file()) {
        return Err(Failed(format!(
            "{} is missing: run `cargo xtask setup`",
            missing.path
        )));
    }
    let mut lab = Lab::new()?;
    let certs = std::env::temp_dir().join(format!("llbench-{}-certs", std::process::id()));
    let listen = format!("127.0.0.1:{WATCHED_PORT}");
    let apiserver = workspace().join("target/debug/ll-apiserver");
    let mut server = lab.in_ns(&apiserver);
    server.args(["--listen", &listen, "--cert-dir"]).arg(&certs);
    // The fixture ends a watch after 60 s by default, and `kubectl get -w` exits then.
    let kubeconfig = certs.join("kubeconfig");
    server.args(["--event-interval", EVENT_INTERVAL, "--watch-timeout", "1h"]);
    lab.spawn(&mut server)?;
    thread::sleep(Duration::from_secs(2));

    report.line("## Go clients' streams");
    report.line("");
    let mut python_rows = Vec::new();
    fs::write(&kubeconfig, fixture_kubeconfig(&format!("https://{listen}")))
        .map_err(|e| Failed(format!("{}: {e}", kubeconfig.display())))?;
    for (index, client) in CLIENTS.iter().enumerate() {
        let watches = (0..WATCHES)
            .map(|_| Watch::start(&lab, client, &kubeconfig))
            .collect::<Result<Vec<_>>>()?;
        let pids: Vec<u32> = watches.iter().map(|w| w.child.id()).collect();
        thread::sleep(Duration::from_secs(3));
        let measured = rounds(&mut lab, bins, client, &watches, &pids)?;
        report_rounds(report, client, &measured);
        if index == 0 {
            python_rows = python_beside(&mut lab, bins, &watches, &pids)?;
        }
    }
    let _ = fs::remove_dir_all(&certs);
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

/// The interleaved rounds of one client's watches.
fn rounds(lab: &mut Lab, bins: &Bins, client: &Client, watches: &[Watch], pids: &[u32]) -> Result<Measured> {
    let mut windows: BTreeMap<Observer, Vec<Window>> = BTreeMap::new();
    let mut ratios: BTreeMap<Observer, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for round in 0..ROUNDS {
        // Each round starts with another observer: a client whose cost per event drifts (its
        // heap grows, the machine's other work comes and goes) favours no observer.
        let mut order = ORDER;
        order.rotate_left(round % ORDER.len());
        let mut measured = BTreeMap::new();
        for observer in order {
            let agent = observe(lab, bins, observer, pids)?;
            let w = measure(watches, agent);
            if let Some(a) = agent {
                lab.stop(a);
            }
            if w.events_per_second < 1.0 {
                return Err(Failed(format!(
                    "{}, round {round}, {}: the watches printed no event (did they exit?)",
                    client.path,
                    observer.label()
                )));
            }
            eprintln!(
                "{}, round {round}: {:<44} {:6.0} events/s, client {:6.1} µs/event, agent {:.2} ms/s, {:.0} stream records, {:.0} lost place",
                client.label,
                observer.label(),
                w.events_per_second,
                w.client_us_per_event,
                w.agent_cpu * 1000.0,
                w.records,
                w.lost_place
            );
            measured.insert(observer, w);
        }
        let baseline = (
            measured[&Observer::None].events_per_second,
            measured[&Observer::None].client_us_per_event,
        );
        for (observer, w) in measured {
            let r = ratios.entry(observer).or_default();
            r.0.push(w.events_per_second / baseline.0);
            r.1.push(w.client_us_per_event / baseline.1);
            windows.entry(observer).or_default().push(w);
        }
    }
    Ok(Measured { windows, ratios })
}

/// A client that runs no probed binary: the kubectls stopped (still connected, their binary
/// still probed), a python OpenSSL client's requests against each observer.
fn python_beside(lab: &mut Lab, bins: &Bins, watches: &[Watch], pids: &[u32]) -> Result<Vec<PythonRow>> {
    for w in watches {
        w.signal(libc::SIGSTOP);
    }
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
        let go_calls: u64 = match (agent, before) {
            (Some(a), Some(b)) => per_call(&b, &prog_stats(a))
                .iter()
                .filter(|c| c.0.starts_with("go_"))
                .map(|c| c.1)
                .sum(),
            _ => 0,
        };
        let attached = agent.map(|_| all_streams(pids));
        if let Some(a) = agent {
            lab.stop(a);
        }
        eprintln!(
            "python with {:<44} {rate:6.0} requests/s, go_* calls {go_calls}",
            observer.label()
        );
        python_rows.push((observer, rate, go_calls, attached));
    }
    for w in watches {
        w.signal(libc::SIGCONT);
    }
    Ok(python_rows)
}

/// One client's table and the kernel's cost per probed call.
fn report_rounds(report: &mut Report, client: &Client, measured: &Measured) {
    let Measured { windows, ratios } = measured;
    report.line(format!(
        "{WATCHES} `{}` ({}) on the fixture \
         apiserver, which changes a pod every {EVENT_INTERVAL} (a DATA frame per event on every \
         watch, one output line per event); the same processes throughout, {SECONDS} s per \
         observer, {ROUNDS} interleaved rounds, each starting with another observer (medians; \
         ratios against the round's no-agent window). Client CPU is the clients' own (all threads) per event they printed.",
        client.kind.command(),
        client.label
    ));
    report.line("");
    report.line("| observer | events/s | vs no agent | client CPU per event | vs no agent | agent CPU | stream records/s | frames that lost their place (all windows) |");
    report.line("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let med = |o: Observer, f: fn(&Window) -> f64| median(windows[&o].iter().map(f).collect());
    for observer in ORDER {
        let (rate_ratio, cpu_ratio) = &ratios[&observer];
        report.line(format!(
            "| {} | {:.0} | {:.3} | {:.1} µs | {:.3} | {} | {} | {} |",
            observer.label(),
            med(observer, |w| w.events_per_second),
            median(rate_ratio.clone()),
            med(observer, |w| w.client_us_per_event),
            median(cpu_ratio.clone()),
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
    report.line("");
    report.line("Kernel cost per probed call (`kernel.bpf_stats`, the probes' windows summed):");
    report.line("");
    report.line(format!(
        "| program | calls/s | ns per call | goal ≤ {PER_CALL_GOAL_NS:.0} ns |"
    ));
    report.line("| --- | ---: | ---: | --- |");
    let mut sums: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for w in &windows[&Observer::Streams] {
        for (name, calls, ns) in &w.calls {
            let s = sums.entry(name.clone()).or_default();
            s.0 += calls;
            s.1 += *calls as f64 * ns;
        }
    }
    let total_seconds = (SECONDS as usize * windows[&Observer::Streams].len()) as f64;
    for (name, (calls, ns)) in &sums {
        let per_call = ns / (*calls).max(1) as f64;
        report.line(format!(
            "| {name} | {:.0} | {per_call:.0} | {} |",
            *calls as f64 / total_seconds,
            if per_call <= PER_CALL_GOAL_NS {
                "met"
            } else {
                "not met"
            }
        ));
    }
}

fn report_python(report: &mut Report, python_rows: Vec<PythonRow>) {
    report.line("");
    report.line(format!(
        "A client that runs no probed binary: python's `http.client` over OpenSSL, keep-alive \
         GETs for {PYTHON_SECONDS} s, while the kubectls are stopped (SIGSTOP: still connected, \
         kubectl's binary still probed while the agent runs)."
    ));
    report.line("");
    report.line(
        "| observer | python requests/s | vs no agent | go_* probe calls meanwhile | kubectl still probed |",
    );
    report.line("| --- | ---: | ---: | ---: | --- |");
    let base = python_rows.first().map_or(f64::NAN, |r| r.1);
    for (observer, rate, calls, attached) in python_rows {
        report.line(format!(
            "| {} | {rate:.0} | {:.3} | {} | {} |",
            observer.label(),
            rate / base,
            if observer == Observer::None {
                "—".into()
            } else {
                calls.to_string()
            },
            match attached {
                None => "—",
                Some(true) => "yes",
                Some(false) => "no",
            }
        ));
    }
    report.line("");
}
