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
};

use serde_json::Value;

use crate::{ip, NetNs};

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
    _hub: NetNs,
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
        Topology { hosts, _hub: hub }
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .get(name)
            .unwrap_or_else(|| panic!("no host {name} in the topology"))
    }
}

/// haproxy as an L7 HTTP/2 gateway (seed 002): TLS with ALPN h2 on the front, TLS h2 to the
/// apiservers behind it, long timeouts so watches live for the whole test.
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
    timeout connect 2s\n    timeout client 1h\n    timeout server 1h\n    timeout tunnel 1h\n\
frontend api\n    bind {ip}:{port} ssl crt {pem} alpn h2,http/1.1\n    default_backend apiservers\n\
backend apiservers\n    balance first\n{servers}",
            ip = host.ip,
            pem = pem.display(),
        );
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
