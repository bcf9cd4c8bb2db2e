//! What the agent reports: one JSON object per client process (SPEC.md `/api/v1/clients`),
//! built on request from the live connection table and the latest health verdicts, so a new
//! connection is visible as soon as its kernel event was applied.
use std::{
    collections::{BTreeMap, HashMap},
    time::{Instant, SystemTime},
};

use chrono::{DateTime, SecondsFormat, Utc};
use lifeline_common::tcp_state;
use serde::{Deserialize, Serialize};

use crate::{
    cluster::{pods::PodRef, ApiVersions},
    endpoint::EndpointSet,
    health::{State, Verdict},
    process::ProcessInfo,
    table::{Connection, ConnectionTable},
};

/// Identity of a process across pid reuse: pid + start time.
pub type ClientKey = (u32, u64);

/// The pod a process runs in, when the agent knows one (the cluster's pod index by container
/// id); standalone, always `None`.
pub type PodOf<'a> = &'a dyn Fn(&ProcessInfo) -> Option<PodRef>;

/// [`PodOf`] without a cluster.
#[cfg(test)]
pub fn no_pod(_: &ProcessInfo) -> Option<PodRef> {
    None
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClientView {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    /// Inode of the process's network namespace.
    pub netns: Option<u64>,
    pub cgroup: String,
    pub container_id: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub state: String,
    pub state_since: String,
    pub reason: String,
    pub connections: Vec<ConnectionView>,
    pub connect_failures: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConnectionView {
    pub local: String,
    pub remote: String,
    pub endpoint: String,
    pub tcp_state: String,
    pub established_at: Option<String>,
    /// Seconds since the last inbound payload; null when none arrived yet.
    pub last_receive_age_seconds: Option<f64>,
    pub bytes_received: u64,
    pub retransmits: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EndpointView {
    pub endpoint: String,
    /// Where it came from first (`flag`, `config`, ...).
    pub source: String,
    /// Every source that asked for it.
    pub sources: Vec<String>,
}

pub fn tcp_state_name(state: u32) -> &'static str {
    match state {
        tcp_state::ESTABLISHED => "ESTABLISHED",
        tcp_state::SYN_SENT => "SYN_SENT",
        tcp_state::SYN_RECV => "SYN_RECV",
        tcp_state::FIN_WAIT1 => "FIN_WAIT1",
        tcp_state::FIN_WAIT2 => "FIN_WAIT2",
        tcp_state::TIME_WAIT => "TIME_WAIT",
        tcp_state::CLOSE => "CLOSE",
        tcp_state::CLOSE_WAIT => "CLOSE_WAIT",
        tcp_state::LAST_ACK => "LAST_ACK",
        tcp_state::LISTEN => "LISTEN",
        tcp_state::CLOSING => "CLOSING",
        _ => "UNKNOWN",
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Wall-clock time of a monotonic instant in the past.
pub fn wall_clock(at: Instant, now: Instant) -> SystemTime {
    SystemTime::now() - now.saturating_duration_since(at)
}

fn connection_view(c: &Connection, now: Instant) -> ConnectionView {
    ConnectionView {
        local: c.tuple.local.to_string(),
        remote: c.tuple.remote.to_string(),
        endpoint: c.endpoint.to_string(),
        tcp_state: tcp_state_name(c.tcp_state).to_owned(),
        established_at: c.established_at.map(rfc3339),
        last_receive_age_seconds: c
            .last_payload
            .map(|at| now.saturating_duration_since(at).as_secs_f64()),
        bytes_received: c.bytes_received,
        retransmits: c.retransmits,
    }
}

/// Processes to list: those holding a connection now, and clients (judged processes),
/// ordered by pid.
pub fn clients(
    table: &ConnectionTable,
    verdicts: &HashMap<ClientKey, Verdict>,
    connect_window: std::time::Duration,
    now: Instant,
    pod_of: PodOf<'_>,
) -> Vec<ClientView> {
    let mut by_pid: BTreeMap<u32, Vec<ConnectionView>> = BTreeMap::new();
    for c in table.connections() {
        if let Some(pid) = c.owner {
            by_pid.entry(pid).or_default().push(connection_view(c, now));
        }
    }
    let mut out = Vec::new();
    for p in table.processes() {
        let key = (p.info.pid, p.info.start_time_ticks);
        let verdict = verdicts.get(&key);
        let mut connections = by_pid.remove(&p.info.pid).unwrap_or_default();
        if connections.is_empty() && !verdict.is_some_and(|v| v.is_client) {
            continue;
        }
        connections.sort_by(|a, b| a.local.cmp(&b.local));
        let (state, since, reason) = match verdict {
            Some(v) => (v.state, wall_clock(v.since, now), v.reason.clone()),
            None => (
                State::Healthy,
                wall_clock(p.first_seen, now),
                "just seen; not judged yet".to_owned(),
            ),
        };
        let connect_failures = p
            .connect_failures
            .iter()
            .filter(|f| now.saturating_duration_since(f.at) <= connect_window)
            .count() as u32;
        let pod = pod_of(&p.info);
        out.push(ClientView {
            pid: p.info.pid,
            comm: p.info.comm.clone(),
            cmdline: p.info.cmdline.clone(),
            netns: p.info.netns,
            cgroup: p.info.cgroup.clone(),
            container_id: p.info.container.as_ref().map(|c| c.id.clone()),
            namespace: pod.as_ref().map(|p| p.namespace.clone()),
            pod: pod.as_ref().map(|p| p.pod.clone()),
            container: pod.map(|p| p.container),
            state: state.as_str().to_owned(),
            state_since: rfc3339(since),
            reason,
            connections,
            connect_failures,
        });
    }
    out.sort_by_key(|c| c.pid);
    out
}

/// `/api/v1/endpoints`: the set in force, and which API versions the cluster side uses.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointsView {
    pub endpoints: Vec<EndpointView>,
    /// `null` standalone, or until API discovery succeeded.
    pub api_versions: Option<ApiVersions>,
}

pub fn endpoints(set: &EndpointSet) -> Vec<EndpointView> {
    set.iter()
        .map(|(e, sources)| EndpointView {
            endpoint: e.to_string(),
            source: sources.first().map_or("", |s| s.as_str()).to_owned(),
            sources: sources.iter().map(|s| s.as_str().to_owned()).collect(),
        })
        .collect()
}
