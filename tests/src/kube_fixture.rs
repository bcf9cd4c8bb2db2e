//! Helpers for the fake kube-apiserver (`ll-apiserver`) and the real Kubernetes clients run
//! against it: kubeconfigs, line-collecting child processes, and the TCP sockets a process holds.
//!
//! None of this needs root.
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Debian's kubectl 1.20 (client-go 1.20, x/net/http2 of that era), unpacked by the setup.
pub const KUBECTL_1_20: &str = "/opt/lifeline-kubectl-1.20/usr/bin/kubectl";
/// The system kubectl (1.32; a dispatcher that first asks the server's `/version`).
pub const KUBECTL_1_32: &str = "/usr/bin/kubectl";
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

/// A running `ll-apiserver`. Start it again on the same address and cert dir to model an
/// apiserver restart: the CA stays, so clients keep trusting it.
pub struct ApiServer {
    pub proc: Watched,
    addr: SocketAddr,
    cert_dir: PathBuf,
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
        }
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
