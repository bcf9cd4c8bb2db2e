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
use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

use super::{
    per_call, prog_stats,
    streams::{self, Watch},
    Bins, Lab, Report, WATCHED_PORT,
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
/// Issue 26's goal for each probe, per call in the kernel (bpf_stats).
const PER_CALL_GOAL_NS: f64 = 1000.0;

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
         (`kernel.bpf_stats`) over the whole run."
    ));
    report.line("");
    report.line(format!(
        "| build | program | calls | ns per call | goal ≤ {PER_CALL_GOAL_NS:.0} ns |"
    ));
    report.line("| --- | --- | ---: | ---: | --- |");
    for (file, what) in BUILDS {
        let binary = PathBuf::from(gomatrix::CLIENTS).join(file);
        if !binary.is_file() {
            return Err(Failed(format!(
                "{} is missing: run `cargo xtask setup`",
                binary.display()
            )));
        }
        let triggers: Vec<PathBuf> = (0..PROCESSES).map(|i| dir.join(format!("{file}-{i}"))).collect();
        let clients = triggers
            .iter()
            .map(|trigger| start(&lab, &binary, fixture.port, trigger))
            .collect::<Result<Vec<_>>>()?;
        let pids: Vec<u32> = clients.iter().map(|c| c.child.id()).collect();
        let agent = lab.agent(bins, &[])?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !streams::all_streams(&pids) {
            if Instant::now() > deadline {
                return Err(Failed(format!("{file}: not followed by streams within 30 s")));
            }
            thread::sleep(Duration::from_millis(500));
        }
        let before = prog_stats(agent);
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
        let calls = per_call(&before, &prog_stats(agent));
        lab.stop(agent);
        drop(clients);
        for program in ["go_headers_sent", "go_reset_sent"] {
            let row = calls.iter().find(|c| c.0 == program);
            let (count, text, met) = match row {
                Some((_, n, ns)) => (
                    *n,
                    format!("{ns:.0}"),
                    if *ns <= PER_CALL_GOAL_NS { "met" } else { "not met" },
                ),
                None => (0, "no calls".to_owned(), "—"),
            };
            report.line(format!(
                "| {file} ({what}) | {program} | {count} | {text} | {met} |"
            ));
        }
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(())
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
