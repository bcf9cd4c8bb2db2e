//! What the agent reports: one JSON object per client process (SPEC.md `/api/v1/clients`) and
//! the endpoints in force, built from the latest tick's snapshot (at most a tick old).
use lifeline_common::tcp_state;
use serde::{Deserialize, Serialize};

use crate::{
    cluster::ApiVersions,
    endpoint::EndpointSet,
    health::reachability::{EndpointStatus, Status},
    health::snapshot::{ClientSnapshot, ConnectionSnapshot, Snapshot},
    kernel::probed::Visibility,
    times::rfc3339,
};

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
    /// `streams` (its requests are followed inside its connections) or `connection`.
    #[serde(default)]
    pub visibility: String,
    /// The Go version whose streams are read, or why only connections are; for a followed
    /// client whose streams are not judged yet, also why not.
    #[serde(default)]
    pub visibility_reason: String,
    /// Its streams are judged: a response to one of its requests was seen (evidence before
    /// judgement). False for a client seen at connection level.
    #[serde(default)]
    pub streams_judged: bool,
    /// Its open streams (where `visibility` is `streams`), watches first.
    #[serde(default)]
    pub streams: Vec<StreamView>,
    /// `complete`, or `incomplete` while the kernel lately lost records about one of its
    /// connections: what was pending then is timed afresh, never judged from the gap.
    #[serde(default)]
    pub evidence: String,
    /// Since when its evidence is incomplete.
    #[serde(default)]
    pub evidence_incomplete_since: Option<String>,
    /// Why: the cause and how many records, e.g. `rate_limited: 120 records lost on 1
    /// connection`.
    #[serde(default)]
    pub evidence_reason: Option<String>,
}

/// One open stream (SPEC "Streams"): what it asks for, never a header value or a body.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StreamView {
    /// The HTTP/2 stream id on its connection.
    pub id: u32,
    /// The connection's local address.
    pub local: String,
    /// Null for a stream opened before lifeline followed the connection (not judged).
    pub method: Option<String>,
    pub kind: Option<String>,
    /// `resource` or `group/resource` (`/subresource` included).
    pub resource: Option<String>,
    /// Null for all namespaces or a cluster-scoped resource.
    pub namespace: Option<String>,
    /// The path, query values redacted outside SPEC's allow-list.
    pub path: Option<String>,
    pub started: String,
    /// When it declared it would end (watches).
    pub deadline: Option<String>,
    pub response_headers: bool,
    pub last_frame_age_seconds: f64,
    pub stuck: bool,
    /// False when not every frame of it could be seen (opened before lifeline followed the
    /// connection, or events lost since): listed, never judged.
    pub judged: bool,
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
    /// Records about it the kernel lost lately, if any.
    #[serde(default)]
    pub evidence_gap: Option<GapView>,
}

/// Records the kernel lost about one connection (see `table/gaps.rs`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GapView {
    pub since: String,
    pub last: String,
    /// `ring_full`, `rate_limited` or `unscoped`.
    pub cause: String,
    pub records: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EndpointView {
    pub endpoint: String,
    /// Where it came from first (`flag`, `config`, ...).
    pub source: String,
    /// Every source that asked for it.
    pub sources: Vec<String>,
    /// `reachable`, `unreachable` or `unknown` (no evidence yet), from the agent's probe and
    /// the node's processes.
    #[serde(default)]
    pub reachability: String,
    /// Since when it is unreachable, and why.
    #[serde(default)]
    pub unreachable_since: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    /// Unreachable for `outage_after`: `LifelineApiserverOutage` fires.
    #[serde(default)]
    pub outage: bool,
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

fn connection_view(c: &ConnectionSnapshot, snap: &Snapshot) -> ConnectionView {
    ConnectionView {
        local: c.tuple.local.to_string(),
        remote: c.tuple.remote.to_string(),
        endpoint: c.endpoint.to_string(),
        tcp_state: tcp_state_name(c.tcp_state).to_owned(),
        established_at: c.established_at.map(rfc3339),
        last_receive_age_seconds: c
            .last_payload
            .map(|at| snap.at.saturating_duration_since(at).as_secs_f64()),
        bytes_received: c.bytes_received,
        retransmits: c.retransmits,
        evidence_gap: c.gap.map(|g| GapView {
            since: rfc3339(snap.wall_of(g.since)),
            last: rfc3339(snap.wall_of(g.last)),
            cause: g.cause.as_str().to_owned(),
            records: g.records,
        }),
    }
}

/// Whether a client's evidence is complete, and if not since when and why.
fn evidence(c: &ClientSnapshot, snap: &Snapshot) -> (String, Option<String>, Option<String>) {
    let gaps: Vec<_> = c.connections.iter().filter_map(|k| k.gap).collect();
    let Some(since) = gaps.iter().map(|g| g.since).min() else {
        return ("complete".into(), None, None);
    };
    let latest = gaps.iter().max_by_key(|g| g.last).expect("not empty");
    let records: u64 = gaps.iter().map(|g| g.records).sum();
    let why = format!(
        "{}: {records} records lost on {} connection{}",
        latest.cause.as_str(),
        gaps.len(),
        if gaps.len() == 1 { "" } else { "s" }
    );
    ("incomplete".into(), Some(rfc3339(snap.wall_of(since))), Some(why))
}

/// `/api/v1/clients`: every listed process of the latest tick, ordered by pid.
pub fn clients(snap: &Snapshot) -> Vec<ClientView> {
    snap.clients
        .iter()
        .filter(|c| c.listed())
        .map(|c| (c, evidence(c, snap)))
        .map(
            |(c, (evidence, evidence_incomplete_since, evidence_reason))| ClientView {
                pid: c.process.pid,
                comm: c.process.comm.clone(),
                cmdline: c.process.cmdline.clone(),
                netns: c.process.netns,
                cgroup: c.process.cgroup.clone(),
                container_id: c.process.container.as_ref().map(|k| k.id.clone()),
                namespace: c.pod.as_ref().map(|p| p.namespace.clone()),
                pod: c.pod.as_ref().map(|p| p.pod.clone()),
                container: c.pod.as_ref().map(|p| p.container.clone()),
                state: c.verdict.state.as_str().to_owned(),
                state_since: rfc3339(snap.wall_of(c.verdict.since)),
                reason: c.verdict.reason.clone(),
                connections: c.connections.iter().map(|k| connection_view(k, snap)).collect(),
                connect_failures: c.recent_failures,
                visibility: c.visibility.as_str().to_owned(),
                visibility_reason: match &c.visibility {
                    Visibility::Streams { client } if !c.streams_judged => {
                        format!(
                            "{client}; its streams are judged once a response to one of its requests is seen"
                        )
                    }
                    Visibility::Streams { client } => client.clone(),
                    Visibility::Connection { why } => why.clone(),
                },
                streams_judged: c.streams_judged && matches!(c.visibility, Visibility::Streams { .. }),
                streams: stream_views(c, snap),
                evidence,
                evidence_incomplete_since,
                evidence_reason,
            },
        )
        .collect()
}

fn stream_views(c: &ClientSnapshot, snap: &Snapshot) -> Vec<StreamView> {
    let mut out: Vec<StreamView> = c
        .connections
        .iter()
        .flat_map(|conn| conn.streams.iter().map(move |s| (conn, s)))
        .map(|(conn, s)| {
            let r = s.request.as_ref();
            StreamView {
                id: s.id,
                local: conn.tuple.local.to_string(),
                method: r.map(|r| r.method.clone()),
                kind: r.map(|r| r.kind.as_str().to_owned()),
                resource: r.map(|r| r.resource.clone()),
                namespace: r.and_then(|r| r.namespace.clone()),
                path: r.map(|r| r.path.clone()),
                started: rfc3339(snap.wall_of(s.started)),
                deadline: s.deadline.map(|d| {
                    rfc3339(
                        snap.wall + d.saturating_duration_since(snap.at)
                            - snap.at.saturating_duration_since(d),
                    )
                }),
                response_headers: s.response_at.is_some(),
                last_frame_age_seconds: snap.at.saturating_duration_since(s.last_frame).as_secs_f64(),
                stuck: s.stuck,
                judged: s.whole,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        (a.kind.as_deref() != Some("watch"), &a.resource, a.id).cmp(&(
            b.kind.as_deref() != Some("watch"),
            &b.resource,
            b.id,
        ))
    });
    out
}

/// `/api/v1/endpoints`: the set in force, and which API versions the cluster side uses.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointsView {
    pub endpoints: Vec<EndpointView>,
    /// `null` standalone, or until API discovery succeeded.
    pub api_versions: Option<ApiVersions>,
}

/// The endpoints in force with where each came from and, from the latest tick, whether it is
/// reachable.
pub fn endpoints(set: &EndpointSet, snap: &Snapshot) -> Vec<EndpointView> {
    set.iter()
        .map(|(e, sources)| {
            let status: Option<&EndpointStatus> = snap.endpoints.iter().find(|s| s.endpoint == *e);
            let (reachability, since, reason) = match status.map(|s| &s.status) {
                Some(Status::Reachable) => ("reachable", None, None),
                Some(Status::Unreachable { since, reason }) => (
                    "unreachable",
                    Some(rfc3339(snap.wall_of(*since))),
                    Some(reason.clone()),
                ),
                Some(Status::Unknown) | None => ("unknown", None, None),
            };
            EndpointView {
                endpoint: e.to_string(),
                source: sources.first().map_or("", |s| s.as_str()).to_owned(),
                sources: sources.iter().map(|s| s.as_str().to_owned()).collect(),
                reachability: reachability.to_owned(),
                unreachable_since: since,
                reason,
                outage: status.is_some_and(|s| s.outage),
            }
        })
        .collect()
}
