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
    process::Procfs,
    sock_diag::{self, DiagSocket},
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
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    fn listener(local: &str, pid: u32, comm: &str) -> Listener {
        Listener {
            local: sa(local),
            owner: Some(Owner {
                pid,
                comm: comm.into(),
            }),
        }
    }

    fn shown(found: &BTreeMap<Endpoint, String>) -> Vec<String> {
        found.keys().map(ToString::to_string).collect()
    }

    #[test]
    fn kubeconfig_flag_forms() {
        let cmd = |args: &[&str]| args.join("\0").into_bytes();
        assert_eq!(
            kubeconfig_flag(&cmd(&[
                "/usr/bin/kubelet",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--v=2"
            ])),
            Some("/etc/kubernetes/kubelet.conf".into())
        );
        assert_eq!(
            kubeconfig_flag(&cmd(&[
                "kubelet",
                "--kubeconfig",
                "kubelet.kubeconfig",
                "--node-ip",
                "10.0.0.1"
            ])),
            Some("kubelet.kubeconfig".into())
        );
        // The last one wins; --bootstrap-kubeconfig is another flag; a trailing NUL is harmless.
        assert_eq!(
            kubeconfig_flag(b"kubelet\0--bootstrap-kubeconfig=/b.conf\0--kubeconfig=/a\0-kubeconfig=/c\0"),
            Some("/c".into())
        );
        assert_eq!(
            kubeconfig_flag(&cmd(&["kubelet", "--config=/var/lib/kubelet/config.yaml"])),
            None
        );
        assert_eq!(kubeconfig_flag(&cmd(&["kubelet", "--kubeconfig"])), None);
        assert_eq!(kubeconfig_flag(&cmd(&["kubelet", "--kubeconfig="])), None);
    }

    /// kubeadm's kubelet.conf (abridged: the client certificate is a file reference).
    const KUBEADM_KUBELET_CONF: &str = r#"apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://127.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: system:node:cp-1
  name: system:node:cp-1@kubernetes
current-context: system:node:cp-1@kubernetes
kind: Config
preferences: {}
users:
- name: system:node:cp-1
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
"#;

    /// k3s' agent kubeconfig: the client-side load balancer on 127.0.0.1:6444.
    const K3S_KUBELET_KUBECONFIG: &str = r#"apiVersion: v1
clusters:
- cluster:
    server: https://127.0.0.1:6444
    certificate-authority: /var/lib/rancher/k3s/agent/server-ca.crt
  name: local
contexts:
- context:
    cluster: local
    namespace: default
    user: user
  name: Default
current-context: Default
kind: Config
preferences: {}
users:
- name: user
  user:
    client-certificate: /var/lib/rancher/k3s/agent/client-kubelet.crt
    client-key: /var/lib/rancher/k3s/agent/client-kubelet.key
"#;

    #[test]
    fn kubeconfig_servers_and_bad_files() {
        let p = Path::new("/etc/kubernetes/kubelet.conf");
        assert_eq!(
            kubeconfig_server(p, KUBEADM_KUBELET_CONF).expect("kubeadm"),
            "https://127.0.0.1:6443"
        );
        assert_eq!(
            kubeconfig_server(p, K3S_KUBELET_KUBECONFIG).expect("k3s"),
            "https://127.0.0.1:6444"
        );
        for (text, needle) in [
            ("{not yaml", "is not a kubeconfig"),
            (
                &KUBEADM_KUBELET_CONF.replace("current-context: system:node:cp-1@kubernetes", "")[..],
                "has no current-context",
            ),
            (
                &KUBEADM_KUBELET_CONF.replace(
                    "current-context: system:node:cp-1@kubernetes",
                    "current-context: other",
                )[..],
                "current-context \"other\" is not among its contexts",
            ),
            (
                &KUBEADM_KUBELET_CONF.replace("    cluster: kubernetes", "    cluster: elsewhere")[..],
                "names cluster \"elsewhere\", which has no server",
            ),
        ] {
            let err = kubeconfig_server(p, text).expect_err(needle).to_string();
            assert!(
                err.contains(needle) && err.contains("/etc/kubernetes/kubelet.conf"),
                "{err}"
            );
        }
    }

    /// A fake `/proc`: `<pid>/comm`, `<pid>/cmdline`, and `<pid>/root` as a directory standing
    /// for the process's root.
    struct FakeProc {
        dir: PathBuf,
    }

    impl FakeProc {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("lifeline-fakeproc-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("fake proc");
            Self { dir }
        }

        fn process(&self, pid: u32, comm: &str, args: &[&str]) -> &Self {
            let p = self.dir.join(pid.to_string());
            std::fs::create_dir_all(p.join("root")).expect("pid dir");
            std::fs::create_dir_all(p.join("cwd")).expect("cwd");
            std::fs::write(p.join("comm"), format!("{comm}\n")).expect("comm");
            std::fs::write(p.join("cmdline"), args.join("\0") + "\0").expect("cmdline");
            self
        }

        fn file(&self, pid: u32, path: &str, text: &str) -> &Self {
            let f = through(&self.dir, pid, path);
            std::fs::create_dir_all(f.parent().expect("parent")).expect("dirs");
            std::fs::write(f, text).expect("file");
            self
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn kubelet_kubeconfig_from_its_flag_through_its_root() {
        let proc = FakeProc::new("flag");
        proc.process(1, "systemd", &["/sbin/init"])
            .process(
                812,
                "kubelet",
                &["/usr/bin/kubelet", "--kubeconfig=/etc/kubernetes/kubelet.conf"],
            )
            .file(812, "/etc/kubernetes/kubelet.conf", KUBEADM_KUBELET_CONF)
            // A decoy in a usual place on the host's root: the flag wins.
            .file(1, "/var/lib/kubelet/kubeconfig", K3S_KUBELET_KUBECONFIG);
        let found = kubelet_server(&proc.dir).expect("read").expect("found");
        assert_eq!(found.found, Found::Flag { pid: 812 });
        assert_eq!(
            (found.host.clone(), found.port),
            (Host::Ip("127.0.0.1".parse().unwrap()), 6443)
        );
        assert_eq!(
            found.to_string(),
            "server https://127.0.0.1:6443 of /etc/kubernetes/kubelet.conf (--kubeconfig of the kubelet, pid 812)"
        );
        // A relative flag is resolved against the kubelet's working directory.
        let proc = FakeProc::new("relative");
        proc.process(1, "init", &["init"])
            .process(9, "kubelet", &["kubelet", "--kubeconfig", "kubelet.kubeconfig"])
            .file(9, "kubelet.kubeconfig", K3S_KUBELET_KUBECONFIG);
        let found = kubelet_server(&proc.dir).expect("read").expect("found");
        assert_eq!(found.port, 6444);
    }

    #[test]
    fn kubelet_kubeconfig_in_a_usual_place_or_nowhere() {
        // k3s: no kubelet process (it runs inside k3s), the kubeconfig under the host's root.
        let proc = FakeProc::new("usual");
        proc.process(1, "systemd", &["/sbin/init"])
            .process(40, "k3s-agent", &["/usr/local/bin/k3s", "agent"])
            .file(
                1,
                "/var/lib/rancher/k3s/agent/kubelet.kubeconfig",
                K3S_KUBELET_KUBECONFIG,
            );
        let found = kubelet_server(&proc.dir).expect("read").expect("found");
        assert_eq!(found.found, Found::UsualPlace);
        assert_eq!(found.server, "https://127.0.0.1:6444");
        // Not a node.
        let proc = FakeProc::new("none");
        proc.process(1, "systemd", &["/sbin/init"]);
        assert_eq!(kubelet_server(&proc.dir).expect("read"), None);
        // The kubelet names a file that cannot be read: an error naming it.
        let proc = FakeProc::new("missing");
        proc.process(1, "init", &["init"]).process(
            5,
            "kubelet",
            &["kubelet", "--kubeconfig=/etc/kubernetes/gone.conf"],
        );
        let err = kubelet_server(&proc.dir).expect_err("unreadable").to_string();
        assert!(err.contains("/etc/kubernetes/gone.conf"), "{err}");
        // A broken one in a usual place is reported too, not skipped.
        let proc = FakeProc::new("broken");
        proc.process(1, "init", &["init"])
            .file(1, "/etc/kubernetes/kubelet.conf", "current-context: x\n");
        let err = kubelet_server(&proc.dir).expect_err("broken").to_string();
        assert!(err.contains("current-context \"x\""), "{err}");
    }

    #[test]
    fn what_a_listener_accepts() {
        assert!(accepts(sa("0.0.0.0:6443"), sa("127.0.0.1:6443")));
        assert!(accepts(sa("0.0.0.0:6443"), sa("10.0.0.1:6443")));
        assert!(!accepts(sa("0.0.0.0:6443"), sa("[::1]:6443")));
        assert!(accepts(sa("[::]:6443"), sa("127.0.0.1:6443")));
        assert!(accepts(sa("[::]:6443"), sa("[::1]:6443")));
        assert!(accepts(sa("[::ffff:127.0.0.1]:6443"), sa("127.0.0.1:6443")));
        assert!(!accepts(sa("127.0.0.1:6443"), sa("127.0.0.1:6444")));
        assert!(!accepts(sa("10.0.0.1:6443"), sa("127.0.0.1:6443")));
        assert_eq!(loopback_accepted(sa("10.0.0.1:6443")), Vec::<IpAddr>::new());
        assert_eq!(
            loopback_accepted(sa("127.0.0.2:6443")),
            vec!["127.0.0.2".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn apiserver_processes_and_the_kubelets_proxy_only() {
        let listeners = [
            // kubeadm control plane: the apiserver on every address, IPv4 and IPv6.
            listener("[::]:6443", 100, "kube-apiserver"),
            // Its insecure port of old, on loopback.
            listener("127.0.0.1:8080", 100, "kube-apiserver"),
            // A node-local proxy where the kubelet points, on both loopbacks.
            listener("127.0.0.1:7445", 200, "haproxy"),
            listener("[::1]:7445", 200, "haproxy"),
            // The same proxy's stats port: not an apiserver address.
            listener("127.0.0.1:8404", 200, "haproxy"),
            // Other loopback listeners: never evidence by themselves, not even on 6444.
            listener("127.0.0.1:6444", 300, "some-daemon"),
            listener("127.0.0.1:10248", 400, "kubelet"),
            // An apiserver bound to one external address accepts no loopback address.
            listener("10.0.0.5:9443", 500, "kube-apiserver"),
            // Owner unknown: only the kubelet's address can make it count.
            Listener {
                local: sa("127.0.0.1:9999"),
                owner: None,
            },
        ];
        let found = local_apiservers(&listeners, &[sa("127.0.0.1:7445")]);
        assert_eq!(
            shown(&found),
            [
                "127.0.0.1:6443",
                "127.0.0.1:7445",
                "127.0.0.1:8080",
                "[::1]:6443",
                "[::1]:7445"
            ]
        );
        assert_eq!(
            found[&Endpoint::exact("::1".parse().unwrap(), 7445)],
            "haproxy (pid 200) listens on 127.0.0.1:7445, where the kubelet's kubeconfig points (127.0.0.1:7445); also listens on [::1]:7445"
        );
        assert_eq!(
            found[&Endpoint::exact("127.0.0.1".parse().unwrap(), 6443)],
            "kube-apiserver (pid 100) listens on [::]:6443"
        );
        // Without the kubelet's address, the proxy is not evidence.
        assert_eq!(
            shown(&local_apiservers(&listeners, &[])),
            ["127.0.0.1:6443", "127.0.0.1:8080", "[::1]:6443"]
        );
        // An unknown owner at the kubelet's address counts, alone.
        assert_eq!(
            shown(&local_apiservers(&listeners, &[sa("127.0.0.1:9999")])),
            ["127.0.0.1:6443", "127.0.0.1:8080", "127.0.0.1:9999", "[::1]:6443"]
        );
    }

    #[test]
    fn findings_carry_both_sources() {
        let kubelet = KubeletServer {
            path: "/etc/kubernetes/kubelet.conf".into(),
            found: Found::UsualPlace,
            server: "https://localhost:6443".into(),
            host: Host::Name("localhost".into()),
            port: 6443,
        };
        let listeners = [listener("0.0.0.0:6443", 7, "kube-apiserver")];
        let ips: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
        let f = findings(Some(&kubelet), &ips, &listeners);
        let got: Vec<String> = f
            .entries
            .keys()
            .map(|(e, s)| format!("{e} {}", s.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                "127.0.0.1:6443 kubelet-kubeconfig",
                "127.0.0.1:6443 local-apiserver",
                "[::1]:6443 kubelet-kubeconfig"
            ]
        );
        assert!(news(&f, &f).is_empty());
        assert_eq!(news(&Findings::default(), &f).len(), 3);
    }

    /// The agent's periodic look at the node: the kubelet's server name resolved, and a part
    /// that cannot be read keeps its last answer.
    #[tokio::test]
    #[ignore = "needs root: sock_diag through setns"]
    async fn the_node_watch_resolves_and_keeps_answers() {
        let proc = FakeProc::new("watch");
        proc.process(1, "systemd", &["/sbin/init"])
            .process(
                30,
                "kubelet",
                &["kubelet", "--kubeconfig=/etc/kubernetes/kubelet.conf"],
            )
            .file(
                30,
                "/etc/kubernetes/kubelet.conf",
                &KUBEADM_KUBELET_CONF.replace("https://127.0.0.1:6443", "https://localhost:16443"),
            );
        // The host's network namespace is this process's own (owners stay unknown: the fake
        // /proc has no fds).
        std::fs::create_dir_all(proc.dir.join("1/ns")).expect("ns dir");
        std::os::unix::fs::symlink("/proc/self/ns/net", proc.dir.join("1/ns/net")).expect("ns link");
        let mut watch = NodeWatch::new(proc.dir.clone());
        let first = watch.look().await;
        let kubelet: Vec<String> = first
            .entries
            .keys()
            .filter(|(_, s)| *s == Source::KubeletKubeconfig)
            .map(|(e, _)| e.to_string())
            .collect();
        assert!(kubelet.contains(&"127.0.0.1:16443".to_owned()), "{first:?}");
        assert!(
            first
                .entries
                .values()
                .any(|why| why.contains("--kubeconfig of the kubelet, pid 30")),
            "{first:?}"
        );
        // The kubeconfig becomes unreadable: the last answer stays.
        std::fs::write(through(&proc.dir, 30, "/etc/kubernetes/kubelet.conf"), "{broken").expect("break");
        let second = watch.look().await;
        assert_eq!(first.entries(), second.entries());
    }

    /// A process that kills its child on drop.
    struct Running(std::process::Child);

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Real listeners in a fresh network namespace, held by processes named `kube-apiserver`,
    /// `haproxy` and `nginx`: the sockets are found through sock_diag in that namespace, their
    /// owners through /proc, and only the apiserver's and the kubelet's proxy's loopback
    /// addresses are taken.
    #[test]
    #[ignore = "needs root: network namespaces"]
    fn real_listeners_in_a_namespace() {
        let ns = crate::netns::TestNetns::new();
        let bin = std::env::temp_dir().join(format!("lifeline-listeners-{}", std::process::id()));
        std::fs::create_dir_all(&bin).expect("bin dir");
        let python = Path::new("/usr/bin/python3");
        assert!(
            python.exists(),
            "/usr/bin/python3 is needed for the listener processes"
        );
        // Each listener runs as `<name>`: a symlink to python3, so its comm is that name.
        let spawn = |name: &str, binds: &[(&str, u16)]| -> Running {
            let link = bin.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(python, &link).expect("symlink");
            let socks: Vec<String> = binds
                .iter()
                .map(|(host, port)| {
                    let family = if host.contains(':') { "AF_INET6" } else { "AF_INET" };
                    format!(
                        "s=socket.socket(socket.{family}); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); {} s.bind(('{host}', {port})); s.listen(); keep.append(s)",
                        if family == "AF_INET6" { "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0);" } else { "" }
                    )
                })
                .collect();
            let script = format!(
                "import socket, time\nkeep=[]\n{}\ntime.sleep(120)\n",
                socks.join("\n")
            );
            Running(
                std::process::Command::new("ip")
                    .args(["netns", "exec", &ns.name])
                    .arg(&link)
                    .args(["-c", &script])
                    .spawn()
                    .expect("spawn listener"),
            )
        };
        let _apiserver = spawn("kube-apiserver", &[("::", 6443)]);
        let _proxy = spawn("haproxy", &[("127.0.0.1", 7445), ("::1", 7445)]);
        let _other = spawn("nginx", &[("127.0.0.1", 6444)]);
        let procfs = Procfs::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let all = listeners(&ns.path, &procfs).expect("listeners in the namespace");
            let owned = all.iter().filter(|l| l.owner.is_some()).count();
            if owned >= 4 {
                break all;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the four listeners with their owners did not show up: {all:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let comm_of = |port: u16| -> Vec<String> {
            found
                .iter()
                .filter(|l| l.local.port() == port)
                .filter_map(|l| l.owner.as_ref().map(|o| o.comm.clone()))
                .collect()
        };
        assert_eq!(comm_of(6443), ["kube-apiserver"]);
        assert_eq!(comm_of(6444), ["nginx"]);
        let f = findings(None, &[], &found);
        let only_apiserver: Vec<String> = f.entries.keys().map(|(e, _)| e.to_string()).collect();
        assert_eq!(only_apiserver, ["127.0.0.1:6443", "[::1]:6443"]);
        let kubelet = KubeletServer {
            path: "/var/lib/kubelet/kubeconfig".into(),
            found: Found::UsualPlace,
            server: "https://127.0.0.1:7445".into(),
            host: Host::Ip("127.0.0.1".parse().unwrap()),
            port: 7445,
        };
        let f = findings(Some(&kubelet), &["127.0.0.1".parse().unwrap()], &found);
        let got: Vec<String> = f
            .entries
            .keys()
            .map(|(e, s)| format!("{e} {}", s.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                "127.0.0.1:6443 local-apiserver",
                "127.0.0.1:7445 kubelet-kubeconfig",
                "127.0.0.1:7445 local-apiserver",
                "[::1]:6443 local-apiserver",
                "[::1]:7445 local-apiserver"
            ]
        );
        let _ = std::fs::remove_dir_all(&bin);
    }
}
