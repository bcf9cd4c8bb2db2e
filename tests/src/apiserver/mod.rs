//! `ll-apiserver`, the fake kube-apiserver: its documentation is on the binary
//! (`src/bin/ll-apiserver.rs`), whose `main` is [`main`](crate::apiserver::main).
mod handlers;
mod kinds;
mod patch;
mod select;
mod store;
mod tls;
pub mod util;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use kinds::{Generation, Kind};
use store::Store;
use util::parse_duration;

pub const USAGE: &str = "usage: ll-apiserver --listen ADDR --cert-dir DIR [--san IP|DNS]... \
[--event-interval DUR(2s)] [--bookmark-interval DUR(5s)] [--watch-timeout DUR(60s)] [--name NAME] \
[--generation new|old] [--server-version vX.Y.Z] [--service-ip IP(10.96.0.1)] [--endpoint-ip IP]... \
[--endpoint-port PORT(6443)] [--pods FILE] [--pdbs FILE] [--strict-eviction] [--hang-watches RESOURCE]... \
[--hang-first N] [--hang-lists RESOURCE]... [--chunk-lists RESOURCE]...";

// ---------------------------------------------------------------------------------------------
// Command line

pub struct Config {
    pub listen: SocketAddr,
    pub cert_dir: PathBuf,
    pub sans: Vec<String>,
    pub event_interval: Duration,
    pub bookmark_interval: Duration,
    pub watch_timeout: Duration,
    pub name: String,
    pub generation: Generation,
    /// Overrides the generation's `/version`.
    pub server_version: Option<String>,
    pub service_ip: IpAddr,
    pub endpoint_ips: Vec<IpAddr>,
    pub endpoint_port: u16,
    pub pods: Option<PathBuf>,
    pub pdbs: Option<PathBuf>,
    /// Reject Eviction bodies of the group-version the generation does not serve (a real
    /// current apiserver accepts policy/v1beta1 too).
    pub strict_eviction: bool,
    /// Resources (plural, e.g. `pods`, or `NAMESPACE/pods` for the watches of one namespace)
    /// whose watches hang: headers and the initial events are sent, then nothing, and the
    /// watch never ends (an upstream of one resource stuck).
    pub hang_watches: Vec<String>,
    /// Only the first N of those watches hang (`--hang-first`; all without it): a client that
    /// dials again after its connection is reset gets answered.
    pub hang_first: Option<usize>,
    /// Resources (as `hang_watches`) whose lists hang mid-answer: headers and the first half
    /// of the body are sent, then nothing, and the response never ends (a gateway whose
    /// upstream died mid-response).
    pub hang_lists: Vec<String>,
    /// Resources (as `hang_watches`) whose lists are sent whole but streamed, in two chunks
    /// (on HTTP/1.1 chunked, as the real apiserver sends a large answer), never with a
    /// Content-Length.
    pub chunk_lists: Vec<String>,
}

fn parse_args() -> Result<Config, String> {
    let mut listen = None;
    let mut cert_dir = None;
    let mut sans = Vec::new();
    let mut event_interval = Duration::from_secs(2);
    let mut bookmark_interval = Duration::from_secs(5);
    let mut watch_timeout = Duration::from_secs(60);
    let mut name = "ll-apiserver".to_string();
    let mut generation = Generation::New;
    let mut server_version = None;
    let mut service_ip = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1));
    let mut endpoint_ips = Vec::new();
    let mut endpoint_port = 6443;
    let mut pods = None;
    let mut pdbs = None;
    let mut strict_eviction = false;
    let mut hang_watches = Vec::new();
    let mut hang_first = None;
    let mut hang_lists = Vec::new();
    let mut chunk_lists = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (flag, None),
        };
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        if flag == "--strict-eviction" {
            strict_eviction = inline.is_none_or(|v| v != "false");
            continue;
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
        let ip = |v: &str| v.parse::<IpAddr>().map_err(|_| format!("bad {flag} {v:?}"));
        match flag.as_str() {
            "--listen" => {
                listen = Some(value.parse().map_err(|_| format!("bad --listen {value:?}"))?);
            }
            "--cert-dir" => cert_dir = Some(PathBuf::from(value)),
            "--san" => sans.push(value),
            "--event-interval" => event_interval = parse_duration(&value)?,
            "--bookmark-interval" => bookmark_interval = parse_duration(&value)?,
            "--watch-timeout" => watch_timeout = parse_duration(&value)?,
            "--name" => name = value,
            "--generation" => generation = Generation::parse(&value)?,
            "--server-version" => server_version = Some(value),
            "--service-ip" => service_ip = ip(&value)?,
            "--endpoint-ip" => endpoint_ips.push(ip(&value)?),
            "--endpoint-port" => {
                endpoint_port = value
                    .parse()
                    .map_err(|_| format!("bad --endpoint-port {value:?}"))?;
            }
            "--pods" => pods = Some(PathBuf::from(value)),
            "--pdbs" => pdbs = Some(PathBuf::from(value)),
            "--hang-watches" => hang_watches.push(value),
            "--hang-lists" => hang_lists.push(value),
            "--chunk-lists" => chunk_lists.push(value),
            "--hang-first" => {
                hang_first = Some(value.parse().map_err(|_| format!("bad --hang-first {value:?}"))?);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if event_interval.is_zero() || bookmark_interval.is_zero() || watch_timeout.is_zero() {
        return Err("intervals and timeouts must be > 0".into());
    }
    kinds::address_type(&endpoint_ips)?;
    let listen: SocketAddr = listen.ok_or("--listen is required")?;
    if endpoint_ips.is_empty() {
        // The real default: the apiserver's own (advertised) address.
        endpoint_ips.push(match listen.ip() {
            ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ip => ip,
        });
    }
    Ok(Config {
        listen,
        cert_dir: cert_dir.ok_or("--cert-dir is required")?,
        sans,
        event_interval,
        bookmark_interval,
        watch_timeout,
        name,
        generation,
        server_version,
        service_ip,
        endpoint_ips,
        endpoint_port,
        pods,
        pdbs,
        strict_eviction,
        hang_watches,
        hang_first,
        hang_lists,
        chunk_lists,
    })
}

/// A JSON array of objects from `path`.
fn read_objects(path: &PathBuf) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(_) => Err(format!("{}: not a JSON array", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

// ---------------------------------------------------------------------------------------------
// The server

/// What the tests asked for and can read back (`GET /fixture/log`).
#[derive(Default)]
pub struct Journal {
    pub evictions: Vec<Value>,
    pub deletions: Vec<Value>,
    pub events: Vec<Value>,
}

pub struct Server {
    pub cfg: Config,
    pub store: Mutex<Store>,
    pub journal: Mutex<Journal>,
    /// The port of the `kubernetes` endpoints.
    pub endpoint_port: Mutex<u16>,
    pub local: SocketAddr,
    /// Watches hung so far (`--hang-first`).
    pub hung: std::sync::atomic::AtomicUsize,
}

impl Server {
    pub fn log(&self, msg: impl std::fmt::Display) {
        eprintln!("{}: {msg}", self.cfg.name);
    }

    /// Replaces the addresses of the `kubernetes` EndpointSlice and Endpoints (MODIFIED for
    /// each); returns both as stored.
    pub fn set_endpoints(&self, ips: &[IpAddr], port: u16) -> Result<(Value, Value), String> {
        let mut store = self.store.lock().unwrap();
        let start = store.start_secs;
        let mut slice = kinds::kubernetes_slice(ips, port, start)?;
        let endpoints = kinds::kubernetes_endpoints(self.cfg.generation, ips, port, start);
        *self.endpoint_port.lock().unwrap() = port;
        let merge = |store: &Store, kind: Kind, mut new: Value| -> Value {
            // Keep uid, creationTimestamp and the like; the spec part is new.
            if let Some(old) = store.get(kind, kinds::NAMESPACE, "kubernetes") {
                new["metadata"] = old["metadata"].clone();
            }
            new
        };
        if let Some(old) = store.get(Kind::EndpointSlice, kinds::NAMESPACE, "kubernetes") {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            slice = merge(&store, Kind::EndpointSlice, slice);
            slice["metadata"]["generation"] = serde_json::json!(generation + 1);
        }
        let endpoints = merge(&store, Kind::Endpoints, endpoints);
        let slice = store
            .replace(Kind::EndpointSlice, slice)
            .ok_or("no EndpointSlice")?;
        let endpoints = store.replace(Kind::Endpoints, endpoints).ok_or("no Endpoints")?;
        drop(store);
        self.log(format_args!("endpoints of kubernetes set to {ips:?} port {port}"));
        Ok((slice, endpoints))
    }
}

/// The store with everything the server starts with.
fn seed(cfg: &Config) -> Result<Store, String> {
    let mut store = Store::new();
    let start = store.start_secs;
    let mut pods: Vec<Value> = (0..kinds::PODS).map(|i| kinds::web_pod(i, start)).collect();
    if let Some(path) = &cfg.pods {
        for pod in read_objects(path)? {
            pods.push(kinds::loaded_pod(pod)?);
        }
    }
    let mut pdbs = Vec::new();
    if let Some(path) = &cfg.pdbs {
        for pdb in read_objects(path)? {
            pdbs.push(kinds::loaded_pdb(pdb)?);
        }
    }
    let mut namespaces: Vec<String> = ["default", "kube-node-lease", "kube-public", "kube-system"]
        .map(String::from)
        .to_vec();
    let mut nodes = vec![kinds::NODE.to_string()];
    for o in pods.iter().chain(&pdbs) {
        if let Some(ns) = o["metadata"]["namespace"].as_str() {
            if !namespaces.iter().any(|n| n == ns) {
                namespaces.push(ns.to_string());
            }
        }
        if let Some(node) = o["spec"]["nodeName"].as_str() {
            if !nodes.iter().any(|n| n == node) {
                nodes.push(node.to_string());
            }
        }
    }
    for ns in &namespaces {
        store.insert(Kind::Namespace, kinds::namespace(ns, start));
    }
    for node in &nodes {
        store.insert(Kind::Node, kinds::node(node, cfg.generation, start));
    }
    for pod in pods {
        let (ns, name) = (
            pod["metadata"]["namespace"].as_str().unwrap_or("").to_string(),
            pod["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        if store.get(Kind::Pod, &ns, &name).is_some() {
            return Err(format!("pod {ns}/{name} is there twice"));
        }
        store.insert(Kind::Pod, pod);
    }
    for pdb in pdbs {
        store.insert(Kind::PodDisruptionBudget, pdb);
    }
    store.insert(
        Kind::Service,
        kinds::kubernetes_service(cfg.generation, cfg.service_ip, cfg.endpoint_port, start),
    );
    store.insert(
        Kind::EndpointSlice,
        kinds::kubernetes_slice(&cfg.endpoint_ips, cfg.endpoint_port, start)?,
    );
    store.insert(
        Kind::Endpoints,
        kinds::kubernetes_endpoints(cfg.generation, &cfg.endpoint_ips, cfg.endpoint_port, start),
    );
    Ok(store)
}

/// Modifies one `web-*` pod every `--event-interval`, forever.
async fn generate_events(srv: Arc<Server>) {
    let mut ticker =
        tokio::time::interval_at(Instant::now() + srv.cfg.event_interval, srv.cfg.event_interval);
    loop {
        ticker.tick().await;
        srv.store.lock().unwrap().modify_next_web_pod();
    }
}

async fn serve_connection(
    srv: Arc<Server>,
    tls: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    watcher: Watcher,
) {
    let stream = match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return srv.log(format_args!("{peer} TLS handshake failed: {e}")),
        Err(_) => return srv.log(format_args!("{peer} TLS handshake timed out")),
    };
    let alpn = stream
        .get_ref()
        .1
        .alpn_protocol()
        .map_or("none".to_string(), |p| String::from_utf8_lossy(p).into_owned());
    srv.log(format_args!("{peer} connection open alpn={alpn}"));
    let service_srv = srv.clone();
    let service = service_fn(move |req| handlers::handle(service_srv.clone(), peer, req));
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .into_owned();
    match watcher.watch(conn).await {
        Ok(()) => srv.log(format_args!("{peer} connection closed")),
        Err(e) => srv.log(format_args!("{peer} connection closed: {e}")),
    }
}

async fn run(cfg: Config) -> Result<(), String> {
    let tls = tls::tls_acceptor(&cfg.cert_dir, &cfg.sans)?;
    let store = seed(&cfg)?;
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", cfg.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let first_rv = store.oldest;
    let srv = Arc::new(Server {
        endpoint_port: Mutex::new(cfg.endpoint_port),
        cfg,
        store: Mutex::new(store),
        journal: Mutex::new(Journal::default()),
        local,
        hung: std::sync::atomic::AtomicUsize::new(0),
    });
    tokio::spawn(generate_events(srv.clone()));
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening {local}");
        let _ = out.flush();
    }
    srv.log(format_args!(
        "generation {:?}, version {}",
        srv.cfg.generation,
        srv.cfg.generation.version_info(srv.cfg.server_version.as_deref())["gitVersion"]
    ));
    srv.log(format_args!(
        "listening on {local}, first resourceVersion {first_rv}"
    ));

    let graceful = GracefulShutdown::new();
    let signal = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    srv.log(format_args!("{peer} accepted TCP connection"));
                    let _ = tcp.set_nodelay(true);
                    tokio::spawn(serve_connection(srv.clone(), tls.clone(), tcp, peer, graceful.watcher()));
                }
                Err(e) => {
                    srv.log(format_args!("accept: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
        }
    };
    drop(listener);
    let cap = srv.cfg.watch_timeout;
    srv.log(format_args!(
        "{signal}: listener closed; shutting down {} connection(s), waiting at most {cap:?}",
        graceful.count()
    ));
    match tokio::time::timeout(cap, graceful.shutdown()).await {
        Ok(()) => srv.log("every connection closed; exiting"),
        Err(_) => srv.log("shutdown timeout reached; exiting"),
    }
    Ok(())
}

pub fn main() -> ExitCode {
    let cfg = match parse_args() {
        Ok(cfg) => cfg,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ll-apiserver: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ll-apiserver: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let name = cfg.name.clone();
    let result = runtime.block_on(run(cfg));
    // Connections still open (only past the shutdown timeout) are dropped here.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
