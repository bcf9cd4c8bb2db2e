//! What one tick of the judge found, for every action that follows it: alerts, remediation,
//! metrics, the HTTP API and Kubernetes Events all read the same immutable [`Snapshot`] and
//! none of them reads the connection table again. Also the identity types they share.
use std::{
    sync::{Arc, PoisonError, RwLock},
    time::{Instant, SystemTime},
};

use crate::{
    cluster::pods::PodRef,
    endpoint::{Endpoint, EndpointSet},
    health::reachability::EndpointStatus,
    health::{Thresholds, Transition, Verdict},
    host::process::ProcessInfo,
    kernel::probed::Visibility,
    table::gaps::Gap,
    table::streams::request::Request,
    table::Tuple,
};

/// Identity of a process across pid reuse: pid + start time.
pub type ClientKey = (u32, u64);

/// The pod a process runs in, when the agent knows one (the cluster's pod index by container
/// id); standalone, always `None`.
pub type PodOf<'a> = &'a dyn Fn(&ProcessInfo) -> Option<PodRef>;

/// How a process is seen (see `kernel::golang`).
pub type VisibilityOf<'a> = &'a dyn Fn(ClientKey) -> Visibility;

/// [`VisibilityOf`] for tests: every process seen at connection level.
#[cfg(test)]
pub fn no_streams(_: ClientKey) -> Visibility {
    Visibility::Connection {
        why: "not a Go program".into(),
    }
}

/// [`PodOf`] without a cluster.
#[cfg(test)]
pub fn no_pod(_: &ProcessInfo) -> Option<PodRef> {
    None
}

/// One connection of a client, as it was at the tick.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionSnapshot {
    pub tuple: Tuple,
    pub endpoint: Endpoint,
    /// Kernel `TCP_*` state.
    pub tcp_state: u32,
    pub established_at: Option<SystemTime>,
    /// Last inbound payload, if any arrived.
    pub last_payload: Option<Instant>,
    pub bytes_received: u64,
    pub retransmits: u64,
    /// Its open HTTP/2 streams, where the client's plaintext is read.
    pub streams: Vec<StreamSnapshot>,
    /// Records about it the kernel lost lately (see `table/gaps.rs`): its evidence is
    /// incomplete.
    pub gap: Option<Gap>,
}

/// One open stream of a connection, as it was at the tick (SPEC "Streams").
#[derive(Clone, Debug, PartialEq)]
pub struct StreamSnapshot {
    pub id: u32,
    /// None for a stream opened before lifeline followed the connection.
    pub request: Option<Request>,
    pub started: Instant,
    pub response_at: Option<Instant>,
    pub last_frame: Instant,
    /// The end it declared (watches).
    pub deadline: Option<Instant>,
    pub stuck: bool,
    /// Judged: every frame of it can have been seen.
    pub whole: bool,
}

/// One process the table knows: a client, a process holding a connection that is not judged
/// yet, or one that only failed to connect so far.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientSnapshot {
    pub key: ClientKey,
    pub process: ProcessInfo,
    pub pod: Option<PodRef>,
    pub verdict: Verdict,
    /// Its connections, ordered by local address.
    pub connections: Vec<ConnectionSnapshot>,
    /// Failed connects within `connect_window`.
    pub recent_failures: u32,
    /// Selected by the config's `select` patterns (for host processes, this opts them into
    /// remediation).
    pub selected: bool,
    /// Whether its streams are followed, or only its connections (and why).
    pub visibility: Visibility,
    /// A response to one of its requests was seen: its streams are judged (evidence before
    /// judgement, see `health::judge`). Until then a followed client keeps the
    /// connection-level judgement.
    pub streams_judged: bool,
}

impl ClientSnapshot {
    /// Whether it is listed (API, metric gauges): a client, or holding a connection. A
    /// process that only failed to connect a few times is not, but its counters are kept.
    pub fn listed(&self) -> bool {
        self.verdict.is_client || !self.connections.is_empty()
    }

    /// `namespace`, `pod`, `container` (empty outside Kubernetes) and `comm`: the labels of
    /// its metric series and alerts.
    pub fn labels(&self) -> [String; 4] {
        match &self.pod {
            Some(p) => [
                p.namespace.clone(),
                p.pod.clone(),
                p.container.clone(),
                self.process.comm.clone(),
            ],
            None => [
                String::new(),
                String::new(),
                String::new(),
                self.process.comm.clone(),
            ],
        }
    }

    /// The connections a reset would destroy: those the verdict names as evidence.
    pub fn suspect_tuples(&self) -> Vec<Tuple> {
        let mut tuples: Vec<Tuple> = self
            .connections
            .iter()
            .filter(|c| self.verdict.suspects.contains(&c.tuple.local))
            .map(|c| c.tuple)
            .collect();
        tuples.sort_by_key(|t| (t.netns, t.local, t.remote));
        tuples
    }

    /// Established connections per endpoint.
    pub fn established(&self) -> impl Iterator<Item = &ConnectionSnapshot> {
        self.connections
            .iter()
            .filter(|c| c.tcp_state == lifeline_common::tcp_state::ESTABLISHED)
    }
}

/// A client's state change this tick.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientTransition {
    pub key: ClientKey,
    pub transition: Transition,
    pub endpoint: Option<String>,
}

/// Everything one tick found.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The tick's monotonic time, and the same moment on the wall clock.
    pub at: Instant,
    pub wall: SystemTime,
    /// Every process the table knows, ordered by pid (see [`ClientSnapshot::listed`]).
    pub clients: Vec<ClientSnapshot>,
    pub transitions: Vec<ClientTransition>,
    /// The endpoint set in force, and every endpoint's reachability.
    pub endpoint_set: EndpointSet,
    pub endpoints: Vec<EndpointStatus>,
    /// The thresholds the clients were judged with.
    pub thresholds: Thresholds,
}

impl Snapshot {
    /// An empty snapshot (before the first tick).
    pub fn empty() -> Self {
        Self {
            at: Instant::now(),
            wall: SystemTime::now(),
            clients: Vec::new(),
            transitions: Vec::new(),
            endpoint_set: EndpointSet::default(),
            endpoints: Vec::new(),
            thresholds: Thresholds::default(),
        }
    }

    /// The wall-clock time of a monotonic instant of this tick's past.
    pub fn wall_of(&self, at: Instant) -> SystemTime {
        self.wall - self.at.saturating_duration_since(at)
    }

    pub fn client(&self, key: ClientKey) -> Option<&ClientSnapshot> {
        self.clients.iter().find(|c| c.key == key)
    }

    /// The status of the endpoint `display` (as a verdict names it), when unreachable.
    pub fn unreachable(&self, display: &str) -> Option<&EndpointStatus> {
        self.endpoints
            .iter()
            .find(|e| e.endpoint.to_string() == display && e.unreachable_since().is_some())
    }
}

/// The latest snapshot, shared with the HTTP API: replaced whole each tick, read without
/// waiting for the tick.
#[derive(Clone)]
pub struct Latest(Arc<RwLock<Arc<Snapshot>>>);

impl Latest {
    pub fn new(first: Snapshot) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(first))))
    }

    pub fn get(&self) -> Arc<Snapshot> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn set(&self, snap: Arc<Snapshot>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = snap;
    }
}
