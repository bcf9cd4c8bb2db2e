//! Helpers for the fake kube-apiserver (`ll-apiserver`) and the real Kubernetes clients run
//! against it: kubeconfigs, line-collecting child processes, a small HTTPS client for the
//! server's API and its `/fixture/` control endpoints, and the TCP sockets a process holds.
//!
//! None of this needs root (but talking to a server inside a network namespace does).
use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Debian's kubectl 1.20 (client-go 1.20, x/net/http2 of that era), unpacked by the setup.
pub const KUBECTL_1_20: &str = "/opt/lifeline-kubectl-1.20/usr/bin/kubectl";
/// The system kubectl (1.32; a dispatcher that first asks the server's `/version`).
pub const KUBECTL_1_32: &str = "/usr/bin/kubectl";
/// The image's kubectl 1.32.5 itself (go1.23.8), without the dispatcher that may exec another
/// version after asking the server's `/version`.
pub const KUBECTL_1_32_ITSELF: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";
/// sid's kubectl 1.36.4 (go1.27.1: the HTTP/2 client in `net/http/internal/http2`, a PIE linked
/// by the C linker), extracted by the setup.
pub const KUBECTL_1_36: &str = "/var/tmp/lifeline-kubectl-1.36/usr/bin/kubectl";
/// The Python that has Debian's python3-kubernetes (22.6); the `python3` on PATH may not.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Path of a binary of this package, for integration tests: `bin!("ll-apiserver")`.
#[macro_export]
macro_rules! bin {
    ($name:literal) => {
        ::std::path::Path::new(env!(concat!("CARGO_BIN_EXE_", $name)))
    };
}

/// `tests/clients/NAME`: the client scripts (`py-watch.py`, `kubectl-watch.sh`).
pub fn client_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients").join(name)
}

/// Writes a kubeconfig for `server_url` (e.g. `https://127.0.0.1:6443`) trusting the CA in
/// `ca_pem_path`, with a bearer token (the fixture ignores authentication) and `default` as the
/// namespace. kubectl, python3-kubernetes, the kube crate and `ll-stuck` all read it.
pub fn write_kubeconfig(path: &Path, server_url: &str, ca_pem_path: &Path) {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fixture
  cluster:
    server: {server_url}
    certificate-authority: {ca}
users:
- name: fixture
  user:
    token: lifeline-test-token
contexts:
- name: fixture
  context:
    cluster: fixture
    user: fixture
    namespace: default
current-context: fixture
preferences: {{}}
",
        ca = ca_pem_path.display()
    );
    fs::write(path, text).unwrap_or_else(|e| panic!("write kubeconfig {}: {e}", path.display()));
}

// ---------------------------------------------------------------------------------------------
// Line-collecting child processes

/// One line a [`Watched`] process printed.
#[derive(Clone, Debug)]
pub struct OutLine {
    pub at: Instant,
    pub stderr: bool,
    pub text: String,
}

/// A child process in its own process group whose stdout and stderr lines are collected (with
/// arrival times) as they come. On drop the whole group gets SIGKILL (so a script's children die
/// with it), and if the test panicked, the output is printed.
pub struct Watched {
    what: String,
    child: Child,
    lines: Arc<Mutex<Vec<OutLine>>>,
    status: Option<ExitStatus>,
}

impl Watched {
    /// Spawns `cmd` (stdin from /dev/null) in a new process group; `what` names it in messages.
    pub fn spawn(what: &str, mut cmd: Command) -> Watched {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what} ({cmd:?}): {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        for (stream, stderr) in [
            (Box::new(out) as Box<dyn Read + Send>, false),
            (Box::new(err), true),
        ] {
            let lines = lines.clone();
            thread::spawn(move || {
                for text in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(OutLine {
                        at: Instant::now(),
                        stderr,
                        text,
                    });
                }
            });
        }
        Watched {
            what: what.to_string(),
            child,
            lines,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<OutLine> {
        self.lines.lock().unwrap().clone()
    }

    /// How many lines there are so far: pass it to [`Watched::wait_line_after`] to look only at
    /// later lines.
    pub fn mark(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// Every line so far, stdout and stderr interleaved (stderr ones prefixed), for messages.
    pub fn output(&self) -> String {
        self.lines()
            .iter()
            .map(|l| {
                if l.stderr {
                    format!("stderr: {}", l.text)
                } else {
                    l.text.clone()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits up to `timeout` for a line at index >= `mark` that `pred` accepts, and returns it.
    /// Panics (showing the output) on timeout.
    pub fn wait_line_after(
        &self,
        mark: usize,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&OutLine) -> bool,
    ) -> OutLine {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.lines.lock().unwrap().iter().skip(mark).find(|l| pred(l)) {
                return line.clone();
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: no {what} within {timeout:?}; its output:\n{}",
                    self.what,
                    self.output()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`Watched::wait_line_after`] from the first line.
    pub fn wait_line(&self, timeout: Duration, what: &str, pred: impl Fn(&OutLine) -> bool) -> OutLine {
        self.wait_line_after(0, timeout, what, pred)
    }

    /// Its exit status, if it exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the process (not its group).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// SIGKILLs the whole process group and reaps the process.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            // SAFETY: as above; the group id is the child's pid (process_group(0)).
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        }
        self.status = Some(self.child.wait().expect("wait"));
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // SAFETY: as in `kill`; the group may still hold children after the leader exited.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!(
                "--- output of {} ---\n{}\n--- end of {} ---",
                self.what,
                self.output(),
                self.what
            );
        }
    }
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pid {})", self.what, self.child.id())
    }
}

// ---------------------------------------------------------------------------------------------
// The fake apiserver

/// Which Kubernetes API generation `ll-apiserver` plays (`--generation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Generation {
    /// A current apiserver (v1.30): `discovery.k8s.io/v1`, `policy/v1`, `events.k8s.io/v1`.
    #[default]
    New,
    /// A 1.18 apiserver: `discovery.k8s.io/v1beta1`, `policy/v1beta1`, `events.k8s.io/v1beta1`.
    Old,
}

impl Generation {
    pub fn flag(self) -> &'static str {
        match self {
            Generation::New => "new",
            Generation::Old => "old",
        }
    }

    /// The version of `discovery.k8s.io`, `policy` and `events.k8s.io` it serves.
    pub fn group_version(self) -> &'static str {
        match self {
            Generation::New => "v1",
            Generation::Old => "v1beta1",
        }
    }

    /// What `/version` says (its `gitVersion`).
    pub fn git_version(self) -> &'static str {
        match self {
            Generation::New => "v1.30.4",
            Generation::Old => "v1.18.20",
        }
    }
}

/// What [`ApiServer::start_with`] starts `ll-apiserver` with, besides `--listen` and
/// `--cert-dir`.
#[derive(Clone, Debug, Default)]
pub struct ApiServerOptions {
    pub generation: Generation,
    /// Pod objects for `--pods` (namespace `default`, phase `Running` and the like are filled
    /// in): set `metadata.name`, and as needed `metadata.namespace`/`uid`/`labels`,
    /// `spec.nodeName`, `status.containerStatuses[].containerID`.
    pub pods: Vec<Value>,
    /// PodDisruptionBudget objects for `--pdbs` (`spec.selector`, `status.disruptionsAllowed`).
    pub pdbs: Vec<Value>,
    /// `--service-ip` (default 10.96.0.1).
    pub service_ip: Option<IpAddr>,
    /// `--endpoint-ip`s (default: the listen address).
    pub endpoint_ips: Vec<IpAddr>,
    /// `--endpoint-port` (default 6443).
    pub endpoint_port: Option<u16>,
    /// `--strict-eviction`: reject an Eviction of the group-version the generation does not
    /// serve (a real current apiserver accepts policy/v1beta1 as well as policy/v1).
    pub strict_eviction: bool,
    /// `--server-version`: what `/version` says instead of the generation's.
    pub server_version: Option<String>,
    /// Any other flags (`--event-interval 300ms`, `--name NAME`, ...).
    pub extra: Vec<String>,
}

impl ApiServerOptions {
    pub fn new(generation: Generation) -> ApiServerOptions {
        ApiServerOptions {
            generation,
            ..Default::default()
        }
    }

    /// The command line flags; the pods and PDBs files are written into `dir`.
    pub fn args(&self, dir: &Path) -> Vec<String> {
        let mut args = vec!["--generation".to_string(), self.generation.flag().into()];
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        for (flag, objects, file) in [
            ("--pods", &self.pods, "pods.json"),
            ("--pdbs", &self.pdbs, "pdbs.json"),
        ] {
            if !objects.is_empty() {
                let path = dir.join(file);
                fs::write(&path, Value::Array(objects.clone()).to_string())
                    .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
                args.extend([flag.to_string(), path.display().to_string()]);
            }
        }
        if let Some(ip) = self.service_ip {
            args.extend(["--service-ip".into(), ip.to_string()]);
        }
        for ip in &self.endpoint_ips {
            args.extend(["--endpoint-ip".into(), ip.to_string()]);
        }
        if let Some(port) = self.endpoint_port {
            args.extend(["--endpoint-port".into(), port.to_string()]);
        }
        if self.strict_eviction {
            args.push("--strict-eviction".into());
        }
        if let Some(v) = &self.server_version {
            args.extend(["--server-version".into(), v.clone()]);
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// One eviction request the server got (`GET /fixture/log`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRecord {
    pub namespace: String,
    pub name: String,
    /// The Eviction body's apiVersion (empty if it had none).
    pub api_version: String,
    /// `evicted`, `blocked` (429, a PodDisruptionBudget), `not-found`, `rejected` (400),
    /// `error`.
    pub outcome: String,
    pub code: u16,
    /// The PodDisruptionBudget that allowed or blocked it.
    pub pdb: Option<String>,
}

/// One pod DELETE the server got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletionRecord {
    pub namespace: String,
    pub name: String,
    /// `deleted` or `not-found`.
    pub outcome: String,
    pub code: u16,
}

/// One Event create or patch the server got, through either API group.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRecord {
    /// `create` or `patch`.
    pub verb: String,
    /// `v1`, `events.k8s.io/v1` or `events.k8s.io/v1beta1`.
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    /// 201 or 200 if accepted.
    pub code: u16,
    /// The Event as stored (in the request's version), or the request body if rejected.
    pub object: Value,
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn code_of(v: &Value) -> u16 {
    v.as_u64().and_then(|c| u16::try_from(c).ok()).unwrap_or(0)
}

/// A running `ll-apiserver`. Start it again on the same address and cert dir to model an
/// apiserver restart: the CA stays, so clients keep trusting it.
pub struct ApiServer {
    pub proc: Watched,
    addr: SocketAddr,
    cert_dir: PathBuf,
    /// The network namespace it runs in, for [`ApiServer::request`].
    netns: Option<String>,
}

impl ApiServer {
    /// Starts `bin` (the `ll-apiserver` binary, `bin!("ll-apiserver")`) with `--listen listen
    /// --cert-dir cert_dir` and `extra` arguments, and waits for it to print `listening ADDR`.
    /// `listen` may have port 0 (see [`ApiServer::addr`]).
    pub fn start(bin: &Path, listen: SocketAddr, cert_dir: &Path, extra: &[&str]) -> ApiServer {
        Self::start_in(None, bin, listen, cert_dir, extra)
    }

    /// [`ApiServer::start`] inside network namespace `ns` (a scenario host).
    pub fn start_in(
        ns: Option<&crate::NetNs>,
        bin: &Path,
        listen: SocketAddr,
        cert_dir: &Path,
        extra: &[&str],
    ) -> ApiServer {
        let mut cmd = crate::command_in(ns, bin);
        cmd.arg("--listen")
            .arg(listen.to_string())
            .arg("--cert-dir")
            .arg(cert_dir)
            .args(extra);
        let proc = Watched::spawn("ll-apiserver", cmd);
        let line = proc.wait_line(Duration::from_secs(10), "`listening ADDR` line", |l| {
            !l.stderr && l.text.starts_with("listening ")
        });
        let addr = line.text["listening ".len()..]
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad listening line {:?}: {e}", line.text));
        ApiServer {
            proc,
            addr,
            cert_dir: cert_dir.to_path_buf(),
            netns: ns.map(|ns| ns.name.clone()),
        }
    }

    /// [`ApiServer::start`] with `options` (files for `--pods`/`--pdbs` go into
    /// `cert_dir/fixture-input`).
    pub fn start_with(
        bin: &Path,
        listen: SocketAddr,
        cert_dir: &Path,
        options: &ApiServerOptions,
    ) -> ApiServer {
        Self::start_with_in(None, bin, listen, cert_dir, options)
    }

    /// [`ApiServer::start_with`] inside network namespace `ns`.
    pub fn start_with_in(
        ns: Option<&crate::NetNs>,
        bin: &Path,
        listen: SocketAddr,
        cert_dir: &Path,
        options: &ApiServerOptions,
    ) -> ApiServer {
        let args = options.args(&cert_dir.join("fixture-input"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_in(ns, bin, listen, cert_dir, &args)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://ADDR`
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA certificate clients must trust.
    pub fn ca_pem(&self) -> PathBuf {
        self.cert_dir.join("ca.pem")
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Its stderr log lines (one per request, connection and watch).
    pub fn log(&self) -> Vec<String> {
        self.proc
            .lines()
            .into_iter()
            .filter(|l| l.stderr)
            .map(|l| l.text)
            .collect()
    }

    /// SIGKILL: every connection drops at once (the kernel closes the sockets).
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// SIGTERM: graceful shutdown.
    pub fn terminate(&self) {
        self.proc.signal(libc::SIGTERM);
    }

    /// One HTTPS request (HTTP/1.1, a fresh connection; from inside the server's network
    /// namespace if it runs in one): returns the status code and the body as JSON (a JSON
    /// string holding the text if it is not JSON). Panics if the server cannot be reached.
    pub fn request_raw(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
        https_request(
            self.netns.as_deref(),
            self.addr,
            &self.ca_pem(),
            method,
            path,
            content_type,
            body,
        )
        .unwrap_or_else(|e| panic!("{method} {path} to ll-apiserver at {}: {e}", self.addr))
    }

    /// [`ApiServer::request_raw`] with a JSON body (`application/json`; for PATCH
    /// `application/merge-patch+json`).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let content_type = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        let body = body.map(Value::to_string).unwrap_or_default();
        self.request_raw(method, path, content_type, body.as_bytes())
    }

    /// GET `path`, which must answer 200.
    pub fn get_json(&self, path: &str) -> Value {
        let (code, body) = self.request("GET", path, None);
        assert_eq!(code, 200, "GET {path}: {body}");
        body
    }

    /// POSTs an Eviction of `ns/name` with apiVersion `api_version` (`policy/v1` or
    /// `policy/v1beta1`), as `kubectl drain` does: returns the status code and the Status.
    pub fn evict(&self, ns: &str, name: &str, api_version: &str) -> (u16, Value) {
        let eviction = json!({
            "apiVersion": api_version,
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        });
        self.request(
            "POST",
            &format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"),
            Some(&eviction),
        )
    }

    /// `GET /fixture/log`: `{"evictions": [...], "deletions": [...], "events": [...]}`.
    pub fn fixture_log(&self) -> Value {
        self.get_json("/fixture/log")
    }

    /// Every eviction request so far, allowed or not.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        let log = self.fixture_log();
        log["evictions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| EvictionRecord {
                namespace: str_of(&e["namespace"]),
                name: str_of(&e["name"]),
                api_version: str_of(&e["apiVersion"]),
                outcome: str_of(&e["outcome"]),
                code: code_of(&e["code"]),
                pdb: e["pdb"].as_str().map(String::from),
            })
            .collect()
    }

    /// Every pod DELETE so far.
    pub fn deletions(&self) -> Vec<DeletionRecord> {
        let log = self.fixture_log();
        log["deletions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| DeletionRecord {
                namespace: str_of(&e["namespace"]),
                name: str_of(&e["name"]),
                outcome: str_of(&e["outcome"]),
                code: code_of(&e["code"]),
            })
            .collect()
    }

    /// Every Event create and patch so far (rejected ones too: see `code`).
    pub fn events(&self) -> Vec<EventRecord> {
        let log = self.fixture_log();
        log["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| EventRecord {
                verb: str_of(&e["verb"]),
                api_version: str_of(&e["apiVersion"]),
                namespace: str_of(&e["namespace"]),
                name: str_of(&e["name"]),
                code: code_of(&e["code"]),
                object: e["object"].clone(),
            })
            .collect()
    }

    /// Replaces the addresses of the `kubernetes` EndpointSlice and Endpoints (watchers get
    /// MODIFIED); the port stays.
    pub fn set_endpoint_ips(&self, ips: &[IpAddr]) {
        let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        let (code, body) = self.request("POST", "/fixture/endpoint-ips", Some(&json!(ips)));
        assert_eq!(code, 200, "set endpoint IPs: {body}");
    }

    /// [`ApiServer::set_endpoint_ips`] with a new port too.
    pub fn set_endpoints(&self, ips: &[IpAddr], port: u16) {
        let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        let (code, body) = self.request(
            "POST",
            "/fixture/endpoint-ips",
            Some(&json!({"ips": ips, "port": port})),
        );
        assert_eq!(code, 200, "set endpoints: {body}");
    }
}

// ---------------------------------------------------------------------------------------------
// A small HTTPS client

/// A TCP connection to `addr`, made from inside network namespace `netns` (by name, as under
/// /run/netns) if given: a thread enters it, connects, and leaves the socket there.
fn tcp_connect(netns: Option<&str>, addr: SocketAddr) -> io::Result<TcpStream> {
    let connect = move || TcpStream::connect_timeout(&addr, Duration::from_secs(5));
    let Some(name) = netns else {
        return connect();
    };
    let path = format!("/run/netns/{name}");
    thread::scope(|s| {
        s.spawn(|| {
            let ns = fs::File::open(&path)?;
            // SAFETY: setns on an open namespace fd; it changes this (scoped) thread only.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            connect()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("connect thread panicked")))
    })
}

/// One HTTP/1.1 request over TLS (trusting `ca`), read to its end.
pub fn https_request(
    netns: Option<&str>,
    addr: SocketAddr,
    ca: &Path,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> io::Result<(u16, Value)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};

    let target = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        ip if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    };
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).map_err(io::Error::other)?)
        .map_err(io::Error::other)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::IpAddress(target.ip().into());
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(io::Error::other)?;
    let tcp = tcp_connect(netns, target)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {target}\r\nAccept: application/json\r\nUser-Agent: lifeline-fixture-harness\r\n\
         Authorization: Bearer lifeline-test-token\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes())?;
    tls.write_all(body)?;
    tls.flush()?;
    let mut reader = BufReader::new(tls);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(&format!("bad status line {line:?}")))?;
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
    }
    let mut raw = Vec::new();
    if chunked {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad(&format!("bad chunk size {line:?}")))?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            raw.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = length {
        raw.resize(length, 0);
        reader.read_exact(&mut raw)?;
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

// ---------------------------------------------------------------------------------------------
// Sockets of a process

/// One TCP socket a process holds (from /proc/PID/fd and /proc/PID/net/tcp{,6}).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// ESTABLISHED, SYN_SENT, LISTEN, CLOSE_WAIT, ...
    pub state: &'static str,
}

fn tcp_state(code: u8) -> &'static str {
    match code {
        0x01 => "ESTABLISHED",
        0x02 => "SYN_SENT",
        0x03 => "SYN_RECV",
        0x04 => "FIN_WAIT1",
        0x05 => "FIN_WAIT2",
        0x06 => "TIME_WAIT",
        0x07 => "CLOSE",
        0x08 => "CLOSE_WAIT",
        0x09 => "LAST_ACK",
        0x0A => "LISTEN",
        0x0B => "CLOSING",
        0x0C => "NEW_SYN_RECV",
        _ => "UNKNOWN",
    }
}

/// Parses `0100007F:1F90` (IPv4) or the 32-hex-digit IPv6 form of /proc/net/tcp{,6}.
fn proc_net_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.swap_bytes())),
        32 => {
            let mut octets = [0u8; 16];
            for (i, word) in octets.chunks_mut(4).enumerate() {
                let w = u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).ok()?;
                word.copy_from_slice(&w.to_le_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Every TCP socket process `pid` holds open (in its network namespace), any state. Empty if the
/// process is gone.
pub fn tcp_sockets_of(pid: u32) -> Vec<TcpSocket> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut found = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || !inodes.iter().any(|i| i == f[9]) {
                continue;
            }
            if let (Some(local), Some(remote), Ok(state)) = (
                proc_net_addr(f[1]),
                proc_net_addr(f[2]),
                u8::from_str_radix(f[3], 16),
            ) {
                found.push(TcpSocket {
                    local,
                    remote,
                    state: tcp_state(state),
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_addresses() {
        assert_eq!(
            proc_net_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            proc_net_addr("00000000000000000000000001000000:0050"),
            Some("[::1]:80".parse().unwrap())
        );
        assert_eq!(proc_net_addr("zz:1"), None);
    }

    #[test]
    fn sees_own_sockets() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let sockets = tcp_sockets_of(std::process::id());
        assert!(
            sockets.iter().any(|s| s.state == "LISTEN" && s.local == addr),
            "{sockets:?}"
        );
        assert!(
            sockets.iter().any(|s| s.state == "ESTABLISHED"
                && s.remote == addr
                && s.local == client.local_addr().unwrap()),
            "{sockets:?}"
        );
    }
}
