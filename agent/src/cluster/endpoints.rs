//! Apiserver endpoints learnt from the cluster, kept live.
//!
//! Four feeds, each a full replacement of what it said before:
//!
//! - [`Feed::Server`]: the address(es) of the server the agent itself talks to (the kubeconfig's
//!   server URL, names resolved and re-resolved every [`RESOLVE_EVERY`]; or the in-cluster
//!   `KUBERNETES_SERVICE_HOST:PORT`);
//! - [`Feed::Service`]: every ClusterIP of the `default/kubernetes` Service (IPv4 and IPv6) with
//!   every TCP service port;
//! - [`Feed::Backends`]: the addresses and TCP ports of the EndpointSlices labelled
//!   `kubernetes.io/service-name=kubernetes`, or, on apiservers without `discovery.k8s.io/v1`,
//!   of the core Endpoints `default/kubernetes` (ready and not-ready addresses alike: a client
//!   may hold a connection to an apiserver that is not ready, which is exactly what to watch);
//! - [`Feed::Node`]: what the node itself says (in a pod only, see `node_local.rs`): the server
//!   of the kubelet's kubeconfig, and loopback addresses of apiservers and node-local proxies,
//!   looked at again every [`RESOLVE_EVERY`].
//!
//! An endpoint that a feed stops naming stays in the set for [`RETAIN_REMOVED`]: during a rolling
//! restart every apiserver drops out of the EndpointSlice for a while, and the connections that
//! clients held to it (and their failure to come back) are what the agent exists to see.
//! A feed that fails (watch error, name that does not resolve) keeps its last answer.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    net::IpAddr,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Endpoints, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Resource, ResourceExt,
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::Trouble;
use crate::endpoint::{Endpoint, EndpointSet, Source};

/// How long an endpoint that disappeared from its feed is still watched.
pub const RETAIN_REMOVED: Duration = Duration::from_secs(15 * 60);
/// How often the server name of a kubeconfig is resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(60);

/// Where endpoints come from; each feed replaces its own entries as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feed {
    /// The server URL the agent's client uses.
    Server,
    /// The `default/kubernetes` Service.
    Service,
    /// Its EndpointSlices, or its core Endpoints.
    Backends,
    /// The node's own: the kubelet's kubeconfig and loopback apiserver listeners.
    Node,
}

/// One endpoint and where it came from.
pub type Entry = (Endpoint, Source);

/// The ClusterIPs × TCP ports of a Service. Old apiservers (before 1.20) only fill `clusterIP`;
/// dual-stack ones list both families in `clusterIPs`. Headless (`None`) and empty are skipped.
pub fn service_entries(svc: &Service) -> Vec<Entry> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.iter().map(String::as_str).collect(),
    };
    let ports = tcp_ports(
        spec.ports
            .iter()
            .flatten()
            .map(|p| (p.protocol.as_deref(), Some(p.port))),
    );
    cross(
        ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()),
        &ports,
        Source::Service,
    )
}

/// The addresses × TCP ports of an EndpointSlice (`addressType` IPv4 or IPv6; FQDN slices and
/// ports without a number, which mean "all ports", name nothing the kernel can match).
pub fn slice_entries(slice: &EndpointSlice) -> Vec<Entry> {
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        return Vec::new();
    }
    let ports = tcp_ports(
        slice
            .ports
            .iter()
            .flatten()
            .map(|p| (p.protocol.as_deref(), p.port)),
    );
    let ips = slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok());
    cross(ips, &ports, Source::EndpointSlice)
}

/// The addresses (ready and not ready) × TCP ports of every subset of a core Endpoints object.
pub fn endpoints_entries(ep: &Endpoints) -> Vec<Entry> {
    let mut out = Vec::new();
    for subset in ep.subsets.iter().flatten() {
        let ports = tcp_ports(
            subset
                .ports
                .iter()
                .flatten()
                .map(|p| (p.protocol.as_deref(), Some(p.port))),
        );
        let ips = subset
            .addresses
            .iter()
            .flatten()
            .chain(subset.not_ready_addresses.iter().flatten())
            .filter_map(|a| a.ip.parse::<IpAddr>().ok());
        out.extend(cross(ips, &ports, Source::Endpoints));
    }
    out.sort();
    out.dedup();
    out
}

/// The port numbers of the TCP ports among `(protocol, port)`: no protocol means TCP; a port
/// without a number (all ports), zero or out of range names nothing.
fn tcp_ports<'a>(ports: impl Iterator<Item = (Option<&'a str>, Option<i32>)>) -> Vec<u16> {
    ports
        .filter(|(protocol, _)| protocol.is_none_or(|p| p == "TCP"))
        .filter_map(|(_, port)| port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0))
        .collect()
}

fn cross(ips: impl Iterator<Item = IpAddr>, ports: &[u16], source: Source) -> Vec<Entry> {
    let mut out: Vec<Entry> = ips
        .flat_map(|ip| ports.iter().map(move |p| (Endpoint::exact(ip, *p), source)))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The objects a watch currently shows, by `namespace/name`, each reduced to what matters (`T`).
///
/// Follows the watcher's protocol: a relist (`Init` … `InitApply`* … `InitDone`) is buffered and
/// replaces the previous state at `InitDone`, so readers never see a half-listed state.
#[derive(Debug)]
pub struct Objects<T> {
    live: BTreeMap<String, T>,
    relisting: Option<BTreeMap<String, T>>,
    listed: bool,
}

impl<T> Default for Objects<T> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            relisting: None,
            listed: false,
        }
    }
}

impl<T> Objects<T> {
    /// Applies one watcher event; true when what [`Objects::values`] shows changed (or may
    /// have: an `Apply` of an object is reported even if its reduction is the same).
    pub fn apply<K: Resource>(&mut self, event: watcher::Event<K>, reduce: impl Fn(&K) -> T) -> bool {
        let key = |k: &K| format!("{}/{}", k.namespace().unwrap_or_default(), k.name_any());
        match event {
            watcher::Event::Init => {
                self.relisting = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(k) => {
                let value = reduce(&k);
                self.relisting
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key(&k), value);
                false
            }
            watcher::Event::InitDone => {
                self.live = self.relisting.take().unwrap_or_default();
                self.listed = true;
                true
            }
            watcher::Event::Apply(k) => {
                self.live.insert(key(&k), reduce(&k));
                true
            }
            watcher::Event::Delete(k) => self.live.remove(&key(&k)).is_some(),
        }
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.live.values()
    }

    /// True once a first full list arrived.
    pub fn listed(&self) -> bool {
        self.listed
    }
}

/// The cluster's endpoint set: the feeds' current answers plus recently removed entries.
#[derive(Debug)]
pub struct Tracker {
    retain: Duration,
    current: BTreeMap<Feed, BTreeSet<Entry>>,
    /// Entries no feed names any more, and since when.
    removed: BTreeMap<Entry, Instant>,
}

/// What one [`Tracker::update`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub added: Vec<Entry>,
    pub removed: Vec<Entry>,
}

impl Tracker {
    pub fn new(retain: Duration) -> Self {
        Self {
            retain,
            current: BTreeMap::new(),
            removed: BTreeMap::new(),
        }
    }

    /// Replaces what `feed` says with `entries`.
    pub fn update(&mut self, feed: Feed, now: Instant, entries: impl IntoIterator<Item = Entry>) -> Change {
        let new: BTreeSet<Entry> = entries.into_iter().collect();
        let old = self.current.insert(feed, new.clone()).unwrap_or_default();
        let mut change = Change::default();
        for gone in old.difference(&new) {
            self.removed.entry(*gone).or_insert(now);
            change.removed.push(*gone);
        }
        for came in new.difference(&old) {
            self.removed.remove(came);
            change.added.push(*came);
        }
        change
    }

    /// True when `feed` answered at least once.
    pub fn has(&self, feed: Feed) -> bool {
        self.current.contains_key(&feed)
    }

    /// Forgets removed entries older than the retention; the ones forgotten.
    pub fn expire(&mut self, now: Instant) -> Vec<Entry> {
        let retain = self.retain;
        let expired: Vec<Entry> = self
            .removed
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= retain)
            .map(|(e, _)| *e)
            .collect();
        for e in &expired {
            self.removed.remove(e);
        }
        expired
    }

    /// When the next removed entry expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.removed.values().min().map(|since| *since + self.retain)
    }

    /// Every current and retained entry.
    pub fn set(&self) -> EndpointSet {
        let mut set = EndpointSet::default();
        for (endpoint, source) in self.current.values().flatten().chain(self.removed.keys()) {
            set.insert(*endpoint, *source);
        }
        set
    }
}

/// Adds every entry of `other` to `base` (the run loop merges flag/config endpoints with the
/// cluster's this way).
pub fn merge_into(base: &mut EndpointSet, other: &EndpointSet) {
    for (endpoint, sources) in other.iter() {
        for source in sources {
            base.insert(*endpoint, *source);
        }
    }
}

/// Entries for the server the agent talks to: `addrs` (a literal IP, or what its name resolved
/// to) at `port`.
pub fn server_entries(addrs: impl IntoIterator<Item = IpAddr>, port: u16, source: Source) -> Vec<Entry> {
    cross(addrs.into_iter(), &[port], source)
}

// ---------------------------------------------------------------------------------------------
// The tasks

/// Resolving the server's name may take this long (also at start).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// One feed from a watch: after each change (once listed), the entries of every object.
pub(super) async fn watch_feed<K>(
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
pub(super) async fn aggregate(
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
                        RETAIN_REMOVED
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

pub(super) async fn resolve_server(
    name: &str,
    port: u16,
    source: Source,
) -> Result<Vec<Entry>, std::io::Error> {
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
    let entries = server_entries(addrs.map(|a| a.ip()), port, source);
    if entries.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{name} resolved to no address"),
        ));
    }
    Ok(entries)
}

/// Re-resolves the server name every [`RESOLVE_EVERY`].
pub(super) async fn resolve_loop(
    name: String,
    port: u16,
    source: Source,
    feeds: mpsc::Sender<(Feed, Vec<Entry>)>,
) {
    let mut trouble = Trouble::new("resolving the apiserver's name");
    loop {
        tokio::time::sleep(RESOLVE_EVERY).await;
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

#[cfg(test)]
mod tests;
