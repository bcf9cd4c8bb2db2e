//! The glue between the tick and the alerts: [`ClientInput`]s and [`EndpointInput`]s taken
//! from the tick's snapshot, the node's name, and [`Alerter`], which does a whole tick.
use crate::{
    act::alerts::{AlertBook, ClientInput, ClientLabels, Dispatcher, EndpointInput, DEFAULT_SETTLE},
    health::snapshot::Snapshot,
};

/// The alert policy and the delivery, for the run loop: one call per tick.
pub struct Alerter {
    book: AlertBook,
    dispatcher: Dispatcher,
}

impl Alerter {
    /// Alerts about clients on `node`, delivered through `dispatcher` (keep a clone of it for
    /// [`Dispatcher::shutdown`]).
    pub fn new(node: impl Into<String>, dispatcher: Dispatcher) -> Self {
        Self {
            book: AlertBook::new(node, DEFAULT_SETTLE),
            dispatcher,
        }
    }

    /// Feeds a tick's snapshot to the policy and hands the alert changes to the receivers
    /// without waiting for them.
    pub fn tick(&mut self, snap: &Snapshot) {
        let (clients, unreachable) = inputs(snap);
        self.book.set_recovery_hold(snap.thresholds.connect_window);
        let changes = self.book.tick(snap.wall, &clients, &unreachable);
        for alert in &changes {
            tracing::info!(
                alert = alert.name(),
                status = alert.status().as_str(),
                comm = alert.labels.get("comm").map_or("", String::as_str),
                endpoint = alert.labels.get("endpoint").map_or("", String::as_str),
                "alert"
            );
        }
        self.dispatcher.submit(changes);
    }
}

/// The policy's inputs: one per listed process, ordered by key, and one per unreachable
/// endpoint.
pub fn inputs(snap: &Snapshot) -> (Vec<ClientInput>, Vec<EndpointInput>) {
    let clients = snap
        .clients
        .iter()
        .map(|c| ClientInput {
            key: c.key,
            is_client: c.verdict.is_client,
            state: c.verdict.state,
            since: snap.wall_of(c.verdict.since),
            reason: c.verdict.reason.clone(),
            labels: ClientLabels {
                namespace: c.pod.as_ref().map(|p| p.namespace.clone()),
                pod: c.pod.as_ref().map(|p| p.pod.clone()),
                container: c.pod.as_ref().map(|p| p.container.clone()),
                comm: c.process.comm.clone(),
                resource: c.verdict.resource.clone().unwrap_or_default(),
            },
            endpoint: c.verdict.endpoint.clone(),
        })
        .collect();
    let unreachable = snap
        .endpoints
        .iter()
        .filter_map(|e| match &e.status {
            crate::health::reachability::Status::Unreachable { since, reason } => Some(EndpointInput {
                endpoint: e.endpoint.to_string(),
                since: snap.wall_of(*since),
                reason: reason.clone(),
                outage: e.outage,
            }),
            _ => None,
        })
        .collect();
    (clients, unreachable)
}

/// The node's name for alerts: the `--node-name` flag (which also reads `NODE_NAME`), else
/// the hostname, else `"unknown"`.
pub fn node_name(flag: Option<&str>) -> String {
    if let Some(name) = flag.map(str::trim).filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(host) if rc == 0 && !host.is_empty() => host.to_owned(),
        _ => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use prometheus::{IntCounterVec, Opts};

    use super::*;
    use crate::{
        act::alerts::{node_name, sink::Sink, Options},
        cluster::pods::PodRef,
        health::judge::{Judge, Select},
        health::{State, Thresholds},
        host::prober::{Probe, ProbeOutcome},
        host::process::ProcessInfo,
        testkit::{endpoint, Lab, APISERVER},
    };

    fn in_pod(_: &ProcessInfo) -> Option<PodRef> {
        Some(PodRef {
            namespace: "kube-system".into(),
            pod: "kcm-0".into(),
            container: "kcm".into(),
            uid: "u".into(),
            monitor: false,
            remediate: false,
            labels: Default::default(),
        })
    }

    #[test]
    fn inputs_carry_verdict_pod_endpoint_and_wall_clock_since() {
        let mut lab = Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        let mut judge = Judge::new(Thresholds::default(), Select::default());
        let reached = BTreeMap::from([(
            endpoint(APISERVER),
            Probe {
                at: lab.at(14_000),
                outcome: ProbeOutcome::Answered(200),
            },
        )]);
        judge.tick(
            &lab.table,
            &reached,
            &in_pod,
            &crate::health::snapshot::no_streams,
            lab.at(15_000),
        );
        lab.peer_close(20_000, 0xa, 40000);
        let probes = BTreeMap::from([(
            endpoint(APISERVER),
            Probe {
                at: lab.at(35_000),
                outcome: ProbeOutcome::Refused,
            },
        )]);
        let snap = judge.tick(
            &lab.table,
            &probes,
            &in_pod,
            &crate::health::snapshot::no_streams,
            lab.at(36_000),
        );
        let (clients, unreachable) = inputs(&snap);
        assert_eq!(clients.len(), 1);
        let c = &clients[0];
        assert_eq!((c.key, c.is_client, c.state), ((7, 1), true, State::Disconnected));
        assert_eq!(c.since, snap.wall);
        assert_eq!(c.endpoint.as_deref(), Some(APISERVER));
        assert_eq!(c.labels.pod.as_deref(), Some("kcm-0"));
        assert_eq!(c.labels.comm, "proc-7");
        assert_eq!(unreachable.len(), 1);
        assert_eq!(unreachable[0].endpoint, APISERVER);
        assert_eq!(unreachable[0].since, snap.wall - Duration::from_secs(1));
        assert!(!unreachable[0].outage);
    }

    /// The judge's snapshot at `ms`, with a wall clock that moves with the lab's.
    fn tick(judge: &mut Judge, lab: &Lab, ms: u64) -> crate::health::snapshot::Snapshot {
        let mut snap = judge.tick(
            &lab.table,
            &BTreeMap::new(),
            &in_pod,
            &crate::health::snapshot::no_streams,
            lab.at(ms),
        );
        snap.wall = std::time::SystemTime::UNIX_EPOCH
            + Duration::from_secs(1_700_000_000)
            + Duration::from_millis(ms);
        snap
    }

    #[tokio::test]
    async fn the_alerter_turns_a_snapshot_into_delivered_alerts() {
        let sink = Sink::start().await;
        let sent = IntCounterVec::new(Opts::new("sent", "sent"), &["receiver", "result"]).unwrap();
        let dispatcher = Dispatcher::start(
            &[],
            std::slice::from_ref(&sink.url),
            &[],
            &sent,
            Options::default(),
        )
        .unwrap();
        let mut alerter = Alerter::new("node-9", dispatcher.clone());
        let mut lab = Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        let mut judge = Judge::new(Thresholds::default(), Select::default());
        alerter.tick(&tick(&mut judge, &lab, 15_000));
        lab.peer_close(20_000, 0xa, 40000);
        alerter.tick(&tick(&mut judge, &lab, 36_000));
        alerter.tick(&tick(&mut judge, &lab, 39_000));
        let got = sink.wait_accepted(1, Duration::from_secs(5)).await;
        let alert = &got[0].body["alerts"][0];
        assert_eq!(alert["labels"]["alertname"], "LifelineClientDisconnected");
        assert_eq!(
            alert["labels"]["namespace"], "kube-system",
            "pod labels from the pod index"
        );
        assert_eq!(alert["labels"]["pod"], "kcm-0");
        assert_eq!(alert["labels"]["container"], "kcm");
        assert_eq!(alert["labels"]["node"], "node-9");
        assert_eq!(alert["labels"]["comm"], "proc-7");
        assert_eq!(alert["labels"]["endpoint"], APISERVER);
        lab.connect(40_000, 0xb, 40001, 7);
        alerter.tick(&tick(&mut judge, &lab, 41_000));
        let got = sink.wait_accepted(2, Duration::from_secs(5)).await;
        assert_eq!(got[1].body["status"], "resolved");
        dispatcher.shutdown(Duration::from_secs(1)).await;
    }

    #[test]
    fn node_name_prefers_the_flag_then_the_hostname() {
        assert_eq!(node_name(Some("node-7")), "node-7");
        let host = node_name(None);
        assert!(!host.is_empty() && host != "unknown", "{host}");
        assert_eq!(node_name(Some(" ")), host);
    }
}
