//! A process that is no client, through a client's libssl (issue 26 item 4): a libssl is shared
//! by every process of the node that speaks TLS. A python3 client keeps a connection to the
//! watched endpoint (so the agent follows it through the system libssl); another python3
//! process, through the same file, sends keep-alive HTTPS GETs to a server that is no
//! endpoint, as fast as it can, while the client is stopped (SIGSTOP: still connected, still
//! followed). Interleaved rounds: no agent, the connection-only agent, the agent with its
//! probes. Printed: the other process's requests per second against no agent, the OpenSSL
//! probes' runs meanwhile (bpf_stats), and the client's own runs afterwards (the count works).
use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use super::{
    median, per_call, prog_stats,
    streams::{all_streams, python_rate, PYTHON_CLIENT},
    Bins, Lab, Report, WATCHED_PORT,
};
use crate::{workspace, Failed, Result};

/// The server that is no endpoint.
const OTHER_PORT: u16 = 26446;
/// Seconds of the other process per observer and round.
const SECONDS: &str = "5";
const ROUNDS: usize = 3;
/// The client: one GET every 200 ms over one keep-alive connection, forever.
const CLIENT: &str = r#"
import http.client, ssl, sys, time
c = http.client.HTTPSConnection(sys.argv[1], int(sys.argv[2]), context=ssl._create_unverified_context())
while True:
    c.request("GET", "/api/v1/namespaces/default/pods/web-0")
    c.getresponse().read()
    time.sleep(0.2)
"#;
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Observer {
    None,
    Connections,
    Probes,
}

impl Observer {
    fn label(self) -> &'static str {
        match self {
            Observer::None => "no agent",
            Observer::Connections => "agent, connection-only (`--no-go-probes`)",
            Observer::Probes => "agent with its client probes",
        }
    }
}

/// The OpenSSL probes' runs between two reads of the agent's program stats.
fn ssl_runs(before: &BTreeMap<u32, (u64, u64)>, after: &BTreeMap<u32, (u64, u64)>) -> u64 {
    per_call(before, after)
        .iter()
        .filter(|c| c.0.starts_with("ssl_"))
        .map(|c| c.1)
        .sum()
}

/// Runs the other process: requests per second.
fn other(lab: &Lab) -> Result<f64> {
    python_rate(lab, PYTHON_CLIENT, OTHER_PORT, SECONDS)
}

/// One window: the other process's rate, the probes' runs meanwhile, and the client's own
/// runs in the 2 s after it.
struct Window {
    rate: f64,
    runs: Option<u64>,
    client_runs: Option<u64>,
}

pub(super) fn libssl_section(bins: &Bins, report: &mut Report) -> Result {
    let mut lab = Lab::new()?;
    let certs = std::env::temp_dir().join(format!("llbench-{}-ssl-certs", std::process::id()));
    let apiserver = workspace().join("target/debug/ll-apiserver");
    for (port, dir) in [(WATCHED_PORT, "watched"), (OTHER_PORT, "other")] {
        let listen = format!("127.0.0.1:{port}");
        let mut server = lab.in_ns(&apiserver);
        server
            .args(["--listen", &listen, "--cert-dir"])
            .arg(certs.join(dir));
        lab.spawn(&mut server)?;
    }
    thread::sleep(Duration::from_secs(2));
    let port = WATCHED_PORT.to_string();
    let client = lab.spawn(lab.in_ns("python3").args(["-c", CLIENT, "127.0.0.1", &port]))?;
    thread::sleep(Duration::from_secs(1));
    let signal = |sig| {
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(client as i32, sig) };
    };

    let order = [Observer::None, Observer::Connections, Observer::Probes];
    let mut windows: BTreeMap<Observer, Vec<Window>> = BTreeMap::new();
    for round in 0..ROUNDS {
        for observer in order {
            let agent = match observer {
                Observer::None => None,
                Observer::Connections => Some(lab.agent(bins, &["--no-go-probes"])?),
                Observer::Probes => Some(lab.agent(bins, &[])?),
            };
            if observer == Observer::Probes {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !all_streams(&[client]) {
                    if Instant::now() > deadline {
                        return Err(Failed("the python client was not followed within 30 s".into()));
                    }
                    thread::sleep(Duration::from_millis(200));
                }
            } else {
                thread::sleep(Duration::from_secs(3));
            }
            signal(libc::SIGSTOP);
            thread::sleep(Duration::from_millis(300));
            let before = agent.map(prog_stats);
            let rate = other(&lab)?;
            let during = agent.map(prog_stats);
            signal(libc::SIGCONT);
            thread::sleep(Duration::from_secs(2));
            let after = agent.map(prog_stats);
            let (runs, client_runs) = match (&before, &during, &after) {
                (Some(b), Some(d), Some(a)) => (Some(ssl_runs(b, d)), Some(ssl_runs(d, a))),
                _ => (None, None),
            };
            if let Some(a) = agent {
                lab.stop(a);
            }
            eprintln!(
                "round {round}: {:<44} other process {rate:6.0} requests/s, ssl_* runs {runs:?}, the client's own {client_runs:?}",
                observer.label()
            );
            windows.entry(observer).or_default().push(Window {
                rate,
                runs,
                client_runs,
            });
        }
    }
    let _ = std::fs::remove_dir_all(&certs);

    report.line("## A process that is no client, through a client's libssl");
    report.line("");
    report.line(format!(
        "A python3 client keeps a keep-alive connection to the watched endpoint (a GET every \
         200 ms), so the agent follows it through the system libssl; another python3 process, \
         through the same file, sends keep-alive HTTPS GETs to a server that is no endpoint for \
         {SECONDS} s while the client is stopped (SIGSTOP: still connected, still followed); \
         {ROUNDS} interleaved rounds (medians; the runs are summed). The OpenSSL probes fire for \
         their client processes only (issue 26 item 4: goal, nothing for the other process)."
    ));
    report.line("");
    report.line("| observer | other process's requests/s | vs no agent | OpenSSL probe runs meanwhile | the client's own runs in the 2 s after |");
    report.line("| --- | ---: | ---: | ---: | ---: |");
    let base = median(windows[&Observer::None].iter().map(|w| w.rate).collect());
    for observer in order {
        let w = &windows[&observer];
        let rate = median(w.iter().map(|w| w.rate).collect());
        let sum = |f: fn(&Window) -> Option<u64>| {
            w.iter()
                .map(f)
                .sum::<Option<u64>>()
                .map_or_else(|| "—".to_owned(), |n| n.to_string())
        };
        report.line(format!(
            "| {} | {rate:.0} | {:.3} | {} | {} |",
            observer.label(),
            rate / base,
            sum(|w| w.runs),
            sum(|w| w.client_runs),
        ));
    }
    report.line("");
    Ok(())
}
