//! Apiserver addresses that the node's own components use without being configured for them:
//! host-level clients (kubelet, kube-proxy, and on control-plane nodes kube-controller-manager
//! and kube-scheduler) talk to `127.0.0.1:6443` or to a node-local proxy, addresses that the
//! `default/kubernetes` Service and its EndpointSlices never name.
//!
//! Two kinds of evidence, both read from the host (the agent runs with `hostPID`, so the host's
//! processes are in its `/proc`, and their files under `/proc/<pid>/root`):
//!
//! - **The kubelet's kubeconfig** ([`Source::KubeletKubeconfig`]): the server of its current
//!   context is where this node reaches the apiserver. Found as a node finds it: the
//!   `--kubeconfig` flag on the running kubelet's command line (`/proc/<pid>/cmdline`, the file
//!   read through `/proc/<pid>/root`), else the usual places (kubeadm, cloud images, k3s, RKE2,
//!   MicroK8s) under the host's root (`/proc/1/root`).
//! - **Loopback listeners of an apiserver** ([`Source::LocalApiserver`]): a TCP socket listening
//!   in the host's network namespace (that of pid 1) that either belongs to a process named
//!   `kube-apiserver`, or accepts connections at an address of the kubelet's kubeconfig (the
//!   node-local proxy the kubelet uses, or the apiserver itself). Every loopback address such a
//!   socket accepts is an apiserver address, and so is every loopback address at which the same
//!   process listens on the same port (a proxy bound to `127.0.0.1` and `::1`). A process that
//!   merely listens on a loopback port is not evidence: 6443 is only a convention.
//!
//! A socket bound to `0.0.0.0` accepts `127.0.0.1`, one bound to `::` accepts `::1` and (unless
//! it is IPv6-only, which Linux does not report here) `127.0.0.1`; one bound to a specific
//! non-loopback address accepts no loopback address. Non-loopback addresses of the node are not
//! added: an apiserver's advertised address is already in its EndpointSlice.
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fmt, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
};

use kube::config::Kubeconfig;

use tokio::sync::mpsc;

use super::{
    connect::{self, Host},
    endpoints::{resolve_server, Entry, Feed, RESOLVE_EVERY},
    Trouble,
};
use crate::{
    endpoint::{canonical_ip, Endpoint, Source},
    host::process::Procfs,
    host::sock_diag::{self, DiagSocket},
};

/// Where the host's processes are (the agent runs with `hostPID`).
pub const PROC: &str = "/proc";
/// The name (`/proc/<pid>/comm`) of an apiserver process.
pub const APISERVER_COMM: &str = "kube-apiserver";
/// The name of the kubelet process.
pub const KUBELET_COMM: &str = "kubelet";
/// Where distributions put the kubelet's kubeconfig when the kubelet is not found running (or
/// runs inside another process: k3s, RKE2, MicroK8s), first match wins.
pub const KUBELET_KUBECONFIGS: [&str; 5] = [
    "/etc/kubernetes/kubelet.conf",
    "/var/lib/kubelet/kubeconfig",
    "/var/lib/rancher/k3s/agent/kubelet.kubeconfig",
    "/var/lib/rancher/rke2/agent/kubelet.kubeconfig",
    "/var/snap/microk8s/current/credentials/kubelet.config",
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the kubelet's kubeconfig {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the kubelet's kubeconfig {path} is not a kubeconfig")]
    Parse {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("the kubelet's kubeconfig {path} has no current-context")]
    NoCurrentContext { path: PathBuf },
    #[error("the kubelet's kubeconfig {path}: current-context {context:?} is not among its contexts")]
    NoContext { path: PathBuf, context: String },
    #[error(
        "the kubelet's kubeconfig {path}: context {context:?} names cluster {cluster:?}, which has no server"
    )]
    NoServer {
        path: PathBuf,
        context: String,
        cluster: String,
    },
    #[error("the kubelet's kubeconfig {path}: server {server:?} is not a URL with a host")]
    BadServer { path: PathBuf, server: String },
    #[error("listing the listening sockets of the host's network namespace {netns}")]
    Listeners {
        netns: PathBuf,
        #[source]
        source: sock_diag::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the kubelet's kubeconfig was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// `--kubeconfig` of the running kubelet.
    Flag { pid: u32 },
    /// One of [`KUBELET_KUBECONFIGS`] on the host.
    UsualPlace,
}

/// The kubelet's kubeconfig, and the server it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletServer {
    /// The path as the kubelet sees it.
    pub path: PathBuf,
    pub found: Found,
    /// The server URL as written.
    pub server: String,
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for KubeletServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.found {
            Found::Flag { pid } => write!(
                f,
                "server {} of {} (--kubeconfig of the kubelet, pid {pid})",
                self.server,
                self.path.display()
            ),
            Found::UsualPlace => write!(f, "server {} of {}", self.server, self.path.display()),
        }
    }
}

/// The value of `--kubeconfig` on a NUL-separated command line (`--kubeconfig=PATH` or
/// `--kubeconfig PATH`; the last one wins, as with Go's flag parsing).
pub fn kubeconfig_flag(cmdline: &[u8]) -> Option<String> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        for prefix in [&b"--kubeconfig"[..], &b"-kubeconfig"[..]] {
            if let Some(rest) = arg.strip_prefix(prefix) {
                if let Some(value) = rest.strip_prefix(b"=") {
                    found = Some(String::from_utf8_lossy(value).into_owned());
                } else if rest.is_empty() {
                    if let Some(value) = args.get(i + 1) {
                        found = Some(String::from_utf8_lossy(value).into_owned());
                        i += 1;
                    }
                }
            }
        }
        i += 1;
    }
    found.filter(|v| !v.is_empty())
}

/// The server URL of the current context of a kubeconfig's text (`path` names it in errors).
pub fn kubeconfig_server(path: &Path, text: &str) -> Result<String> {
    let config = Kubeconfig::from_yaml(text).map_err(|source| Error::Parse {
        path: path.to_owned(),
        source,
    })?;
    let context_name = config
        .current_context
        .clone()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Error::NoCurrentContext {
            path: path.to_owned(),
        })?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| Error::NoContext {
            path: path.to_owned(),
            context: context_name.clone(),
        })?;
    config
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::NoServer {
            path: path.to_owned(),
            context: context_name,
            cluster: context.cluster.clone(),
        })
}

/// `path` as process `pid` sees it, reached through `proc_root/<pid>/root` (absolute) or
/// `proc_root/<pid>/cwd` (relative).
fn through(proc_root: &Path, pid: u32, path: &str) -> PathBuf {
    let base = proc_root.join(pid.to_string());
    match path.strip_prefix('/') {
        Some(rel) => base.join("root").join(rel),
        None => base.join("cwd").join(path),
    }
}

/// The pids whose process name is `comm`, in `proc_root` order.
fn pids_named(proc_root: &Path, comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
                .is_ok_and(|c| c.trim_end_matches('\n') == comm)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The kubelet's kubeconfig and its server, `None` when this host has neither a kubelet with
/// `--kubeconfig` nor a kubeconfig in a usual place (not a Kubernetes node, or a standalone
/// kubelet).
pub fn kubelet_server(proc_root: &Path) -> Result<Option<KubeletServer>> {
    let mut candidates: Vec<(String, Found, PathBuf)> = Vec::new();
    for pid in pids_named(proc_root, KUBELET_COMM) {
        let cmdline = std::fs::read(proc_root.join(pid.to_string()).join("cmdline")).unwrap_or_default();
        if let Some(path) = kubeconfig_flag(&cmdline) {
            let on_host = through(proc_root, pid, &path);
            candidates.push((path, Found::Flag { pid }, on_host));
        }
    }
    for path in KUBELET_KUBECONFIGS {
        candidates.push((path.to_owned(), Found::UsualPlace, through(proc_root, 1, path)));
    }
    for (path, found, on_host) in candidates {
        let text = match std::fs::read_to_string(&on_host) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound && found == Found::UsualPlace => continue,
            Err(source) => {
                return Err(Error::Read {
                    path: PathBuf::from(path),
                    source,
                })
            }
        };
        let shown = PathBuf::from(&path);
        let server = kubeconfig_server(&shown, &text)?;
        let uri: http::Uri = server.parse().map_err(|_| Error::BadServer {
            path: shown.clone(),
            server: server.clone(),
        })?;
        let (host, port) = connect::server_target(&uri).ok_or_else(|| Error::BadServer {
            path: shown.clone(),
            server: server.clone(),
        })?;
        return Ok(Some(KubeletServer {
            path: shown,
            found,
            server,
            host,
            port,
        }));
    }
    Ok(None)
}

/// A listening TCP socket of the host and the process that holds it, when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub local: SocketAddr,
    pub owner: Option<Owner>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub comm: String,
}

/// The loopback addresses a socket listening on `local` accepts connections at.
fn loopback_accepted(local: SocketAddr) -> Vec<IpAddr> {
    match canonical_ip(local.ip()) {
        IpAddr::V4(v4) if v4.is_loopback() => vec![IpAddr::V4(v4)],
        IpAddr::V4(v4) if v4.is_unspecified() => vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        IpAddr::V6(v6) if v6.is_loopback() => vec![IpAddr::V6(v6)],
        IpAddr::V6(v6) if v6.is_unspecified() => {
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)]
        }
        _ => Vec::new(),
    }
}

/// True when a socket listening on `local` accepts connections to `dest`.
fn accepts(local: SocketAddr, dest: SocketAddr) -> bool {
    if local.port() != dest.port() {
        return false;
    }
    let (bound, dest) = (canonical_ip(local.ip()), canonical_ip(dest.ip()));
    bound == dest
        || (bound == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && dest.is_ipv4())
        || bound == IpAddr::V6(Ipv6Addr::UNSPECIFIED)
}

/// The loopback apiserver endpoints the listeners give evidence of, each with its evidence
/// (one sentence). `kubelet_addrs`: the addresses the kubelet's kubeconfig names.
pub fn local_apiservers(listeners: &[Listener], kubelet_addrs: &[SocketAddr]) -> BTreeMap<Endpoint, String> {
    // Why a listener is an apiserver's, by index.
    let mut why: BTreeMap<usize, String> = BTreeMap::new();
    for (i, l) in listeners.iter().enumerate() {
        let owner = l
            .owner
            .as_ref()
            .map(|o| format!("{} (pid {})", o.comm, o.pid))
            .unwrap_or_else(|| "a process".into());
        if l.owner.as_ref().is_some_and(|o| o.comm == APISERVER_COMM) {
            why.insert(i, format!("{owner} listens on {}", l.local));
        } else if let Some(addr) = kubelet_addrs.iter().find(|a| accepts(l.local, **a)) {
            why.insert(
                i,
                format!(
                    "{owner} listens on {}, where the kubelet's kubeconfig points ({addr})",
                    l.local
                ),
            );
        }
    }
    // The same process's other sockets on the same port.
    let chosen: Vec<(usize, String)> = why.iter().map(|(i, w)| (*i, w.clone())).collect();
    for (i, reason) in chosen {
        let Some(owner) = &listeners[i].owner else {
            continue;
        };
        for (j, other) in listeners.iter().enumerate() {
            let same = other.owner.as_ref().is_some_and(|o| o.pid == owner.pid)
                && other.local.port() == listeners[i].local.port();
            if same && !why.contains_key(&j) {
                why.insert(j, format!("{reason}; also listens on {}", other.local));
            }
        }
    }
    let mut out = BTreeMap::new();
    for (i, reason) in why {
        for ip in loopback_accepted(listeners[i].local) {
            out.entry(Endpoint::exact(ip, listeners[i].local.port()))
                .or_insert_with(|| reason.clone());
        }
    }
    out
}

/// Every listening TCP socket of the network namespace at `netns` (`/proc/1/ns/net`: the
/// host's), with the process holding it (found through `procfs`'s `<pid>/fd`).
pub fn listeners(netns: &Path, procfs: &Procfs) -> Result<Vec<Listener>> {
    let failed = |source| Error::Listeners {
        netns: netns.to_owned(),
        source,
    };
    let diag = DiagSocket::open_in(netns).map_err(failed)?;
    let mut found = Vec::new();
    for family in [libc::AF_INET as u16, libc::AF_INET6 as u16] {
        let listening = 1 << lifeline_common::tcp_state::LISTEN;
        found.extend(diag.dump(family, listening).map_err(failed)?);
    }
    let inodes: HashSet<u64> = found.iter().map(|s| s.inode).filter(|i| *i != 0).collect();
    let owners = procfs.socket_owners(&inodes);
    let mut comms: BTreeMap<u32, Option<String>> = BTreeMap::new();
    let mut out = Vec::with_capacity(found.len());
    for socket in found {
        let owner = owners
            .get(&socket.inode)
            .and_then(|pids| pids.first())
            .and_then(|pid| {
                let comm = comms
                    .entry(*pid)
                    .or_insert_with(|| procfs.process(*pid).ok().map(|p| p.comm))
                    .clone()?;
                Some(Owner { pid: *pid, comm })
            });
        out.push(Listener {
            local: socket.local,
            owner,
        });
    }
    Ok(out)
}

/// What the host says, as endpoint entries with their evidence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub entries: BTreeMap<Entry, String>,
}

impl Findings {
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.keys().copied().collect()
    }
}

/// The kubelet's server (its addresses already resolved: `kubelet_addrs`) and the loopback
/// apiservers, as entries with evidence.
pub fn findings(
    kubelet: Option<&KubeletServer>,
    kubelet_addrs: &[IpAddr],
    listeners: &[Listener],
) -> Findings {
    let mut entries = BTreeMap::new();
    let mut sockets = Vec::new();
    if let Some(kubelet) = kubelet {
        for ip in kubelet_addrs {
            let ep = Endpoint::exact(*ip, kubelet.port);
            sockets.push(SocketAddr::new(canonical_ip(*ip), kubelet.port));
            entries.insert((ep, Source::KubeletKubeconfig), kubelet.to_string());
        }
    }
    for (ep, why) in local_apiservers(listeners, &sockets) {
        entries.insert((ep, Source::LocalApiserver), why);
    }
    Findings { entries }
}

/// The distinct entries in `new` that `old` lacks, with their evidence, for the log.
pub fn news<'a>(old: &Findings, new: &'a Findings) -> Vec<(&'a Entry, &'a String)> {
    let before: BTreeSet<&Entry> = old.entries.keys().collect();
    new.entries.iter().filter(|(e, _)| !before.contains(e)).collect()
}

// ---------------------------------------------------------------------------------------------
// The task

/// What the node says (the above), looked at every [`RESOLVE_EVERY`]. Each part
/// that fails to be read keeps its last answer (the tracker then still retains what it named).
pub(super) struct NodeWatch {
    proc_root: PathBuf,
    kubelet: Option<(KubeletServer, Vec<IpAddr>)>,
    listeners: Vec<Listener>,
    findings: Findings,
    kubelet_trouble: Trouble,
    resolve_trouble: Trouble,
    listeners_trouble: Trouble,
}

impl NodeWatch {
    pub(super) fn new(proc_root: PathBuf) -> Self {
        Self {
            proc_root,
            kubelet: None,
            listeners: Vec::new(),
            findings: Findings::default(),
            kubelet_trouble: Trouble::new("reading the kubelet's kubeconfig"),
            resolve_trouble: Trouble::new("resolving the server of the kubelet's kubeconfig"),
            listeners_trouble: Trouble::new("listing the host's listening sockets"),
        }
    }

    /// One look (the /proc and sock_diag reads on a blocking thread); logs what is new.
    pub(super) async fn look(&mut self) -> Findings {
        let proc_root = self.proc_root.clone();
        let read = tokio::task::spawn_blocking(move || {
            let kubelet = kubelet_server(&proc_root);
            let netns = proc_root.join("1/ns/net");
            let listeners = listeners(&netns, &Procfs::new(&proc_root));
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
        let findings = findings(
            kubelet.map(|(s, _)| s),
            kubelet.map_or(&[][..], |(_, a)| a.as_slice()),
            &self.listeners,
        );
        for ((endpoint, source), why) in news(&self.findings, &findings) {
            tracing::info!(%endpoint, source = source.as_str(), "apiserver endpoint of this node: {why}");
        }
        self.findings = findings.clone();
        findings
    }

    pub(super) async fn run(mut self, feeds: mpsc::Sender<(Feed, Vec<Entry>)>) {
        loop {
            tokio::time::sleep(RESOLVE_EVERY).await;
            let findings = self.look().await;
            if feeds.send((Feed::Node, findings.entries())).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
