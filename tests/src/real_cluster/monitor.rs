//! Watching what the agent judges while a test does something slow (a soak, an apiserver
//! restart): a background thread polls `/api/v1/clients` every second and records every
//! non-healthy judgement it sees, so a test can fail on all of them at once, with when and why.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime},
};

use serde_json::Value;

/// How often the monitor asks the agent.
const INTERVAL: Duration = Duration::from_secs(1);

/// A client seen in a non-healthy state (first sighting of that pid in that state).
#[derive(Clone, Debug)]
pub struct Sighting {
    /// Since the monitor started.
    pub at: Duration,
    pub pid: u32,
    pub comm: String,
    /// `namespace/pod` of a client in a pod, empty for a host process.
    pub pod: String,
    pub state: String,
    pub reason: String,
    /// What the agent listed of the client then, for a failure to be explained from its
    /// message: visibility, connections and streams (compact JSON).
    pub listed: String,
}

impl fmt::Display for Sighting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "+{:.0}s {} (pid {}",
            self.at.as_secs_f64(),
            self.comm,
            self.pid
        )?;
        if !self.pod.is_empty() {
            write!(f, ", pod {}", self.pod)?;
        }
        write!(f, ") {}: {}", self.state, self.reason)?;
        write!(f, "\n        as listed then: {}", self.listed)
    }
}

/// A client's visibility, connections and streams as `/api/v1/clients` lists them.
fn listed(client: &Value) -> String {
    let keep = [
        "visibility",
        "visibility_reason",
        "streams_judged",
        "connections",
        "streams",
    ];
    let view: serde_json::Map<String, Value> = keep
        .iter()
        .filter_map(|k| client.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect();
    Value::Object(view).to_string()
}

#[derive(Default)]
struct Record {
    polls: u64,
    failed_polls: Vec<String>,
    sightings: Vec<Sighting>,
    seen: BTreeSet<(u32, String)>,
    /// Every pid ever listed, with its comm.
    listed: BTreeMap<u32, String>,
    /// When each (pid, kind, resource) stream was first seen stuck, and as it was listed
    /// then; ignored clients included.
    first_stuck: BTreeMap<(u32, String, String), (SystemTime, Value)>,
}

/// A running monitor; stopped on drop.
pub struct Monitor {
    started: Instant,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Polls the agent at `agent` every second; clients for which `ignore` returns true (e.g.
    /// the kube-apiserver's own loopback client while it restarts) are not recorded.
    pub fn start(agent: SocketAddr, ignore: impl Fn(&Value) -> bool + Send + 'static) -> Monitor {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let record = Arc::new(Mutex::new(Record::default()));
        let (stop2, record2) = (stop.clone(), record.clone());
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let answer = crate::http_get(agent, "/api/v1/clients");
                let mut r = record2.lock().expect("monitor lock");
                r.polls += 1;
                match answer.map(|(status, body)| (status, serde_json::from_str::<Value>(&body))) {
                    Ok((200, Ok(Value::Array(clients)))) => {
                        let now = SystemTime::now();
                        for c in &clients {
                            let pid = c["pid"].as_u64().unwrap_or(0) as u32;
                            let streams = c["streams"].as_array().map(Vec::as_slice).unwrap_or_default();
                            for s in streams.iter().filter(|s| s["stuck"] == true) {
                                let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
                                let key = (pid, text(&s["kind"]), text(&s["resource"]));
                                r.first_stuck.entry(key).or_insert_with(|| (now, s.clone()));
                            }
                        }
                        for c in clients.iter().filter(|c| !ignore(c)) {
                            let pid = c["pid"].as_u64().unwrap_or(0) as u32;
                            let comm = c["comm"].as_str().unwrap_or("?").to_owned();
                            r.listed.insert(pid, comm.clone());
                            let state = c["state"].as_str().unwrap_or("?").to_owned();
                            if state != "healthy" && r.seen.insert((pid, state.clone())) {
                                r.sightings.push(Sighting {
                                    at: started.elapsed(),
                                    pid,
                                    comm,
                                    pod: pod_of(c),
                                    state,
                                    reason: c["reason"].as_str().unwrap_or("").to_owned(),
                                    listed: listed(c),
                                });
                            }
                        }
                    }
                    other => {
                        let at = started.elapsed().as_secs_f64();
                        r.failed_polls.push(format!("+{at:.0}s: {other:?}"));
                    }
                }
                drop(r);
                thread::sleep(INTERVAL);
            }
        });
        Monitor {
            started,
            stop,
            record,
            thread: Some(thread),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Every non-healthy judgement seen so far.
    pub fn sightings(&self) -> Vec<Sighting> {
        self.record.lock().expect("monitor lock").sightings.clone()
    }

    /// Polls that got no valid answer from the agent.
    pub fn failed_polls(&self) -> Vec<String> {
        self.record.lock().expect("monitor lock").failed_polls.clone()
    }

    /// How many polls were made.
    pub fn polls(&self) -> u64 {
        self.record.lock().expect("monitor lock").polls
    }

    /// When the monitor first saw a `kind` stream of `resource` of `pid` stuck (ignored
    /// clients too), and the stream as the agent listed it then: a poll a second, so within
    /// a second of the agent's judgement, however long the test was busy elsewhere.
    pub fn first_stuck(&self, pid: u32, kind: &str, resource: &str) -> Option<(SystemTime, Value)> {
        let key = (pid, kind.to_owned(), resource.to_owned());
        self.record
            .lock()
            .expect("monitor lock")
            .first_stuck
            .get(&key)
            .cloned()
    }

    /// Every (pid, comm) listed at least once.
    pub fn listed(&self) -> BTreeMap<u32, String> {
        self.record.lock().expect("monitor lock").listed.clone()
    }
}

/// `namespace/pod` of a listed client, empty for a host process.
pub fn pod_of(client: &Value) -> String {
    match (client["namespace"].as_str(), client["pod"].as_str()) {
        (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
        _ => String::new(),
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// A sighting keeps what explains a judgement (visibility, connections, streams) and
    /// drops the rest of the client's listing (its command line among them).
    #[test]
    fn a_sighting_keeps_the_clients_evidence_only() {
        let client = json!({
            "pid": 7,
            "cmdline": "ll-informer --token=REDACTED",
            "visibility": "streams",
            "streams_judged": false,
            "connections": [{"local": "10.0.0.2:40000", "bytes_received": 9}],
            "streams": [],
        });
        let kept: serde_json::Value = serde_json::from_str(&super::listed(&client)).unwrap();
        assert_eq!(
            kept,
            json!({
                "visibility": "streams",
                "streams_judged": false,
                "connections": [{"local": "10.0.0.2:40000", "bytes_received": 9}],
                "streams": [],
            })
        );
    }
}
