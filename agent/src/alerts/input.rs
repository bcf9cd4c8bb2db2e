//! The glue between the run loop and the alerts: [`ClientInput`]s built from the connection
//! table and the judge's verdicts, the node's name, and [`Alerter`], which does a whole tick.
use std::{
    collections::HashMap,
    time::{Instant, SystemTime},
};

use lifeline_common::tcp_state;

use crate::{
    alerts::{AlertBook, ClientInput, ClientLabels, Dispatcher, DEFAULT_SETTLE},
    health::{assess_outage, Verdict},
    table::ConnectionTable,
    views::{ClientKey, PodOf},
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

    /// Feeds this tick's verdicts (judged at monotonic `now`) to the policy and hands the
    /// alert changes to the receivers without waiting for them. The outage is judged from the
    /// same verdicts.
    pub fn tick(
        &mut self,
        table: &ConnectionTable,
        verdicts: &HashMap<ClientKey, Verdict>,
        now: Instant,
        pod_of: PodOf<'_>,
    ) {
        let wall_now = SystemTime::now();
        let clients = inputs(table, verdicts, now, wall_now, pod_of);
        let outage = assess_outage(verdicts.values());
        let changes = self.book.tick(wall_now, &clients, outage.as_ref());
        for alert in &changes {
            tracing::info!(
                alert = alert.name(),
                status = alert.status().as_str(),
                comm = alert.labels.get("comm").map_or("", String::as_str),
                "alert"
            );
        }
        self.dispatcher.submit(changes);
    }
}

/// One input per judged process still in the table, ordered by pid. `now` is the monotonic
/// time of the verdicts and `wall_now` the same moment on the wall clock (state `since` is
/// converted with it).
pub fn inputs(
    table: &ConnectionTable,
    verdicts: &HashMap<ClientKey, Verdict>,
    now: Instant,
    wall_now: SystemTime,
    pod_of: PodOf<'_>,
) -> Vec<ClientInput> {
    let mut out: Vec<ClientInput> = verdicts
        .iter()
        .filter_map(|(key, verdict)| {
            let record = table
                .process(key.0)
                .filter(|r| r.info.start_time_ticks == key.1)?;
            // As the judge reports it: an established connection's, else the last failed
            // connect's, else any connection's.
            let established = table
                .connections_of(key.0)
                .find(|c| c.tcp_state == tcp_state::ESTABLISHED);
            let endpoint = established
                .map(|c| c.endpoint.to_string())
                .or_else(|| record.connect_failures.back().map(|f| f.endpoint.to_string()))
                .or_else(|| table.connections_of(key.0).next().map(|c| c.endpoint.to_string()));
            Some(ClientInput {
                key: *key,
                is_client: verdict.is_client,
                state: verdict.state,
                since: wall_now - now.saturating_duration_since(verdict.since),
                reason: verdict.reason.clone(),
                labels: {
                    let pod = pod_of(&record.info);
                    ClientLabels {
                        namespace: pod.as_ref().map(|p| p.namespace.clone()),
                        pod: pod.as_ref().map(|p| p.pod.clone()),
                        container: pod.map(|p| p.container),
                        comm: record.info.comm.clone(),
                    }
                },
                endpoint,
            })
        })
        .collect();
    out.sort_by_key(|c| c.key);
    out
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
    use std::time::Duration;

    use prometheus::{IntCounterVec, Opts};

    use super::*;
    use crate::{
        alerts::{node_name, sink::Sink, Alerter, Options},
        endpoint::{Endpoint, EndpointSet, Source},
        health::State,
        kernel::events::{Change, KernelEvent},
        process::ProcessInfo,
    };

    fn table_with_connected(pid: u32, start: u64, t0: Instant) -> ConnectionTable {
        let mut set = EndpointSet::default();
        for e in Endpoint::parse_all("10.0.0.1:6443").unwrap() {
            set.insert(e, Source::Flag);
        }
        let mut table = ConnectionTable::new(set);
        let ev = |local: &str, old, new, tgid| KernelEvent {
            at: t0,
            sk: 0xa,
            netns: 1,
            change: Change::State { old, new },
            local: local.parse().unwrap(),
            remote: "10.0.0.1:6443".parse().unwrap(),
            owner_tgid: tgid,
            thread_comm: "worker".into(),
            sk_err: 0,
            bytes_received: 0,
        };
        let info = ProcessInfo {
            pid,
            comm: "kcm".into(),
            cmdline: String::new(),
            cgroup: "/".into(),
            container: None,
            netns: Some(1),
            start_time_ticks: start,
        };
        table.apply_event(
            &ev("10.0.0.2:0", tcp_state::CLOSE, tcp_state::SYN_SENT, Some(pid)),
            Some(info),
        );
        table.apply_event(
            &ev(
                "10.0.0.2:40000",
                tcp_state::SYN_SENT,
                tcp_state::ESTABLISHED,
                None,
            ),
            None,
        );
        table
    }

    #[test]
    fn inputs_carry_verdict_comm_endpoint_and_wall_clock_since() {
        let t0 = Instant::now();
        let table = table_with_connected(7, 42, t0);
        let verdict = |since| Verdict {
            state: State::Stale,
            since,
            reason: "quiet".into(),
            is_client: true,
        };
        let verdicts = HashMap::from([
            ((7, 42), verdict(t0 + Duration::from_secs(5))),
            ((7, 41), verdict(t0)), // an older process with the same pid: gone
            ((8, 1), verdict(t0)),  // not in the table: gone
        ]);
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let got = inputs(
            &table,
            &verdicts,
            t0 + Duration::from_secs(20),
            wall,
            &crate::views::no_pod,
        );
        assert_eq!(
            got,
            [ClientInput {
                key: (7, 42),
                is_client: true,
                state: State::Stale,
                since: wall - Duration::from_secs(15),
                reason: "quiet".into(),
                labels: ClientLabels {
                    comm: "kcm".into(),
                    ..Default::default()
                },
                endpoint: Some("10.0.0.1:6443".into()),
            }]
        );
    }

    #[tokio::test]
    async fn the_alerter_turns_verdicts_into_delivered_alerts() {
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
        let t0 = Instant::now();
        let table = table_with_connected(7, 42, t0);
        let verdict = |state| Verdict {
            state,
            since: t0,
            reason: "lost it".into(),
            is_client: true,
        };
        let later = t0 + Duration::from_secs(10);
        let in_pod = |_: &crate::process::ProcessInfo| {
            Some(crate::cluster::pods::PodRef {
                namespace: "kube-system".into(),
                pod: "kcm-0".into(),
                container: "kcm".into(),
                uid: "u".into(),
                monitor: false,
                remediate: false,
                labels: Default::default(),
            })
        };
        alerter.tick(
            &table,
            &HashMap::from([((7, 42), verdict(State::Disconnected))]),
            later,
            &in_pod,
        );
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
        assert_eq!(alert["labels"]["comm"], "kcm");
        assert_eq!(alert["labels"]["endpoint"], "10.0.0.1:6443");
        assert_eq!(alert["annotations"]["description"], "lost it");
        alerter.tick(
            &table,
            &HashMap::from([((7, 42), verdict(State::Healthy))]),
            later,
            &in_pod,
        );
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
