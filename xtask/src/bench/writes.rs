//! The Go clients' own writes, per probed call: where a binary's client writes its requests
//! and resets only through `(*ClientConn).writeHeaders` and `writeStreamReset`, the agent
//! takes them from the registers there (`go_headers_sent`, `go_reset_sent`) instead of reading
//! frame headers from what `crypto/tls.(*Conn).Write` is given. A watch client writes little
//! in the streams section (flow control, which those two do not trap), so here clients write
//! what a controller writes: go-watch of the Go matrix (go1.23's bundle, go1.27's internal
//! copy), 4 processes each, each over one connection opening a watch of nodes and cancelling
//! it HOLD_MS later (its HEADERS, then its RST_STREAM), CANCELS times, on the fixture apiserver,
//! with the agent with its Go probes: each program's calls and kernel time per call
//! (`kernel.bpf_stats`), ten requests a second per connection as a busy controller's come.
//!
//! Then the same clients again under bpftrace alone, a one-counter program on each instruction
//! the agent probed (read from the kernel: `uprobe_sites`): the floor of a call on this
//! machine, what any program pays there. A reset comes after the client idled HOLD_MS: whatever
//! runs then starts cold.
use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

use super::{
    per_call, prog_name, prog_stats,
    streams::{self, Watch},
    uprobe_sites, Bins, Lab, Report, PER_CALL_GOAL_NS, WATCHED_PORT,
};
use crate::{gomatrix, Failed, Result};

/// The go-watch builds measured, and what each is.
const BUILDS: [(&str, &str); 2] = [
    ("go-watch-1.23-exe", "go1.23, `net/http`'s bundle"),
    ("go-watch-1.27-exe", "go1.27, `net/http/internal/http2`"),
];
const PROCESSES: usize = 4;
/// Watches each process opens and cancels, each HOLD_MS after its response headers.
const CANCELS: u64 = 100;
const HOLD_MS: u64 = 100;

pub(super) fn writes_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    let dir = std::env::temp_dir().join(format!("llbench-{}-writes", std::process::id()));
    let fixture = streams::Fixture::start(&mut lab, WATCHED_PORT, &dir.join("fixture"))?;
    thread::sleep(Duration::from_secs(2));
    report.line("## Go clients' own writes");
    report.line("");
    report.line(format!(
        "{PROCESSES} go-watch processes of each build (the Go matrix's, stripped), each over one \
         HTTP/2 connection to the fixture apiserver opening a watch of nodes and cancelling it \
         {HOLD_MS} ms later, {CANCELS} times (a HEADERS written, then a RST_STREAM), with the \
         agent with its Go probes, which takes them from the registers at the entry of the \
         transport's `writeHeaders` and `writeStreamReset`: kernel cost per probed call \
         (`kernel.bpf_stats`) over the whole run; beside it, the same clients' calls under \
         bpftrace alone, one counter on each instruction the agent probed: what any program \
         costs there on this machine (a reset comes after the client idled {HOLD_MS} ms)."
    ));
    report.line("");
    report.line(format!(
        "| build | program | calls | ns per call | bpftrace's counter there | goal ≤ {PER_CALL_GOAL_NS:.0} ns |"
    ));
    report.line("| --- | --- | ---: | ---: | ---: | --- |");
    for (file, what) in BUILDS {
        let binary = PathBuf::from(gomatrix::CLIENTS).join(file);
        if !binary.is_file() {
            return Err(Failed(format!(
                "{} is missing: run `cargo xtask setup`",
                binary.display()
            )));
        }
        let agent = Probed::Agent(bins);
        let (calls, sites) = run_clients(&mut lab, &binary, fixture.port, &dir, file, &agent)?;
        let floor = run_clients(
            &mut lab,
            &binary,
            fixture.port,
            &dir,
            file,
            &Probed::Counter(&sites),
        )?
        .0;
        for program in PROGRAMS {
            let (ours, counter) = (of(&calls, program), of(&floor, program));
            // The same workload: as many hits on each site, or the counter is not where the
            // agent's program was.
            let (n, hits) = (ours.map_or(0, |c| c.0), counter.map_or(0, |c| c.0));
            if hits.abs_diff(n) > n / 10 {
                return Err(Failed(format!(
                    "{file}: bpftrace counted {hits} calls where the agent's {program} ran {n} times"
                )));
            }
            let (text, met) = match ours {
                Some((_, ns)) => (
                    format!("{ns:.0}"),
                    if ns <= PER_CALL_GOAL_NS { "met" } else { "not met" },
                ),
                None => ("no calls".to_owned(), "—"),
            };
            let floor = counter.map_or_else(|| "no calls".to_owned(), |(_, ns)| format!("{ns:.0}"));
            report.line(format!(
                "| {file} ({what}) | {program} | {n} | {text} | {floor} | {met} |"
            ));
        }
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(())
}

/// The programs measured.
const PROGRAMS: [&str; 2] = ["go_headers_sent", "go_reset_sent"];

/// A program's calls and ns per call, named as the agent's program.
type Calls = Vec<(String, u64, f64)>;

/// `program`'s calls and ns per call in `calls`.
fn of(calls: &Calls, program: &str) -> Option<(u64, f64)> {
    calls.iter().find(|c| c.0 == program).map(|&(_, n, ns)| (n, ns))
}

/// Where the agent probed: its program, and the file offset.
type Sites = Vec<(&'static str, u64)>;

/// What probes the clients of a run.
enum Probed<'a> {
    /// The agent, with its Go probes.
    Agent(&'a Bins),
    /// bpftrace alone, one counter on each site (program, file offset) the agent probed.
    Counter(&'a [(&'static str, u64)]),
}

/// One run of PROCESSES clients of `binary` under `probed`: each program's calls and ns per
/// call (named as the agent's, for the counters too), and the sites the agent probed.
fn run_clients(
    lab: &mut Lab,
    binary: &Path,
    port: u16,
    dir: &Path,
    file: &str,
    probed: &Probed,
) -> Result<(Calls, Sites)> {
    let triggers: Vec<PathBuf> = (0..PROCESSES).map(|i| dir.join(format!("{file}-{i}"))).collect();
    for trigger in &triggers {
        let _ = fs::remove_file(trigger);
    }
    let clients = triggers
        .iter()
        .map(|trigger| start(lab, binary, port, trigger))
        .collect::<Result<Vec<_>>>()?;
    let pids: Vec<u32> = clients.iter().map(|c| c.child.id()).collect();
    let (observer, sites) = match probed {
        Probed::Agent(bins) => {
            let agent = lab.agent(bins, &[])?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !streams::all_streams(&pids) {
                if Instant::now() > deadline {
                    return Err(Failed(format!("{file}: not followed by streams within 30 s")));
                }
                thread::sleep(Duration::from_millis(500));
            }
            let sites = probed_sites(agent, binary)?;
            (agent, sites)
        }
        Probed::Counter(sites) => {
            // bpftrace takes the number after a binary with no symbols as the offset in it.
            let probes = sites
                .iter()
                .map(|&(_, offset)| format!("uprobe:{}:{offset:#x} {{ @n = count(); }}", binary.display()))
                .collect::<Vec<_>>();
            let pid = lab.bpftrace_unsafe(&probes.join(" "))?;
            (pid, sites.to_vec())
        }
    };
    let before = prog_stats(observer);
    for trigger in &triggers {
        fs::write(trigger, "").map_err(|e| Failed(format!("{}: {e}", trigger.display())))?;
    }
    // `connected`, then `open I` and `cancelled I` for each, then `done`.
    let lines = 2 + 2 * CANCELS;
    let deadline =
        Instant::now() + Duration::from_millis(CANCELS * (HOLD_MS + 100)) + Duration::from_secs(30);
    while clients.iter().any(|c| c.lines.load(Ordering::Relaxed) < lines) {
        if Instant::now() > deadline {
            return Err(Failed(format!("{file}: its watches not all cancelled in time")));
        }
        thread::sleep(Duration::from_millis(200));
    }
    let after = prog_stats(observer);
    let calls = match probed {
        Probed::Agent(_) => per_call(&before, &after),
        Probed::Counter(_) => {
            // bpftrace's programs by the site each is on, summed per program of the agent's.
            let on = uprobe_sites::uprobes(observer)?;
            PROGRAMS
                .iter()
                .filter_map(|&program| {
                    let (mut n, mut ns) = (0, 0);
                    for site in &on {
                        if !sites.iter().any(|s| s.0 == program && s.1 == site.offset) {
                            continue;
                        }
                        let (ns1, n1) = after.get(&site.prog_id).copied().unwrap_or((0, 0));
                        let (ns0, n0) = before.get(&site.prog_id).copied().unwrap_or((0, 0));
                        n += n1 - n0;
                        ns += ns1 - ns0;
                    }
                    (n > 0).then(|| (program.to_owned(), n, ns as f64 / n as f64))
                })
                .collect()
        }
    };
    lab.stop(observer);
    drop(clients);
    Ok((calls, sites))
}

/// The sites of [`PROGRAMS`] that process `pid` has attached in `binary`: (program, offset).
fn probed_sites(pid: u32, binary: &Path) -> Result<Sites> {
    let file = binary.display().to_string();
    let held = uprobe_sites::uprobes(pid)?;
    let mut sites = Vec::new();
    for site in held.iter().filter(|s| s.file == file) {
        let name = prog_name(site.prog_id);
        if let Some(program) = PROGRAMS.iter().find(|p| **p == name) {
            sites.push((*program, site.offset));
        }
    }
    for program in PROGRAMS {
        if !sites.iter().any(|s| s.0 == program) {
            return Err(Failed(format!(
                "the agent has no {program} on {file} (it holds uprobes on {:?})",
                held.iter().map(|s| &s.file).collect::<Vec<_>>()
            )));
        }
    }
    Ok(sites)
}

/// A go-watch process cancelling its watches, its output lines counted.
fn start(lab: &Lab, binary: &Path, port: u16, trigger: &Path) -> Result<Watch> {
    let mut command = lab.in_ns(binary);
    command
        .arg(format!("https://127.0.0.1:{port}"))
        .arg(trigger)
        .env("GO_WATCH_TOKEN", "x")
        .env("GO_WATCH_CANCEL", CANCELS.to_string())
        .env("GO_WATCH_HOLD_MS", HOLD_MS.to_string());
    Watch::spawn(command, binary)
}
