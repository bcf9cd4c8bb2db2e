//! The fake kube-apiserver (`ll-apiserver`) against real clients: kubectl 1.32 and 1.20,
//! python3-kubernetes 22.6, the kube crate (`ll-kube-watch`) and the stuck HTTP/2 client
//! (`ll-stuck`). Proves the fixture behaves like a real apiserver on the wire (TLS + ALPN h2,
//! chunked watch streams, bookmarks, the server-side watch timeout, a graceful SIGTERM) and that
//! the clients behave as the scenarios need (re-dialing after a restart, or never dialing again).
//!
//! The second half checks what the agent's Kubernetes features need from a cluster, against
//! either API generation (`--generation new|old`): discovery, the `kubernetes` Service with its
//! EndpointSlice and Endpoints (followed live), this node's pods by field selector, the
//! eviction subresource with PodDisruptionBudget refusals (also through `kubectl drain`), and
//! Events through core v1 and events.k8s.io.
//!
//! Needs no root: `cargo test -p lifeline-integration --test fixture -- --test-threads=2`.
use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use lifeline_integration::{
    bin, client_script, tcp_sockets_of, write_kubeconfig, ApiServer, ApiServerOptions, Generation, NetNs,
    OutLine, TempDir, Watched, KUBECTL_1_20, KUBECTL_1_32, SYSTEM_PYTHON,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

const WATCH: &str = "/api/v1/namespaces/default/pods?watch=1&allowWatchBookmarks=true";

// ---------------------------------------------------------------------------------------------
// The fixture

struct Fixture {
    dir: TempDir,
    server: ApiServer,
    args: Vec<String>,
    kubeconfig: PathBuf,
}

impl Fixture {
    /// Starts `ll-apiserver` on a free 127.0.0.1 port with `args`, and writes a kubeconfig.
    fn start(args: &[&str]) -> Fixture {
        let dir = TempDir::new();
        let server = ApiServer::start(
            bin!("ll-apiserver"),
            "127.0.0.1:0".parse().unwrap(),
            &dir.path().join("certs"),
            args,
        );
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server.url(), &server.ca_pem());
        Fixture {
            dir,
            server,
            args: args.iter().map(|s| s.to_string()).collect(),
            kubeconfig,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Starts `ll-apiserver` as [`Fixture::start`] does, with `options`.
    fn with(options: &ApiServerOptions) -> Fixture {
        let dir = TempDir::new();
        let args = options.args(&dir.path().join("input"));
        let server = ApiServer::start(
            bin!("ll-apiserver"),
            "127.0.0.1:0".parse().unwrap(),
            &dir.path().join("certs"),
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let kubeconfig = dir.path().join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server.url(), &server.ca_pem());
        Fixture {
            dir,
            server,
            args,
            kubeconfig,
        }
    }

    /// SIGKILL, then the same server again on the same address and cert dir.
    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.server = ApiServer::start(
            bin!("ll-apiserver"),
            self.addr(),
            &self.dir.path().join("certs"),
            &args,
        );
    }

    /// The first resourceVersion of the running server (every event of it is newer).
    fn first_rv(&self) -> u64 {
        self.server
            .log()
            .iter()
            .find_map(|l| l.split("first resourceVersion ").nth(1)?.trim().parse().ok())
            .expect("the server logs its first resourceVersion")
    }

    fn log_text(&self) -> String {
        self.server.log().join("\n")
    }

    /// A kubectl command for this fixture (own discovery cache; killed after 30 s).
    fn kubectl_cmd(&self, kubectl: &str, args: &[&str]) -> Command {
        assert!(
            Path::new(kubectl).is_file(),
            "{kubectl} is missing (installed by the setup)"
        );
        let mut cmd = Command::new("timeout");
        cmd.arg("30")
            .arg(kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(
                self.dir
                    .path()
                    .join(format!("kube-cache-{}", kubectl.replace('/', "_"))),
            )
            .args(args);
        cmd
    }

    fn kubectl(&self, kubectl: &str, args: &[&str]) -> Output {
        let mut cmd = self.kubectl_cmd(kubectl, args);
        cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `{"type":..., "object":...}` → (type, object).
fn event(line: &str) -> Option<(String, Value)> {
    let v: Value = serde_json::from_str(line).ok()?;
    Some((v["type"].as_str()?.to_string(), v["object"].clone()))
}

fn rv_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no numeric resourceVersion in {object}"))
}

// ---------------------------------------------------------------------------------------------
// A TLS client and a minimal HTTP/1.1 client

fn tls_config(ca: &Path, alpn: &[&str]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).expect("read ca.pem"))
        .expect("add CA");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A verified TLS connection to `addr` (as `127.0.0.1`) offering the `alpn` protocols.
fn tls_connect(addr: SocketAddr, ca: &Path, alpn: &[&str]) -> io::Result<Tls> {
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(tls_config(ca, alpn), name).map_err(io::Error::other)?;
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

fn alpn_of(tls: &Tls) -> Option<String> {
    tls.conn.alpn_protocol().map(text)
}

/// One HTTP/1.1 response over TLS, read as it comes.
struct H1 {
    reader: BufReader<Tls>,
    status: u16,
    headers: Vec<(String, String)>,
    pending: Vec<u8>,
    ended: bool,
}

impl H1 {
    fn get(addr: SocketAddr, ca: &Path, path: &str) -> H1 {
        let mut tls = tls_connect(addr, ca, &["http/1.1"]).expect("TLS connect");
        assert_eq!(alpn_of(&tls).as_deref(), Some("http/1.1"));
        H1::send(&mut tls, addr, path);
        H1::read_head(tls)
    }

    fn send(mut out: impl Write, addr: SocketAddr, path: &str) {
        write!(
            out,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nUser-Agent: fixture-test\r\n\
             Authorization: Bearer lifeline-test-token\r\n\r\n"
        )
        .and_then(|()| out.flush())
        .expect("send request");
    }

    fn read_head(tls: Tls) -> H1 {
        let mut reader = BufReader::new(tls);
        let mut line = String::new();
        reader.read_line(&mut line).expect("status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            reader.read_line(&mut line).expect("header line");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("header");
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        H1 {
            reader,
            status,
            headers,
            pending: Vec::new(),
            ended: false,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next line of a chunked body: `Ok(None)` after the terminating chunk (a clean end).
    fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(nl) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=nl).collect();
                return Ok(Some(text(&line[..nl])));
            }
            if self.ended {
                return Ok(None);
            }
            let mut size = String::new();
            if self.reader.read_line(&mut size)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "EOF inside a chunked body",
                ));
            }
            let size =
                usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {size:?}"))
                })?;
            let mut chunk = vec![0; size + 2];
            self.reader.read_exact(&mut chunk)?;
            if &chunk[size..] != b"\r\n" {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "chunk without CRLF"));
            }
            chunk.truncate(size);
            if size == 0 {
                self.ended = true;
            }
            self.pending.extend_from_slice(&chunk);
        }
    }

    /// A `Content-Length` body, whole.
    fn body(&mut self) -> String {
        let len: usize = self
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .expect("content-length");
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).expect("body");
        text(&body)
    }

    /// Reads events until `pred` accepts one (returned), the stream ends, or `timeout`.
    fn wait_event(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str, &Value) -> bool,
    ) -> Option<(String, Value)> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.next_line() {
                Ok(Some(line)) => {
                    let (kind, object) =
                        event(&line).unwrap_or_else(|| panic!("not a watch event: {line:?}"));
                    if pred(&kind, &object) {
                        return Some((kind, object));
                    }
                }
                Ok(None) => return None,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("watch stream failed: {e}"),
            }
        }
        None
    }

    /// Reads the stream to its end; returns the events and whether it ended cleanly.
    fn drain(&mut self) -> (Vec<(String, Value)>, io::Result<()>) {
        let mut events = Vec::new();
        loop {
            match self.next_line() {
                Ok(Some(line)) => events.push(event(&line).unwrap_or_else(|| panic!("bad event {line:?}"))),
                Ok(None) => return (events, Ok(())),
                Err(e) => return (events, Err(e)),
            }
        }
    }
}

/// GET `path` over HTTP/1.1 and parse the JSON body.
fn get_json(fx: &Fixture, path: &str) -> Value {
    let mut resp = H1::get(fx.addr(), &fx.server.ca_pem(), path);
    assert_eq!(resp.status, 200, "GET {path}");
    let body = resp.body();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

// ---------------------------------------------------------------------------------------------
// (a) discovery and get with both kubectls

#[test]
fn kubectl_1_32_and_1_20_get_pods() {
    // A 1.20 apiserver on the wire, as the scenarios' clients know it.
    let fx = Fixture::start(&["--name", "fixture-a", "--server-version", "v1.20.2"]);
    for kubectl in [KUBECTL_1_32, KUBECTL_1_20] {
        let out = fx.kubectl(kubectl, &["get", "pods"]);
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{kubectl} get pods: {}\n{}",
            out.status,
            text(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        let header: Vec<&str> = lines.first().map_or(vec![], |l| l.split_whitespace().collect());
        assert_eq!(
            header,
            ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
            "{kubectl}:\n{stdout}"
        );
        let names: BTreeSet<&str> = lines[1..]
            .iter()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(
            names,
            BTreeSet::from(["web-0", "web-1", "web-2", "web-3", "web-4"]),
            "{stdout}"
        );
        assert!(
            lines[1..]
                .iter()
                .all(|l| l.contains(" 1/1 ") && l.contains(" Running ")),
            "{stdout}"
        );

        let out = fx.kubectl(kubectl, &["get", "pod", "web-3", "-o", "json"]);
        assert!(
            out.status.success(),
            "{kubectl} get pod -o json: {}",
            text(&out.stderr)
        );
        let pod: Value = serde_json::from_slice(&out.stdout).expect("pod JSON");
        assert_eq!(pod["kind"], "Pod");
        assert_eq!(pod["metadata"]["name"], "web-3");
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert_eq!(pod["status"]["phase"], "Running");

        let out = fx.kubectl(kubectl, &["get", "pod", "nope"]);
        assert!(!out.status.success(), "getting a missing pod must fail");
        assert!(
            text(&out.stderr).contains("pods \"nope\" not found"),
            "{kubectl}: {}",
            text(&out.stderr)
        );
    }
    let out = fx.kubectl(KUBECTL_1_32, &["version", "-o", "json"]);
    let version: Value = serde_json::from_slice(&out.stdout).expect("version JSON");
    assert_eq!(
        version["serverVersion"]["gitVersion"],
        "v1.20.2",
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// (b) watch events and bookmarks, with a real client and over raw HTTP/1.1

#[test]
fn raw_watch_gets_modified_events_and_bookmarks() {
    let fx = Fixture::start(&["--event-interval", "300ms", "--bookmark-interval", "1s"]);
    let cmd = fx.kubectl_cmd(KUBECTL_1_20, &["get", "--raw", WATCH]);
    let watch = Watched::spawn("kubectl 1.20 get --raw (watch)", cmd);
    let is =
        |kind: &'static str| move |l: &OutLine| !l.stderr && event(&l.text).is_some_and(|(k, _)| k == kind);
    watch.wait_line(Duration::from_secs(10), "MODIFIED event", is("MODIFIED"));
    watch.wait_line(Duration::from_secs(10), "BOOKMARK event", is("BOOKMARK"));
    let start = watch
        .wait_line(Duration::from_secs(1), "first event", |l| !l.stderr)
        .at;
    // Both intervals are short: a second MODIFIED and BOOKMARK come within them, relative to
    // the stream's own start (kubectl's start-up time does not count).
    let later = |kind| {
        watch
            .wait_line(Duration::from_secs(5), kind, is(kind))
            .at
            .duration_since(start)
    };
    assert!(
        later("MODIFIED") < Duration::from_millis(1500),
        "first MODIFIED too late"
    );
    assert!(
        later("BOOKMARK") < Duration::from_millis(2500),
        "first BOOKMARK too late"
    );
    thread::sleep(Duration::from_millis(2300));

    let events: Vec<(String, Value)> = watch
        .lines()
        .iter()
        .filter(|l| !l.stderr)
        .filter_map(|l| event(&l.text))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds[..5],
        ["ADDED"; 5],
        "without resourceVersion: ADDED for every pod first"
    );
    let added: BTreeSet<&str> = events[..5]
        .iter()
        .map(|(_, o)| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(added.len(), 5);
    let mut last_rv = 0;
    let mut bookmarks = 0;
    for (kind, object) in &events[5..] {
        match kind.as_str() {
            "MODIFIED" => {
                assert_eq!(object["kind"], "Pod");
                assert!(rv_of(object) > last_rv, "resourceVersions must grow: {events:?}");
                last_rv = rv_of(object);
                assert!(
                    object["metadata"]["labels"]["lifeline.test/counter"].is_string(),
                    "{object}"
                );
            }
            "BOOKMARK" => {
                bookmarks += 1;
                assert_eq!(object["kind"], "Pod");
                assert_eq!(
                    object["metadata"].as_object().map(|m| m.len()),
                    Some(1),
                    "{object}"
                );
                assert!(rv_of(object) >= last_rv, "a bookmark may not go back: {object}");
                last_rv = rv_of(object);
            }
            other => panic!("unexpected {other} event"),
        }
    }
    let modified = kinds.iter().filter(|k| **k == "MODIFIED").count();
    // ~4.5 s of stream: ~14 modifications at 300 ms, ~4 bookmarks at 1 s.
    assert!(
        (8..=20).contains(&modified),
        "{modified} MODIFIED events: {kinds:?}"
    );
    assert!(
        (2..=6).contains(&bookmarks),
        "{bookmarks} BOOKMARK events: {kinds:?}"
    );
    assert!(
        fx.log_text().contains("HTTP/2.0 ua=\"kubectl/v1.20.2"),
        "{}",
        fx.log_text()
    );
}

#[test]
fn watch_semantics_over_http1() {
    let fx = Fixture::start(&[
        "--event-interval",
        "200ms",
        "--bookmark-interval",
        "1s",
        "--server-version",
        "v1.20.2",
    ]);
    let ca = fx.server.ca_pem();

    // Discovery, as the clients read it.
    assert_eq!(get_json(&fx, "/version")["gitVersion"], "v1.20.2");
    assert_eq!(get_json(&fx, "/api")["versions"][0], "v1");
    assert_eq!(get_json(&fx, "/apis")["kind"], "APIGroupList");
    let resources = get_json(&fx, "/api/v1");
    let pods = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods")
        .expect("pods resource");
    assert_eq!(pods["namespaced"], true);
    assert!(pods["verbs"].as_array().unwrap().contains(&"watch".into()));
    for health in ["/healthz", "/readyz"] {
        let mut resp = H1::get(fx.addr(), &ca, health);
        assert_eq!((resp.status, resp.body()), (200, "ok".to_string()), "{health}");
    }
    let mut resp = H1::get(fx.addr(), &ca, "/apis/apps/v1");
    assert_eq!(resp.status, 404);
    assert_eq!(
        serde_json::from_str::<Value>(&resp.body()).unwrap()["reason"],
        "NotFound"
    );

    // Lists: all namespaces, one namespace, pages.
    assert_eq!(
        get_json(&fx, "/api/v1/pods")["items"].as_array().unwrap().len(),
        5
    );
    let list = get_json(&fx, "/api/v1/namespaces/default/pods");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"].as_array().unwrap().len(), 5);
    let page = get_json(&fx, "/api/v1/namespaces/default/pods?limit=2");
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let token = page["metadata"]["continue"].as_str().expect("continue token");
    let page = get_json(
        &fx,
        &format!("/api/v1/namespaces/default/pods?limit=2&continue={token}"),
    );
    let token = page["metadata"]["continue"]
        .as_str()
        .expect("second continue token");
    let page = get_json(
        &fx,
        &format!("/api/v1/namespaces/default/pods?limit=2&continue={token}"),
    );
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert!(page["metadata"].get("continue").is_none());
    assert_eq!(
        get_json(&fx, "/api/v1/namespaces/other/pods")["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );

    // Watch from a resourceVersion: only later events, chunked, no bookmarks unless asked.
    let rv = rv_of(&list);
    thread::sleep(Duration::from_millis(700));
    let mut watch = H1::get(
        fx.addr(),
        &ca,
        &format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={rv}"),
    );
    assert_eq!(watch.status, 200);
    assert_eq!(watch.header("transfer-encoding"), Some("chunked"));
    assert_eq!(watch.header("content-type"), Some("application/json"));
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline {
        let line = watch.next_line().expect("watch line").expect("stream open");
        seen.push(event(&line).expect("event"));
    }
    let rvs: Vec<u64> = seen.iter().map(|(_, o)| rv_of(o)).collect();
    assert!(seen.iter().all(|(k, _)| k == "MODIFIED"), "{seen:?}");
    assert_eq!(
        rvs[0],
        rv + 1,
        "replay starts right after the requested resourceVersion"
    );
    assert!(
        rvs.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap and no duplicate: {rvs:?}"
    );
    assert!(rvs.len() >= 8, "history replay plus live events: {rvs:?}");

    // A resourceVersion older than the server's history: ERROR 410 Expired, then a clean end.
    let mut expired = H1::get(
        fx.addr(),
        &ca,
        "/api/v1/namespaces/default/pods?watch=1&resourceVersion=5",
    );
    assert_eq!(expired.status, 200);
    let (events, end) = expired.drain();
    end.expect("clean end after the ERROR event");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "ERROR");
    assert_eq!(events[0].1["code"], 410);
    assert_eq!(events[0].1["reason"], "Expired");

    // A watch over all namespaces (`/api/v1/pods`) sees the same pods.
    let mut all = H1::get(fx.addr(), &ca, "/api/v1/pods?watch=1&timeoutSeconds=1");
    let (events, end) = all.drain();
    end.expect("clean end");
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[..5], ["ADDED"; 5], "{kinds:?}");
    assert!(kinds[5..].contains(&"MODIFIED"), "{kinds:?}");
    assert!(events
        .iter()
        .all(|(_, o)| o["metadata"]["namespace"] == "default"));

    // python3-kubernetes sends `watch=True`: Go's ParseBool accepts it, so must the fixture.
    let mut py_style = H1::get(
        fx.addr(),
        &ca,
        "/api/v1/namespaces/default/pods?timeoutSeconds=1&watch=True",
    );
    let (events, end) = py_style.drain();
    end.expect("clean end");
    assert!(
        events.len() >= 5 && events[..5].iter().all(|(k, _)| k == "ADDED"),
        "{events:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// (c) HTTP/2 through ALPN

#[test]
fn http2_is_negotiated_through_alpn() {
    // A 1.20 server: the kubectl dispatcher then runs its default client, kubectl 1.32.
    let fx = Fixture::start(&["--server-version", "v1.20.2"]);
    let ca = fx.server.ca_pem();
    let alpn = |offer: &[&str]| alpn_of(&tls_connect(fx.addr(), &ca, offer).expect("TLS connect"));
    assert_eq!(alpn(&["h2", "http/1.1"]).as_deref(), Some("h2"));
    assert_eq!(
        alpn(&["http/1.1", "h2"]).as_deref(),
        Some("h2"),
        "the server's preference wins"
    );
    assert_eq!(alpn(&["http/1.1"]).as_deref(), Some("http/1.1"));
    // No ALPN at all (the kube crate's client): served as HTTP/1.1.
    let mut tls = tls_connect(fx.addr(), &ca, &[]).expect("TLS connect");
    assert_eq!(alpn_of(&tls), None);
    H1::send(&mut tls, fx.addr(), "/version");
    let mut resp = H1::read_head(tls);
    assert_eq!(resp.status, 200);
    assert!(resp.body().contains("v1.20.2"));

    // The real clients: both kubectls speak h2, python3-kubernetes speaks HTTP/1.1.
    for (kubectl, ua) in [(KUBECTL_1_32, "kubectl/v1.32"), (KUBECTL_1_20, "kubectl/v1.20")] {
        let out = fx.kubectl(kubectl, &["get", "pods"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let log = fx.server.log();
        let requests: Vec<&String> = log.iter().filter(|l| l.contains(&format!("ua=\"{ua}"))).collect();
        assert!(!requests.is_empty(), "no request from {ua}:\n{}", log.join("\n"));
        assert!(
            requests.iter().all(|l| l.contains(" HTTP/2.0 ")),
            "{ua} must speak HTTP/2:\n{}",
            log.join("\n")
        );
    }
    assert!(fx.log_text().contains("alpn=h2"));
    let out = Command::new("timeout")
        .args(["30", SYSTEM_PYTHON, "-c"])
        .arg(
            "import sys\nfrom kubernetes import client, config\nconfig.load_kube_config(sys.argv[1])\n\
             print(len(client.CoreV1Api().list_namespaced_pod('default').items))",
        )
        .arg(&fx.kubeconfig)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python3-kubernetes list: {}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), "5");
    let log = fx.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains(" HTTP/1.1 ") && l.contains("OpenAPI-Generator/22.6.0/python")),
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------------
// (d) the server-side watch timeout

#[test]
fn server_side_watch_timeout_ends_watches() {
    let fx = Fixture::start(&["--watch-timeout", "2s", "--event-interval", "300ms"]);
    let ca = fx.server.ca_pem();
    let addr = fx.addr();
    // (query, earliest end, latest end)
    let cases = [
        ("", 1900, 2800),
        ("&timeoutSeconds=1", 900, 1800),
        ("&timeoutSeconds=30", 1900, 2800),
    ];
    let handles: Vec<_> = cases
        .iter()
        .map(|&(query, min, max)| {
            let ca = ca.clone();
            thread::spawn(move || {
                let path = format!("/api/v1/namespaces/default/pods?watch=1{query}");
                let start = Instant::now();
                let mut watch = H1::get(addr, &ca, &path);
                let (events, end) = watch.drain();
                let took = start.elapsed();
                end.unwrap_or_else(|e| panic!("{path}: the stream must end cleanly (last chunk): {e}"));
                assert!(
                    took >= Duration::from_millis(min) && took <= Duration::from_millis(max),
                    "{path}: ended after {took:?}, expected {min}..{max} ms"
                );
                assert!(events.iter().any(|(k, _)| k == "MODIFIED"), "{path}: {events:?}");
            })
        })
        .collect();
    // A real client: `kubectl get pods -w` exits 0, silently, when its watch ends.
    let start = Instant::now();
    let out = fx.kubectl(KUBECTL_1_20, &["get", "pods", "-w"]);
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "kubectl get -w: {} {}",
        out.status,
        text(&out.stderr)
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(8),
        "kubectl get pods -w ran {took:?}"
    );
    assert!(text(&out.stdout).lines().count() > 6, "{}", text(&out.stdout));
    for h in handles {
        h.join().expect("watch thread");
    }
    assert!(fx.log_text().contains("watch end: timeout"), "{}", fx.log_text());
}

// ---------------------------------------------------------------------------------------------
// (e) re-dialing clients recover after the apiserver restarts

/// Waits for an event from the current server: a line whose resourceVersion `rv` extracts is
/// newer than `after`.
fn wait_event_newer(
    client: &Watched,
    after: u64,
    timeout: Duration,
    rv: impl Fn(&str) -> Option<u64>,
) -> OutLine {
    client.wait_line(
        timeout,
        &format!("an event with resourceVersion > {after}"),
        |l| !l.stderr && rv(&l.text).is_some_and(|v| v > after),
    )
}

/// `APPLY web-1 123` / `MODIFIED web-1 123` → 123 (for the named kinds only).
fn rv_field(kinds: &'static [&'static str]) -> impl Fn(&str) -> Option<u64> {
    move |line: &str| {
        let mut f = line.split_whitespace();
        let kind = f.next()?;
        if !kinds.contains(&kind) {
            return None;
        }
        f.nth(1)?.parse().ok()
    }
}

fn raw_modified_rv(line: &str) -> Option<u64> {
    let (kind, object) = event(line)?;
    (kind == "MODIFIED").then(|| rv_of(&object))
}

#[test]
fn redialing_clients_recover_after_restart() {
    let mut fx = Fixture::start(&[
        "--event-interval",
        "300ms",
        "--bookmark-interval",
        "1s",
        "--watch-timeout",
        "20s",
        "--name",
        "fixture-e",
    ]);
    let mut kube = Command::new(bin!("ll-kube-watch"));
    kube.arg("--kubeconfig").arg(&fx.kubeconfig);
    let kube = Watched::spawn("ll-kube-watch", kube);
    let mut py = Command::new(SYSTEM_PYTHON);
    py.arg(client_script("py-watch.py"))
        .arg("--kubeconfig")
        .arg(&fx.kubeconfig)
        .args(["--timeout-seconds", "30"]);
    let py = Watched::spawn("py-watch.py", py);
    let mut sh = Command::new(client_script("kubectl-watch.sh"));
    sh.arg(&fx.kubeconfig);
    let sh = Watched::spawn("kubectl-watch.sh", sh);
    let kube_rv = rv_field(&["APPLY"]);
    let py_rv = rv_field(&["MODIFIED"]);

    let first = fx.first_rv();
    wait_event_newer(&kube, first, Duration::from_secs(20), &kube_rv);
    wait_event_newer(&py, first, Duration::from_secs(20), &py_rv);
    wait_event_newer(&sh, first, Duration::from_secs(20), raw_modified_rv);
    let log = fx.log_text();
    assert!(log.contains("OpenAPI-Generator/22.6.0/python"), "{log}");
    assert!(log.contains("kubectl/v1.20.2"), "{log}");

    let marks = [kube.mark(), py.mark(), sh.mark()];
    let killed = Instant::now();
    fx.kill();
    // Every client notices the broken connection.
    kube.wait_line_after(marks[0], Duration::from_secs(10), "an error line", |l| {
        l.stderr && l.text.starts_with("ERROR")
    });
    py.wait_line_after(marks[1], Duration::from_secs(10), "an error line", |l| {
        l.stderr && l.text.starts_with("ERROR")
    });
    sh.wait_line_after(marks[2], Duration::from_secs(10), "kubectl exiting", |l| {
        l.stderr && l.text.starts_with("kubectl exited")
    });
    thread::sleep(Duration::from_secs(1));
    fx.restart();
    let restarted = Instant::now();
    let second = fx.first_rv();
    assert!(
        second > first + 10,
        "resourceVersions grow across restarts ({first} → {second})"
    );
    // They dial again by themselves and get events from the new server (the kube watcher backs
    // off exponentially and relists after the 410 for its old resourceVersion).
    let recovered = [
        (
            "ll-kube-watch",
            wait_event_newer(&kube, second, Duration::from_secs(40), &kube_rv),
        ),
        (
            "py-watch.py",
            wait_event_newer(&py, second, Duration::from_secs(20), &py_rv),
        ),
        (
            "kubectl-watch.sh",
            wait_event_newer(&sh, second, Duration::from_secs(20), raw_modified_rv),
        ),
    ];
    for (client, line) in recovered {
        eprintln!(
            "{client}: first event from the restarted server {:?} after the restart",
            line.at - restarted
        );
    }
    let log = fx.log_text();
    for ua in ["OpenAPI-Generator/22.6.0/python", "kubectl/v1.20.2"] {
        assert!(
            log.contains(ua),
            "no request from {ua} on the restarted server:\n{log}"
        );
    }
    assert!(
        kube.lines()
            .iter()
            .any(|l| l.text == "INIT_DONE" && l.at > killed),
        "the kube watcher relists after the restart"
    );
}

// ---------------------------------------------------------------------------------------------
// (f) the stuck client never dials again

#[test]
fn stuck_client_never_redials() {
    let mut fx = Fixture::start(&["--event-interval", "300ms", "--name", "fixture-f"]);
    let mut cmd = Command::new(bin!("ll-stuck"));
    cmd.arg("--kubeconfig")
        .arg(&fx.kubeconfig)
        .args(["--retry-interval", "500ms"]);
    let stuck = Watched::spawn("ll-stuck", cmd);
    let first = fx.first_rv();
    // `EVENT MODIFIED web-1 123`
    let event_rv = |line: &str| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() == 4 && f[0] == "EVENT" && f[1] == "MODIFIED")
            .then(|| f[3].parse().ok())
            .flatten()
    };
    wait_event_newer(&stuck, first, Duration::from_secs(10), event_rv);
    let sockets = tcp_sockets_of(stuck.pid());
    let to_server: Vec<_> = sockets.iter().filter(|s| s.remote == fx.addr()).collect();
    assert_eq!(to_server.len(), 1, "one connection to the apiserver: {sockets:?}");
    assert_eq!(to_server[0].state, "ESTABLISHED");
    assert!(fx.log_text().contains("alpn=h2"), "{}", fx.log_text());

    fx.kill();
    stuck.wait_line(Duration::from_secs(5), "LOST", |l| l.text == "LOST");
    fx.restart();
    let restarted = Instant::now();
    let mark = stuck.mark();
    stuck.wait_line_after(mark, Duration::from_secs(3), "a retry line", |l| {
        l.stderr && l.text.contains("http2: no cached connection was available")
    });
    // For 5 s: alive, no TCP socket at all, and the restarted server sees no connection.
    let mut stuck = stuck;
    while restarted.elapsed() < Duration::from_secs(5) {
        assert_eq!(stuck.try_status(), None, "ll-stuck must stay alive");
        let sockets = tcp_sockets_of(stuck.pid());
        assert!(sockets.is_empty(), "ll-stuck opened a socket: {sockets:?}");
        thread::sleep(Duration::from_millis(20));
    }
    let log = fx.log_text();
    assert!(
        !log.contains("accepted TCP connection"),
        "the restarted server saw a connection:\n{log}"
    );
    let retries = stuck
        .lines()
        .iter()
        .skip(mark)
        .filter(|l| l.text.contains("http2: no cached connection was available"))
        .count();
    assert!(
        retries >= 8,
        "it keeps logging the error every 500 ms ({retries} lines)"
    );
    assert_eq!(
        stuck
            .lines()
            .iter()
            .filter(|l| l.text.starts_with("DIALED"))
            .count(),
        1
    );
    // The restarted server was there to be dialed all along.
    tls_connect(fx.addr(), &fx.server.ca_pem(), &["h2"]).expect("the restarted server accepts connections");
}

// ---------------------------------------------------------------------------------------------
// (g) graceful SIGTERM

/// Messages from [`H2Probe`]'s thread.
#[derive(Debug)]
enum H2Msg {
    Line(String),
    StreamEnd(Result<(), String>),
    NewRequest(Result<u16, String>),
}

/// One HTTP/2 connection (hyper client) in its own thread: a watch on one stream, and on
/// request, a new request (`GET /version`) on another stream of the same connection.
struct H2Probe {
    msgs: mpsc::Receiver<H2Msg>,
    probe: tokio::sync::mpsc::UnboundedSender<()>,
}

impl H2Probe {
    fn start(addr: SocketAddr, ca: &Path, path: &str) -> H2Probe {
        let (tx, msgs) = mpsc::channel();
        let (probe, mut probes) = tokio::sync::mpsc::unbounded_channel::<()>();
        let config = tls_config(ca, &["h2"]);
        let uri = format!("https://{addr}{path}");
        thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                use http_body_util::BodyExt;
                let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let name = ServerName::try_from("127.0.0.1").unwrap();
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .expect("TLS");
                assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
                let io = hyper_util::rt::TokioIo::new(tls);
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await
                        .expect("h2 handshake");
                tokio::spawn(conn);
                let req = http::Request::get(&uri)
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap();
                let resp = sender.send_request(req).await.expect("watch request");
                assert_eq!(resp.status(), 200);
                let mut body = resp.into_body();
                let watch_tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = String::new();
                    loop {
                        match body.frame().await {
                            None => break watch_tx.send(H2Msg::StreamEnd(Ok(()))),
                            Some(Err(e)) => break watch_tx.send(H2Msg::StreamEnd(Err(e.to_string()))),
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    buf.push_str(&text(&data));
                                    while let Some(nl) = buf.find('\n') {
                                        let line: String = buf.drain(..=nl).collect();
                                        let _ = watch_tx.send(H2Msg::Line(line.trim_end().to_string()));
                                    }
                                }
                            }
                        }
                    }
                });
                while probes.recv().await.is_some() {
                    let req = http::Request::get(format!("https://{addr}/version"))
                        .body(http_body_util::Empty::<bytes::Bytes>::new())
                        .unwrap();
                    let result = tokio::time::timeout(Duration::from_secs(2), async {
                        sender.ready().await?;
                        sender.send_request(req).await
                    })
                    .await;
                    let msg = match result {
                        Ok(Ok(resp)) => Ok(resp.status().as_u16()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("timed out".into()),
                    };
                    let _ = tx.send(H2Msg::NewRequest(msg));
                }
            });
        });
        H2Probe { msgs, probe }
    }

    /// The next message, within `timeout`.
    fn next(&self, timeout: Duration) -> Option<H2Msg> {
        self.msgs.recv_timeout(timeout).ok()
    }

    /// Asks for a new request on the connection; returns its outcome (skipping watch lines,
    /// which are returned too).
    fn new_request(&self) -> (Result<u16, String>, Vec<H2Msg>) {
        self.probe.send(()).expect("probe thread alive");
        let mut other = Vec::new();
        loop {
            match self.next(Duration::from_secs(5)).expect("probe answer") {
                H2Msg::NewRequest(r) => return (r, other),
                m => other.push(m),
            }
        }
    }
}

#[test]
fn sigterm_refuses_new_connections_and_drains_watches() {
    let mut fx = Fixture::start(&[
        "--event-interval",
        "300ms",
        "--watch-timeout",
        "4s",
        "--name",
        "fixture-g",
    ]);
    let ca = fx.server.ca_pem();
    let h2 = H2Probe::start(fx.addr(), &ca, "/api/v1/namespaces/default/pods?watch=1");
    let mut h1 = H1::get(fx.addr(), &ca, "/api/v1/namespaces/default/pods?watch=1");
    let h1_started = Instant::now();
    // Both streams are live, and the h2 connection takes new requests.
    h1.wait_event(Duration::from_secs(3), |k, _| k == "MODIFIED")
        .expect("h1 MODIFIED");
    let (before, _) = h2.new_request();
    assert_eq!(
        before,
        Ok(200),
        "a new stream on the h2 connection before SIGTERM"
    );

    fx.server.terminate();
    let term = Instant::now();
    // The listener closes at once.
    let refused_at = loop {
        match TcpStream::connect_timeout(&fx.addr(), Duration::from_millis(200)) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break term.elapsed(),
            _ if term.elapsed() > Duration::from_secs(2) => panic!("still accepting 2 s after SIGTERM"),
            _ => thread::sleep(Duration::from_millis(10)),
        }
    };
    assert!(
        refused_at < Duration::from_millis(500),
        "refused only after {refused_at:?}"
    );

    // The open watches go on: the h1 one gets events after SIGTERM...
    h1.wait_event(Duration::from_secs(2), |k, _| k == "MODIFIED")
        .expect("events after SIGTERM");
    // ... and the h2 connection got GOAWAY: no new stream, while its watch stream goes on.
    thread::sleep(Duration::from_millis(300));
    let (after, seen) = h2.new_request();
    eprintln!("a new h2 stream after SIGTERM: {after:?}");
    assert!(
        after.is_err(),
        "a new h2 stream after SIGTERM must be refused (GOAWAY), got {after:?}"
    );
    assert!(
        !seen.iter().any(|m| matches!(m, H2Msg::StreamEnd(_))),
        "the h2 watch ended early: {seen:?}"
    );
    let is_modified =
        |m: &H2Msg| matches!(m, H2Msg::Line(l) if event(l).is_some_and(|(k, _)| k == "MODIFIED"));
    let mut h2_events_after_term = seen.iter().filter(|m| is_modified(m)).count();
    assert_eq!(
        fx.server.proc.try_status(),
        None,
        "still running while watches are open"
    );

    // The watches end at their timeout (4 s after they started), cleanly; then the server exits 0.
    let (_, end) = h1.drain();
    end.expect("the h1 watch ends with the last chunk");
    let h1_took = h1_started.elapsed();
    assert!(
        h1_took > Duration::from_millis(3800) && h1_took < Duration::from_millis(5000),
        "h1 watch lasted {h1_took:?}"
    );
    let h2_end = loop {
        match h2.next(Duration::from_secs(3)).expect("h2 stream end") {
            H2Msg::StreamEnd(r) => break r,
            m @ H2Msg::Line(_) => h2_events_after_term += usize::from(is_modified(&m)),
            other => panic!("unexpected {other:?}"),
        }
    };
    h2_end.expect("the h2 watch ends with END_STREAM");
    assert!(h2_events_after_term > 3, "the h2 watch got events after SIGTERM");
    let status = fx
        .server
        .proc
        .wait_exit(Duration::from_secs(3))
        .expect("exit after the watches ended");
    let exited = term.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        exited > Duration::from_millis(2500),
        "exited {exited:?} after SIGTERM, before its watches ended"
    );
    assert!(exited < Duration::from_secs(6), "exited {exited:?} after SIGTERM");
    let log = fx.log_text();
    assert!(log.contains("SIGTERM: listener closed"), "{log}");
    assert!(log.contains("every connection closed"), "{log}");
}

// ---------------------------------------------------------------------------------------------
// (h) the cluster objects the agent's Kubernetes features use, in both API generations

const GENERATIONS: [Generation; 2] = [Generation::New, Generation::Old];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A pod for `--pods`.
fn test_pod(ns: &str, name: &str, node: &str, app: &str, n: u32) -> Value {
    json!({
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": format!("00000000-0000-4000-8000-{n:012x}"),
            "labels": {"app": app},
            "annotations": {"lifeline.test/owner": "fixture"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]},
        "status": {
            "phase": "Running",
            "podIP": format!("10.244.1.{n}"),
            "containerStatuses": [{
                "name": "main",
                "ready": true,
                "restartCount": 0,
                "containerID": format!("containerd://{:064x}", 0x00c0_ffee_0000_u64 + u64::from(n)),
            }],
        },
    })
}

/// A PodDisruptionBudget for `--pdbs` selecting `app=APP`.
fn test_pdb(name: &str, app: &str, allowed: i64, healthy: i64) -> Value {
    json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": 1,
            "expectedPods": healthy,
        },
    })
}

/// The cluster of these tests: pods on node-a and node-b in three namespaces, one pod that a
/// PDB allowing nothing guards, two pods a PDB allowing one disruption guards.
fn cluster(generation: Generation) -> ApiServerOptions {
    ApiServerOptions {
        generation,
        pods: vec![
            test_pod("kube-system", "lifeline-agent-a", "node-a", "lifeline", 1),
            test_pod("team-x", "client-1", "node-a", "client", 2),
            test_pod("team-x", "client-2", "node-b", "client", 3),
            test_pod("default", "free-1", "node-a", "free", 4),
            test_pod("default", "guarded-1", "node-a", "guarded", 5),
            test_pod("default", "budget-1", "node-b", "budget", 6),
            test_pod("default", "budget-2", "node-b", "budget", 7),
        ],
        pdbs: vec![
            test_pdb("guarded-pdb", "guarded", 0, 1),
            test_pdb("budget-pdb", "budget", 1, 2),
        ],
        endpoint_ips: vec![ip("127.0.0.1"), ip("127.0.0.2")],
        ..Default::default()
    }
}

/// Runs kubectl, which must succeed; returns its stdout.
fn kubectl_ok(fx: &Fixture, kubectl: &str, args: &[&str]) -> String {
    let out = fx.kubectl(kubectl, args);
    assert!(
        out.status.success(),
        "{kubectl} {args:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The rows of kubectl's table output (header left out), split at whitespace.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// Every `(group/)version` a server's discovery lists.
fn served_group_versions(fx: &Fixture) -> BTreeSet<String> {
    let mut gvs = BTreeSet::from(["v1".to_string()]);
    for group in get_json(fx, "/apis")["groups"].as_array().unwrap() {
        for v in group["versions"].as_array().unwrap() {
            gvs.insert(v["groupVersion"].as_str().unwrap().to_string());
        }
    }
    gvs
}

#[test]
fn discovery_matches_the_generation() {
    for generation in GENERATIONS {
        let fx = Fixture::with(&ApiServerOptions::new(generation));
        let v = generation.group_version();
        let other = if v == "v1" { "v1beta1" } else { "v1" };
        assert_eq!(get_json(&fx, "/version")["gitVersion"], generation.git_version());
        let expected: BTreeSet<String> = ["v1".to_string()]
            .into_iter()
            .chain(["discovery.k8s.io", "events.k8s.io", "policy"].map(|g| format!("{g}/{v}")))
            .collect();
        assert_eq!(served_group_versions(&fx), expected, "{generation:?}");
        for (group, kinds) in [
            ("discovery.k8s.io", vec!["endpointslices"]),
            ("policy", vec!["poddisruptionbudgets"]),
            ("events.k8s.io", vec!["events"]),
        ] {
            let g = get_json(&fx, &format!("/apis/{group}"));
            assert_eq!(g["kind"], "APIGroup");
            assert_eq!(g["preferredVersion"]["groupVersion"], format!("{group}/{v}"));
            let list = get_json(&fx, &format!("/apis/{group}/{v}"));
            assert_eq!(list["groupVersion"], format!("{group}/{v}"));
            let names: Vec<&str> = list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, kinds);
            // The other version of the group is not served: a 404 as from a real server.
            let mut resp = H1::get(fx.addr(), &fx.server.ca_pem(), &format!("/apis/{group}/{other}"));
            assert_eq!(resp.status, 404, "/apis/{group}/{other} on {generation:?}");
            assert_eq!(
                serde_json::from_str::<Value>(&resp.body()).unwrap()["reason"],
                "NotFound"
            );
            let path = format!("/apis/{group}/{other}/namespaces/default/{}", kinds[0]);
            let (code, _) = fx.server.request("GET", &path, None);
            assert_eq!(code, 404, "{path} on {generation:?}");
        }
        let core = get_json(&fx, "/api/v1");
        let resources = core["resources"].as_array().unwrap();
        let names: BTreeSet<&str> = resources.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            BTreeSet::from([
                "endpoints",
                "events",
                "namespaces",
                "nodes",
                "pods",
                "pods/eviction",
                "services"
            ])
        );
        let eviction = resources.iter().find(|r| r["name"] == "pods/eviction").unwrap();
        assert_eq!(
            (eviction["group"].as_str(), eviction["version"].as_str()),
            (Some("policy"), Some(v))
        );

        // Both kubectls discover the same, and list it in api-resources.
        for kubectl in [KUBECTL_1_32, KUBECTL_1_20] {
            let listed: BTreeSet<String> = kubectl_ok(&fx, kubectl, &["api-versions"])
                .lines()
                .map(String::from)
                .collect();
            assert_eq!(listed, expected, "{kubectl} api-versions on {generation:?}");
            let resources = kubectl_ok(&fx, kubectl, &["api-resources"]);
            for r in ["endpointslices", "poddisruptionbudgets"] {
                let row = resources
                    .lines()
                    .find(|l| l.starts_with(r))
                    .unwrap_or_else(|| panic!("{kubectl} api-resources lacks {r}:\n{resources}"));
                assert!(
                    row.contains(&format!("/{v} ")) || !row.contains(&format!("/{other} ")),
                    "{kubectl}: {row}"
                );
            }
        }
    }
}

#[test]
fn kubectl_reads_the_cluster_in_both_generations() {
    for generation in GENERATIONS {
        let fx = Fixture::with(&cluster(generation));
        let v = generation.group_version();
        // One core Event to list back (a cluster-scoped object: namespace default).
        let (code, body) = fx.server.request(
            "POST",
            "/api/v1/namespaces/default/events",
            Some(&json!({
                "metadata": {"generateName": "node-a."},
                "involvedObject": {"kind": "Node", "name": "node-a", "apiVersion": "v1"},
                "reason": "LifelineStarted",
                "message": "lifeline watches node-a",
                "type": "Normal",
                "source": {"component": "lifeline", "host": "node-a"},
                "firstTimestamp": "2024-05-01T12:00:00Z",
                "lastTimestamp": "2024-05-01T12:00:00Z",
                "count": 1,
            })),
        );
        assert_eq!(code, 201, "{body}");
        for kubectl in [KUBECTL_1_32, KUBECTL_1_20] {
            let what = format!("{kubectl} on {generation:?}");
            let slices = rows(&kubectl_ok(&fx, kubectl, &["get", "endpointslices"]));
            assert_eq!(
                slices,
                [["kubernetes", "IPv4", "6443", "127.0.0.1,127.0.0.2"].map(String::from)]
                    .map(|r| r.into_iter().chain([slices[0][4].clone()]).collect::<Vec<_>>()),
                "{what}"
            );
            let slice: Value = serde_json::from_str(&kubectl_ok(
                &fx,
                kubectl,
                &["get", "endpointslices", "kubernetes", "-o", "json"],
            ))
            .unwrap();
            assert_eq!(slice["apiVersion"], format!("discovery.k8s.io/{v}"), "{what}");
            assert_eq!(
                slice["metadata"]["labels"]["kubernetes.io/service-name"],
                "kubernetes"
            );
            assert_eq!(slice["endpoints"][1]["addresses"][0], "127.0.0.2");

            let endpoints = rows(&kubectl_ok(&fx, kubectl, &["get", "endpoints", "kubernetes"]));
            assert_eq!(
                endpoints[0][..2],
                ["kubernetes", "127.0.0.1:6443,127.0.0.2:6443"],
                "{what}"
            );
            let svc = rows(&kubectl_ok(&fx, kubectl, &["get", "svc", "kubernetes"]));
            assert_eq!(
                svc[0][..5],
                ["kubernetes", "ClusterIP", "10.96.0.1", "<none>", "443/TCP"],
                "{what}"
            );
            let svc: Value = serde_json::from_str(&kubectl_ok(
                &fx,
                kubectl,
                &["get", "svc", "kubernetes", "-o", "json"],
            ))
            .unwrap();
            assert_eq!(svc["spec"]["ports"][0]["targetPort"], 6443);

            // This node's pods, over every namespace.
            let on_a = rows(&kubectl_ok(
                &fx,
                kubectl,
                &["get", "pods", "-A", "--field-selector", "spec.nodeName=node-a"],
            ));
            let on_a: BTreeSet<(String, String)> =
                on_a.iter().map(|r| (r[0].clone(), r[1].clone())).collect();
            let expected: BTreeSet<(String, String)> = [
                ("default", "free-1"),
                ("default", "guarded-1"),
                ("kube-system", "lifeline-agent-a"),
                ("team-x", "client-1"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .into();
            assert_eq!(on_a, expected, "{what}");
            let clients = rows(&kubectl_ok(
                &fx,
                kubectl,
                &["get", "pods", "-n", "team-x", "-l", "app=client", "-o", "wide"],
            ));
            assert_eq!(clients.len(), 2, "{what}: {clients:?}");
            assert!(clients
                .iter()
                .any(|r| r[0] == "client-2" && r.contains(&"node-b".to_string())));
            let pod: Value = serde_json::from_str(&kubectl_ok(
                &fx,
                kubectl,
                &[
                    "get",
                    "pod",
                    "-n",
                    "kube-system",
                    "lifeline-agent-a",
                    "-o",
                    "json",
                ],
            ))
            .unwrap();
            assert_eq!(
                pod["status"]["containerStatuses"][0]["containerID"],
                format!("containerd://{:064x}", 0x00c0_ffee_0000_u64 + 1)
            );
            assert_eq!(pod["metadata"]["uid"], "00000000-0000-4000-8000-000000000001");

            let events = kubectl_ok(&fx, kubectl, &["get", "events"]);
            assert!(
                events.contains("LifelineStarted") && events.contains("node/node-a"),
                "{what}:\n{events}"
            );
            let pdbs = rows(&kubectl_ok(&fx, kubectl, &["get", "pdb"]));
            let guarded = pdbs
                .iter()
                .find(|r| r[0] == "guarded-pdb")
                .expect("guarded-pdb row");
            assert_eq!(guarded[1..4], ["1", "N/A", "0"], "{what}");
            let node = rows(&kubectl_ok(&fx, kubectl, &["get", "node", "node-a"]));
            assert_eq!(node[0][..2], ["node-a", "Ready"], "{what}");
        }
        // A field label the server does not support is a 400, as on a real one.
        let (code, body) = fx
            .server
            .request("GET", "/api/v1/pods?fieldSelector=spec.nodeNam%3Dx", None);
        assert_eq!(code, 400, "{body}");
        assert_eq!(body["message"], "field label not supported: spec.nodeNam");
    }
}

#[test]
fn eviction_honours_pdbs_and_the_served_policy_version() {
    for generation in GENERATIONS {
        let fx = Fixture::with(&cluster(generation));
        let s = &fx.server;
        let served = format!("policy/{}", generation.group_version());
        let what = format!("{generation:?}");
        let mut watch = H1::get(
            fx.addr(),
            &s.ca_pem(),
            "/api/v1/namespaces/default/pods?watch=1&labelSelector=app%20in%20(free%2Cbudget)",
        );

        // Allowed: 201 with a Success Status, and the pod is gone (a DELETED watch event).
        let (code, status) = s.evict("default", "free-1", &served);
        assert_eq!(code, 201, "{what}: {status}");
        assert_eq!(
            (status["kind"].as_str(), status["status"].as_str()),
            (Some("Status"), Some("Success"))
        );
        let (code, gone) = s.request("GET", "/api/v1/namespaces/default/pods/free-1", None);
        assert_eq!(code, 404, "{gone}");
        assert_eq!(gone["message"], "pods \"free-1\" not found");
        let deleted = watch.wait_event(Duration::from_secs(5), |k, o| {
            k == "DELETED" && o["metadata"]["name"] == "free-1"
        });
        assert!(deleted.is_some(), "{what}: no DELETED event for the evicted pod");

        // A PDB that allows nothing: 429 TooManyRequests with a DisruptionBudget cause.
        let (code, status) = s.evict("default", "guarded-1", &served);
        assert_eq!(code, 429, "{what}: {status}");
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(
            status["message"],
            "Cannot evict pod as it would violate the pod's disruption budget."
        );
        assert_eq!(status["details"]["causes"][0]["reason"], "DisruptionBudget");
        assert_eq!(
            status["details"]["causes"][0]["message"],
            "The disruption budget guarded-pdb needs 1 healthy pods and has 1 currently"
        );
        assert_eq!(
            s.get_json("/api/v1/namespaces/default/pods/guarded-1")["metadata"]["name"],
            "guarded-1"
        );

        // A PDB that allows one: the first goes, the second is refused.
        assert_eq!(s.evict("default", "budget-1", &served).0, 201, "{what}");
        assert_eq!(s.evict("default", "budget-2", &served).0, 429, "{what}");
        let pdb = s.get_json(&format!(
            "/apis/{served}/namespaces/default/poddisruptionbudgets/budget-pdb"
        ));
        assert_eq!(pdb["apiVersion"], served.as_str());
        assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
        assert!(pdb["status"]["disruptedPods"]["budget-1"].is_string(), "{pdb}");

        // A missing pod, a name that does not match the URL.
        let (code, status) = s.evict("default", "nope", &served);
        assert_eq!(
            (code, status["reason"].as_str()),
            (404, Some("NotFound")),
            "{status}"
        );
        let (code, status) = s.request(
            "POST",
            "/api/v1/namespaces/default/pods/guarded-1/eviction",
            Some(&json!({"apiVersion": served, "kind": "Eviction", "metadata": {"name": "other"}})),
        );
        assert_eq!(code, 400, "{status}");
        assert_eq!(
            status["message"],
            "name in URL does not match name in Eviction object"
        );

        // The other group-version: a 1.18 server has never heard of policy/v1 (400); a current
        // one still accepts policy/v1beta1 on this subresource, as the real one does.
        let team = "/api/v1/namespaces/team-x/pods";
        let (code, status) = match generation {
            Generation::Old => s.evict("team-x", "client-1", "policy/v1"),
            Generation::New => s.evict("team-x", "client-1", "policy/v1beta1"),
        };
        match generation {
            Generation::Old => {
                assert_eq!(
                    (code, status["reason"].as_str()),
                    (400, Some("BadRequest")),
                    "{status}"
                );
                assert!(
                    status["message"]
                        .as_str()
                        .unwrap()
                        .contains("no kind \"Eviction\" is registered for version \"policy/v1\""),
                    "{status}"
                );
                s.get_json(&format!("{team}/client-1"));
            }
            Generation::New => assert_eq!(code, 201, "{status}"),
        }

        // DELETE works too, and is recorded apart from evictions.
        let (code, pod) = s.request("DELETE", &format!("{team}/client-2"), None);
        assert_eq!(
            (code, pod["metadata"]["name"].as_str()),
            (200, Some("client-2")),
            "{pod}"
        );
        assert_eq!(s.request("DELETE", &format!("{team}/client-2"), None).0, 404);
        let deletions: Vec<(String, u16)> = s.deletions().into_iter().map(|d| (d.outcome, d.code)).collect();
        assert_eq!(
            deletions,
            [("deleted".to_string(), 200), ("not-found".to_string(), 404)]
        );

        let evictions = s.evictions();
        let summary: Vec<(&str, &str, u16)> = evictions
            .iter()
            .map(|e| (e.name.as_str(), e.outcome.as_str(), e.code))
            .collect();
        let other = match generation {
            Generation::Old => ("client-1", "rejected", 400),
            Generation::New => ("client-1", "evicted", 201),
        };
        assert_eq!(
            summary,
            [
                ("free-1", "evicted", 201),
                ("guarded-1", "blocked", 429),
                ("budget-1", "evicted", 201),
                ("budget-2", "blocked", 429),
                ("nope", "not-found", 404),
                ("guarded-1", "rejected", 400),
                other,
            ],
            "{what}"
        );
        assert_eq!(evictions[1].pdb.as_deref(), Some("guarded-pdb"));
        assert!(evictions[..5].iter().all(|e| e.api_version == served));
    }

    // --strict-eviction: a current server that takes only policy/v1.
    let fx = Fixture::with(&ApiServerOptions {
        strict_eviction: true,
        ..cluster(Generation::New)
    });
    let (code, status) = fx.server.evict("default", "free-1", "policy/v1beta1");
    assert_eq!(code, 400, "{status}");
    assert_eq!(
        status["message"],
        "the API version in the data (policy/v1beta1) does not match the expected API version (policy/v1)"
    );
    assert_eq!(fx.server.evict("default", "free-1", "policy/v1").0, 201);
}

#[test]
fn kubectl_drain_evicts_through_discovery() {
    // kubectl cordons the node (PATCH), lists its pods by field selector, evicts each with the
    // group-version the pods/eviction discovery entry names, and waits for them to be gone.
    for (generation, kubectl) in [
        (Generation::New, KUBECTL_1_32),
        (Generation::New, KUBECTL_1_20),
        (Generation::Old, KUBECTL_1_32),
        (Generation::Old, KUBECTL_1_20),
    ] {
        let fx = Fixture::with(&ApiServerOptions {
            pods: vec![
                test_pod("default", "drain-1", "node-d", "drain", 11),
                test_pod("team-x", "drain-2", "node-d", "drain", 12),
                test_pod("default", "stays", "node-e", "drain", 13),
            ],
            ..ApiServerOptions::new(generation)
        });
        let what = format!("{kubectl} on {generation:?}");
        let out = kubectl_ok(
            &fx,
            kubectl,
            &[
                "drain",
                "node-d",
                "--force",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=20s",
            ],
        );
        // kubectl 1.20 ends with "node/node-d evicted", later ones with "drained".
        assert!(
            out.contains("evicting pod default/drain-1")
                && (out.contains("node/node-d drained") || out.contains("node/node-d evicted")),
            "{what}:\n{out}"
        );
        // kubectl 1.20 only asks discovery whether evictions are served, then always sends
        // policy/v1beta1 (which a current apiserver still accepts); later ones send the
        // group-version discovery names.
        let sent = match kubectl {
            KUBECTL_1_20 => "policy/v1beta1".to_string(),
            _ => format!("policy/{}", generation.group_version()),
        };
        let mut evicted: Vec<(String, String, String, String)> = fx
            .server
            .evictions()
            .into_iter()
            .map(|e| (e.namespace, e.name, e.api_version, e.outcome))
            .collect();
        evicted.sort();
        assert_eq!(
            evicted,
            [("default", "drain-1"), ("team-x", "drain-2")].map(|(ns, n)| (
                ns.to_string(),
                n.to_string(),
                sent.clone(),
                "evicted".to_string()
            )),
            "{what}"
        );
        assert_eq!(
            fx.server.get_json("/api/v1/nodes/node-d")["spec"]["unschedulable"],
            true
        );
        let left = fx
            .server
            .get_json("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-d");
        assert_eq!(left["items"].as_array().unwrap().len(), 0, "{what}");
        fx.server.get_json("/api/v1/namespaces/default/pods/stays");
    }
}

#[test]
fn endpointslice_watch_follows_endpoint_changes() {
    for generation in GENERATIONS {
        let fx = Fixture::with(&ApiServerOptions {
            endpoint_ips: vec![ip("127.0.0.1")],
            ..ApiServerOptions::new(generation)
        });
        let v = generation.group_version();
        let ca = fx.server.ca_pem();
        let slices = format!(
            "/apis/discovery.k8s.io/{v}/namespaces/default/endpointslices?watch=1\
             &labelSelector=kubernetes.io%2Fservice-name%3Dkubernetes"
        );
        let mut slice_watch = H1::get(fx.addr(), &ca, &slices);
        let mut ep_watch = H1::get(
            fx.addr(),
            &ca,
            "/api/v1/namespaces/default/endpoints?watch=1&fieldSelector=metadata.name%3Dkubernetes",
        );
        let addresses = |o: &Value| -> Vec<String> {
            o["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| e["addresses"].as_array().unwrap().iter())
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        };
        let (_, first) = slice_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "ADDED")
            .expect("ADDED for the slice");
        assert_eq!(first["apiVersion"], format!("discovery.k8s.io/{v}"));
        assert_eq!(addresses(&first), ["127.0.0.1"]);
        ep_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "ADDED")
            .expect("ADDED for the endpoints");

        // A real client on a current server: the kube crate's watcher on discovery.k8s.io/v1.
        let kube = (generation == Generation::New).then(|| kube_slice_watcher(&fx.kubeconfig));
        if let Some(kube) = &kube {
            let first = kube
                .recv_timeout(Duration::from_secs(10))
                .expect("kube watcher: first slice");
            assert_eq!(first, ["127.0.0.1"]);
        }

        fx.server.set_endpoint_ips(&[ip("127.0.0.3"), ip("127.0.0.4")]);
        let (_, changed) = slice_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "MODIFIED")
            .expect("MODIFIED for the slice");
        assert_eq!(addresses(&changed), ["127.0.0.3", "127.0.0.4"]);
        assert_eq!(changed["apiVersion"], format!("discovery.k8s.io/{v}"));
        assert!(rv_of(&changed) > rv_of(&first));
        assert_eq!(changed["metadata"]["uid"], first["metadata"]["uid"]);
        let (_, ep) = ep_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "MODIFIED")
            .expect("MODIFIED for the endpoints");
        assert_eq!(ep["subsets"][0]["addresses"][1]["ip"], "127.0.0.4");
        if let Some(kube) = &kube {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let seen = kube.recv_timeout(left).expect("kube watcher follows the change");
                if seen == ["127.0.0.3", "127.0.0.4"] {
                    break;
                }
            }
        }

        // A watch that resumes from the first version replays the change; the list shows it.
        let mut resumed = H1::get(
            fx.addr(),
            &ca,
            &format!(
                "/apis/discovery.k8s.io/{v}/namespaces/default/endpointslices?watch=1&resourceVersion={}",
                rv_of(&first)
            ),
        );
        let (kind, replayed) = resumed
            .wait_event(Duration::from_secs(5), |_, _| true)
            .expect("replayed event");
        assert_eq!(
            (kind.as_str(), addresses(&replayed)),
            ("MODIFIED", addresses(&changed))
        );
        let list = get_json(&fx, &format!("/apis/discovery.k8s.io/{v}/endpointslices"));
        assert_eq!(list["kind"], "EndpointSliceList");
        assert_eq!(addresses(&list["items"][0]), ["127.0.0.3", "127.0.0.4"]);

        // Emptied: the Endpoints lose their subsets, the slice its endpoints.
        fx.server.set_endpoint_ips(&[]);
        let (_, empty) = slice_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "MODIFIED")
            .expect("MODIFIED (empty)");
        assert!(addresses(&empty).is_empty(), "{empty}");
        let (code, _) = fx
            .server
            .request("POST", "/fixture/endpoint-ips", Some(&json!(["10.0.0.1", "::1"])));
        assert_eq!(code, 400, "mixed families are refused");
    }
}

/// The kube crate's watcher on the `kubernetes` EndpointSlice (discovery.k8s.io/v1), in a thread:
/// the addresses of every version of the slice it sees.
fn kube_slice_watcher(kubeconfig: &Path) -> mpsc::Receiver<Vec<String>> {
    use futures::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use kube::runtime::{watcher, WatchStreamExt};
    use kube::{Api, Client, Config};

    let (tx, rx) = mpsc::channel();
    let kubeconfig = kubeconfig.to_path_buf();
    thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let kubeconfig = Kubeconfig::read_from(&kubeconfig).unwrap();
            let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
            let slices: Api<EndpointSlice> = Api::namespaced(Client::try_from(config).unwrap(), "default");
            let config = watcher::Config::default().labels("kubernetes.io/service-name=kubernetes");
            let mut stream = watcher::watcher(slices, config).applied_objects().boxed();
            // Ends when the test drops the receiver (the next send fails) or the server goes.
            while let Some(Ok(slice)) = tokio::time::timeout(Duration::from_secs(30), stream.next())
                .await
                .ok()
                .flatten()
            {
                let addresses = slice.endpoints.iter().flat_map(|e| e.addresses.clone()).collect();
                if tx.send(addresses).is_err() {
                    break;
                }
            }
        });
    });
    rx
}

/// An events.k8s.io Event (v1 and v1beta1 share this shape).
fn new_style_event(api_version: &str, reason: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "Event",
        "metadata": {"generateName": "web-0.", "namespace": "default"},
        "eventTime": "2024-05-01T12:00:00.000000Z",
        "reportingController": "lifeline.io/agent",
        "reportingInstance": "lifeline-node-a",
        "action": "Watching",
        "reason": reason,
        "type": "Warning",
        "note": "the apiserver connection of web-0 is stuck",
        "regarding": {"kind": "Pod", "namespace": "default", "name": "web-0", "apiVersion": "v1"},
    })
}

#[test]
fn events_are_stored_and_listed_back() {
    for generation in GENERATIONS {
        let fx = Fixture::with(&ApiServerOptions::new(generation));
        let s = &fx.server;
        let v = generation.group_version();
        let gv = format!("events.k8s.io/{v}");
        let what = format!("{generation:?}");
        let mut core_watch = H1::get(
            fx.addr(),
            &s.ca_pem(),
            "/api/v1/namespaces/default/events?watch=1",
        );

        // The group-version that is not served: 404.
        let other = if v == "v1" { "v1beta1" } else { "v1" };
        let (code, _) = s.request(
            "POST",
            &format!("/apis/events.k8s.io/{other}/namespaces/default/events"),
            Some(&new_style_event(&format!("events.k8s.io/{other}"), "X")),
        );
        assert_eq!(code, 404, "{what}");

        // Created through events.k8s.io, with a generated name.
        let path = format!("/apis/{gv}/namespaces/default/events");
        let (code, created) = s.request("POST", &path, Some(&new_style_event(&gv, "StuckConnection")));
        assert_eq!(code, 201, "{what}: {created}");
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        assert!(
            name.starts_with("web-0.") && name.len() == "web-0.".len() + 5,
            "{name}"
        );
        assert_eq!(created["note"], "the apiserver connection of web-0 is stuck");

        // One storage: core v1 shows it in its own shape, live and listed.
        let (_, seen) = core_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "ADDED")
            .expect("ADDED on the core events watch");
        assert_eq!(seen["metadata"]["name"], name.as_str());
        assert_eq!(seen["apiVersion"], "v1");
        assert_eq!(seen["message"], "the apiserver connection of web-0 is stuck");
        assert_eq!(seen["involvedObject"]["name"], "web-0");
        assert_eq!(seen["reportingComponent"], "lifeline.io/agent");
        let listed = s.get_json(&path);
        assert_eq!(listed["kind"], "EventList");
        assert_eq!(listed["items"][0]["regarding"]["name"], "web-0");
        let core = s.get_json("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dweb-0");
        assert_eq!(core["items"].as_array().unwrap().len(), 1, "{core}");

        // A series update, as client-go's and kube-rs' recorders send it.
        let (code, patched) = s.request(
            "PATCH",
            &format!("{path}/{name}"),
            Some(&json!({"series": {"count": 2, "lastObservedTime": "2024-05-01T12:01:00.000000Z"}})),
        );
        assert_eq!(code, 200, "{what}: {patched}");
        assert_eq!(patched["series"]["count"], 2);
        assert!(rv_of(&patched) > rv_of(&created));
        let (_, modified) = core_watch
            .wait_event(Duration::from_secs(5), |k, _| k == "MODIFIED")
            .expect("MODIFIED on the core events watch");
        assert_eq!(modified["series"]["count"], 2);

        // core v1: a Node's event with the old-style fields, patched with a strategic merge patch.
        let node = s.get_json("/api/v1/nodes/node-a");
        assert_eq!(
            (node["kind"].as_str(), node["metadata"]["name"].as_str()),
            (Some("Node"), Some("node-a"))
        );
        let (code, core_event) = s.request(
            "POST",
            "/api/v1/namespaces/default/events",
            Some(&json!({
                "metadata": {"name": "node-a.lifeline.1"},
                "involvedObject": {"kind": "Node", "name": "node-a", "uid": node["metadata"]["uid"]},
                "reason": "AgentReady",
                "message": "ready",
                "type": "Normal",
                "source": {"component": "lifeline"},
                "count": 1,
            })),
        );
        assert_eq!(code, 201, "{what}: {core_event}");
        let (code, bumped) = s.request_raw(
            "PATCH",
            "/api/v1/namespaces/default/events/node-a.lifeline.1",
            "application/strategic-merge-patch+json",
            br#"{"count": 2, "lastTimestamp": "2024-05-01T12:02:00Z", "message": "ready again"}"#,
        );
        assert_eq!((code, bumped["count"].as_i64()), (200, Some(2)), "{bumped}");
        let as_new = s.get_json(&format!("{path}/node-a.lifeline.1"));
        assert_eq!(as_new["note"], "ready again");
        assert_eq!(as_new["deprecatedCount"], 2);

        // Validation as the real server's: events.k8s.io/v1 is strict, v1beta1 and core are not.
        let mut no_time = new_style_event(&gv, "NoTime");
        no_time.as_object_mut().unwrap().remove("eventTime");
        let (code, status) = s.request("POST", &path, Some(&no_time));
        match generation {
            Generation::New => {
                assert_eq!(
                    (code, status["reason"].as_str()),
                    (422, Some("Invalid")),
                    "{status}"
                );
                assert_eq!(status["details"]["causes"][0]["field"], "eventTime");
                let (code, status) = s.request(
                    "PATCH",
                    &format!("{path}/{name}"),
                    Some(&json!({"note": "rewritten"})),
                );
                assert_eq!(
                    code, 422,
                    "the note of an events.k8s.io/v1 Event is immutable: {status}"
                );
            }
            Generation::Old => assert_eq!(code, 201, "{status}"),
        }

        // kubectl lists them back (core v1, which it prefers).
        for kubectl in [KUBECTL_1_32, KUBECTL_1_20] {
            let out = kubectl_ok(&fx, kubectl, &["get", "events"]);
            assert!(
                out.contains("StuckConnection") && out.contains("pod/web-0") && out.contains("AgentReady"),
                "{kubectl} on {what}:\n{out}"
            );
        }

        let records: Vec<(String, String, u16)> = s
            .events()
            .into_iter()
            .map(|e| (e.verb, e.api_version, e.code))
            .collect();
        let mut expected = vec![
            ("create", format!("events.k8s.io/{other}"), 404),
            ("create", gv.clone(), 201),
            ("patch", gv.clone(), 200),
            ("create", "v1".into(), 201),
            ("patch", "v1".into(), 200),
        ];
        match generation {
            Generation::New => expected.extend([("create", gv.clone(), 422), ("patch", gv.clone(), 422)]),
            Generation::Old => expected.push(("create", gv.clone(), 201)),
        }
        // The 404 never reached the events resource (the group-version is not served).
        expected.remove(0);
        let expected: Vec<(String, String, u16)> = expected
            .into_iter()
            .map(|(a, b, c)| (a.to_string(), b, c))
            .collect();
        assert_eq!(records, expected, "{what}");
    }
}

#[test]
fn kube_rs_recorder_and_eviction_against_a_current_server() {
    use k8s_openapi::api::core::v1::{ObjectReference, Pod};
    use kube::api::EvictParams;
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::{Api, Client, Config};

    let fx = Fixture::with(&cluster(Generation::New));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let kubeconfig = Kubeconfig::read_from(&fx.kubeconfig).unwrap();
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
        let client = Client::try_from(config).unwrap();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "lifeline.io/agent".into(),
                instance: Some("lifeline-node-a".into()),
            },
        );
        let pod = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("web-1".into()),
            namespace: Some("default".into()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "StuckConnection".into(),
            note: Some("stuck".into()),
            action: "Watching".into(),
            secondary: None,
        };
        // The first publish creates the Event, the second patches its series.
        tokio::time::timeout(Duration::from_secs(10), recorder.publish(&event, &pod))
            .await
            .unwrap()
            .expect("create through events.k8s.io/v1");
        tokio::time::timeout(Duration::from_secs(10), recorder.publish(&event, &pod))
            .await
            .unwrap()
            .expect("patch of the series");

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let status = pods
            .evict("free-1", &EvictParams::default())
            .await
            .expect("evict free-1");
        assert_eq!(status.status, Some(kube::core::response::StatusSummary::Success));
        // (A PDB refusal is not tried here: kube's client retries every 429 by itself.)
    });
    let records: Vec<(String, u16, i64)> = fx
        .server
        .events()
        .into_iter()
        .map(|e| (e.verb, e.code, e.object["series"]["count"].as_i64().unwrap_or(0)))
        .collect();
    assert_eq!(
        records,
        [("create".to_string(), 201, 0), ("patch".to_string(), 200, 2)]
    );
    let outcomes: Vec<String> = fx.server.evictions().into_iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, ["evicted"]);
    assert!(fx
        .log_text()
        .contains("events.k8s.io/v1/namespaces/default/events"));
}

#[test]
fn harness_reaches_a_server_in_a_network_namespace() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let ns = NetNs::new();
    let dir = TempDir::new();
    let server = ApiServer::start_with_in(
        Some(&ns),
        bin!("ll-apiserver"),
        "127.0.0.1:0".parse().unwrap(),
        &dir.path().join("certs"),
        &ApiServerOptions {
            pods: vec![test_pod("default", "free-1", "node-a", "free", 4)],
            ..ApiServerOptions::new(Generation::Old)
        },
    );
    // The harness's requests enter the namespace: nothing listens there in the test's own.
    assert!(TcpStream::connect_timeout(&server.addr(), Duration::from_millis(300)).is_err());
    assert_eq!(server.get_json("/version")["gitVersion"], "v1.18.20");
    server.set_endpoint_ips(&[ip("127.0.0.9")]);
    let slice =
        server.get_json("/apis/discovery.k8s.io/v1beta1/namespaces/default/endpointslices/kubernetes");
    assert_eq!(slice["endpoints"][0]["addresses"][0], "127.0.0.9");
    assert_eq!(server.evict("default", "free-1", "policy/v1beta1").0, 201);
    assert_eq!(server.evictions().len(), 1);
}
