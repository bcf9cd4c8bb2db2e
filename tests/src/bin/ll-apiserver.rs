//! `ll-apiserver`: a fake kube-apiserver that behaves like a real one (1.20) on the wire, for the
//! fault-injection scenarios: TLS with ALPN `h2` / `http/1.1`, discovery, Pods in `default` that
//! change every `--event-interval`, list and watch with resourceVersion semantics, bookmarks, the
//! server-side watch timeout and a graceful SIGTERM.
//!
//! ```text
//! ll-apiserver --listen ADDR --cert-dir DIR [--san IP|DNS]... [--event-interval DUR]
//!              [--bookmark-interval DUR] [--watch-timeout DUR] [--name NAME]
//! ```
//!
//! DUR is `300ms`, `2s`, `1.5s`, `1m`. On start the server creates a CA in DIR (`ca.pem`,
//! `ca-key.pem`) unless one is there, then (re)issues `server.pem` / `server-key.pem` signed by it
//! for every `--san` plus 127.0.0.1, ::1 and localhost; a restart on the same DIR keeps the CA, so
//! clients keep trusting it. Once it accepts connections it prints `listening ADDR` on stdout.
//! Every request, connection and watch is logged as one line on stderr.
//!
//! Semantics (what a real apiserver does, simplified):
//! - resourceVersions are global and start at the start time in milliseconds, so they grow across
//!   restarts, as etcd's do across apiserver restarts.
//! - `GET .../pods?watch=1`: `resourceVersion` absent, empty or `0` → a synthetic `ADDED` for every
//!   current pod, then live events (the real `RV=""`/`"0"` semantics). `resourceVersion=N` → every
//!   event after N from the history (which starts at this process's start), then live events; N
//!   older than the history (a restarted server) → one `ERROR` event with a 410 `Expired` Status,
//!   then the stream ends, like the real watch cache. N newer than the newest event: live events.
//! - `allowWatchBookmarks=true` → a `BOOKMARK` every `--bookmark-interval`.
//! - the stream ends cleanly after min(`timeoutSeconds`, `--watch-timeout`).
//! - `limit`/`continue` page lists; label and field selectors are ignored.
//! - `Accept: ...;as=Table;...` (kubectl's `get`) is answered with a `meta.k8s.io/v1` Table.
//! - authentication is not checked.
//! - SIGTERM/SIGINT: the listener is closed at once, connections are asked to shut down (h2
//!   GOAWAY, h1 close after the response in flight), open watches run until their timeout, and
//!   the process exits 0 once every connection closed, or after `--watch-timeout`.
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

type Body = BoxBody<Bytes, Infallible>;

const USAGE: &str = "usage: ll-apiserver --listen ADDR --cert-dir DIR [--san IP|DNS]... \
[--event-interval DUR(2s)] [--bookmark-interval DUR(5s)] [--watch-timeout DUR(60s)] [--name NAME]";

/// The namespace that holds the pods.
const NAMESPACE: &str = "default";
/// How many pods there are.
const PODS: usize = 5;
/// How many events the watch history keeps.
const HISTORY: usize = 4096;
/// The node every pod runs on.
const NODE: &str = "lifeline-node-1";

// ---------------------------------------------------------------------------------------------
// Command line

struct Config {
    listen: SocketAddr,
    cert_dir: PathBuf,
    sans: Vec<String>,
    event_interval: Duration,
    bookmark_interval: Duration,
    watch_timeout: Duration,
    name: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_args() -> Result<Config, String> {
    let mut listen = None;
    let mut cert_dir = None;
    let mut sans = Vec::new();
    let mut event_interval = Duration::from_secs(2);
    let mut bookmark_interval = Duration::from_secs(5);
    let mut watch_timeout = Duration::from_secs(60);
    let mut name = "ll-apiserver".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (flag, None),
        };
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
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
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if event_interval.is_zero() || bookmark_interval.is_zero() || watch_timeout.is_zero() {
        return Err("intervals and timeouts must be > 0".into());
    }
    Ok(Config {
        listen: listen.ok_or("--listen is required")?,
        cert_dir: cert_dir.ok_or("--cert-dir is required")?,
        sans,
        event_interval,
        bookmark_interval,
        watch_timeout,
        name,
    })
}

// ---------------------------------------------------------------------------------------------
// Certificates

/// The CA's parameters. They are the same on every run, so a CA key loaded from `ca-key.pem`
/// signs certificates whose issuer matches the `ca.pem` written on the first run.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ll-apiserver-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn write_file(path: &Path, contents: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("rename to {}: {e}", path.display()))
}

/// Loads or creates the CA, issues the server certificate, and returns its chain and key.
fn certificates(cfg: &Config) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let dir = &cfg.cert_dir;
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let ca_pem = dir.join("ca.pem");
    let ca_key_pem = dir.join("ca-key.pem");
    let ca_key = if ca_pem.is_file() && ca_key_pem.is_file() {
        let pem = std::fs::read_to_string(&ca_key_pem).map_err(|e| format!("read CA key: {e}"))?;
        KeyPair::from_pem(&pem).map_err(|e| format!("parse {}: {e}", ca_key_pem.display()))?
    } else {
        let key = KeyPair::generate().map_err(|e| format!("generate CA key: {e}"))?;
        let cert = ca_params().self_signed(&key).map_err(|e| format!("CA: {e}"))?;
        write_file(&ca_key_pem, &key.serialize_pem())?;
        write_file(&ca_pem, &cert.pem())?;
        key
    };
    let issuer = Issuer::new(ca_params(), ca_key);

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kube-apiserver");
    params.distinguished_name = dn;
    let mut names: Vec<String> = cfg.sans.clone();
    names.extend(["127.0.0.1", "::1", "localhost"].map(String::from));
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                name.clone()
                    .try_into()
                    .map_err(|e| format!("--san {name}: {e}"))?,
            ),
        };
        if !params.subject_alt_names.contains(&san) {
            params.subject_alt_names.push(san);
        }
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(|e| format!("generate server key: {e}"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("server certificate: {e}"))?;
    write_file(&dir.join("server-key.pem"), &key.serialize_pem())?;
    write_file(&dir.join("server.pem"), &cert.pem())?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((vec![cert.der().clone()], key))
}

fn tls_acceptor(cfg: &Config) -> Result<TlsAcceptor, String> {
    let (chain, key) = certificates(cfg)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("TLS config: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

// ---------------------------------------------------------------------------------------------
// Time

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// RFC 3339 in UTC with second precision, like Kubernetes' metav1.Time.
fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Kubernetes' duration.HumanDuration, as kubectl's AGE column shows it.
fn human_duration(secs: u64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else {
        format!("{d}d")
    }
}

// ---------------------------------------------------------------------------------------------
// The object store

/// One change of one object.
#[derive(Clone)]
struct Event {
    rv: u64,
    kind: &'static str,
    object: Arc<Value>,
}

impl Event {
    fn namespace(&self) -> &str {
        self.object["metadata"]["namespace"].as_str().unwrap_or("")
    }
}

struct Store {
    /// The newest resourceVersion.
    rv: u64,
    /// Watches may start from any resourceVersion >= this.
    oldest: u64,
    /// Every pod, as a full object (with kind and apiVersion).
    pods: Vec<Value>,
    history: VecDeque<Event>,
    /// How many modifications were made.
    tick: u64,
    /// Start time of this process (seconds since the epoch), for the generated objects.
    start_secs: u64,
}

fn pod(i: usize, rv: u64, start_secs: u64) -> Value {
    let name = format!("web-{i}");
    let created = rfc3339(start_secs.saturating_sub(3600 * (i as u64 + 1)));
    // A stable uid per (start, pod).
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        start_secs as u32,
        i,
        (start_secs >> 32) & 0xfff,
        i,
        (start_secs ^ 0x5eed) & 0xffff_ffff_ffff
    );
    let ip = format!("10.244.0.{}", 10 + i);
    let image = "registry.k8s.io/pause:3.2";
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid,
            "resourceVersion": rv.to_string(),
            "creationTimestamp": created,
            "labels": {"app": "web", "pod-template-hash": "6b7c9d5f8", "lifeline.test/counter": "0"},
            "annotations": {"lifeline.test/modified-at": created},
        },
        "spec": {
            "containers": [{
                "name": "app",
                "image": image,
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": NODE,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": created},
            ],
            "hostIP": "192.0.2.10",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": created,
            "containerStatuses": [{
                "name": "app",
                "state": {"running": {"startedAt": created}},
                "lastState": {},
                "ready": true,
                "restartCount": 0,
                "image": image,
                "imageID": "registry.k8s.io/pause@sha256:927d98197ec1141a368550822d18fa1c60bdae27b78b0c004f705f548c07814f",
                "containerID": format!("containerd://{:064x}", start_secs as u128 * 1000 + i as u128),
                "started": true,
            }],
            "qosClass": "BestEffort",
        },
    })
}

impl Store {
    fn new() -> Store {
        let now = unix_now();
        let base = now.as_millis() as u64;
        let mut store = Store {
            rv: base,
            oldest: base,
            pods: Vec::new(),
            history: VecDeque::new(),
            tick: 0,
            start_secs: now.as_secs(),
        };
        for i in 0..PODS {
            store.rv += 1;
            let object = pod(i, store.rv, store.start_secs);
            store.pods.push(object.clone());
            store.record("ADDED", object);
        }
        store
    }

    fn record(&mut self, kind: &'static str, object: Value) -> Event {
        let event = Event {
            rv: self.rv,
            kind,
            object: Arc::new(object),
        };
        if self.history.len() == HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.oldest = old.rv;
            }
        }
        self.history.push_back(event.clone());
        event
    }

    /// Modifies the next pod (round robin): a new counter label and annotation.
    fn modify_next(&mut self) -> Event {
        self.tick += 1;
        self.rv += 1;
        let i = (self.tick as usize - 1) % self.pods.len();
        let rv = self.rv;
        let tick = self.tick;
        let pod = &mut self.pods[i];
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        pod["metadata"]["labels"]["lifeline.test/counter"] = json!(tick.to_string());
        pod["metadata"]["annotations"]["lifeline.test/modified-at"] = json!(rfc3339(unix_now().as_secs()));
        let object = pod.clone();
        self.record("MODIFIED", object)
    }
}

struct Server {
    cfg: Config,
    store: Mutex<Store>,
    events: broadcast::Sender<Event>,
    local: SocketAddr,
}

impl Server {
    fn log(&self, msg: impl std::fmt::Display) {
        eprintln!("{}: {msg}", self.cfg.name);
    }
}

/// Modifies one pod every `--event-interval`, forever.
async fn generate_events(srv: Arc<Server>) {
    let mut ticker =
        tokio::time::interval_at(Instant::now() + srv.cfg.event_interval, srv.cfg.event_interval);
    loop {
        ticker.tick().await;
        let store = &mut *srv.store.lock().unwrap();
        let event = store.modify_next();
        // Sent under the lock: a watch that subscribes under the same lock sees exactly the
        // events after its snapshot.
        let _ = srv.events.send(event);
    }
}

// ---------------------------------------------------------------------------------------------
// Responses

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Full::new(body.into()).boxed())
        .expect("valid response")
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    full(status, "application/json", value.to_string())
}

fn status_object(code: u16, reason: &str, message: &str, details: Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    })
}

fn error(status: StatusCode, reason: &str, message: &str, details: Value) -> Response<Body> {
    json_response(status, &status_object(status.as_u16(), reason, message, details))
}

fn not_found() -> Response<Body> {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

fn bad_request(message: &str) -> Response<Body> {
    error(StatusCode::BAD_REQUEST, "BadRequest", message, json!({}))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex(*hi).zip(hex(*lo)).map(|(hi, lo)| hi << 4 | lo),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(kv), String::new()),
        })
        .collect()
}

/// Go's strconv.ParseBool, which the apiserver uses for query booleans (python sends `True`).
fn parse_bool(s: Option<&String>) -> bool {
    matches!(
        s.map(String::as_str),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    )
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "20",
        "gitVersion": "v1.20.2",
        "gitCommit": "faecb196815e248d3ecfb03c680a4507229c2a56",
        "gitTreeState": "clean",
        "buildDate": "2021-01-13T13:20:00Z",
        "goVersion": "go1.15.5",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn api_resources() -> Value {
    let all = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "namespaces", "singularName": "", "namespaced": false, "kind": "Namespace",
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
             "shortNames": ["ns"], "storageVersionHash": "Q3oi5N2YM8M="},
            {"name": "pods", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": all,
             "shortNames": ["po"], "categories": ["all"], "storageVersionHash": "xPOwRZ+Yhw8="},
            {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]},
            {"name": "pods/status", "singularName": "", "namespaced": true, "kind": "Pod",
             "verbs": ["get", "patch", "update"]},
        ],
    })
}

fn namespace(name: &str, start_secs: u64) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("{:08x}-0000-4000-8000-{:012x}", start_secs as u32, name.len()),
            "resourceVersion": "1",
            "creationTimestamp": rfc3339(start_secs.saturating_sub(86_400)),
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// A pod as a list item: real lists leave out each item's kind and apiVersion.
fn list_item(pod: &Value) -> Value {
    let mut item = pod.clone();
    if let Some(map) = item.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    item
}

/// How the client asked for objects to be shown.
#[derive(Clone, Copy, PartialEq)]
enum Format {
    Object,
    /// A Table with rows holding the object as none, PartialObjectMetadata, or the object.
    Table(Include),
}

#[derive(Clone, Copy, PartialEq)]
enum Include {
    None,
    Metadata,
    Object,
}

fn format_of(accept: &str, query: &BTreeMap<String, String>) -> Format {
    if !accept.contains("as=Table") {
        return Format::Object;
    }
    Format::Table(match query.get("includeObject").map(String::as_str) {
        Some("None") => Include::None,
        Some("Object") => Include::Object,
        _ => Include::Metadata,
    })
}

fn table_columns() -> Value {
    let col = |name: &str, ty: &str, format: &str, description: &str, priority: u8| json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority});
    json!([
        col(
            "Name",
            "string",
            "name",
            "Name must be unique within a namespace.",
            0
        ),
        col(
            "Ready",
            "string",
            "",
            "The aggregate readiness state of this pod for accepting traffic.",
            0
        ),
        col(
            "Status",
            "string",
            "",
            "The aggregate status of the containers in this pod.",
            0
        ),
        col(
            "Restarts",
            "integer",
            "",
            "The number of times the containers in this pod have been restarted.",
            0
        ),
        col(
            "Age",
            "string",
            "",
            "CreationTimestamp is a timestamp representing the server time when this object was created.",
            0
        ),
        col(
            "IP",
            "string",
            "",
            "IP address allocated to the pod. Routable at least within the cluster.",
            1
        ),
        col(
            "Node",
            "string",
            "",
            "NodeName is a request to schedule this pod onto a specific node.",
            1
        ),
        col(
            "Nominated Node",
            "string",
            "",
            "nominatedNodeName is set when this pod preempts other pods on the node.",
            1
        ),
        col(
            "Readiness Gates",
            "string",
            "",
            "If specified, all readiness gates will be evaluated for pod readiness.",
            1
        ),
    ])
}

fn table_row(pod: &Value, include: Include, start_secs: u64, hours_old: u64) -> Value {
    let metadata = &pod["metadata"];
    let age = unix_now().as_secs().saturating_sub(start_secs) + hours_old * 3600;
    let object = match include {
        Include::None => Value::Null,
        Include::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
        }),
        Include::Object => pod.clone(),
    };
    json!({
        "cells": [
            metadata["name"], "1/1", "Running", 0, human_duration(age),
            pod["status"]["podIP"], NODE, "<none>", "<none>",
        ],
        "object": object,
    })
}

fn table(pods: &[&Value], include: Include, rv: u64, start_secs: u64, headers: bool) -> Value {
    let rows: Vec<Value> = pods
        .iter()
        .map(|p| {
            let hours = p["metadata"]["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("web-"))
                .and_then(|i| i.parse::<u64>().ok())
                .map_or(1, |i| i + 1);
            table_row(p, include, start_secs, hours)
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": if headers { table_columns() } else { json!([]) },
        "rows": rows,
    });
    if !headers {
        t["columnDefinitions"] = Value::Null;
    }
    t
}

// ---------------------------------------------------------------------------------------------
// Requests

async fn handle(
    srv: Arc<Server>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let ua = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let target = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    srv.log(format_args!(
        "{peer} {} {target} {:?} ua={ua:?}",
        req.method(),
        req.version()
    ));
    let query = parse_query(req.uri().query());
    let format = format_of(&accept, &query);
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    let mut resp = if req.method() != Method::GET {
        error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fixture only serves GET",
            json!({}),
        )
    } else {
        route(&srv, peer, &segs, &query, format)
    };
    let audit_id = format!("{:032x}", unix_now().as_nanos() ^ u128::from(peer.port()));
    if let Ok(v) = audit_id.parse() {
        resp.headers_mut().insert("audit-id", v);
    }
    Ok(resp)
}

fn route(
    srv: &Arc<Server>,
    peer: SocketAddr,
    segs: &[&str],
    query: &BTreeMap<String, String>,
    format: Format,
) -> Response<Body> {
    let start_secs = srv.store.lock().unwrap().start_secs;
    match segs {
        [] => json_response(
            StatusCode::OK,
            &json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]}),
        ),
        ["version"] => json_response(StatusCode::OK, &version()),
        ["healthz" | "readyz" | "livez"] => full(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
        ["api"] => json_response(
            StatusCode::OK,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": srv.local.to_string()}],
            }),
        ),
        ["apis"] => json_response(
            StatusCode::OK,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ),
        ["api", "v1"] => json_response(StatusCode::OK, &api_resources()),
        ["api", "v1", "pods"] => pods(srv, peer, None, query, format),
        ["api", "v1", "namespaces", ns, "pods"] => pods(srv, peer, Some(ns), query, format),
        ["api", "v1", "namespaces", ns, "pods", name] => {
            let store = srv.store.lock().unwrap();
            let found = store
                .pods
                .iter()
                .find(|p| p["metadata"]["namespace"] == *ns && p["metadata"]["name"] == *name);
            match (found, format) {
                (Some(pod), Format::Object) => json_response(StatusCode::OK, pod),
                (Some(pod), Format::Table(include)) => json_response(
                    StatusCode::OK,
                    &table(&[pod], include, store.rv, store.start_secs, true),
                ),
                (None, _) => error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("pods \"{name}\" not found"),
                    json!({"name": name, "kind": "pods"}),
                ),
            }
        }
        ["api", "v1", "namespaces"] => {
            let items: Vec<Value> = [NAMESPACE, "kube-system"]
                .iter()
                .map(|n| list_item(&namespace(n, start_secs)))
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        }
        ["api", "v1", "namespaces", name] if [NAMESPACE, "kube-system"].contains(name) => {
            json_response(StatusCode::OK, &namespace(name, start_secs))
        }
        ["api", "v1", "namespaces", name] => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("namespaces \"{name}\" not found"),
            json!({"name": name, "kind": "namespaces"}),
        ),
        _ => not_found(),
    }
}

fn pods(
    srv: &Arc<Server>,
    peer: SocketAddr,
    ns: Option<&str>,
    query: &BTreeMap<String, String>,
    format: Format,
) -> Response<Body> {
    if parse_bool(query.get("watch")) {
        return watch(srv, peer, ns, query, format);
    }
    let store = srv.store.lock().unwrap();
    let matching: Vec<&Value> = store
        .pods
        .iter()
        .filter(|p| ns.is_none_or(|ns| p["metadata"]["namespace"] == ns))
        .collect();
    let offset = match query.get("continue").filter(|c| !c.is_empty()) {
        None => 0,
        Some(token) => match token
            .strip_prefix("ll-offset-")
            .and_then(|o| o.parse::<usize>().ok())
        {
            Some(o) => o.min(matching.len()),
            None => return bad_request(&format!("invalid continue token {token:?}")),
        },
    };
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0)
        .unwrap_or(usize::MAX);
    let end = offset.saturating_add(limit).min(matching.len());
    let page = &matching[offset..end];
    let mut metadata = json!({"resourceVersion": store.rv.to_string()});
    if end < matching.len() {
        metadata["continue"] = json!(format!("ll-offset-{end}"));
        metadata["remainingItemCount"] = json!(matching.len() - end);
    }
    let mut body = match format {
        Format::Object => json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": page.iter().map(|p| list_item(p)).collect::<Vec<_>>(),
        }),
        Format::Table(include) => table(page, include, store.rv, store.start_secs, true),
    };
    body["metadata"] = metadata;
    json_response(StatusCode::OK, &body)
}

/// One line of a watch stream.
fn event_line(kind: &str, object: &Value) -> Bytes {
    // Written by hand to keep the real apiserver's key order: type, then object.
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n"))
}

fn watch(
    srv: &Arc<Server>,
    peer: SocketAddr,
    ns: Option<&str>,
    query: &BTreeMap<String, String>,
    format: Format,
) -> Response<Body> {
    let cap = srv.cfg.watch_timeout;
    let timeout = match query.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()) {
        Some(t) if t > 0 => Duration::from_secs(t).min(cap),
        _ => cap,
    };
    let bookmarks = parse_bool(query.get("allowWatchBookmarks")).then_some(srv.cfg.bookmark_interval);
    let from = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return bad_request(&format!(
                    "resourceVersion: Invalid value: \"{rv}\": strconv.ParseUint: parsing \"{rv}\": invalid syntax"
                ))
            }
        },
    };
    let ns = ns.map(str::to_string);
    let start_secs = srv.store.lock().unwrap().start_secs;
    let render = move |e: &Event| -> Bytes {
        match format {
            Format::Object => event_line(e.kind, &e.object),
            Format::Table(include) => {
                event_line(e.kind, &table(&[&e.object], include, e.rv, start_secs, false))
            }
        }
    };
    let (events, initial, progress) = {
        let store = srv.store.lock().unwrap();
        let events = srv.events.subscribe();
        let in_ns = |o: &Value| ns.as_deref().is_none_or(|ns| o["metadata"]["namespace"] == ns);
        let initial: Vec<Bytes> = match from {
            None => store
                .pods
                .iter()
                .filter(|p| in_ns(p))
                .map(|p| {
                    render(&Event {
                        rv: store.rv,
                        kind: "ADDED",
                        object: Arc::new(p.clone()),
                    })
                })
                .collect(),
            Some(rv) if rv < store.oldest => {
                let status = status_object(
                    410,
                    "Expired",
                    &format!("too old resource version: {rv} ({})", store.oldest),
                    json!({}),
                );
                srv.log(format_args!(
                    "{peer} watch from rv {rv}: expired (oldest {})",
                    store.oldest
                ));
                let line = event_line("ERROR", &status);
                return streaming(stream_lines(vec![line]));
            }
            Some(rv) => store
                .history
                .iter()
                .filter(|e| e.rv > rv && in_ns(&e.object))
                .map(&render)
                .collect(),
        };
        (events, initial, store.rv)
    };
    srv.log(format_args!(
        "{peer} watch start ns={} from={from:?} timeout={timeout:?} bookmarks={bookmarks:?} initial={}",
        ns.as_deref().unwrap_or("*"),
        initial.len()
    ));
    let (tx, rx) = mpsc::channel(64);
    let task = WatchTask {
        srv: srv.clone(),
        peer,
        tx,
        events,
        ns,
        progress,
        bookmarks,
        deadline: Instant::now() + timeout,
    };
    tokio::spawn(task.run(initial, render));
    streaming(rx)
}

/// A channel that yields the given lines, then ends.
fn stream_lines(lines: Vec<Bytes>) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(lines.len().max(1));
    for line in lines {
        let _ = tx.try_send(line);
    }
    rx
}

/// A 200 response whose body is every chunk received from `rx` (chunked on h1, DATA frames on
/// h2), ending when the sender is dropped.
fn streaming(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("valid response")
}

struct WatchTask {
    srv: Arc<Server>,
    peer: SocketAddr,
    tx: mpsc::Sender<Bytes>,
    events: broadcast::Receiver<Event>,
    ns: Option<String>,
    /// The newest resourceVersion this watch has seen (sent or filtered out).
    progress: u64,
    bookmarks: Option<Duration>,
    deadline: Instant,
}

impl WatchTask {
    async fn run(mut self, initial: Vec<Bytes>, render: impl Fn(&Event) -> Bytes) {
        let mut sent = 0usize;
        for line in initial {
            if self.tx.send(line).await.is_err() {
                self.srv.log(format_args!("{} watch end: client gone", self.peer));
                return;
            }
            sent += 1;
        }
        let mut bookmark = self
            .bookmarks
            .map(|every| tokio::time::interval_at(Instant::now() + every, every));
        let why = loop {
            let next_bookmark = async {
                match bookmark.as_mut() {
                    Some(ticker) => ticker.tick().await,
                    None => std::future::pending().await,
                }
            };
            let line = tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => break "timeout",
                _ = self.tx.closed() => break "client gone",
                _ = next_bookmark => event_line(
                    "BOOKMARK",
                    &json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": self.progress.to_string()}}),
                ),
                event = self.events.recv() => match event {
                    Ok(event) => {
                        if event.rv <= self.progress {
                            continue;
                        }
                        self.progress = event.rv;
                        if self.ns.as_deref().is_some_and(|ns| event.namespace() != ns) {
                            continue;
                        }
                        render(&event)
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => break "lagged",
                    Err(broadcast::error::RecvError::Closed) => break "closed",
                },
            };
            if self.tx.send(line).await.is_err() {
                break "client gone";
            }
            sent += 1;
        };
        self.srv
            .log(format_args!("{} watch end: {why}, {sent} events sent", self.peer));
    }
}

// ---------------------------------------------------------------------------------------------
// Connections

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
    let service = service_fn(move |req| handle(service_srv.clone(), peer, req));
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
    let tls = tls_acceptor(&cfg)?;
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", cfg.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let (events, _) = broadcast::channel(1024);
    let srv = Arc::new(Server {
        cfg,
        store: Mutex::new(Store::new()),
        events,
        local,
    });
    tokio::spawn(generate_events(srv.clone()));
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening {local}");
        let _ = out.flush();
    }
    srv.log(format_args!(
        "listening on {local}, first resourceVersion {}",
        srv.store.lock().unwrap().oldest
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

fn main() -> ExitCode {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_610_544_000), "2021-01-13T13:20:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("2x").is_err());
        assert_eq!(human_duration(59), "59s");
        assert_eq!(human_duration(185), "3m5s");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(5 * 86_400), "5d");
    }

    #[test]
    fn queries() {
        let q = parse_query(Some("watch=True&labelSelector=a%3Db&x&c=100%&d=%e2%9c%93"));
        assert_eq!(q["c"], "100%");
        assert_eq!(q["d"], "\u{2713}");
        assert!(parse_bool(q.get("watch")));
        assert_eq!(q["labelSelector"], "a=b");
        assert_eq!(q["x"], "");
        assert!(!parse_bool(q.get("missing")));
    }
}
