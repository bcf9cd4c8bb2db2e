//! Unrelated segments: what every segment of the node that is not the endpoints' costs. A
//! loopback ping-pong (`ll-load pingpong`: round trips of 100 bytes, each a segment that
//! arrives on an established socket, where `tcp_probe` fires) to a port nobody watches,
//! observed in turn by nobody, by lifeline, by bpftrace's one-comparison filter on
//! `inet_sock_set_state` (the churn section's reference) and by the same filter on the classic
//! `tcp/tcp_probe` tracepoint (what a per-segment filter costs when the kernel builds the
//! tracepoint's record first); rounds interleaved, medians.
use std::{collections::BTreeMap, thread, time::Duration};

use super::{median, per_call, prog_stats, Bins, Lab, Report, CHURN_SECONDS, ROUNDS, WATCHED_PORT};
use crate::{Failed, Result};

/// The echo server's port (no observer watches it).
const PINGPONG_PORT: u16 = 18081;
/// Round trips per connection of `ll-load pingpong`.
const ROUND_TRIPS_PER_CONNECTION: f64 = 50.0;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Observer {
    None,
    Lifeline,
    BpftraceSetState,
    BpftraceProbe,
}

impl Observer {
    fn label(self) -> &'static str {
        match self {
            Observer::None => "no observer",
            Observer::Lifeline => "lifeline",
            Observer::BpftraceSetState => "bpftrace, one comparison on `inet_sock_set_state`",
            Observer::BpftraceProbe => "bpftrace, one comparison on classic `tcp/tcp_probe`",
        }
    }

    fn bpftrace(self) -> Option<String> {
        let on = match self {
            Observer::BpftraceSetState => "tracepoint:sock:inet_sock_set_state",
            Observer::BpftraceProbe => "tracepoint:tcp:tcp_probe",
            _ => return None,
        };
        Some(format!(
            "{on} /args->dport == {WATCHED_PORT}/ {{ @hits = count(); }}"
        ))
    }
}

/// One ping-pong of CHURN_SECONDS: round trips per second.
fn pingpong(lab: &Lab, bins: &Bins) -> Result<f64> {
    let target = format!("127.0.0.1:{PINGPONG_PORT}");
    let secs = CHURN_SECONDS.to_string();
    let last = lab.load(
        bins,
        &[
            "pingpong",
            "--connect",
            &target,
            "--seconds",
            &secs,
            "--threads",
            "2",
        ],
    )?;
    let done: f64 = last
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Failed(format!("ll-load pingpong said {last:?}")))?;
    Ok(done * ROUND_TRIPS_PER_CONNECTION / CHURN_SECONDS as f64)
}

pub(super) fn segments_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    let listen = format!("127.0.0.1:{PINGPONG_PORT}");
    let mut server = lab.in_ns(&bins.load);
    server.args(["serve", "--listen", &listen, "--echo"]);
    lab.spawn(&mut server)?;
    thread::sleep(Duration::from_millis(500));
    pingpong(&lab, bins)?; // warm-up

    let order = [
        Observer::None,
        Observer::Lifeline,
        Observer::BpftraceSetState,
        Observer::BpftraceProbe,
    ];
    let mut rates: BTreeMap<Observer, Vec<f64>> = BTreeMap::new();
    let mut ratios: BTreeMap<Observer, Vec<f64>> = BTreeMap::new();
    // Kernel program time per round trip (bpf_stats, all the observer's programs).
    let mut kernel_ns: BTreeMap<Observer, Vec<f64>> = BTreeMap::new();
    let mut calls: BTreeMap<Observer, Vec<(String, u64, f64)>> = BTreeMap::new();
    for round in 0..ROUNDS {
        let mut baseline = f64::NAN;
        for observer in order {
            let pid = match observer {
                Observer::None => None,
                Observer::Lifeline => Some(lab.agent(bins, &[])?),
                other => Some(lab.bpftrace_running(&other.bpftrace().expect("a bpftrace observer"))?),
            };
            let stats0 = pid.map_or_else(BTreeMap::new, prog_stats);
            let rate = pingpong(&lab, bins)?;
            if let Some(p) = pid {
                let rows = per_call(&stats0, &prog_stats(p));
                let total: f64 = rows.iter().map(|(_, c, ns)| *c as f64 * ns).sum();
                kernel_ns
                    .entry(observer)
                    .or_default()
                    .push(total / (rate * CHURN_SECONDS as f64));
                if round == ROUNDS - 1 || calls.get(&observer).is_none_or(Vec::is_empty) {
                    calls.insert(observer, rows);
                }
                lab.stop(p);
            }
            if observer == Observer::None {
                baseline = rate;
            }
            eprintln!("round {round}: {:<52} {rate:8.0} round trips/s", observer.label());
            rates.entry(observer).or_default().push(rate);
            ratios.entry(observer).or_default().push(rate / baseline);
        }
    }

    report.line("## Unrelated segments");
    report.line("");
    report.line(format!(
        "A loopback ping-pong (`ll-load pingpong`, 2 threads, round trips of 100 bytes, 50 per \
         connection) for {CHURN_SECONDS} s per observer, {ROUNDS} interleaved rounds (medians). \
         Every segment is unrelated: the observers watch port {WATCHED_PORT}. Each round trip is \
         two segments that arrive on established sockets (`tcp_probe` fires twice). Round \
         trips per second swing with where the scheduler puts the two threads (bimodal on 2 \
         cores): read the programs' time, not the throughput."
    ));
    report.line("");
    report.line(
        "| observer | round trips/s | vs no observer | programs' time per round trip (bpf_stats) | per call |",
    );
    report.line("| --- | ---: | ---: | ---: | --- |");
    for observer in order {
        let rate = median(rates[&observer].clone());
        let per_call_text = calls
            .get(&observer)
            .map(|rows| {
                rows.iter()
                    .map(|(n, c, ns)| format!("{n}: {ns:.1} ns × {c}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_else(|| "—".into());
        let kernel = kernel_ns
            .get(&observer)
            .map_or("—".into(), |v| format!("{:.1} ns", median(v.clone())));
        report.line(format!(
            "| {} | {rate:.0} | {:.3} | {kernel} | {per_call_text} |",
            observer.label(),
            median(ratios[&observer].clone()),
        ));
    }
    let first_call = |o: Observer, name: &str| {
        calls
            .get(&o)
            .and_then(|rows| rows.iter().find(|r| r.0 == name))
            .map_or(f64::NAN, |r| r.2)
    };
    let (ours, theirs) = (
        first_call(Observer::Lifeline, "tcp_probe"),
        first_call(Observer::BpftraceProbe, "tcp_probe"),
    );
    report.line("");
    report.line(format!(
        "Per unrelated segment, lifeline's program {ours:.1} ns against bpftrace's one comparison \
         {theirs:.1} ns on the classic tracepoint ({:.2}×), which also pays for the record the \
         kernel builds before it runs (not in bpf_stats; lifeline's typed raw tracepoint builds \
         none).",
        ours / theirs
    ));
    report.line("");
    Ok(())
}
