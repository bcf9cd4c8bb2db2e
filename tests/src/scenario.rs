//! Scenario topology: a small data centre inside one machine. Every host is a network
//! namespace with one interface on a shared bridge (in its own "hub" namespace), addresses
//! 10.252.N.H/24 with N unique per topology. Faults are injected with iptables inside the
//! hosts' namespaces; traffic only ever flows between namespaces the test created.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
    time::SystemTime,
};

use serde_json::Value;

use crate::{
    client_script, find_pid, judged_healthy, setup::ip, wait_until, write_kubeconfig, Agent, ApiServer,
    NetNs, TempDir, Watched, SYSTEM_PYTHON,
};

/// One host of the topology.
pub struct Host {
    pub ns: NetNs,
    pub ip: IpAddr,
}

impl Host {
    /// Adds an iptables rule inside this host (e.g. `["OUTPUT", "-d", "10.252.1.11", "-j",
    /// "DROP"]`).
    pub fn iptables(&self, rule: &[&str]) {
        let mut args = vec!["iptables", "-w", "-A"];
        args.extend_from_slice(rule);
        self.ns.run(&args);
    }

    /// Removes every iptables rule of this host.
    pub fn heal(&self) {
        self.ns.run(&["iptables", "-w", "-F"]);
    }

    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip, port)
    }
}

/// Hosts on one bridge.
pub struct Topology {
    hosts: BTreeMap<String, Host>,
    hub: NetNs,
    /// The third octet of this topology's addresses.
    n: u32,
}

impl Topology {
    /// Creates the hub and one host per name, in order (host k gets 10.252.N.(10+k)).
    pub fn new(names: &[&str]) -> Topology {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = 1 + (std::process::id() + NEXT.fetch_add(1, Ordering::Relaxed)) % 254;
        let hub = NetNs::new();
        hub.run(&["ip", "link", "add", "br0", "type", "bridge"]);
        hub.run(&["ip", "link", "set", "br0", "up"]);
        let mut hosts = BTreeMap::new();
        for (k, name) in names.iter().enumerate() {
            let ns = NetNs::new();
            let port = format!("p{k}");
            ip(&[
                "-n", &hub.name, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns.name,
            ]);
            hub.run(&["ip", "link", "set", &port, "master", "br0", "up"]);
            let addr = IpAddr::from([10, 252, n as u8, 10 + k as u8]);
            ns.run(&["ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ns.run(&["ip", "link", "set", "eth0", "up"]);
            hosts.insert((*name).to_owned(), Host { ns, ip: addr });
        }
        Topology { hosts, hub, n }
    }

    /// Links the test's own (host) network namespace to the bridge as 10.252.N.254, so the
    /// agent, which runs there, can talk to the lab's apiservers as a node's agent would.
    /// The link goes away with the hub namespace.
    pub fn link_host(&self) -> IpAddr {
        let (outside, inside) = (format!("llh{}", self.n), "uplink");
        let addr = IpAddr::from([10, 252, self.n as u8, 254]);
        if std::path::Path::new("/sys/class/net").join(&outside).exists() {
            return addr;
        }
        ip(&[
            "link",
            "add",
            &outside,
            "type",
            "veth",
            "peer",
            "name",
            inside,
            "netns",
            &self.hub.name,
        ]);
        self.hub
            .run(&["ip", "link", "set", inside, "master", "br0", "up"]);
        ip(&["addr", "add", &format!("{addr}/24"), "dev", &outside]);
        ip(&["link", "set", &outside, "up"]);
        addr
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .get(name)
            .unwrap_or_else(|| panic!("no host {name} in the topology"))
    }
}

/// haproxy as an L7 HTTP/2 gateway (seed 002): TLS with ALPN h2 on the front, TLS h2 to the
/// apiservers behind it, long timeouts so watches live for the whole test, and a gateway that
/// waits for an upstream that does not answer (no connect timeout to turn a hung request into a
/// quick 503): a request sent to a blackholed upstream is never answered, while health checks
/// send the next requests elsewhere.
pub struct Gateway {
    child: std::process::Child,
    pub dir: PathBuf,
}

impl Gateway {
    /// Starts haproxy in `host`, listening on `port`, balancing to `backends` (TLS), with a
    /// combined cert+key PEM at `pem`.
    pub fn start(host: &Host, port: u16, backends: &[SocketAddr], pem: &Path, dir: &Path) -> Gateway {
        let servers: String = backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("    server api{i} {b} ssl verify none alpn h2 check inter 1s\n"))
            .collect();
        let config = format!(
            "global\n    log stderr format raw local0 info\n\
defaults\n    mode http\n    log global\n    option httplog\n\
    timeout connect 1h\n    timeout client 1h\n    timeout server 1h\n    timeout tunnel 1h\n\
frontend api\n    bind {ip}:{port} ssl crt {pem} alpn h2,http/1.1\n    default_backend apiservers\n\
backend apiservers\n    balance first\n{servers}",
            ip = host.ip,
            pem = pem.display(),
        );
        Gateway::start_with_config(host, port, &config, dir)
    }

    /// Starts haproxy in `host` with the configuration text `config` (whose frontend listens
    /// on `port`); returns once it listens.
    pub fn start_with_config(host: &Host, port: u16, config: &str, dir: &Path) -> Gateway {
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, config).expect("write haproxy.cfg");
        let log = std::fs::File::create(dir.join("haproxy.log")).expect("haproxy log");
        let child = host
            .ns
            .command("haproxy")
            .args(["-db", "-f"])
            .arg(&cfg)
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start haproxy");
        let gw = Gateway {
            child,
            dir: dir.to_path_buf(),
        };
        crate::wait_until(Duration::from_secs(5), "haproxy listening", || {
            let out = host.ns.run(&["ss", "-Htln"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if text.contains(&format!("{}:{port}", host.ip)) {
                Ok(())
            } else {
                Err(text)
            }
        });
        gw
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A webhook receiver on the test's loopback that records every Alertmanager-webhook body.
pub struct WebhookSink {
    pub url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl WebhookSink {
    pub fn start() -> WebhookSink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind sink");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let store = bodies.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let store = store.clone();
                thread::spawn(move || serve_one(stream, &store));
            }
        });
        WebhookSink { url, bodies }
    }

    /// Every alert received so far, flattened, as (status, labels) with the whole object.
    pub fn alerts(&self) -> Vec<Value> {
        let bodies = self.bodies.lock().expect("sink lock");
        bodies
            .iter()
            .flat_map(|b| b["alerts"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Alerts named `alertname` (any status).
    pub fn named(&self, alertname: &str) -> Vec<Value> {
        self.alerts()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == alertname)
            .collect()
    }
}

/// Reads HTTP/1.1 requests (keep-alive) and stores JSON bodies; answers 200.
fn serve_one(stream: TcpStream, store: &Mutex<Vec<Value>>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut writer = stream;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if first {
                first = false;
                continue;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&body) {
            store.lock().expect("sink lock").push(v);
        }
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// A binary of this package: beside the agent's (`target/debug/NAME`, or where a VM guest put
/// them), else in `target/debug` (`cargo xtask test` builds them all first) when the agent is
/// elsewhere (`LIFELINE_BIN`: the real-cluster tier runs the image's).
pub fn sibling_bin(name: &str) -> PathBuf {
    let beside = crate::lifeline_bin().with_file_name(name);
    let bin = if beside.is_file() {
        beside
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
            .join("target/debug")
            .join(name)
    };
    assert!(
        bin.is_file(),
        "{} not found: run `cargo build -p lifeline-integration --bins`",
        bin.display()
    );
    bin
}

// ---------------------------------------------------------------------------------------------
// The scenario lab: a topology, a shared CA, a webhook sink, fixtures, real clients, the agent.

/// The apiserver port of every host.
pub const PORT: u16 = 6443;
/// `disconnect_grace` of the scenario agent, seconds.
pub const GRACE: u64 = 10;
/// `min_client_age` of the scenario agent, seconds.
pub const MIN_AGE: u64 = 3;
/// The agent's alert settle delay, seconds.
pub const SETTLE: u64 = 3;

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The kinds of real client the scenarios run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `kube` crate watcher (HTTP/1.1, re-dials with backoff).
    KubeWatch,
    /// python3-kubernetes watch loop (HTTP/1.1, re-dials after 1 s).
    PyWatch,
    /// The same, listing first and waiting 3 s before its first watch (`--settle 3`): the
    /// agent's libssl probes, attached once the client is connected, see that watch.
    PyWatchSettled,
    /// python3-kubernetes reading a pod every second (lease-renewal-like traffic).
    PyLease,
    /// kubectl 1.20 raw watch in a shell re-dial loop (HTTP/2, client-go pings when idle).
    KubectlLoop,
    /// never dials again after losing its connection (seeds 000/004).
    Stuck,
}

/// A topology, a shared CA, the webhook sink and the files of one scenario.
pub struct Lab {
    pub topo: Topology,
    pub dir: TempDir,
    pub sink: WebhookSink,
    hosts: Vec<String>,
}

impl Lab {
    pub fn new(hosts: &[&str]) -> Lab {
        Lab {
            topo: Topology::new(hosts),
            dir: TempDir::new(),
            sink: WebhookSink::start(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    pub fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// Starts (or restarts) the fake apiserver on `host`:6443. Its certificate is valid for
    /// every host of the lab, so the gateway can present it too.
    pub fn apiserver(&self, host: &str) -> ApiServer {
        let flags = self.apiserver_flags();
        let h = self.topo.host(host);
        ApiServer::start_in(
            Some(&h.ns),
            &sibling_bin("ll-apiserver"),
            h.addr(PORT),
            &self.certs(),
            &flags.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    }

    /// The fake apiserver on `host`:6443 serving Kubernetes objects per `options` (generation,
    /// pods, endpoint addresses), with the lab's certificate and intervals.
    pub fn apiserver_with(&self, host: &str, mut options: crate::ApiServerOptions) -> ApiServer {
        options.extra.extend(self.apiserver_flags());
        let h = self.topo.host(host);
        ApiServer::start_with_in(
            Some(&h.ns),
            &sibling_bin("ll-apiserver"),
            h.addr(PORT),
            &self.certs(),
            &options,
        )
    }

    /// The lab's `ll-apiserver` intervals, and a `--san` for every host.
    fn apiserver_flags(&self) -> Vec<String> {
        let mut flags: Vec<String> = [
            "--event-interval",
            "1s",
            "--bookmark-interval",
            "3s",
            "--watch-timeout",
            "300s",
        ]
        .map(String::from)
        .into();
        for h in &self.hosts {
            flags.extend(["--san".to_owned(), self.topo.host(h).ip.to_string()]);
        }
        flags
    }

    /// A kubeconfig whose server is `host`:6443 (an apiserver or the gateway), written once
    /// and atomically (clients started earlier may be reading it).
    pub fn kubeconfig(&self, host: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{host}"));
        if !path.exists() {
            let url = format!("https://{}", self.topo.host(host).addr(PORT));
            let tmp = path.with_extension("tmp");
            write_kubeconfig(&tmp, &url, &self.certs().join("ca.pem"));
            std::fs::rename(&tmp, &path).expect("rename kubeconfig");
        }
        path
    }

    pub fn client(&self, host: &str, kind: Kind, server: &str) -> Watched {
        self.client_in(host, kind, server, None)
    }

    /// A client started inside `cgroup` (a cgroup named like a containerd container), joined
    /// before the program starts, so it is in the container from its first connection.
    pub fn client_in(
        &self,
        host: &str,
        kind: Kind,
        server: &str,
        cgroup: Option<&crate::ContainerCgroup>,
    ) -> Watched {
        let kubeconfig = self.kubeconfig(server).display().to_string();
        let script = |name: &str| client_script(name).display().to_string();
        let argv: Vec<String> = match kind {
            Kind::KubeWatch => vec![
                sibling_bin("ll-kube-watch").display().to_string(),
                "--kubeconfig".into(),
                kubeconfig,
            ],
            Kind::Stuck => vec![
                sibling_bin("ll-stuck").display().to_string(),
                "--kubeconfig".into(),
                kubeconfig,
            ],
            Kind::PyWatch | Kind::PyWatchSettled => {
                let mut argv = vec![
                    SYSTEM_PYTHON.into(),
                    script("py-watch.py"),
                    "--kubeconfig".into(),
                    kubeconfig,
                ];
                if kind == Kind::PyWatchSettled {
                    argv.extend(["--settle".into(), "3".into()]);
                }
                argv
            }
            Kind::PyLease => vec![
                SYSTEM_PYTHON.into(),
                script("py-lease.py"),
                "--kubeconfig".into(),
                kubeconfig,
            ],
            Kind::KubectlLoop => vec!["bash".into(), script("kubectl-watch.sh"), kubeconfig],
        };
        let ns = &self.topo.host(host).ns;
        let Some(cg) = cgroup else {
            let mut cmd = ns.command(&argv[0]);
            cmd.args(&argv[1..]);
            return Watched::spawn(&format!("{kind:?}"), cmd);
        };
        // `ip netns exec` remounts /sys, so the child cannot join the cgroup itself: it waits
        // for a go file while the test moves it, then execs the client (same pid).
        let go = self.dir.path().join(format!("go-{}", crate::unique()));
        let mut cmd = ns.command("sh");
        let wait = format!(
            "while [ ! -e {} ]; do sleep 0.02; done; exec \"$@\"",
            go.display()
        );
        cmd.args(["-c", &wait, "sh"]).args(&argv);
        let child = Watched::spawn(&format!("{kind:?}"), cmd);
        cg.add(child.pid());
        std::fs::write(&go, b"").expect("go file");
        child
    }

    /// The agent for Kubernetes scenarios: no endpoint list (discovery through `kubeconfig`),
    /// the lab's thresholds and sink, plus `config_tail` (e.g. a `remediation:` section).
    pub fn agent_in_cluster(&self, kubeconfig_host: &str, config_tail: &str, extra: &[&str]) -> Agent {
        let config = format!(
            "thresholds:\n  disconnect_grace: {GRACE}s\n  min_client_age: {MIN_AGE}s\n  stale_after: 15s\n\
receivers:\n  - {{ name: sink, webhook: {{ url: \"{}\" }} }}\n{config_tail}",
            self.sink.url
        );
        let kubeconfig = self.kubeconfig(kubeconfig_host).display().to_string();
        let args = ["--kubeconfig", &kubeconfig, "--node-name", "node-a"];
        self.start_agent("lifeline-k8s.yaml", &config, &args, extra)
    }

    /// The agent, watching port 6443 of every host, alerting to the sink.
    pub fn agent(&self, extra: &[&str]) -> Agent {
        let endpoints: Vec<String> = self
            .hosts
            .iter()
            .map(|h| format!("\"{}\"", self.topo.host(h).addr(PORT)))
            .collect();
        let config = format!(
            "endpoints: [{}]\nthresholds:\n  disconnect_grace: {GRACE}s\n  min_client_age: {MIN_AGE}s\n  \
connect_failures: 3\n  connect_window: 30s\nreceivers:\n  - {{ name: sink, webhook: {{ url: \"{}\" }} }}\n",
            endpoints.join(", "),
            self.sink.url
        );
        self.start_agent("lifeline.yaml", &config, &["--node-name", "lab"], extra)
    }

    /// `lifeline run --config FILE ARGS... EXTRA...` with `config` written to FILE in the lab's
    /// directory.
    fn start_agent(&self, file: &str, config: &str, args: &[&str], extra: &[&str]) -> Agent {
        // The agent reaches the apiservers from the host, as it does on a node (its probe).
        self.topo.link_host();
        let path = self.dir.path().join(file);
        std::fs::write(&path, config).expect("write config");
        let mut all = vec!["--config".to_owned(), path.display().to_string()];
        all.extend(args.iter().chain(extra).map(|s| (*s).to_owned()));
        Agent::start_with(&all)
    }
}

/// The client object of `pid` once it is judged healthy with an established connection.
pub fn wait_healthy_clients(agent: &Agent, pids: &[u32]) {
    agent.wait_clients(secs(MIN_AGE + 20), "every client healthy and judged", |clients| {
        pids.iter()
            .all(|pid| find_pid(clients, *pid).is_some_and(|c| judged_healthy(c, None).is_ok()))
            .then_some(())
    });
}

/// Asserts that every one of `pids` is listed and `healthy` right now (bystanders of a fault).
pub fn assert_still_healthy(agent: &Agent, pids: &[u32]) {
    let clients = agent.clients();
    for pid in pids {
        let c = find_pid(&clients, *pid).unwrap_or_else(|| panic!("pid {pid} not listed"));
        assert_eq!(c["state"], "healthy", "bystander {pid} stayed healthy: {c}");
    }
}

/// Waits until `pid` is in `state`; returns the client and when the agent says it got there.
pub fn wait_state(agent: &Agent, pid: u32, state: &str, timeout: Duration) -> (Value, SystemTime) {
    let c = agent.wait_clients(timeout, &format!("pid {pid} {state}"), |clients| {
        find_pid(clients, pid).filter(|c| c["state"] == state).cloned()
    });
    let since = c["state_since"].as_str().expect("state_since");
    let since = chrono::DateTime::parse_from_rfc3339(since).expect("RFC 3339 state_since");
    (c, SystemTime::from(since))
}

/// Asserts `at - fault` is within `[low, high]` seconds (`high` times
/// [`wait_scale`](crate::wait::wait_scale) in a guest under emulation).
pub fn assert_detected(what: &str, fault: SystemTime, at: SystemTime, low: f64, high: f64) {
    let high = high * crate::wait::wait_scale();
    let took = at
        .duration_since(fault)
        .map_or_else(|e| -e.duration().as_secs_f64(), |d| d.as_secs_f64());
    eprintln!("{what}: detected {took:.2}s after the fault (bound {low}..{high})");
    assert!(
        took >= low && took <= high,
        "{what}: detected {took:.2}s after the fault, bound {low}..{high}"
    );
}

/// The one firing alert named `alertname` for `comm`, waited for.
pub fn wait_alert(sink: &WebhookSink, alertname: &str, comm: &str, timeout: Duration) -> Value {
    wait_until(timeout, &format!("{alertname} for {comm}"), || {
        let found: Vec<Value> = sink
            .named(alertname)
            .into_iter()
            .filter(|a| a["labels"]["comm"] == comm && a["status"] == "firing")
            .collect();
        match found.as_slice() {
            [one, ..] => Ok(one.clone()),
            [] => Err(sink.alerts()),
        }
    })
}

pub fn pid_of_comm(agent: &Agent, comm: &str) -> u32 {
    agent.wait_clients(secs(15), &format!("a {comm} client"), |clients| {
        clients
            .iter()
            .find(|c| c["comm"] == comm)
            .and_then(|c| c["pid"].as_u64())
            .map(|p| p as u32)
    })
}
