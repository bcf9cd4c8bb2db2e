//! Unrelated segments: what every segment of the node that is not the endpoints' costs. A
//! loopback ping-pong (`ll-load pingpong`: round trips of 100 bytes, each a segment that
//! arrives on an established socket, where `tcp_probe` fires) to a port nobody watches,
//! observed in turn by nobody, by lifeline, by bpftrace's one-comparison filter on
//! `inet_sock_set_state` (the churn section's reference) and by the same filter on the classic
//! `tcp/tcp_probe` tracepoint (what a per-segment filter costs when the kernel builds the
//! tracepoint's record first); rounds interleaved, medians.
use super::{observed, Bins, Lab, Report, Tally, CHURN_SECONDS, ROUNDS, WATCHED_PORT};
use crate::Result;

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
    Ok(lab.repeat(bins, "pingpong", PINGPONG_PORT)? * ROUND_TRIPS_PER_CONNECTION)
}

pub(super) fn segments_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    lab.serve(bins, PINGPONG_PORT, "--echo")?;
    pingpong(&lab, bins)?; // warm-up

    let order = [
        Observer::None,
        Observer::Lifeline,
        Observer::BpftraceSetState,
        Observer::BpftraceProbe,
    ];
    let mut tally = Tally::new();
    for _ in 0..ROUNDS {
        for observer in order {
            let pid = match observer {
                Observer::None => None,
                Observer::Lifeline => Some(lab.agent(bins, &[])?),
                other => Some(lab.bpftrace_running(&other.bpftrace().expect("a bpftrace observer"))?),
            };
            let (rate, seen) = observed(&mut lab, pid, |lab| pingpong(lab, bins))?;
            let rows = seen.map(|(_, rows)| rows);
            eprintln!("{:<52} {rate:8.0} round trips/s", observer.label());
            tally.record(observer, rate, CHURN_SECONDS as f64, rows);
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
        let kernel = tally
            .programs_ns(observer)
            .map_or("—".into(), |ns| format!("{ns:.1} ns"));
        report.line(format!(
            "| {} | {:.0} | {:.3} | {kernel} | {} |",
            observer.label(),
            tally.rate(observer),
            tally.ratio(observer),
            tally.per_call_text(observer),
        ));
    }
    // The port filter in front (`segment_filter`, issue 26), or the segment program attached
    // directly where the kernel refuses the filter.
    let (program, ours) = ["segment_filter", "tcp_probe"]
        .into_iter()
        .map(|name| (name, tally.per_call(Observer::Lifeline, name)))
        .find(|(_, ns)| ns.is_finite())
        .unwrap_or(("segment_filter", f64::NAN));
    let theirs = tally.per_call(Observer::BpftraceProbe, "tcp_probe");
    report.line("");
    report.line(format!(
        "Per unrelated segment, lifeline's first program (`{program}`) {ours:.1} ns against \
         bpftrace's one comparison {theirs:.1} ns on the classic tracepoint ({:.2}×), which also \
         pays for the record the kernel builds before it runs (not in bpf_stats; lifeline's \
         typed raw tracepoint builds none).",
        ours / theirs
    ));
    report.line("");
    Ok(())
}
