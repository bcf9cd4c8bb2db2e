//! Busy connections: every tracked connection receives payload every few seconds (a busy
//! node's informers), against idle ones, as the sampler pays for them; with `LL_BENCH_BASELINE`
//! set to another agent binary, that one is measured first on the same connections (before and
//! after a change, in one run).
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use super::{
    cpu_seconds, sampling_us_per_socket, status_kib, threads_cpu_seconds, wait_listed, Bins, Hold, Lab,
    Report, WATCHED_PORT,
};
use crate::{Failed, Result};

/// Connections held, all of one process.
const CONNECTIONS: usize = 3000;
/// Seconds between two payloads the server writes on each connection (spread over the interval).
const PUSH_EVERY: &str = "5";
/// Seconds measured per row, after the table is complete and a quiet spell could begin: one
/// `LOOKED_SAMPLE_EVERY` (the agent's `table/mod.rs`), so that the sample every busy
/// connection gets however often segments look at it falls in the window once.
const SECONDS: u64 = 30;
/// Issue 26's goal: the agent's whole CPU per busy connection and second, in µs.
const BUSY_GOAL_US: f64 = 1.0;
/// The agent's thread that samples, judges and acts each tick (`app/run.rs`), and the one
/// that applies kernel events (`app/pump.rs`).
const TICK_THREAD: &str = "sampler";
const PUMP_THREAD: &str = "event-pump";

/// Where an agent's CPU went between two readings of [`threads_cpu_seconds`], per connection
/// and second, in µs: the tick thread's time less sampling's (judgement, actions, metrics),
/// the event pump's, and every other thread's.
fn split_us(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    sampling_us: f64,
    per: f64,
) -> (f64, f64, f64) {
    let spent = |name: &str| after.get(name).unwrap_or(&0.0) - before.get(name).unwrap_or(&0.0);
    let all: f64 = after.values().sum::<f64>() - before.values().sum::<f64>();
    let (tick, pump) = (spent(TICK_THREAD), spent(PUMP_THREAD));
    let us = |seconds: f64| seconds * 1e6 / per;
    (us(tick) - sampling_us, us(pump), us(all - tick - pump))
}

/// `lifeline --version`'s revision of `binary`.
fn revision(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .trim_start_matches("lifeline ")
                .to_owned()
        })
        .unwrap_or_default()
}

/// Sockets sampled per second, from the sampler's rounds logged between bytes `from` and `to`.
fn sampled_per_second(log: &Path, (from, to): (u64, u64), seconds: f64) -> f64 {
    let text = fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(from as usize..to as usize).unwrap_or_default());
    let sampled: f64 = text
        .lines()
        .filter(|l| l.contains("sampling round"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("sampled=")?.parse::<f64>().ok())
        })
        .sum();
    sampled / seconds
}

pub(super) fn busy_section(bins: &Bins, report: &mut Report) -> Result {
    let mut agents: Vec<(String, PathBuf)> = Vec::new();
    if let Some(before) = std::env::var_os("LL_BENCH_BASELINE").map(PathBuf::from) {
        if !before.is_file() {
            return Err(Failed(format!(
                "LL_BENCH_BASELINE={}: no such file",
                before.display()
            )));
        }
        agents.push((format!("before ({})", revision(&before)), before));
    }
    agents.push((
        format!("this build ({})", revision(&bins.lifeline)),
        bins.lifeline.clone(),
    ));
    report.line("## Busy connections");
    report.line("");
    report.line(format!(
        "{CONNECTIONS} connections to the watched endpoint, all of one process, in one \
         namespace: *busy*, the server writes 200 bytes on each every {PUSH_EVERY} s (spread \
         over the interval, {} payloads a second, as a busy node's informers receive events), \
         or *idle*. Agent CPU over {SECONDS} s once the table is complete and 15 s old; \
         *sampling* is the sampling rounds' own CPU (see Tracked connections), *sampled* the \
         sockets they read per second; the agent's CPU per connection splits into sampling, \
         the rest of the tick's thread (the judgement, actions, metrics and API views of each \
         tick), the event pump's thread (kernel events into the table) and all other threads.",
        CONNECTIONS / PUSH_EVERY.parse::<usize>().expect("seconds")
    ));
    report.line("");
    report.line(
        "| agent | connections | agent CPU | per connection | sampling per connection | the tick's rest | event pump | other threads | sampled/s | RSS |",
    );
    report.line("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    // This build's busy figure, for the goal (the last agent measured is this build).
    let mut busy_figure = None;
    for busy in [true, false] {
        let mut lab = Lab::new()?;
        let listen = format!("127.0.0.1:{WATCHED_PORT}");
        let mut server = lab.in_ns(&bins.load);
        server.args(["serve", "--listen", &listen]);
        if busy {
            server.args(["--push-every", PUSH_EVERY]);
        }
        lab.spawn(&mut server)?;
        thread::sleep(Duration::from_millis(300));
        let (hold, held) = Hold::start(&lab, bins, CONNECTIONS)?;
        for (label, binary) in &agents {
            let log = std::env::temp_dir().join(format!("llbench-{}-busy.log", std::process::id()));
            let these = Bins {
                lifeline: binary.clone(),
                load: bins.load.clone(),
            };
            let agent = lab.agent_logging(&these, &[], Some(&log))?;
            let listed = wait_listed(CONNECTIONS, Duration::from_secs(60));
            // Past QUIET_AFTER (10 s unchanged) from the first samples, and a little more.
            thread::sleep(Duration::from_secs(15));
            let log_size = || fs::metadata(&log).map_or(0, |m| m.len());
            let (c0, from) = (cpu_seconds(agent), log_size());
            let threads0 = threads_cpu_seconds(agent);
            thread::sleep(Duration::from_secs(SECONDS));
            let threads1 = threads_cpu_seconds(agent);
            let per_second = (cpu_seconds(agent) - c0) / SECONDS as f64;
            let per_connection_us = per_second * 1e6 / CONNECTIONS as f64;
            if busy {
                busy_figure = Some(per_connection_us);
            }
            let span = (from, log_size());
            let sampling = sampling_us_per_socket(&log, span, SECONDS as f64, CONNECTIONS);
            let (tick, pump, other) = split_us(
                &threads0,
                &threads1,
                sampling.unwrap_or(0.0),
                (SECONDS as usize * CONNECTIONS) as f64,
            );
            report.line(format!(
                "| {label} | {CONNECTIONS} {} | {:.2} ms/s | {:.2} µs/s | {} | {tick:.2} µs/s | {pump:.2} µs/s | {other:.2} µs/s | {:.0} | {} MiB |",
                if busy { "busy" } else { "idle" },
                per_second * 1000.0,
                per_connection_us,
                sampling.map_or("?".into(), |us| format!("{us:.2} µs/s")),
                sampled_per_second(&log, span, SECONDS as f64),
                status_kib(agent, "VmRSS") / 1024,
            ));
            if listed < CONNECTIONS {
                report.line(format!(
                    "(only {listed} of {CONNECTIONS} listed; ll-load: {held})"
                ));
            }
            lab.stop(agent);
            let _ = fs::remove_file(&log);
        }
        drop(hold);
    }
    report.line("");
    if let Some(us) = busy_figure {
        report.line(format!(
            "Goal (issue 26): this build's whole CPU ≤ {BUSY_GOAL_US:.0} µs per busy connection and \
             second: {us:.2} µs/s, {}.",
            if us <= BUSY_GOAL_US { "met" } else { "not met" }
        ));
        report.line("");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_s_cpu_splits_into_its_threads_shares() {
        let reading = |tick: f64, pump: f64, web: f64| {
            BTreeMap::from([
                (TICK_THREAD.to_owned(), tick),
                (PUMP_THREAD.to_owned(), pump),
                ("tokio-rt-worker".to_owned(), web),
            ])
        };
        // 10 connection-seconds: the tick spent 40 µs (15 of them sampling), the pump 20,
        // the runtime 5.
        let (tick, pump, other) = split_us(
            &reading(1.0, 2.0, 3.0),
            &reading(1.000_040, 2.000_020, 3.000_005),
            1.5,
            10.0,
        );
        assert!((tick - 2.5).abs() < 1e-6, "{tick}");
        assert!((pump - 2.0).abs() < 1e-6, "{pump}");
        assert!((other - 0.5).abs() < 1e-6, "{other}");
    }
}
