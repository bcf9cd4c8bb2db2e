//! `cargo xtask bench`: what the agent costs, in figures measured in one run.
//!
//! 1. Unrelated traffic: iperf3 over loopback inside a fresh network namespace, without the
//!    agent and then with it attached (watching an endpoint on another port, so every packet is
//!    unrelated). Printed: throughput of both, their ratio, and the agent's CPU time while the
//!    traffic ran. The kernel programs fire only on TCP state changes and retransmits, and the
//!    inbound sampling looks only at tracked sockets, so the ratio should be ~1 and the CPU time
//!    near zero.
//! 2. Tracked connections: the agent's CPU time per second with N idle connections to a watched
//!    endpoint (the once-a-second sock_diag sampling), for two values of N: the cost per tracked
//!    connection per sample.
use std::{
    fs,
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use crate::{cargo, run, workspace, Failed, Result};

const NS: &str = "llbench";
const SECONDS: u64 = 5;

struct Cleanup(Vec<Child>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", NS]).status();
    }
}

fn in_ns(program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", NS, program]);
    c
}

fn quiet(cmd: &mut Command) -> Result<Child> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.spawn()
        .map_err(|e| Failed(format!("{}: {e}", crate::show(cmd))))
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat =
        fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| Failed(format!("stat {pid}: {e}")))?;
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap_or(0) + 2..]
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse::<f64>().unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// iperf3 for SECONDS over the namespace's loopback; returns Gbit/s received.
fn iperf() -> Result<f64> {
    let out = in_ns("iperf3")
        .args(["-c", "127.0.0.1", "-p", "15201", "-t", &SECONDS.to_string(), "-J"])
        .output()
        .map_err(|e| Failed(format!("iperf3: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let key = "\"sum_received\"";
    let at = text
        .find(key)
        .ok_or_else(|| Failed(format!("iperf3 gave no sum_received: {text}")))?;
    let bps = text[at..]
        .split("\"bits_per_second\":")
        .nth(1)
        .and_then(|t| t.split([',', '\n', '}']).next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| Failed("iperf3 JSON without bits_per_second".into()))?;
    Ok(bps / 1e9)
}

pub fn bench() -> Result {
    crate::require_root("the benchmark")?;
    run(cargo().args(["build", "--release", "-p", "lifeline"]))?;
    run(cargo().args(["build", "-p", "lifeline-integration", "--bins"]))?;
    let lifeline = workspace().join("target/release/lifeline");
    let tests = workspace().join("target/debug");
    let _ = Command::new("ip")
        .args(["netns", "del", NS])
        .stderr(Stdio::null())
        .status();
    run(Command::new("ip").args(["netns", "add", NS]))?;
    let mut guard = Cleanup(Vec::new());
    run(in_ns("ip").args(["link", "set", "lo", "up"]))?;
    guard.0.push(quiet(in_ns("iperf3").args(["-s", "-p", "15201"]))?);
    guard.0.push(quiet(
        in_ns(&tests.join("ll-server").display().to_string()).args(["--listen", "127.0.0.1:16443"]),
    )?);
    thread::sleep(Duration::from_millis(500));

    let without = iperf()?;
    let mut agent = Command::new(&lifeline);
    agent.args([
        "run",
        "--endpoint",
        "127.0.0.1:16443",
        "--listen",
        "127.0.0.1:19477",
    ]);
    guard.0.push(quiet(&mut agent)?);
    let agent_pid = guard.0.last().expect("agent").id();
    thread::sleep(Duration::from_secs(2));
    let cpu0 = cpu_seconds(agent_pid)?;
    let with = iperf()?;
    let cpu_traffic = cpu_seconds(agent_pid)? - cpu0;
    println!("unrelated traffic (iperf3, loopback, {SECONDS} s each):");
    println!("  without the agent   {without:8.2} Gbit/s");
    println!(
        "  with the agent      {with:8.2} Gbit/s   (ratio {:.3})",
        with / without
    );
    println!("  agent CPU meanwhile {:8.3} s over {SECONDS} s", cpu_traffic);

    println!("tracked connections (agent CPU per second of idle connections, sampled once a second):");
    let mut previous: Option<(usize, f64)> = None;
    for n in [50usize, 400] {
        let mut client = in_ns(&tests.join("ll-client").display().to_string());
        for _ in 0..n {
            client.args(["--connect", "127.0.0.1:16443"]);
        }
        guard.0.push(quiet(&mut client)?);
        thread::sleep(Duration::from_secs(3));
        let c0 = cpu_seconds(agent_pid)?;
        thread::sleep(Duration::from_secs(10));
        let per_second = (cpu_seconds(agent_pid)? - c0) / 10.0;
        println!(
            "  {n:4} connections   {:8.2} ms CPU per second",
            per_second * 1000.0
        );
        if let Some((m, p)) = previous {
            let per_conn = (per_second - p) / (n - m) as f64 * 1e6;
            println!("  marginal cost       {per_conn:8.1} µs CPU per connection per sample");
        }
        previous = Some((n, per_second));
        let mut c = guard.0.pop().expect("client");
        let _ = c.kill();
        let _ = c.wait();
        thread::sleep(Duration::from_secs(2));
    }
    Ok(())
}
