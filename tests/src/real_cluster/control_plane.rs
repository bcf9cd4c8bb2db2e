//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kube-proxy, configured as
//! a kubeadm-style control plane: RBAC and the Node authorizer, service-account tokens, leader
//! election on, kube-proxy in iptables mode. Clients authenticate with bearer tokens from a
//! token file (the kubelet included); the apiserver reaches kubelets with a client certificate.
use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs,
    io::Write,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use super::{
    k8s_bin, output, pki, secs,
    supervisor::{Exit, Supervisor},
    system_bin, write_kubeconfig, Daemon, HostLock, LoAddress, KUBECTL,
};
use crate::{free_port, wait_until};

/// The service range: the `kubernetes` Service gets its first address, 10.96.0.1.
const SERVICE_CIDR: &str = "10.96.0.0/12";
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// What [`Options::audit`] records: pods created and deleted, evictions created (Metadata
/// level: who, what, the answer), once the request completed; nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    verbs: [create, delete, deletecollection]
    resources:
      - group: \"\"
        resources: [pods, pods/eviction]
  - level: None
";
/// How long the apiserver gets to become ready (measured here: 4–6 s).
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a SIGTERMed apiserver may take to exit: its 60 s request timeout for open watches,
/// then the GOAWAY (measured: ~62 s).
const TERM_TIMEOUT: Duration = Duration::from_secs(150);

/// Who a kubeconfig authenticates as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum User {
    /// `system:masters`: the tests and the test clients.
    Admin,
    ControllerManager,
    Scheduler,
    KubeProxy,
    /// The kubelet of [`Options::node_name`] (`system:node:NAME`, group `system:nodes`).
    Node,
}

impl User {
    const ALL: [User; 5] = [
        User::Admin,
        User::ControllerManager,
        User::Scheduler,
        User::KubeProxy,
        User::Node,
    ];

    /// The user name and groups the apiserver gives the token (the bootstrap RBAC policy binds
    /// the system components' roles to these names).
    fn identity(self, node: &str) -> (String, &'static str) {
        match self {
            User::Admin => ("lifeline-admin".into(), "system:masters"),
            User::ControllerManager => ("system:kube-controller-manager".into(), ""),
            User::Scheduler => ("system:kube-scheduler".into(), ""),
            User::KubeProxy => ("system:kube-proxy".into(), ""),
            User::Node => (format!("system:node:{node}"), "system:nodes"),
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            User::Admin => "admin",
            User::ControllerManager => "controller-manager",
            User::Scheduler => "scheduler",
            User::KubeProxy => "kube-proxy",
            User::Node => "kubelet",
        }
    }
}

/// What [`ControlPlane::start`] starts.
#[derive(Clone, Debug)]
pub struct Options {
    /// The apiserver's port on every address (`--secure-port`).
    pub port: u16,
    /// The node name the kubelet token and kube-proxy's `hostnameOverride` are for.
    pub node_name: String,
    /// The server URL kube-controller-manager uses (default `https://127.0.0.1:PORT`, as host
    /// components normally do).
    pub controller_manager_server: Option<String>,
    /// The server URL kube-scheduler uses (default as above).
    pub scheduler_server: Option<String>,
    /// The server URL kube-proxy uses (default as above).
    pub kube_proxy_server: Option<String>,
    /// Whether to run kube-proxy (iptables mode; needed for the `kubernetes` ClusterIP).
    pub kube_proxy: bool,
    /// kube-proxy's `clusterCIDR` (the pod network, when a node runs pods; without it
    /// kube-proxy masquerades nothing, which a single node does not need).
    pub cluster_cidr: Option<String>,
    /// Whether the apiserver writes an audit log of pod creations, deletions and evictions
    /// ([`ControlPlane::audit_events`]): who evicted or deleted which pod, through which API.
    pub audit: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 6443,
            node_name: "lifeline-node".into(),
            controller_manager_server: None,
            scheduler_server: None,
            kube_proxy_server: None,
            kube_proxy: true,
            cluster_cidr: None,
            audit: false,
        }
    }
}

/// How the apiserver is stopped in [`ControlPlane::restart_apiserver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: every connection drops at once.
    Kill,
    /// SIGTERM, and the new apiserver started as soon as the old one closed its listener
    /// (at once): HTTP/2 connections get a GOAWAY at once and re-dial to the new one, the old
    /// one drains its HTTP/1.1 watches until its 60 s request timeout, beside the new one (Go
    /// listeners bind with SO_REUSEADDR), then exits. A few seconds without an apiserver.
    Term,
    /// SIGTERM, and the new apiserver started only once the old one exited, as systemd or the
    /// kubelet restart a single apiserver: no apiserver accepts connections for the old one's
    /// whole drain (its 60 s request timeout, longer with watches open).
    TermWaitExit,
}

/// What a restart took.
#[derive(Clone, Copy, Debug)]
pub struct Restart {
    pub how: Stop,
    /// When the old apiserver got its signal.
    pub signalled_at: SystemTime,
    /// From the signal to the old process's exit.
    pub exited_after: Duration,
    /// From the signal to the moment no apiserver listened (the old one closed its listener).
    pub listener_closed_after: Duration,
    /// From the signal to the new apiserver's `/readyz` answering ok.
    pub ready_after: Duration,
}

/// A directory under /var/tmp/lifeline-k8s/runs, removed on drop unless the test panicked.
struct RunDir(PathBuf);

impl RunDir {
    fn new() -> RunDir {
        let path = Path::new(super::K8S_BIN)
            .parent()
            .and_then(Path::parent)
            .expect("the cache root")
            .join("runs")
            .join(crate::unique());
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        RunDir(path)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "(kept {} for inspection: logs, configs, etcd data)",
                self.0.display()
            );
            if let Some(headlines) = super::findings::take_headlines() {
                eprintln!("----- the failure, again -----\n{headlines}");
            }
        } else {
            super::unmount_all_under(&self.0);
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// A running control plane. Dropped: components stopped (clients first), kube-proxy's rules
/// cleaned, apiserver and etcd stopped, the `lo` address removed, the directory removed.
pub struct ControlPlane {
    options: Options,
    /// The address the apiserver advertises (on `lo`, in 10.231.0.0/16).
    pub advertise: Ipv4Addr,
    /// The `kubernetes` Service's ClusterIP.
    pub service_ip: Ipv4Addr,
    pki: pki::Pki,
    tokens: BTreeMap<User, String>,
    etcd: Option<Daemon>,
    apiserver: Option<Daemon>,
    /// When the current apiserver first answered `/readyz`.
    ready_at: Option<Instant>,
    /// Everything else, restarted when it exits (stopped first on drop).
    supervisor: Option<Supervisor>,
    dir: RunDir,
    /// Held for its drop: the advertised address leaves `lo` with the control plane.
    _lo: LoAddress,
    _lock: HostLock,
}

impl ControlPlane {
    /// Starts everything and returns once the apiserver is ready, the controller-manager and
    /// the scheduler hold their leader-election leases, and (with kube-proxy) the `kubernetes`
    /// ClusterIP answers.
    pub fn start(options: Options) -> ControlPlane {
        crate::require_root();
        let lock = HostLock::take();
        if let Err(e) = TcpListener::bind(("0.0.0.0", options.port)) {
            let who = output(Command::new("ss").args(["-Htlnp", &format!("sport = :{}", options.port)]));
            panic!(
                "port {} is taken ({e}); another apiserver runs on this machine:\n{}",
                options.port,
                String::from_utf8_lossy(&who.stdout)
            );
        }
        let lo = LoAddress::add();
        let dir = RunDir::new();
        let pki = pki::Pki::create(&dir.0.join("pki"));
        let tokens = User::ALL.into_iter().map(|u| (u, pki::token())).collect();
        let mut cp = ControlPlane {
            advertise: lo.ip,
            service_ip: SERVICE_IP,
            options,
            pki,
            tokens,
            etcd: None,
            apiserver: None,
            ready_at: None,
            supervisor: None,
            dir,
            _lo: lo,
            _lock: lock,
        };
        cp.supervisor = Some(Supervisor::new(&cp.dir.0));
        let started = Instant::now();
        cp.write_apiserver_files();
        cp.start_etcd();
        cp.start_apiserver();
        cp.wait_ready(READY_TIMEOUT);
        let apiserver_ready = started.elapsed();
        let cm_server = cp.options.controller_manager_server.clone().unwrap_or(cp.url());
        cp.start_controller_manager(&cm_server);
        let scheduler_server = cp.options.scheduler_server.clone().unwrap_or(cp.url());
        cp.start_scheduler("kube-scheduler", &scheduler_server);
        if cp.options.kube_proxy {
            let proxy_server = cp.options.kube_proxy_server.clone().unwrap_or(cp.url());
            cp.start_kube_proxy(&proxy_server);
        }
        for lease in ["kube-controller-manager", "kube-scheduler"] {
            cp.wait_lease_held(lease, secs(60));
        }
        let leases_held = started.elapsed();
        if cp.options.kube_proxy {
            cp.wait_cluster_ip(secs(60));
        }
        eprintln!(
            "control plane {} up in {:.1} s (apiserver ready {:.1} s, leases held {:.1} s): \
             apiserver advertised at {}:{}, ClusterIP {}:443, dir {}",
            super::K8S_VERSION,
            started.elapsed().as_secs_f64(),
            apiserver_ready.as_secs_f64(),
            leases_held.as_secs_f64(),
            cp.advertise,
            cp.options.port,
            cp.service_ip,
            cp.dir.0.display()
        );
        cp
    }

    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    pub fn pki(&self) -> &pki::Pki {
        &self.pki
    }

    pub fn ca_pem(&self) -> PathBuf {
        self.pki.ca_pem()
    }

    pub fn token(&self, user: User) -> &str {
        &self.tokens[&user]
    }

    /// `https://127.0.0.1:PORT`: what host components use.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.options.port)
    }

    /// `https://ADVERTISE:PORT`
    pub fn advertise_url(&self) -> String {
        format!("https://{}:{}", self.advertise, self.options.port)
    }

    /// `https://10.96.0.1:443`: the `kubernetes` ClusterIP (through kube-proxy's rules).
    pub fn cluster_ip_url(&self) -> String {
        format!("https://{}:443", self.service_ip)
    }

    pub fn loopback_endpoint(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.options.port))
    }

    pub fn advertise_endpoint(&self) -> SocketAddr {
        SocketAddr::from((self.advertise, self.options.port))
    }

    pub fn cluster_ip_endpoint(&self) -> SocketAddr {
        SocketAddr::from((self.service_ip, 443))
    }

    /// A kubeconfig for `user` talking to `server` (written on first use).
    pub fn kubeconfig(&self, user: User, server: &str) -> PathBuf {
        let tag: String = server
            .trim_start_matches("https://")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let path = self.dir.0.join(format!("kubeconfig-{}-{tag}", user.file_name()));
        if !path.exists() {
            let (name, _) = user.identity(&self.options.node_name);
            write_kubeconfig(&path, server, &self.ca_pem(), &name, self.token(user));
        }
        path
    }

    /// The admin kubeconfig for `https://127.0.0.1:PORT`.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.kubeconfig(User::Admin, &self.url())
    }

    /// `kubectl --kubeconfig ADMIN ARGS` (kubectl 1.32), whatever its outcome.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        output(
            Command::new(KUBECTL)
                .arg("--kubeconfig")
                .arg(self.admin_kubeconfig())
                .args(args),
        )
    }

    /// `kubectl ARGS`, panicking unless it succeeds; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed with {}:\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` with `yaml` on stdin; panics unless it succeeds.
    pub fn apply(&self, yaml: &str) -> String {
        let mut child = Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(self.admin_kubeconfig())
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl apply");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(yaml.as_bytes())
            .expect("write to kubectl apply");
        let out = child.wait_with_output().expect("wait for kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply failed with {}:\n{}\n--- applied ---\n{yaml}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates namespace `ns` with a RoleBinding that lets its `default` service account view
    /// the cluster, and waits (up to `timeout`) until that account has its token secret: a pod
    /// created before it cannot mount the token.
    pub fn create_viewer_namespace(&self, ns: &str, timeout: Duration) {
        self.apply(&format!(
            "apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: default-view, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
subjects: [{{kind: ServiceAccount, name: default, namespace: {ns}}}]
"
        ));
        wait_until(
            timeout,
            "the namespace's default service account and its token",
            || {
                let out = self.kubectl(&[
                    "-n",
                    ns,
                    "get",
                    "sa",
                    "default",
                    "-o",
                    "jsonpath={.secrets[0].name}",
                ]);
                let secret = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                if secret.is_empty() {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                } else {
                    Ok(())
                }
            },
        );
    }

    /// Waits (up to `timeout`, for `what`) until the log of pod `ns/pod` has a line `wanted`
    /// accepts; on a timeout the panic shows the log so far and kubectl's stderr.
    pub fn wait_pod_log(
        &self,
        ns: &str,
        pod: &str,
        timeout: Duration,
        what: &str,
        wanted: impl Fn(&str) -> bool,
    ) {
        wait_until(timeout, what, || {
            let out = self.kubectl(&["-n", ns, "logs", pod]);
            let log = String::from_utf8_lossy(&out.stdout).into_owned();
            if log.lines().any(&wanted) {
                Ok(())
            } else {
                Err(format!("{log}{}", String::from_utf8_lossy(&out.stderr)))
            }
        });
    }

    /// Waits until `/readyz` answers ok.
    pub fn wait_ready(&mut self, timeout: Duration) {
        wait_until(timeout, "kube-apiserver /readyz ok", || {
            if let Some(api) = self.apiserver.as_mut() {
                api.assert_running();
            }
            let out = self.kubectl(&["get", "--raw", "/readyz", "--request-timeout=2s"]);
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
        self.ready_at.get_or_insert_with(Instant::now);
    }

    /// The current pid of a component by name (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`, `kube-proxy`, or the name given to an extra
    /// one).
    pub fn pid(&self, name: &str) -> u32 {
        self.etcd
            .iter()
            .chain(self.apiserver.iter())
            .find(|d| d.name() == name)
            .map(Daemon::pid)
            .or_else(|| self.supervisor().pid(name))
            .unwrap_or_else(|| panic!("no component named {name} runs"))
    }

    fn supervisor(&self) -> &Supervisor {
        self.supervisor.as_ref().expect("the supervisor runs")
    }

    /// Every exit of a supervised component (each was restarted).
    pub fn exits(&self) -> Vec<Exit> {
        self.supervisor().exits()
    }

    /// Panics (with the end of its log) if etcd or the apiserver exited.
    pub fn assert_running(&mut self) {
        for d in self.etcd.iter_mut().chain(self.apiserver.iter_mut()) {
            d.assert_running();
        }
    }

    /// Stops the apiserver with `how`, waits for the old process to exit (a SIGTERMed one with
    /// open watches takes up to its 60 s request timeout), starts a new one with the same
    /// flags, and waits for `/readyz`.
    /// Stops the apiserver (SIGSTOP) for `duration`, then lets it run again (SIGCONT): a
    /// stuck apiserver, as a deadlocked or overloaded one looks from outside. Its kernel still
    /// accepts connections; nothing answers them, not even a TLS handshake.
    pub fn pause_apiserver(&mut self, duration: Duration) {
        let api = self.apiserver.as_ref().expect("the apiserver runs");
        api.signal(libc::SIGSTOP);
        std::thread::sleep(duration);
        let api = self.apiserver.as_ref().expect("the apiserver runs");
        api.signal(libc::SIGCONT);
        eprintln!(
            "apiserver stopped (SIGSTOP) for {:.0} s, running again",
            duration.as_secs_f64()
        );
    }

    pub fn restart_apiserver(&mut self, how: Stop) -> Restart {
        let mut old = self.apiserver.take().expect("the apiserver runs");
        let signalled_at = SystemTime::now();
        let started = Instant::now();
        // Waits for the old one's exit, measured from the signal.
        let exit = |old: &mut Daemon| {
            let left = TERM_TIMEOUT.saturating_sub(started.elapsed());
            if old.wait_exit(left).is_none() {
                old.stop(libc::SIGKILL, secs(5));
                panic!(
                    "kube-apiserver still ran {TERM_TIMEOUT:?} after {how:?}; the end of its log:\n{}",
                    old.log_tail(30)
                );
            }
            started.elapsed()
        };
        let (exited_after, listener_closed_after) = match how {
            Stop::Kill => {
                old.signal(libc::SIGKILL);
                let exited = exit(&mut old);
                (exited, exited)
            }
            Stop::TermWaitExit => {
                old.signal(libc::SIGTERM);
                let closed = self.wait_listener_closed(started);
                (exit(&mut old), closed)
            }
            Stop::Term => {
                old.signal(libc::SIGTERM);
                let closed = self.wait_listener_closed(started);
                self.start_apiserver();
                self.wait_ready(READY_TIMEOUT);
                (exit(&mut old), closed)
            }
        };
        drop(old);
        if self.apiserver.is_none() {
            self.start_apiserver();
        }
        self.wait_ready(READY_TIMEOUT);
        let ready_after = match how {
            // Ready long before the old one exited; measured when it became ready.
            Stop::Term => self
                .ready_at
                .map_or(started.elapsed(), |t| t.duration_since(started)),
            _ => started.elapsed(),
        };
        let restart = Restart {
            how,
            signalled_at,
            exited_after,
            listener_closed_after,
            ready_after,
        };
        eprintln!(
            "apiserver restart ({how:?}): listener closed {:.1} s, old process exited {:.1} s, new one ready {:.1} s after the signal",
            listener_closed_after.as_secs_f64(),
            exited_after.as_secs_f64(),
            ready_after.as_secs_f64()
        );
        restart
    }

    /// Waits until nothing listens on the apiserver's port; returns how long after `since`.
    fn wait_listener_closed(&self, since: Instant) -> Duration {
        let filter = format!("sport = :{}", self.options.port);
        wait_until(secs(20), "the old apiserver's listener closed", || {
            let out = output(Command::new("ss").args(["-Htln", &filter]));
            if out.stdout.is_empty() {
                Ok(since.elapsed())
            } else {
                Err(String::from_utf8_lossy(&out.stdout).into_owned())
            }
        })
    }

    /// Starts another kube-scheduler (leader election on, same lease: a standby that tries to
    /// acquire it every 2 s) talking to `server`, as component `name`. Returns its pid.
    pub fn start_scheduler(&mut self, name: &str, server: &str) -> u32 {
        let kubeconfig = self.kubeconfig(User::Scheduler, server);
        let mut cmd = Command::new(k8s_bin("kube-scheduler"));
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display())).args([
            "--leader-elect=true",
            "--port=0",
            "--secure-port=0",
            "--v=2",
        ]);
        self.spawn(name, cmd)
    }

    /// Stops (SIGTERM) and forgets the component `name`.
    pub fn stop_component(&mut self, name: &str) {
        self.supervisor().stop(name);
    }

    fn spawn(&mut self, name: &str, cmd: Command) -> u32 {
        let argv: Vec<OsString> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(OsString::from)
            .collect();
        self.supervisor().start(name, argv)
    }

    fn write_apiserver_files(&self) {
        let mut sans: Vec<String> = [
            self.advertise.to_string(),
            "127.0.0.1".into(),
            self.service_ip.to_string(),
            "localhost".into(),
        ]
        .into();
        for name in [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ] {
            sans.push(name.into());
        }
        self.pki.issue("apiserver", pki::Profile::Server { sans: &sans });
        self.pki.issue(
            "apiserver-kubelet-client",
            pki::Profile::Client {
                user: "kube-apiserver-kubelet-client",
                groups: &["system:masters"],
            },
        );
        let mut csv = String::new();
        for user in User::ALL {
            let (name, groups) = user.identity(&self.options.node_name);
            csv.push_str(&format!("{},{name},{name},\"{groups}\"\n", self.token(user)));
        }
        fs::write(self.dir.0.join("tokens.csv"), csv).expect("write tokens.csv");
        if self.options.audit {
            fs::write(self.dir.0.join("audit-policy.yaml"), AUDIT_POLICY).expect("write audit-policy.yaml");
        }
    }

    /// The audit log's events so far (with [`Options::audit`]), oldest first: every request
    /// that created or deleted a pod or created an eviction (`objectRef.subresource:
    /// "eviction"`), with its user, verb, object and response code. The log is kept across
    /// apiserver restarts.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        assert!(
            self.options.audit,
            "the control plane was started without Options::audit"
        );
        let path = self.dir.0.join("audit.log");
        fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn start_etcd(&mut self) {
        let etcd = system_bin("/usr/bin/etcd", "etcd-server");
        let (client, peer) = (free_port(), free_port());
        let data = self.dir.0.join("etcd");
        let mut cmd = Command::new(etcd);
        cmd.args(["--name", "lifeline"])
            .arg("--data-dir")
            .arg(&data)
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-cluster=lifeline=http://127.0.0.1:{peer}"))
            .args(["--initial-cluster-state=new", "--log-level=warn"]);
        let d = Daemon::spawn("etcd", cmd, &self.dir.0);
        self.etcd = Some(d);
        let addr = SocketAddr::from(([127, 0, 0, 1], client));
        wait_until(secs(30), "etcd /health", || {
            self.etcd.as_mut().expect("etcd").assert_running();
            match crate::http_get(addr, "/health") {
                Ok((200, body)) if body.contains("true") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        fs::write(self.dir.0.join("etcd.url"), format!("http://{addr}")).expect("write etcd.url");
    }

    fn start_apiserver(&mut self) {
        let d = &self.dir.0;
        let pki = d.join("pki");
        let etcd = fs::read_to_string(d.join("etcd.url")).expect("etcd.url");
        let mut cmd = Command::new(k8s_bin("kube-apiserver"));
        cmd.arg(format!("--etcd-servers={etcd}"))
            .arg("--bind-address=0.0.0.0")
            .arg(format!("--secure-port={}", self.options.port))
            .arg(format!("--advertise-address={}", self.advertise))
            .arg("--insecure-port=0")
            .arg(format!("--cert-dir={}", pki.display()))
            .arg(format!("--tls-cert-file={}", pki.join("apiserver.pem").display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.join("apiserver-key.pem").display()
            ))
            .arg(format!("--client-ca-file={}", self.ca_pem().display()))
            .arg(format!("--token-auth-file={}", d.join("tokens.csv").display()))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                self.pki.sa_pub().display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                self.pki.sa_key().display()
            ))
            .arg("--allow-privileged=true")
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
            .arg(format!(
                "--kubelet-client-certificate={}",
                pki.join("apiserver-kubelet-client.pem").display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                pki.join("apiserver-kubelet-client-key.pem").display()
            ))
            .args(["--profiling=false", "--v=1"]);
        if self.options.audit {
            cmd.arg(format!(
                "--audit-policy-file={}",
                d.join("audit-policy.yaml").display()
            ))
            .arg(format!("--audit-log-path={}", d.join("audit.log").display()))
            .args(["--audit-log-format=json", "--audit-log-mode=blocking"]);
        }
        self.apiserver = Some(Daemon::spawn("kube-apiserver", cmd, &self.dir.0));
        self.ready_at = None;
    }

    fn start_controller_manager(&mut self, server: &str) {
        let cmd = self.controller_manager(&k8s_bin("kube-controller-manager"), server, true);
        self.spawn("kube-controller-manager", cmd);
    }

    /// Starts a second kube-controller-manager as component `name`, talking to `server`, from
    /// a copy of the binary in the run directory (a file of its own: uprobes on the original
    /// do not fire in it), with leader election off, so it runs every controller beside the
    /// leader and receives the same updates: a control group for measuring the leader. Its
    /// controllers act on the same objects as the leader's (both converge on the same state).
    /// Returns its pid.
    pub fn start_controller_manager_copy(&mut self, name: &str, server: &str) -> u32 {
        let copy = self.dir.0.join(name);
        fs::copy(k8s_bin("kube-controller-manager"), &copy)
            .unwrap_or_else(|e| panic!("copy kube-controller-manager to {}: {e}", copy.display()));
        let cmd = self.controller_manager(&copy, server, false);
        self.spawn(name, cmd)
    }

    /// kube-controller-manager `binary`'s command line, as this control plane runs it.
    fn controller_manager(&self, binary: &Path, server: &str, leader_elect: bool) -> Command {
        let kubeconfig = self.kubeconfig(User::ControllerManager, server);
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--leader-elect={leader_elect}"))
            .args(["--port=0", "--secure-port=0"])
            .arg("--use-service-account-credentials=true")
            .arg(format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key().display()
            ))
            .arg(format!("--root-ca-file={}", self.ca_pem().display()))
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .args(["--allocate-node-cidrs=false", "--v=2"]);
        cmd
    }

    fn start_kube_proxy(&mut self, server: &str) {
        let kubeconfig = self.kubeconfig(User::KubeProxy, server);
        let config = self.dir.0.join("kube-proxy.yaml");
        let cluster_cidr = self.options.cluster_cidr.clone().unwrap_or_default();
        // conntrack values of 0 leave the host's sysctls as they are. A bind address is the
        // node IP: without it kube-proxy looks for its Node object for ~35 s first.
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
clusterCIDR: \"{cluster_cidr}\"
hostnameOverride: {node}
bindAddress: {advertise}
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  syncPeriod: 30s
  minSyncPeriod: 1s
",
            kubeconfig = kubeconfig.display(),
            node = self.options.node_name,
            advertise = self.advertise,
            healthz = free_port(),
            metrics = free_port(),
        );
        fs::write(&config, text).expect("write kube-proxy.yaml");
        let mut cmd = Command::new(k8s_bin("kube-proxy"));
        cmd.arg(format!("--config={}", config.display())).arg("--v=2");
        self.spawn("kube-proxy", cmd);
    }

    /// Waits until the leader-election lease `name` in kube-system has a holder.
    pub fn wait_lease_held(&mut self, name: &str, timeout: Duration) -> String {
        wait_until(timeout, &format!("lease kube-system/{name} held"), || {
            self.assert_running();
            let out = self.kubectl(&[
                "-n",
                "kube-system",
                "get",
                "lease",
                name,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ]);
            let holder = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if out.status.success() && !holder.is_empty() {
                Ok(holder)
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        })
    }

    /// Waits until the `kubernetes` ClusterIP answers `/readyz` (kube-proxy's rules are in).
    pub fn wait_cluster_ip(&mut self, timeout: Duration) {
        let kubeconfig = self.kubeconfig(User::Admin, &self.cluster_ip_url());
        wait_until(timeout, "the kubernetes ClusterIP answering", || {
            self.assert_running();
            let out = output(Command::new(KUBECTL).arg("--kubeconfig").arg(&kubeconfig).args([
                "get",
                "--raw",
                "/readyz",
                "--request-timeout=2s",
            ]));
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Clients of the apiserver first (newest first), then the apiserver, then etcd.
        drop(self.supervisor.take());
        if self.options.kube_proxy {
            // Removes every KUBE-* chain and jump kube-proxy added to the host's tables.
            let bin = Path::new(super::K8S_BIN).join("kube-proxy");
            match Command::new(&bin).arg("--cleanup").output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => eprintln!(
                    "kube-proxy --cleanup failed with {}:\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
                Err(e) => eprintln!("kube-proxy --cleanup: {e}"),
            }
            super::remove_kube_chains();
        }
        if let Some(mut api) = self.apiserver.take() {
            api.stop(libc::SIGKILL, secs(5));
        }
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop(libc::SIGTERM, secs(5));
        }
        // Then the fields: the `lo` address, the directory, the lock.
    }
}
