//! The Kubernetes side of the agent: where the apiservers are, which pod a container belongs
//! to, Events, evictions, and whether the apiserver answers the agent itself.
//!
//! [`Cluster::start`] only reads local configuration (it fails when there is none, or it is
//! broken); everything that talks to the apiserver runs in background tasks that retry with
//! backoff, so the agent starts, and keeps watching connections, while the apiserver is down —
//! the situation it exists for. Until API discovery succeeded, [`Cluster::api_versions`] is
//! `None`, [`Cluster::evict`] fails, and events wait in their queue.
//!
//! Parts, each a submodule with its pure logic (unit-tested) and, beside it, the background task
//! that does its I/O:
//!
//! - [`connect`]: in-cluster service account or kubeconfig;
//! - [`discovery`]: which API generation this apiserver serves ([`ApiVersions`]), decided once;
//!   its task retries discovery, then starts the watches of [`endpoints`];
//! - [`endpoints`]: the apiserver endpoint set, live (Service, EndpointSlices or Endpoints, the
//!   server URL with its name re-resolved), with removed endpoints retained for a while; its
//!   tasks watch one feed each and aggregate the feeds;
//! - [`node_local`]: in a pod, the addresses the node's own components use (the kubelet's
//!   kubeconfig, loopback apiservers and node-local proxies), looked at again periodically;
//! - [`pods`]: this node's pods by container id ([`PodRef`]), from a node-scoped watch;
//! - [`events`]: deduplicated, rate-limited Events, `events.k8s.io/v1` or core v1, and their
//!   writer;
//! - [`evict`]: `pods/eviction` in `policy/v1` or `policy/v1beta1` (the request is
//!   [`Cluster::evict`]'s own);
//! - [`probe`]: `/readyz` every few seconds, for the remediation guards.
//!
//! This module holds the handle ([`Cluster`]), its [`Error`], and what the tasks share: one
//! request with [`REQUEST_TIMEOUT`] (`call`) and the logging of an activity that keeps failing
//! (`Trouble`).
//!
//! Wiring (in `app/run.rs` and `app/workers.rs`):
//!
//! ```ignore
//! // app/run.rs
//! let node = alerts::node_name(args.node_name.as_deref());
//! let cluster = match Cluster::start(cluster::Options::new(args.kubeconfig.clone(), &node)).await {
//!     Ok(c) => Some(c),
//!     Err(err) => { tracing::info!("without Kubernetes: {}", error::chain(&err)); None }
//! };
//! if let Some(c) = &cluster {
//!     c.settled(CLUSTER_SETTLE).await; // false: discovery goes on in the background
//! }
//! // endpoints: flags/config merged with the cluster's (endpoints::merge_into), now and on every
//! // change of c.endpoints() (follow_discovery); after a change, a rescan finds the existing
//! // connections to new endpoints
//! // shutdown: c.shutdown(GRACE).await;
//!
//! // app/workers.rs
//! // pod of a process: cluster::pod_of(cluster, info), by its container id (also used by
//! // app::pump)
//! // c.emit(EventTarget::Pod { .. }, reason, &message, EventType::Warning) (SampleLoop::event)
//! // c.evict(namespace, name).await (ClusterEvictor); c.apiserver_reachable() for the
//! // remediation guards (SampleLoop)
//! ```
pub mod connect;
pub mod discovery;
pub mod endpoints;
pub mod events;
pub mod evict;
pub mod node_local;
pub mod pods;
pub mod probe;

#[cfg(test)]
mod fixture_tests;

use std::{
    collections::HashMap,
    future::Future,
    path::PathBuf,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use kube::Client;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

pub use discovery::ApiVersions;
pub use events::{EventTarget, EventType, Limits as EventLimits};
pub use evict::EvictOutcome;
pub use pods::PodRef;

use crate::{endpoint::EndpointSet, host::process::ProcessInfo};
use connect::Host;
use endpoints::{Feed, Tracker};
use events::{Admission, Book, EventWriter, Write};
use node_local::NodeWatch;
use probe::Reachability;

/// One request to the apiserver may take this long (watches excepted).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// An eviction may take this long (the apiserver checks PodDisruptionBudgets first).
pub const EVICT_TIMEOUT: Duration = Duration::from_secs(30);
/// While something keeps failing, it is logged again this often.
const RELOG_EVERY: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no Kubernetes API configuration: no --kubeconfig, no $KUBECONFIG, not in a pod \
         (KUBERNETES_SERVICE_HOST/PORT and {token}), and no ~/.kube/config",
        token = connect::TOKEN_FILE
    )]
    NoConfig,
    #[error("$KUBECONFIG names no file")]
    EmptyKubeconfigEnv,
    #[error("reading Kubernetes client configuration from {from}")]
    Kubeconfig {
        from: String,
        #[source]
        err: kube::config::KubeconfigError,
    },
    #[error("reading the in-cluster Kubernetes client configuration")]
    InCluster {
        #[source]
        err: kube::config::InClusterError,
    },
    #[error("building the Kubernetes client for {server}")]
    Client {
        server: String,
        #[source]
        err: kube::Error,
    },
    #[error("{what} on {server}")]
    Request {
        what: String,
        server: String,
        #[source]
        err: kube::Error,
    },
    #[error("{what} on {server}: no answer within {after:?}")]
    Timeout {
        what: String,
        server: String,
        after: Duration,
    },
    #[error("evicting pod {namespace}/{name}: the apiserver's API versions are not known yet (discovery has not succeeded)")]
    NotDiscovered { namespace: String, name: String },
    #[error("evicting pod {namespace}/{name} ({api}) on {server}: refused with {code} {reason}: {message}")]
    EvictionRefused {
        namespace: String,
        name: String,
        api: &'static str,
        server: String,
        code: u16,
        reason: String,
        message: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What [`Cluster::start`] needs.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (`--node-name`, `NODE_NAME`, the hostname): the pod watch's field
    /// selector, and the events' `reportingInstance`.
    pub node_name: String,
    pub event_limits: EventLimits,
}

impl Options {
    pub fn new(kubeconfig: Option<PathBuf>, node_name: &str) -> Self {
        Self {
            kubeconfig,
            node_name: node_name.to_owned(),
            event_limits: EventLimits::default(),
        }
    }
}

/// What [`Cluster::emit`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emitted {
    /// Queued for writing (a new event, or a count update).
    Queued,
    /// A repeat: counted into the existing event.
    Counted,
    /// Dropped by the rate limits.
    RateLimited,
    /// Dropped: the writer's queue is full (the apiserver is slow or out).
    QueueFull,
}

/// The handle: cheap to clone, shared between the run loop and the sampler thread. The
/// background tasks stop when the last clone is dropped, or at [`Cluster::shutdown`].
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    server: String,
    versions: watch::Receiver<Option<ApiVersions>>,
    endpoints: watch::Receiver<EndpointSet>,
    settled: watch::Receiver<bool>,
    pods: Arc<RwLock<HashMap<String, PodRef>>>,
    book: Arc<Mutex<Book>>,
    writes: mpsc::Sender<Write>,
    reach: Arc<Mutex<Reachability>>,
    stop: watch::Sender<bool>,
    writer: Mutex<Option<JoinHandle<()>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            writer.abort();
        }
    }
}

impl Cluster {
    /// Reads the client configuration, resolves the server's name once, and starts the
    /// background tasks. Fails only on local configuration; never waits for the apiserver.
    pub async fn start(options: Options) -> Result<Cluster> {
        let env = connect::Environment::read(options.kubeconfig.as_deref());
        let source = connect::choose(&env).ok_or(Error::NoConfig)?;
        let config = connect::load(&source).await?;
        let server = config.cluster_url.to_string();
        let target = connect::server_target(&config.cluster_url);
        let client = Client::try_from(config).map_err(|err| Error::Client {
            server: server.clone(),
            err,
        })?;
        tracing::info!(node = %options.node_name, "Kubernetes API {server} from the {source}");

        let mut tracker = Tracker::new(endpoints::RETAIN_REMOVED);
        let server_source = source.endpoint_source();
        let resolve = match target {
            Some((Host::Ip(ip), port)) => {
                tracker.update(
                    Feed::Server,
                    Instant::now(),
                    endpoints::server_entries([ip], port, server_source),
                );
                None
            }
            Some((Host::Name(name), port)) => {
                match endpoints::resolve_server(&name, port, server_source).await {
                    Ok(entries) => {
                        tracker.update(Feed::Server, Instant::now(), entries);
                    }
                    Err(err) => tracing::warn!(
                        "apiserver {server}: {err}; retrying every {:?}",
                        endpoints::RESOLVE_EVERY
                    ),
                }
                Some((name, port))
            }
            None => {
                tracing::warn!(
                    "apiserver URL {server} names no host: only the cluster's own endpoints are watched"
                );
                None
            }
        };
        // In a pod (the DaemonSet, with hostPID): what the node says, before the first set is
        // published, so the start-up scan already covers host-level clients.
        let node = if source == connect::ConfigSource::InCluster {
            let mut node = NodeWatch::new(PathBuf::from(node_local::PROC));
            let findings = node.look().await;
            tracker.update(Feed::Node, Instant::now(), findings.entries());
            Some(node)
        } else {
            None
        };
        let (endpoints_tx, endpoints_rx) = watch::channel(tracker.set());
        let (settled_tx, settled_rx) = watch::channel(false);
        let (versions_tx, versions_rx) = watch::channel(None);
        let (feed_tx, feed_rx) = mpsc::channel(16);
        let (writes_tx, writes_rx) = mpsc::channel(options.event_limits.queue);
        let (stop_tx, stop_rx) = watch::channel(false);
        let pods = Arc::new(RwLock::new(HashMap::new()));
        let book = Arc::new(Mutex::new(Book::new(
            options.event_limits.clone(),
            Instant::now(),
        )));
        let reach = Arc::new(Mutex::new(Reachability::default()));

        let mut tasks = vec![
            tokio::spawn(endpoints::aggregate(tracker, feed_rx, endpoints_tx, settled_tx)),
            tokio::spawn(probe::probe_loop(client.clone(), reach.clone(), server.clone())),
            tokio::spawn(pods::watch_pods(
                client.clone(),
                options.node_name.clone(),
                pods.clone(),
            )),
            tokio::spawn(discovery::discover_then_watch(
                client.clone(),
                server.clone(),
                versions_tx,
                feed_tx.clone(),
            )),
        ];
        if let Some(node) = node {
            tasks.push(tokio::spawn(node.run(feed_tx.clone())));
        }
        if let Some((name, port)) = resolve {
            tasks.push(tokio::spawn(endpoints::resolve_loop(
                name,
                port,
                server_source,
                feed_tx,
            )));
        }
        let writer = EventWriter::new(
            client.clone(),
            server.clone(),
            options.node_name.clone(),
            book.clone(),
        );
        let writer = tokio::spawn(writer.run(writes_rx, versions_rx.clone(), stop_rx));
        Ok(Cluster {
            inner: Arc::new(Inner {
                client,
                server,
                versions: versions_rx,
                endpoints: endpoints_rx,
                settled: settled_rx,
                pods,
                book,
                writes: writes_tx,
                reach,
                stop: stop_tx,
                writer: Mutex::new(Some(writer)),
                tasks,
            }),
        })
    }

    /// The API generation decision; `None` until discovery succeeded.
    pub fn api_versions(&self) -> Option<ApiVersions> {
        self.inner.versions.borrow().clone()
    }

    /// The cluster's apiserver endpoints, each with its [`Source`](crate::endpoint::Source); a
    /// new value on every change. Holds the server's own address from the start.
    pub fn endpoints(&self) -> watch::Receiver<EndpointSet> {
        self.inner.endpoints.clone()
    }

    /// Waits (at most `timeout`) until discovery succeeded and the Service and its
    /// EndpointSlices/Endpoints were listed once; true if so. For the start-up scan.
    pub async fn settled(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.settled.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The pod and container of a container id (bare 64 hex, or `<runtime>://<id>`), if it
    /// runs on this node. Cheap: a hash lookup under a read lock.
    pub fn pod_of(&self, container_id: &str) -> Option<PodRef> {
        let index = self.inner.pods.read().expect("pods lock");
        index.get(pods::bare_id(container_id)).cloned()
    }

    /// Records an event and queues its write; never blocks on I/O (see `events.rs` for the
    /// dedup and rate-limit rules).
    pub fn emit(&self, target: EventTarget, reason: &str, message: &str, type_: EventType) -> Emitted {
        let admission = self
            .inner
            .book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .admit(Instant::now(), chrono::Utc::now(), target, reason, message, type_);
        match admission {
            Admission::Write(write) => match self.inner.writes.try_send(write) {
                Ok(()) => Emitted::Queued,
                Err(_) => {
                    tracing::debug!(reason, "event dropped: the writer's queue is full");
                    Emitted::QueueFull
                }
            },
            Admission::Counted => Emitted::Counted,
            Admission::RateLimited => {
                tracing::debug!(reason, "event dropped by the rate limit");
                Emitted::RateLimited
            }
        }
    }

    /// Evicts a pod through `pods/eviction` (PodDisruptionBudgets apply), in the Eviction API
    /// version discovery chose.
    pub async fn evict(&self, namespace: &str, name: &str) -> Result<EvictOutcome> {
        let inner = &self.inner;
        let versions = self.api_versions().ok_or_else(|| Error::NotDiscovered {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })?;
        let path = evict::path(namespace, name);
        let body = evict::body(versions.eviction, namespace, name);
        let request = http::Request::post(&path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string().into_bytes())
            .expect("a path and a static header make a valid request");
        let what = format!("evicting pod {namespace}/{name} (POST {path})");
        let answer = match tokio::time::timeout(EVICT_TIMEOUT, inner.client.request_text(request)).await {
            Err(_) => {
                return Err(Error::Timeout {
                    what,
                    server: inner.server.clone(),
                    after: EVICT_TIMEOUT,
                })
            }
            Ok(answer) => answer,
        };
        let status = match answer {
            Ok(_) => None,
            Err(kube::Error::Api(status)) => Some(status),
            Err(err) => {
                return Err(Error::Request {
                    what,
                    server: inner.server.clone(),
                    err,
                })
            }
        };
        evict::classify(status.as_deref().map_or(Ok(()), Err)).map_err(|refused| Error::EvictionRefused {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            api: versions.eviction.api_version(),
            server: inner.server.clone(),
            code: refused.code,
            reason: refused.reason,
            message: refused.message,
        })
    }

    /// Whether the agent's own probe of the apiserver (`/readyz` every few seconds) recently
    /// succeeded; `None` before the first probe ended or when the probe went quiet.
    pub fn apiserver_reachable(&self) -> Option<bool> {
        self.inner
            .reach
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(Instant::now())
    }

    /// Writes the queued events (at most `grace`), then stops every task.
    pub async fn shutdown(&self, grace: Duration) {
        let _ = self.inner.stop.send(true);
        let writer = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut writer) = writer {
            if tokio::time::timeout(grace, &mut writer).await.is_err() {
                writer.abort();
            }
        }
        for task in &self.inner.tasks {
            task.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by the background tasks

/// Logs a failing activity once when it starts failing, again every [`RELOG_EVERY`] while it
/// keeps failing, and once when it works again.
struct Trouble {
    what: &'static str,
    since: Option<Instant>,
    logged: Option<Instant>,
    failures: u64,
}

impl Trouble {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            since: None,
            logged: None,
            failures: 0,
        }
    }

    fn failed(&mut self, err: &dyn std::error::Error) {
        let now = Instant::now();
        self.failures += 1;
        let since = *self.since.get_or_insert(now);
        if self.logged.is_none_or(|at| now.duration_since(at) >= RELOG_EVERY) {
            self.logged = Some(now);
            tracing::warn!(
                failures = self.failures,
                failing_for_s = now.duration_since(since).as_secs(),
                "{}: {}",
                self.what,
                crate::error::chain(err)
            );
        }
    }

    fn ok(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                failures = self.failures,
                "{}: working again after {}s",
                self.what,
                since.elapsed().as_secs()
            );
        }
        self.logged = None;
        self.failures = 0;
    }
}

/// Runs `fut` (a request named `what`) with [`REQUEST_TIMEOUT`].
async fn call<T>(server: &str, what: &str, fut: impl Future<Output = kube::Result<T>>) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(err)) => Err(Error::Request {
            what: what.to_owned(),
            server: server.to_owned(),
            err,
        }),
        Err(_) => Err(Error::Timeout {
            what: what.to_owned(),
            server: server.to_owned(),
            after: REQUEST_TIMEOUT,
        }),
    }
}

/// The pod a process runs in, from the cluster's pod index by its container id; none outside
/// Kubernetes or outside a container.
pub fn pod_of(cluster: Option<&Cluster>, info: &ProcessInfo) -> Option<PodRef> {
    cluster.and_then(|c| info.container.as_ref().and_then(|k| c.pod_of(&k.id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiled, never run: the handle's futures can be awaited from spawned tasks (the
    /// remediation engine's `Evictor` requires `Send` futures).
    #[allow(dead_code)]
    fn futures_are_send(cluster: &Cluster) {
        fn send<T: Send>(_: T) {}
        send(cluster.evict("ns", "pod"));
        send(cluster.settled(Duration::ZERO));
        send(cluster.shutdown(Duration::ZERO));
    }

    #[test]
    fn the_handle_is_shared_across_threads() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Cluster>();
        shareable::<Error>();
    }
}
