//! The agent: `lifeline` run as a child process ([`Agent`]), and what its HTTP API answers read
//! back ([`Table`], the client objects, their schema).
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::programs::{Client, Conn};
use crate::setup::{free_port, lifeline_bin, TempDir};
use crate::wait::{hold, scaled, wait_until, Pretty, Shown, POLL};

/// How long the agent gets to become ready: a bound on a hang, not a measure of start-up
/// (`lifeline check` and the guests' detection check time that). On the host an agent is
/// ready in about a second; in a guest it is scaled (`wait::scaled`): under TCG, four agents of
/// a suite loading their programs at once beside a busy host took over 10 s each (the 5.10
/// guest, CI of 2026-12-07: 64 s of its run waiting for a CPU).
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Rows of `/api/v1/clients` reduced to what identifies them: pid → its (local, remote) pairs.
pub type Table = BTreeMap<u32, BTreeSet<Conn>>;

/// The [`Table`] of a `/api/v1/clients` answer (panics on objects without pid or addresses).
pub fn table(clients: &[Value]) -> Table {
    clients
        .iter()
        .map(|c| {
            let conns = connections(c)
                .iter()
                .map(|k| Conn {
                    local: addr_field(k, "local"),
                    remote: addr_field(k, "remote"),
                })
                .collect();
            (pid_of(c), conns)
        })
        .collect()
}

/// The [`Table`] the given clients should produce.
pub fn expected(clients: &[&Client]) -> Table {
    clients.iter().map(|c| c.row()).collect()
}

pub fn pid_of(client: &Value) -> u32 {
    client["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("client without numeric pid: {client}")) as u32
}

/// The client object of process `pid`, if listed.
pub fn find_pid(clients: &[Value], pid: u32) -> Option<&Value> {
    clients.iter().find(|c| pid_of(c) == pid)
}

/// Whether client object `c` carries a judgement: its reason says neither "not judged" (too
/// young, or its evidence could not be read) nor "not a client yet" (its connect seen, not its
/// establishment).
pub fn judged(c: &Value) -> bool {
    let reason = c["reason"].as_str().unwrap_or("");
    !reason.contains("not judged") && !reason.contains("not a client yet")
}

/// `Ok` when client object `c` is judged healthy and holds an established connection (to
/// `endpoint`, when given); else what it is instead.
pub fn judged_healthy(c: &Value, endpoint: Option<&str>) -> Result<(), String> {
    let connected = connections(c)
        .iter()
        .any(|k| k["tcp_state"] == "ESTABLISHED" && endpoint.is_none_or(|e| k["endpoint"] == e));
    if c["state"] == "healthy" && judged(c) && connected {
        return Ok(());
    }
    let to = endpoint.map(|e| format!(" to {e}")).unwrap_or_default();
    Err(format!(
        "{} ({}); an established connection{to}: {connected}",
        c["state"],
        c["reason"].as_str().unwrap_or("")
    ))
}

pub fn connections(client: &Value) -> &[Value] {
    client["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("client without connections array: {client}"))
}

/// The connection object of `conn` within client `client`.
pub fn find_conn(client: &Value, conn: Conn) -> &Value {
    connections(client)
        .iter()
        .find(|k| addr_field(k, "local") == conn.local && addr_field(k, "remote") == conn.remote)
        .unwrap_or_else(|| panic!("{conn:?} not in {client:#}"))
}

fn addr_field(v: &Value, key: &str) -> SocketAddr {
    v[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("`{key}` is not an address: {v}"))
}

/// True for `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`.
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !(digits(0..4)
            && digits(5..7)
            && digits(8..10)
            && digits(11..13)
            && digits(14..16)
            && digits(17..19))
        || (b[4], b[7], b[13], b[16]) != (b'-', b'-', b':', b':')
        || !matches!(b[10], b'T' | b't')
    {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    rest.eq_ignore_ascii_case("z")
        || (rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest.as_bytes()[3] == b':'
            && rest[1..3]
                .bytes()
                .chain(rest[4..6].bytes())
                .all(|d| d.is_ascii_digit()))
}

/// Checks every field of a `/api/v1/clients` object for the type the contract gives it.
pub fn assert_client_schema(c: &Value) {
    let ok = |cond: bool, what: &str| assert!(cond, "client object: {what}: {c:#}");
    ok(c["pid"].is_u64(), "pid must be an unsigned integer");
    ok(c["comm"].is_string(), "comm must be a string");
    ok(c["cmdline"].is_string(), "cmdline must be a string");
    ok(c["netns"].is_u64(), "netns must be an unsigned integer");
    ok(c["cgroup"].is_string(), "cgroup must be a string");
    ok(
        c["container_id"].is_null()
            || c["container_id"]
                .as_str()
                .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())),
        "container_id must be null or 64 hex digits",
    );
    for key in ["namespace", "pod", "container"] {
        let v = c.get(key);
        ok(
            v.is_some_and(|v| v.is_null() || v.is_string()),
            &format!("{key} must be present, null or a string"),
        );
    }
    ok(
        c["state"].as_str().is_some_and(|s| !s.is_empty()),
        "state must be a non-empty string",
    );
    ok(
        c["state_since"].as_str().is_some_and(is_rfc3339),
        "state_since must be RFC3339",
    );
    ok(c["reason"].is_string(), "reason must be a string");
    ok(
        c["connect_failures"].is_u64(),
        "connect_failures must be an unsigned integer",
    );
    for k in connections(c) {
        ok(
            k["local"]
                .as_str()
                .is_some_and(|s| s.parse::<SocketAddr>().is_ok()),
            "connection local must be ADDR:PORT",
        );
        ok(
            k["remote"]
                .as_str()
                .is_some_and(|s| s.parse::<SocketAddr>().is_ok()),
            "connection remote must be ADDR:PORT",
        );
        ok(k["endpoint"].is_string(), "connection endpoint must be a string");
        ok(
            k["tcp_state"].as_str().is_some_and(|s| !s.is_empty()),
            "tcp_state must be a string",
        );
        ok(
            k["established_at"].is_null() || k["established_at"].as_str().is_some_and(is_rfc3339),
            "established_at must be null or RFC3339",
        );
        ok(
            k["last_receive_age_seconds"].is_null()
                || k["last_receive_age_seconds"].is_f64()
                || k["last_receive_age_seconds"].is_u64(),
            "last_receive_age_seconds must be null or a number",
        );
        ok(
            k["bytes_received"].is_u64(),
            "bytes_received must be an unsigned integer",
        );
        ok(
            k["retransmits"].is_u64(),
            "retransmits must be an unsigned integer",
        );
    }
}

/// Minimal HTTP/1.1 GET (`Connection: close`): returns the status code and body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad response: {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
    if !chunked {
        return Ok((status, body.to_string()));
    }
    let (mut out, mut rest) = (String::new(), body);
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or_else(bad)?;
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).map_err(|_| bad())?;
        if size == 0 {
            return Ok((status, out));
        }
        out.push_str(after.get(..size).ok_or_else(bad)?);
        rest = after[size..].strip_prefix("\r\n").ok_or_else(bad)?;
    }
}

/// Runs `lifeline ARGS` to completion (killing it after 10 s, which fails the test).
pub fn lifeline(args: &[&str]) -> Output {
    lifeline_via(&[], args, Duration::from_secs(10))
}

/// Runs `WRAPPER... lifeline ARGS` to completion, where the wrapper execs its arguments (as for
/// [`Agent::launch`]); killing it after `timeout` fails the test.
pub fn lifeline_via(wrapper: &[&str], args: &[&str], timeout: Duration) -> Output {
    let mut child = lifeline_command(wrapper)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lifeline");
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            let shown: Vec<&str> = wrapper.iter().chain(&["lifeline"]).chain(args).copied().collect();
            panic!(
                "`{}` still running after {} s; stderr:\n{}",
                shown.join(" "),
                timeout.as_secs(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(POLL);
    }
    child.wait_with_output().expect("wait")
}

/// `WRAPPER... lifeline`, or `lifeline` itself without a wrapper.
fn lifeline_command(wrapper: &[&str]) -> Command {
    match wrapper.split_first() {
        Some((program, wrapper_args)) => {
            let mut cmd = Command::new(program);
            cmd.args(wrapper_args).arg(lifeline_bin());
            cmd
        }
        None => Command::new(lifeline_bin()),
    }
}

/// A running `lifeline run`, listening on a free 127.0.0.1 port. On drop it gets SIGTERM (and
/// SIGKILL if it lingers); if the test panicked, its stderr is printed then (so panic messages
/// about the agent need not include it).
pub struct Agent {
    child: Child,
    /// Where its HTTP API listens.
    pub addr: SocketAddr,
    dir: TempDir,
}

impl Agent {
    /// `lifeline run --endpoint E...`
    pub fn start(endpoints: &[impl AsRef<str>]) -> Agent {
        let args: Vec<String> = endpoints
            .iter()
            .flat_map(|e| ["--endpoint".to_string(), e.as_ref().to_string()])
            .collect();
        Agent::start_with(&args)
    }

    /// `lifeline run ARGS --listen 127.0.0.1:PORT`; returns once `/readyz` answers 200.
    pub fn start_with(args: &[String]) -> Agent {
        Agent::launch(&[], args, IpAddr::from([127, 0, 0, 1]), true)
    }

    /// `WRAPPER... lifeline run ARGS --listen LISTEN_IP:PORT`, where the wrapper execs its
    /// arguments (`sh -c 'ulimit -Sn 1024; exec "$0" "$@"'`, `capsh --drop=... -- -c 'exec "$0"
    /// "$@"'`), so the agent keeps the child's pid. Returns once `/readyz` answers 200, or only
    /// `/healthz` unless `ready` (an agent expected to run degraded). An unspecified
    /// `listen_ip` (`0.0.0.0`) is reached at 127.0.0.1.
    pub fn launch(wrapper: &[&str], args: &[String], listen_ip: IpAddr, ready: bool) -> Agent {
        let dir = TempDir::new();
        let port = free_port();
        let addr = match listen_ip {
            ip if ip.is_unspecified() => SocketAddr::from(([127, 0, 0, 1], port)),
            ip => SocketAddr::new(ip, port),
        };
        let stderr = fs::File::create(dir.path().join("agent.stderr")).expect("stderr file");
        let mut cmd = lifeline_command(wrapper);
        cmd.arg("run")
            .args(args)
            .args(["--listen", &SocketAddr::new(listen_ip, port).to_string()]);
        let shown = format!("{cmd:?}");
        let probe = if ready { "/readyz" } else { "/healthz" };
        let child = cmd
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(stderr.try_clone().expect("dup"))
            .stderr(stderr)
            .spawn()
            .expect("spawn lifeline");
        let mut agent = Agent { child, addr, dir };
        let (start, ready_timeout) = (Instant::now(), scaled(READY_TIMEOUT));
        loop {
            if let Some(status) = agent.child.try_wait().expect("try_wait") {
                panic!("{shown} exited with {status} before becoming ready");
            }
            if matches!(http_get(addr, probe), Ok((200, _))) {
                return agent;
            }
            if start.elapsed() > ready_timeout {
                panic!("{shown}: {probe} not 200 within {ready_timeout:?}");
            }
            thread::sleep(POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A scratch directory that lives as long as the agent (for config files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the agent wrote to stderr (and stdout) so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("agent.stderr")).unwrap_or_default()
    }

    /// GET `path`; panics unless the agent answers.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET `path`, asserting 200 and a JSON array body.
    pub fn get_array(&self, path: &str) -> Vec<Value> {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        match serde_json::from_str(&body) {
            Ok(Value::Array(items)) => items,
            _ => panic!("GET {path}: not a JSON array: {body}"),
        }
    }

    /// `/api/v1/clients`
    pub fn clients(&self) -> Vec<Value> {
        self.get_array("/api/v1/clients")
    }

    /// `/api/v1/endpoints` as a sorted list of (endpoint, source).
    /// `/api/v1/endpoints` → `endpoints[]` as (endpoint, source), sorted.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        let (status, body) = self.get("/api/v1/endpoints");
        assert_eq!(status, 200, "GET /api/v1/endpoints: {body}");
        let doc: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("endpoints JSON: {e}: {body}"));
        let entries = doc["endpoints"]
            .as_array()
            .unwrap_or_else(|| panic!("no endpoints array: {doc}"))
            .clone();
        let mut list: Vec<_> = entries
            .iter()
            .map(|e| match (e["endpoint"].as_str(), e["source"].as_str()) {
                (Some(ep), Some(src)) => (ep.to_string(), src.to_string()),
                _ => panic!("malformed endpoint object: {e}"),
            })
            .collect();
        list.sort();
        list
    }

    /// Polls `/api/v1/clients` until `check` returns `Some`, for at most `timeout` (panics
    /// showing the last answer).
    pub fn wait_clients<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&[Value]) -> Option<T>,
    ) -> T {
        wait_until(timeout, what, || {
            let c = self.clients();
            check(&c).ok_or_else(|| Shown(format!("{:?}", Pretty(&c))))
        })
    }

    /// Waits until the clients' [`Table`] is exactly `want`; returns that answer.
    pub fn wait_table(&self, timeout: Duration, want: &Table) -> Vec<Value> {
        let what = format!("exactly these clients (pid -> connections): {want:#?}");
        self.wait_clients(timeout, &what, |c| (table(c) == *want).then(|| c.to_vec()))
    }

    /// Asserts that the clients' [`Table`] stays exactly `want` for `duration`.
    pub fn hold_table(&self, duration: Duration, want: &Table) {
        let what = format!("the client table {want:#?}");
        hold(duration, &what, || {
            let c = self.clients();
            if table(&c) == *want {
                Ok(())
            } else {
                Err(Shown(format!("{:?}", Pretty(&c))))
            }
        });
    }

    /// Sends signal `sig` to the agent.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, sig) }, 0, "kill");
    }

    /// Stops the agent with SIGTERM and asserts it exits 0 within 10 s.
    pub fn stop(self) {
        self.stop_with(libc::SIGTERM)
    }

    /// Stops the agent with `sig` and asserts it exits 0 within 10 s.
    pub fn stop_with(mut self, sig: i32) {
        self.signal(sig);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent still running 10 s after signal {sig}"
            );
            thread::sleep(POLL);
        };
        assert_eq!(
            status.code(),
            Some(0),
            "agent exited with {status} after signal {sig}"
        );
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.signal(libc::SIGTERM);
            let start = Instant::now();
            while self.child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5) {
                thread::sleep(POLL);
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            let text = self.stderr();
            let cut = (text.len().saturating_sub(16 * 1024)..=text.len())
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            let tail = &text[cut..];
            eprintln!(
                "----- lifeline stderr (last 16 KiB) -----\n{tail}\n----- end of lifeline stderr -----"
            );
        }
    }
}

/// Writes `endpoints: [...]` to the YAML config file `path` (atomically, by rename).
pub fn write_config(path: &Path, endpoints: &[impl AsRef<str>]) {
    let list: Vec<String> = endpoints.iter().map(|e| format!("\"{}\"", e.as_ref())).collect();
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format!("endpoints: [{}]\n", list.join(", "))).expect("write config");
    fs::rename(&tmp, path).expect("rename config");
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    #[test]
    fn rfc3339() {
        for ok in [
            "2025-01-02T03:04:05Z",
            "2025-01-02T03:04:05.123456789Z",
            "2025-01-02T03:04:05+02:00",
        ] {
            assert!(is_rfc3339(ok), "{ok}");
        }
        for bad in [
            "2025-01-02 03:04:05",
            "2025-01-02T03:04:05",
            "2025-01-02T03:04:05.Z",
            "",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
    }

    #[test]
    fn http_get_decodes_chunked_bodies() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for reply in [
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n",
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno",
            ] {
                let (s, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(s);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap() > 2 {
                    line.clear();
                }
                let mut s = reader.into_inner();
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
        assert_eq!(http_get(addr, "/").unwrap(), (200, "[1,2]".into()));
        assert_eq!(http_get(addr, "/").unwrap(), (503, "no".into()));
    }
}
