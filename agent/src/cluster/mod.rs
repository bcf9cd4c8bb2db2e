//! The Kubernetes side of the agent: where the apiservers are, which pod a container belongs
//! to, Events, evictions, and whether the apiserver answers the agent itself.
//!
//! [`Cluster::start`] only reads local configuration (it fails when there is none, or it is
//! broken); everything that talks to the apiserver runs in background tasks that retry with
//! backoff, so the agent starts, and keeps watching connections, while the apiserver is down —
//! the situation it exists for. Until API discovery succeeded, [`Cluster::api_versions`] is
//! `None`, [`Cluster::evict`] fails, and events wait in their queue.
//!
//! Parts (pure logic in each submodule, unit-tested; the tasks below do the I/O):
//!
//! - [`connect`]: in-cluster service account or kubeconfig;
//! - [`discovery`]: which API generation this apiserver serves ([`ApiVersions`]), decided once;
//! - [`endpoints`]: the apiserver endpoint set, live (Service, EndpointSlices or Endpoints, the
//!   server URL with its name re-resolved), with removed endpoints retained for a while;
//! - [`node_local`]: in a pod, the addresses the node's own components use (the kubelet's
//!   kubeconfig, loopback apiservers and node-local proxies);
//! - [`pods`]: this node's pods by container id ([`PodRef`]);
//! - [`events`]: deduplicated, rate-limited Events, `events.k8s.io/v1` or core v1;
//! - [`evict`]: `pods/eviction` in `policy/v1` or `policy/v1beta1`;
//! - [`probe`]: `/readyz` every few seconds, for the remediation guards.
//!
//! Wiring (in `run.rs`):
//!
//! ```ignore
//! let node = alerts::node_name(args.node_name.as_deref());
//! let cluster = match cluster::Cluster::start(cluster::Options::new(args.kubeconfig.clone(), &node)).await {
//!     Ok(c) => Some(c),
//!     Err(err) => { tracing::warn!("without Kubernetes: {}", chain(&err)); None }
//! };
//! if let Some(c) = &cluster { c.settled(Duration::from_secs(10)).await; }
//! // endpoints: flags/config merged with the cluster's (endpoints::merge_into), now and on every
//! // change of c.endpoints(); after a change, rescan so existing connections to new endpoints
//! // are found
//! // pod of a process: c.pod_of(&container_ref.id)
//! // c.emit(EventTarget::Pod { .. }, "LifelineClientDisconnected", &reason, EventType::Warning);
//! // c.evict(ns, name).await; c.apiserver_reachable();
//! // shutdown: c.shutdown(GRACE).await;
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
    fmt::Debug,
    future::Future,
    path::PathBuf,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Endpoints, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Client,
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

pub use discovery::{ApiVersions, EndpointsApi, EventsApi};
pub use events::{EventTarget, EventType, Limits as EventLimits};
pub use evict::EvictOutcome;
pub use pods::PodRef;

use crate::endpoint::{EndpointSet, Source};
use connect::Host;
use endpoints::{Entry, Feed, Objects, Tracker};
use events::{Admission, Book, Write};
use probe::{ProbeResult, Reachability};

/// One request to the apiserver may take this long (watches excepted).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// An eviction may take this long (the apiserver checks PodDisruptionBudgets first).
pub const EVICT_TIMEOUT: Duration = Duration::from_secs(30);
/// Resolving the server's name may take this long (also at start).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Discovery is retried with a backoff from 1 s up to this.
const DISCOVERY_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often due event counts are written.
const FLUSH_EVERY: Duration = Duration::from_secs(5);
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
                match resolve_server(&name, port, server_source).await {
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
            tokio::spawn(aggregate(tracker, feed_rx, endpoints_tx, settled_tx)),
            tokio::spawn(probe_loop(client.clone(), reach.clone(), server.clone())),
            tokio::spawn(watch_pods(
                client.clone(),
                options.node_name.clone(),
                pods.clone(),
            )),
            tokio::spawn(discover_then_watch(
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
            tasks.push(tokio::spawn(resolve_loop(name, port, server_source, feed_tx)));
        }
        let writer = EventWriter {
            client: client.clone(),
            server: server.clone(),
            node: options.node_name.clone(),
            node_uid: None,
            book: book.clone(),
            trouble: Trouble::new("writing events"),
        };
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

    /// The cluster's apiserver endpoints, each with its [`Source`]; a new value on every change.
    /// Holds the server's own address from the start.
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
// Background tasks

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

/// `GET /apis`, `GET /api/v1` and `GET /version`, then the decision.
async fn discover(client: &Client, server: &str) -> Result<ApiVersions> {
    let groups = call(server, "API discovery (GET /apis)", client.list_api_groups()).await?;
    let core = call(
        server,
        "API discovery (GET /api/v1)",
        client.list_core_api_resources("v1"),
    )
    .await?;
    let version = match call(server, "GET /version", client.apiserver_version()).await {
        Ok(info) => Some(info.git_version),
        Err(err) => {
            tracing::debug!("{}", crate::error::chain(&err));
            None
        }
    };
    Ok(ApiVersions::decide(&groups, Some(&core), version))
}

/// Discovery until it succeeds, then the Service and EndpointSlice/Endpoints watches.
async fn discover_then_watch(
    client: Client,
    server: String,
    versions: watch::Sender<Option<ApiVersions>>,
    feeds: mpsc::Sender<(Feed, Vec<Entry>)>,
) {
    let mut trouble = Trouble::new("Kubernetes API discovery");
    let mut backoff = Duration::from_secs(1);
    let decided = loop {
        match discover(&client, &server).await {
            Ok(v) => break v,
            Err(err) => {
                trouble.failed(&err);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(DISCOVERY_BACKOFF_MAX);
            }
        }
    };
    trouble.ok();
    tracing::info!("{decided}");
    let backends = decided.endpoints;
    versions.send_replace(Some(decided));

    let by_name = watcher::Config::default().fields("metadata.name=kubernetes");
    let service = watch_feed(
        Api::<Service>::namespaced(client.clone(), "default"),
        by_name.clone(),
        Feed::Service,
        endpoints::service_entries,
        feeds.clone(),
        "watching Service default/kubernetes",
    );
    match backends {
        EndpointsApi::EndpointSliceV1 => {
            let slices = watch_feed(
                Api::<EndpointSlice>::namespaced(client, "default"),
                watcher::Config::default().labels("kubernetes.io/service-name=kubernetes"),
                Feed::Backends,
                endpoints::slice_entries,
                feeds,
                "watching the EndpointSlices of default/kubernetes",
            );
            futures::join!(service, slices);
        }
        EndpointsApi::CoreV1 => {
            let eps = watch_feed(
                Api::<Endpoints>::namespaced(client, "default"),
                by_name,
                Feed::Backends,
                endpoints::endpoints_entries,
                feeds,
                "watching Endpoints default/kubernetes",
            );
            futures::join!(service, eps);
        }
    }
}

/// One feed from a watch: after each change (once listed), the entries of every object.
async fn watch_feed<K>(
    api: Api<K>,
    config: watcher::Config,
    feed: Feed,
    reduce: fn(&K) -> Vec<Entry>,
    feeds: mpsc::Sender<(Feed, Vec<Entry>)>,
    what: &'static str,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut objects = Objects::default();
    let mut trouble = Trouble::new(what);
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                trouble.ok();
                if objects.apply(event, reduce) && objects.listed() {
                    let entries = objects.values().flatten().copied().collect();
                    if feeds.send((feed, entries)).await.is_err() {
                        return;
                    }
                }
            }
            Err(err) => trouble.failed(&err),
        }
    }
}

/// The feeds → the endpoint set, with removed entries expiring after the retention.
async fn aggregate(
    mut tracker: Tracker,
    mut feeds: mpsc::Receiver<(Feed, Vec<Entry>)>,
    out: watch::Sender<EndpointSet>,
    settled: watch::Sender<bool>,
) {
    loop {
        let next_expiry = tracker.next_expiry();
        let expiry = async {
            match next_expiry {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            update = feeds.recv() => {
                let Some((feed, entries)) = update else { return };
                let change = tracker.update(feed, Instant::now(), entries);
                for (endpoint, source) in &change.added {
                    tracing::info!(%endpoint, source = source.as_str(), "apiserver endpoint discovered");
                }
                for (endpoint, source) in &change.removed {
                    tracing::info!(
                        %endpoint, source = source.as_str(),
                        "apiserver endpoint no longer listed; still watched for {:?}",
                        endpoints::RETAIN_REMOVED
                    );
                }
            }
            () = expiry => {
                for (endpoint, source) in tracker.expire(Instant::now()) {
                    tracing::info!(%endpoint, source = source.as_str(), "apiserver endpoint forgotten");
                }
            }
        }
        let set = tracker.set();
        out.send_if_modified(|current| {
            let changed = *current != set;
            if changed {
                *current = set;
            }
            changed
        });
        if tracker.has(Feed::Service) && tracker.has(Feed::Backends) {
            settled.send_if_modified(|s| !std::mem::replace(s, true));
        }
    }
}

async fn resolve_server(name: &str, port: u16, source: Source) -> Result<Vec<Entry>, std::io::Error> {
    let lookup = tokio::net::lookup_host((name, port));
    let addrs = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("resolving {name} timed out"),
            )
        })?
        .map_err(|err| std::io::Error::new(err.kind(), format!("resolving {name}: {err}")))?;
    let entries = endpoints::server_entries(addrs.map(|a| a.ip()), port, source);
    if entries.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{name} resolved to no address"),
        ));
    }
    Ok(entries)
}

/// Re-resolves the server name every [`endpoints::RESOLVE_EVERY`].
async fn resolve_loop(name: String, port: u16, source: Source, feeds: mpsc::Sender<(Feed, Vec<Entry>)>) {
    let mut trouble = Trouble::new("resolving the apiserver's name");
    loop {
        tokio::time::sleep(endpoints::RESOLVE_EVERY).await;
        match resolve_server(&name, port, source).await {
            Ok(entries) => {
                trouble.ok();
                if feeds.send((Feed::Server, entries)).await.is_err() {
                    return;
                }
            }
            Err(err) => trouble.failed(&err),
        }
    }
}

/// What the node says ([`node_local`]), looked at every [`endpoints::RESOLVE_EVERY`]. Each part
/// that fails to be read keeps its last answer (the tracker then still retains what it named).
struct NodeWatch {
    proc_root: PathBuf,
    kubelet: Option<(node_local::KubeletServer, Vec<std::net::IpAddr>)>,
    listeners: Vec<node_local::Listener>,
    findings: node_local::Findings,
    kubelet_trouble: Trouble,
    resolve_trouble: Trouble,
    listeners_trouble: Trouble,
}

impl NodeWatch {
    fn new(proc_root: PathBuf) -> Self {
        Self {
            proc_root,
            kubelet: None,
            listeners: Vec::new(),
            findings: node_local::Findings::default(),
            kubelet_trouble: Trouble::new("reading the kubelet's kubeconfig"),
            resolve_trouble: Trouble::new("resolving the server of the kubelet's kubeconfig"),
            listeners_trouble: Trouble::new("listing the host's listening sockets"),
        }
    }

    /// One look (the /proc and sock_diag reads on a blocking thread); logs what is new.
    async fn look(&mut self) -> node_local::Findings {
        let proc_root = self.proc_root.clone();
        let read = tokio::task::spawn_blocking(move || {
            let kubelet = node_local::kubelet_server(&proc_root);
            let netns = proc_root.join("1/ns/net");
            let listeners = node_local::listeners(&netns, &crate::process::Procfs::new(&proc_root));
            (kubelet, listeners)
        })
        .await;
        let Ok((kubelet, listeners)) = read else {
            return self.findings.clone();
        };
        match kubelet {
            Ok(None) => {
                self.kubelet_trouble.ok();
                self.kubelet = None;
            }
            Ok(Some(server)) => {
                self.kubelet_trouble.ok();
                let addrs = match &server.host {
                    Host::Ip(ip) => Ok(vec![*ip]),
                    Host::Name(name) => resolve_server(name, server.port, Source::KubeletKubeconfig)
                        .await
                        .map(|entries| entries.into_iter().map(|(e, _)| e.addr).collect()),
                };
                match addrs {
                    Ok(addrs) => {
                        self.resolve_trouble.ok();
                        self.kubelet = Some((server, addrs));
                    }
                    Err(err) => self.resolve_trouble.failed(&err),
                }
            }
            Err(err) => self.kubelet_trouble.failed(&err),
        }
        match listeners {
            Ok(found) => {
                self.listeners_trouble.ok();
                self.listeners = found;
            }
            Err(err) => self.listeners_trouble.failed(&err),
        }
        let kubelet = self.kubelet.as_ref();
        let findings = node_local::findings(
            kubelet.map(|(s, _)| s),
            kubelet.map_or(&[][..], |(_, a)| a.as_slice()),
            &self.listeners,
        );
        for ((endpoint, source), why) in node_local::news(&self.findings, &findings) {
            tracing::info!(%endpoint, source = source.as_str(), "apiserver endpoint of this node: {why}");
        }
        self.findings = findings.clone();
        findings
    }

    async fn run(mut self, feeds: mpsc::Sender<(Feed, Vec<Entry>)>) {
        loop {
            tokio::time::sleep(endpoints::RESOLVE_EVERY).await;
            let findings = self.look().await;
            if feeds.send((Feed::Node, findings.entries())).await.is_err() {
                return;
            }
        }
    }
}

/// This node's pods → the container index.
async fn watch_pods(client: Client, node: String, index: Arc<RwLock<HashMap<String, PodRef>>>) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(Api::<Pod>::all(client), config).default_backoff().boxed();
    let mut objects = Objects::default();
    let mut trouble = Trouble::new("watching this node's pods");
    let reduce = |pod: &Pod| {
        let (found, bad) = pods::pod_containers(pod);
        for err in bad {
            tracing::debug!(
                "pod {}/{}: {err}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            );
        }
        found
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                trouble.ok();
                if objects.apply(event, reduce) && objects.listed() {
                    let new = pods::index(objects.values());
                    *index.write().expect("pods lock") = new;
                }
            }
            Err(err) => trouble.failed(&err),
        }
    }
}

/// `GET /readyz` every [`probe::PROBE_EVERY`].
async fn probe_loop(client: Client, reach: Arc<Mutex<Reachability>>, server: String) {
    let mut tick = tokio::time::interval(probe::PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("a valid request");
        let (result, detail) =
            match tokio::time::timeout(probe::PROBE_TIMEOUT, client.request_text(request)).await {
                Ok(Ok(_)) => (ProbeResult::Answered(200), "ok".to_owned()),
                Ok(Err(kube::Error::Api(status))) => (
                    ProbeResult::Answered(status.code),
                    format!("{} {}", status.code, status.message.lines().next().unwrap_or("")),
                ),
                Ok(Err(err)) => (ProbeResult::NoAnswer, crate::error::chain(&err)),
                Err(_) => (
                    ProbeResult::NoAnswer,
                    format!("no answer within {:?}", probe::PROBE_TIMEOUT),
                ),
            };
        let changed = reach
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(Instant::now(), result);
        match changed {
            Some(true) => tracing::info!("apiserver {server} reachable (GET /readyz: {detail})"),
            Some(false) => tracing::warn!("apiserver {server} unreachable (GET /readyz: {detail})"),
            None => {}
        }
    }
}

/// Resolves once `stop` holds true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Writes the events the [`Book`] admitted.
struct EventWriter {
    client: Client,
    server: String,
    node: String,
    /// The node's UID for node events: `None` until looked up, `Some(None)` if that failed.
    node_uid: Option<Option<String>>,
    book: Arc<Mutex<Book>>,
    trouble: Trouble,
}

impl EventWriter {
    async fn run(
        mut self,
        mut writes: mpsc::Receiver<Write>,
        mut versions: watch::Receiver<Option<ApiVersions>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let discovered = async {
            versions
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|v| v.as_ref().map(|v| v.events))
        };
        let api = tokio::select! {
            api = discovered => match api {
                Some(api) => api,
                None => return,
            },
            () = stopped(&mut stop) => return,
        };
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                write = writes.recv() => match write {
                    Some(write) => self.write(api, write).await,
                    None => return,
                },
                _ = flush.tick() => {
                    let due = self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner).flush(Instant::now());
                    for write in due {
                        self.write(api, write).await;
                    }
                }
                () = stopped(&mut stop) => {
                    while let Ok(write) = writes.try_recv() {
                        self.write(api, write).await;
                    }
                    return;
                }
            }
        }
    }

    async fn write(&mut self, api: EventsApi, write: Write) {
        let (record, create) = match write {
            Write::Create(r) => (r, true),
            Write::Update(r) => (r, false),
        };
        let node_uid = match &record.target {
            EventTarget::Node { .. } => self.node_uid().await,
            EventTarget::Pod { .. } => None,
        };
        let collection = api.collection(record.target.event_namespace());
        let post = || {
            let body = events::create_body(api, &record, &self.node, node_uid.as_deref());
            http::Request::post(&collection)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.to_string().into_bytes())
                .expect("a valid request")
        };
        let patch = || {
            http::Request::patch(format!("{collection}/{}", record.name))
                .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
                .body(events::update_patch(api, &record).to_string().into_bytes())
                .expect("a valid request")
        };
        let first = if create { post() } else { patch() };
        let what = |create: bool| {
            format!(
                "{} event {}/{} ({} {})",
                if create { "creating" } else { "updating" },
                record.target.event_namespace(),
                record.name,
                record.reason,
                api.api_version()
            )
        };
        let result = match call(&self.server, &what(create), self.client.request_text(first)).await {
            // The create's name is taken (a retry that had succeeded): write the count instead.
            Err(Error::Request {
                err: kube::Error::Api(status),
                ..
            }) if create && status.code == 409 => {
                call(&self.server, &what(false), self.client.request_text(patch())).await
            }
            // The event to update is gone (expired, or its create was lost): create it anew.
            Err(Error::Request {
                err: kube::Error::Api(status),
                ..
            }) if !create && status.code == 404 => {
                call(&self.server, &what(true), self.client.request_text(post())).await
            }
            other => other,
        };
        match result {
            Ok(_) => self.trouble.ok(),
            Err(err) => self.trouble.failed(&err),
        }
    }

    async fn node_uid(&mut self) -> Option<String> {
        if let Some(known) = &self.node_uid {
            return known.clone();
        }
        let api = Api::<Node>::all(self.client.clone());
        let what = format!("GET node {}", self.node);
        let uid = match call(&self.server, &what, api.get(&self.node)).await {
            Ok(node) => node.metadata.uid,
            Err(err) => {
                tracing::debug!(
                    "{}; node events use the node name as its UID",
                    crate::error::chain(&err)
                );
                None
            }
        };
        self.node_uid = Some(uid.clone());
        uid
    }
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
