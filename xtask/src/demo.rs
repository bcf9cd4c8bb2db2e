//! `cargo xtask demo`: a self-contained look at the agent, no cluster needed.
//!
//! Topology: the test fixture `ll-apiserver` (a fake kube-apiserver that behaves like the real
//! one on the wire) at 10.251.0.1:6443 in network namespace `lldemo-api`, and three real clients
//! in `lldemo-clients` (10.251.0.2, over a veth pair): the `kube` crate's watcher and a
//! python3-kubernetes watch, which re-dial, and `ll-stuck`, which never dials again after losing
//! its connection (the x/net/http2 bug of seeds 000/004). The agent runs with the SPEC defaults
//! and logs every state change and alert; its table is printed every 5 s.
//!
//! Kill the apiserver by hand (`pkill -KILL ll-apiserver`): the demo restarts it 3 s later, as
//! a rolling restart would, and within `disconnect_grace` + 2 s (17 s) `ll-stuck` is
//! `disconnected` and alerted while the others stay healthy.
use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use crate::{cargo, run, workspace, Failed, Result};

const API_NS: &str = "lldemo-api";
const CLIENT_NS: &str = "lldemo-clients";
const API_IP: &str = "10.251.0.1";
const LISTEN: &str = "127.0.0.1:9477";
const DIR: &str = "/tmp/lifeline-demo";

/// The demo's addresses: routed into a blackhole in the host's namespace while it runs.
const DEMO_RANGE: &str = "10.251.0.0/16";

/// Everything the demo started; dropped (killed and removed) on exit, Ctrl-C included.
struct Topology {
    children: Vec<Child>,
    /// Whether the demo added the blackhole route for [`DEMO_RANGE`] (not when one was there).
    route: bool,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in [API_NS, CLIENT_NS] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        if self.route {
            let _ = Command::new("ip")
                .args(["route", "del", "blackhole", DEMO_RANGE])
                .status();
        }
    }
}

/// Set by SIGINT or SIGTERM: the demo stops and cleans up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Sleeps `d`, or less if asked to stop; whether asked to stop.
fn sleep_unless_stopped(d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until && !STOP.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(100));
    }
    STOP.load(Ordering::SeqCst)
}

fn ip(args: &[&str]) -> Result {
    run(Command::new("ip").args(args))
}

fn spawn(cmd: &mut Command) -> Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.spawn()
        .map_err(|e| Failed(format!("{}: {e}", crate::show(cmd))))
}

fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(program);
    cmd
}

fn start_apiserver(bin: &Path) -> Result<Child> {
    spawn(in_ns(API_NS, bin.join("ll-apiserver")).args([
        "--listen",
        &format!("{API_IP}:6443"),
        "--cert-dir",
        &format!("{DIR}/certs"),
        "--san",
        API_IP,
    ]))
}

fn kubeconfig() -> Result<String> {
    let path = format!("{DIR}/kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: https://{API_IP}:6443\n    \
certificate-authority: {DIR}/certs/ca.pem\nusers:\n- name: demo\n  user:\n    token: demo\ncontexts:\n- name: demo\n  \
context:\n    cluster: demo\n    user: demo\ncurrent-context: demo\n"
    );
    fs::write(&path, text).map_err(|e| Failed(format!("{path}: {e}")))?;
    Ok(path)
}

pub fn demo(no_setup: bool, seconds: Option<u64>) -> Result {
    crate::require_root("the demo")?;
    if !no_setup {
        crate::setup::setup()?;
    }
    run(cargo().args(["build", "-p", "lifeline", "-p", "lifeline-integration", "--bins"]))?;
    let bin = workspace().join("target/debug");
    for ns in [API_NS, CLIENT_NS] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    fs::create_dir_all(format!("{DIR}/certs")).map_err(|e| Failed(format!("{DIR}: {e}")))?;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_stop as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    let mut topo = Topology {
        children: Vec::new(),
        route: false,
    };
    ip(&["netns", "add", API_NS])?;
    ip(&["netns", "add", CLIENT_NS])?;
    ip(&[
        "link", "add", "lldemo0", "netns", API_NS, "type", "veth", "peer", "name", "lldemo1", "netns",
        CLIENT_NS,
    ])?;
    ip(&[
        "-n",
        API_NS,
        "addr",
        "add",
        &format!("{API_IP}/24"),
        "dev",
        "lldemo0",
    ])?;
    ip(&["-n", CLIENT_NS, "addr", "add", "10.251.0.2/24", "dev", "lldemo1"])?;
    // The agent (in the host's namespace) probes the demo apiserver; without a route of its own
    // there, that probe must fail here, not leave the machine by the default route. Removed at
    // the end unless it was there before (a suite's, while one runs).
    topo.route = Command::new("ip")
        .args(["route", "add", "blackhole", DEMO_RANGE])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !topo.route {
        let shown = Command::new("ip")
            .args(["route", "show", "exact", DEMO_RANGE])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if !shown.starts_with("blackhole") {
            return Err(Failed(format!(
                "this host routes {DEMO_RANGE} ({}), the demo's addresses",
                shown.trim()
            )));
        }
    }
    for (ns, dev) in [(API_NS, "lldemo0"), (CLIENT_NS, "lldemo1")] {
        ip(&["-n", ns, "link", "set", dev, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    topo.children.push(start_apiserver(&bin)?);
    thread::sleep(Duration::from_secs(1));
    let kubeconfig = kubeconfig()?;
    let py_watch = workspace().join("tests/clients/py-watch.py");
    topo.children.push(spawn(
        in_ns(CLIENT_NS, bin.join("ll-kube-watch")).args(["--kubeconfig", &kubeconfig]),
    )?);
    topo.children.push(spawn(
        in_ns(CLIENT_NS, "/usr/bin/python3")
            .arg(&py_watch)
            .args(["--kubeconfig", &kubeconfig]),
    )?);
    topo.children.push(spawn(
        in_ns(CLIENT_NS, bin.join("ll-stuck")).args(["--kubeconfig", &kubeconfig]),
    )?);

    // The agent logs to this terminal: state changes and alerts show up as they happen.
    let mut agent = Command::new(bin.join("lifeline"));
    agent.args([
        "run",
        "--endpoint",
        &format!("{API_IP}:6443"),
        "--listen",
        LISTEN,
        "--node-name",
        "demo",
    ]);
    topo.children
        .push(agent.spawn().map_err(|e| Failed(format!("lifeline run: {e}")))?);
    eprintln!(
        "demo: agent on http://{LISTEN}; table every 5 s; `pkill -KILL ll-apiserver` to restart the apiserver; Ctrl-C to stop"
    );
    let started = Instant::now();
    loop {
        if sleep_unless_stopped(Duration::from_secs(5)) {
            eprintln!("demo: stopping; removing what it set up");
            return Ok(());
        }
        if let Ok(Some(status)) = topo.children[0].try_wait() {
            eprintln!("demo: the apiserver exited ({status}); restarting it in 3 s, like a rolling restart");
            if sleep_unless_stopped(Duration::from_secs(3)) {
                return Ok(());
            }
            topo.children[0] = start_apiserver(&bin)?;
        }
        let _ = Command::new(bin.join("lifeline"))
            .args(["status", "--server", &format!("http://{LISTEN}")])
            .status();
        if seconds.is_some_and(|s| started.elapsed() >= Duration::from_secs(s)) {
            return Ok(());
        }
    }
}
