//! `cargo xtask demo`: a self-contained look at the agent, no cluster needed.
//!
//! Topology: an "apiserver" (`ll-server` on 10.251.0.1:6443) in network namespace
//! `lldemo-api`, two client processes in `lldemo-clients` (10.251.0.2, over a veth pair), and
//! one client on the host's loopback to a second endpoint 127.0.0.1:16443. The "apiserver"
//! sends a watch-event-sized burst every 5 s. The agent watches both endpoints; its table is
//! printed every 5 s. Kill the apiserver process by hand (`pkill -f 'll-server --listen
//! 10.251'`) to see the clients lose it.
use std::{
    io::Write,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{cargo, run, workspace, Failed, Result};

const API_NS: &str = "lldemo-api";
const CLIENT_NS: &str = "lldemo-clients";
const API_ADDR: &str = "10.251.0.1:6443";
const LOCAL_ADDR: &str = "127.0.0.1:16443";
const LISTEN: &str = "127.0.0.1:9477";

/// Everything the demo started; dropped (killed and removed) on exit.
struct Topology {
    children: Vec<Child>,
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
    }
}

fn ip(args: &[&str]) -> Result {
    run(Command::new("ip").args(args))
}

fn spawn(cmd: &mut Command) -> Result<Child> {
    cmd.stdin(Stdio::piped()).stdout(Stdio::null());
    cmd.spawn()
        .map_err(|e| Failed(format!("{}: {e}", crate::show(cmd))))
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
    let mut topo = Topology { children: Vec::new() };
    ip(&["netns", "add", API_NS])?;
    ip(&["netns", "add", CLIENT_NS])?;
    ip(&[
        "link", "add", "lldemo0", "netns", API_NS, "type", "veth", "peer", "name", "lldemo1", "netns",
        CLIENT_NS,
    ])?;
    ip(&["-n", API_NS, "addr", "add", "10.251.0.1/24", "dev", "lldemo0"])?;
    ip(&["-n", CLIENT_NS, "addr", "add", "10.251.0.2/24", "dev", "lldemo1"])?;
    for (ns, dev) in [(API_NS, "lldemo0"), (CLIENT_NS, "lldemo1")] {
        ip(&["-n", ns, "link", "set", dev, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    let server = |ns: Option<&str>, addr: &str| {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin.join("ll-server"));
                c
            }
            None => Command::new(bin.join("ll-server")),
        };
        spawn(cmd.args(["--listen", addr]))
    };
    topo.children.push(server(Some(API_NS), API_ADDR)?);
    topo.children.push(server(None, LOCAL_ADDR)?);
    thread::sleep(Duration::from_millis(300));
    for connects in [vec![API_ADDR], vec![API_ADDR, API_ADDR]] {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", CLIENT_NS]).arg(bin.join("ll-client"));
        for c in connects {
            cmd.args(["--connect", c]);
        }
        topo.children.push(spawn(&mut cmd)?);
    }
    topo.children.push(spawn(
        Command::new(bin.join("ll-client")).args(["--connect", LOCAL_ADDR]),
    )?);

    let mut agent = Command::new(bin.join("lifeline"));
    agent.args([
        "run",
        "--endpoint",
        API_ADDR,
        "--endpoint",
        LOCAL_ADDR,
        "--listen",
        LISTEN,
    ]);
    topo.children.push(spawn(&mut agent)?);
    eprintln!("demo: agent on http://{LISTEN}; table every 5 s; Ctrl-C to stop");
    let started = Instant::now();
    loop {
        thread::sleep(Duration::from_secs(5));
        // The "apiserver" sends a watch event to every client.
        if let Some(stdin) = topo.children[0].stdin.as_mut() {
            let _ = writeln!(stdin, "send 400");
        }
        let _ = Command::new(bin.join("lifeline"))
            .args(["status", "--server", &format!("http://{LISTEN}")])
            .status();
        if seconds.is_some_and(|s| started.elapsed() >= Duration::from_secs(s)) {
            return Ok(());
        }
    }
}
