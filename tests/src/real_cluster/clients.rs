//! Real clients run against a [`ControlPlane`](super::ControlPlane), besides its own
//! components: the JDK's `HttpClient` (HTTP/2, AF_INET6 sockets to `::ffff:a.b.c.d`), a
//! python3-kubernetes watch without a timeout, the kube crate's watcher (`ll-kube-watch`), a
//! client-go 0.32 shared informer built with go1.24 (`ll-informer`) and the never-redial
//! x/net/http2 model (`ll-stuck`). Each is a [`Watched`] process (its output
//! collected, killed with its process group on drop).
use std::{fmt, fs, path::PathBuf, process::Command, time::Duration};

use super::{system_bin, ControlPlane, User};
use crate::{client_script, scenario::sibling_bin, Watched, SYSTEM_PYTHON};

/// Where `cargo xtask setup` (`xtask/src/informer.rs`) builds `tests/clients/informer`.
pub const INFORMER: &str = "/var/tmp/lifeline-go/informer/ll-informer";
/// The Go release it is built with (trixie's go1.24).
pub const INFORMER_GO: &str = "go1.24";
/// What it watches, as the agent names the resources.
pub const INFORMER_RESOURCES: [&str; 2] = ["configmaps", "secrets"];

/// The JDK launcher (`java File.java` compiles and runs a single source file).
pub const JAVA: &str = "/usr/bin/java";

/// The kinds of real client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `tests/clients/JavaWatch.java`: list + watch re-dial loop on one HTTP/2 client.
    Jvm,
    /// `JavaWatch.java --resource configmaps --list false`: a watch of ConfigMaps that never
    /// lists first (its first answer is the ADDED event of `kube-root-ca.crt`), re-watched.
    JvmWatchOnly,
    /// `tests/clients/py-watch.py --timeout-seconds 0`: a watch without a timeout, re-dialed.
    PyWatch,
    /// `ll-kube-watch`: the kube crate's watcher (re-dials with backoff).
    KubeWatch,
    /// `ll-informer` (`tests/clients/informer`): client-go 0.32's SharedInformerFactory over
    /// ConfigMaps and Secrets in all namespaces, built with go1.24.
    Informer,
    /// `ll-stuck`: never dials again after losing its connection (seeds 000/004).
    Stuck,
}

impl Kind {
    /// The process name (`/proc/PID/comm`) the agent reports.
    pub fn comm(self) -> &'static str {
        match self {
            Kind::Jvm | Kind::JvmWatchOnly => "java",
            Kind::PyWatch => "python3",
            Kind::KubeWatch => "ll-kube-watch",
            Kind::Informer => "ll-informer",
            Kind::Stuck => "ll-stuck",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A running real client and where it talks to.
pub struct RealClient {
    pub kind: Kind,
    /// The server URL it was given.
    pub server: String,
    pub proc: Watched,
}

impl RealClient {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

impl fmt::Debug for RealClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pid {}) -> {}", self.kind, self.pid(), self.server)
    }
}

/// Starts a client of `kind` talking to `server` as the cluster's admin user.
pub fn start(cp: &ControlPlane, kind: Kind, server: &str) -> RealClient {
    let kubeconfig = cp.kubeconfig(User::Admin, server);
    let cmd = match kind {
        Kind::Jvm | Kind::JvmWatchOnly => {
            let token = token_file(cp);
            let mut cmd = Command::new(system_bin(JAVA, "openjdk-17-jdk-headless"));
            // A small heap, the serial collector and the quick compiler only: 2 shared cores.
            cmd.args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
                .arg(client_script("JavaWatch.java"))
                .args(["--server", server])
                .arg("--ca")
                .arg(cp.ca_pem())
                .arg("--token-file")
                .arg(token);
            if kind == Kind::JvmWatchOnly {
                cmd.args(["--resource", "configmaps", "--list", "false"]);
            }
            cmd
        }
        Kind::PyWatch => {
            let mut cmd = Command::new(system_bin(SYSTEM_PYTHON, "python3-kubernetes"));
            cmd.arg(client_script("py-watch.py"))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["--timeout-seconds", "0"]);
            cmd
        }
        Kind::KubeWatch => {
            let mut cmd = Command::new(sibling_bin("ll-kube-watch"));
            cmd.arg("--kubeconfig").arg(&kubeconfig);
            cmd
        }
        Kind::Informer => {
            assert!(
                std::path::Path::new(INFORMER).is_file(),
                "{INFORMER} not found: run `cargo xtask setup`"
            );
            let mut cmd = Command::new(INFORMER);
            cmd.arg("--kubeconfig").arg(&kubeconfig);
            cmd
        }
        Kind::Stuck => {
            let mut cmd = Command::new(sibling_bin("ll-stuck"));
            cmd.arg("--kubeconfig").arg(&kubeconfig);
            cmd
        }
    };
    RealClient {
        kind,
        server: server.to_owned(),
        proc: Watched::spawn(&format!("{kind} -> {server}"), cmd),
    }
}

/// The admin token in a file (readable by root only), for clients that take no kubeconfig.
fn token_file(cp: &ControlPlane) -> PathBuf {
    let path = cp.dir().join("admin.token");
    if !path.exists() {
        fs::write(&path, cp.token(User::Admin)).expect("write admin.token");
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod admin.token");
    }
    path
}

/// Waits until the client shows it is watching: the JVM's `WATCH HTTP_2`, the kube watcher's
/// `INIT_DONE`, the informer's `SYNCED`, ll-stuck's `LIST`; the python watch prints nothing on a quiet namespace, so for
/// it an established connection to the server's port (as `ss` shows it) is the sign.
pub fn wait_talking(client: &RealClient, timeout: Duration) {
    let line = |what: &str, pred: fn(&str) -> bool| {
        client
            .proc
            .wait_line(timeout, what, |l| !l.stderr && pred(&l.text));
    };
    match client.kind {
        Kind::Jvm | Kind::JvmWatchOnly => line("a `WATCH HTTP_2` line", |t| t == "WATCH HTTP_2"),
        Kind::KubeWatch => line("INIT_DONE", |t| t == "INIT_DONE"),
        Kind::Informer => line("a SYNCED line", |t| t.starts_with("SYNCED ")),
        Kind::Stuck => line("a LIST line", |t| t.starts_with("LIST ")),
        Kind::PyWatch => {
            let port = client
                .server
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(443);
            crate::wait_until(timeout, &format!("{client:?} connected"), || {
                let conns = ss_connections(client.pid(), port);
                if conns.is_empty() {
                    Err(client.proc.output())
                } else {
                    Ok(())
                }
            });
        }
    }
}

/// The TCP sockets `pid` holds to `port`, as `ss` shows them: (local, remote) text, e.g.
/// `[::ffff:10.231.5.1]:41234`. Used to check a test's premise (the JVM's mapped addresses)
/// independently of the agent.
pub fn ss_connections(pid: u32, port: u16) -> Vec<(String, String)> {
    let out = super::output(Command::new("ss").args([
        "-Htnp",
        "state",
        "established",
        &format!("dport = :{port}"),
    ]));
    let needle = format!("pid={pid},");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&needle))
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            // Recv-Q Send-Q Local Peer Process (the state column is omitted with a filter).
            let (_, _, local, peer) = (cols.next()?, cols.next()?, cols.next()?, cols.next()?);
            Some((local.to_owned(), peer.to_owned()))
        })
        .collect()
}
