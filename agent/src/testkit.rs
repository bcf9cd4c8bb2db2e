//! Builders for unit tests: endpoint sets, processes, kernel events and connection tables,
//! with times relative to one origin, and fake `/proc` trees. One place, so every module's tests build the same
//! realistic sequences (connect from process context, establish from softirq, ...).
pub mod heap;

use std::{
    net::SocketAddr,
    os::unix::fs::symlink,
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use lifeline_common::tcp_state;

use crate::{
    endpoint::{Endpoint, EndpointSet, Source},
    health::snapshot::{ClientSnapshot, ConnectionSnapshot, Snapshot},
    health::{State, Verdict},
    host::process::{ProcessInfo, Procfs},
    host::sock_diag::TcpInfo,
    kernel::events::{Change, KernelEvent},
    table::{ConnectionTable, Sample, Tuple},
};

/// The network namespace of every built connection.
pub const NETNS: u64 = 4026531840;
/// The apiserver of [`Lab::new`].
pub const APISERVER: &str = "10.0.0.1:6443";
/// The local address of built connections (ports vary).
pub const LOCAL_IP: &str = "10.0.0.2";

/// An endpoint set from `HOST:PORT`/`CIDR:PORT` strings.
pub fn endpoints(list: &[&str]) -> EndpointSet {
    let mut set = EndpointSet::default();
    for e in list {
        for ep in Endpoint::parse_all(e).unwrap_or_else(|err| panic!("{e}: {err}")) {
            set.insert(ep, Source::Flag);
        }
    }
    set
}

/// The one endpoint `s` parses to.
pub fn endpoint(s: &str) -> Endpoint {
    Endpoint::parse_all(s).unwrap_or_else(|err| panic!("{s}: {err}"))[0]
}

/// A host process named `proc-<pid>`.
pub fn process(pid: u32, start_time_ticks: u64) -> ProcessInfo {
    ProcessInfo {
        pid,
        comm: format!("proc-{pid}"),
        cmdline: format!("/usr/bin/proc-{pid} --serve"),
        cgroup: "/".into(),
        container: None,
        netns: Some(NETNS),
        start_time_ticks,
    }
}

pub fn state(old: u32, new: u32) -> Change {
    Change::State { old, new }
}

/// A table and a clock: every time is milliseconds after `t0`.
pub struct Lab {
    pub table: ConnectionTable,
    pub t0: Instant,
    pub remote: SocketAddr,
}

impl Lab {
    /// A table watching [`APISERVER`].
    pub fn new() -> Self {
        Self::watching(&[APISERVER], APISERVER)
    }

    /// A table watching `list`, connections going to `remote`.
    pub fn watching(list: &[&str], remote: &str) -> Self {
        Self {
            table: ConnectionTable::new(endpoints(list)),
            t0: Instant::now(),
            remote: remote.parse().expect("remote address"),
        }
    }

    pub fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    pub fn local(&self, port: u16) -> SocketAddr {
        let ip: std::net::IpAddr = LOCAL_IP.parse().expect("ip");
        let ip = match self.remote {
            SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some() => match ip {
                std::net::IpAddr::V4(v4) => std::net::IpAddr::V6(v4.to_ipv6_mapped()),
                v6 => v6,
            },
            _ => ip,
        };
        SocketAddr::new(ip, port)
    }

    pub fn tuple(&self, port: u16) -> Tuple {
        Tuple {
            netns: NETNS,
            local: self.local(port),
            remote: self.remote,
        }
    }

    /// A kernel event about socket `sk` with local port `port` (0 before it is chosen).
    pub fn ev(&self, ms: u64, sk: u64, port: u16, change: Change, tgid: Option<u32>) -> KernelEvent {
        KernelEvent {
            at: self.at(ms),
            sk,
            netns: NETNS,
            change,
            local: self.local(port),
            remote: self.remote,
            owner_tgid: tgid,
            thread_comm: "worker".into(),
            sk_err: 0,
            bytes_received: 0,
        }
    }

    /// Applies `change` to socket `sk` (port `port`) from softirq (no owner).
    pub fn apply(&mut self, ms: u64, sk: u64, port: u16, change: Change, sk_err: i32) {
        let mut ev = self.ev(ms, sk, port, change, None);
        ev.sk_err = sk_err;
        self.table.apply_event(&ev, None);
    }

    /// connect() by `pid` (port not chosen yet, process context).
    pub fn syn(&mut self, ms: u64, sk: u64, pid: u32) {
        let ev = self.ev(ms, sk, 0, state(tcp_state::CLOSE, tcp_state::SYN_SENT), Some(pid));
        self.table.apply_event(&ev, Some(process(pid, 1)));
    }

    /// connect() by `pid`, then ESTABLISHED 1 ms later from softirq with the real port.
    pub fn connect(&mut self, ms: u64, sk: u64, port: u16, pid: u32) {
        self.syn(ms, sk, pid);
        let est = self.ev(
            ms + 1,
            sk,
            port,
            state(tcp_state::SYN_SENT, tcp_state::ESTABLISHED),
            Some(999),
        );
        self.table.apply_event(&est, None);
    }

    /// The client closes socket `sk` itself.
    pub fn close(&mut self, ms: u64, sk: u64, port: u16) {
        self.apply(
            ms,
            sk,
            port,
            state(tcp_state::ESTABLISHED, tcp_state::FIN_WAIT1),
            0,
        );
    }

    /// The peer closes socket `sk` (FIN received).
    pub fn peer_close(&mut self, ms: u64, sk: u64, port: u16) {
        self.apply(
            ms,
            sk,
            port,
            state(tcp_state::ESTABLISHED, tcp_state::CLOSE_WAIT),
            0,
        );
    }

    /// A sample of connection `port` at `ms` with these cumulative counters.
    pub fn sample(&mut self, ms: u64, port: u16, tcp: TcpInfo) {
        let tuple = self.tuple(port);
        let sample = Sample::Found {
            inode: 5,
            tcp_state: tcp_state::ESTABLISHED,
            tcp: Some(tcp),
        };
        self.table.apply_sample(&tuple, sample, self.at(ms));
    }
}

impl Default for Lab {
    fn default() -> Self {
        Self::new()
    }
}

/// Cumulative `tcp_info` counters: bytes and data segments received and sent, the rest idle.
pub fn counters(bytes_in: u64, segs_in: u32, bytes_out: u64, segs_out: u32) -> TcpInfo {
    TcpInfo {
        bytes_received: bytes_in,
        data_segs_in: segs_in,
        bytes_sent: bytes_out,
        data_segs_out: segs_out,
        bytes_acked: bytes_out + 1,
        ..TcpInfo::default()
    }
}

/// A listed client `pid` in `state` since `since`, with one established connection to
/// [`APISERVER`] from local port 40000 + pid (named as the suspect of `stale`/`blackholed`).
pub fn client_snapshot(pid: u32, start_time_ticks: u64, state: State, since: Instant) -> ClientSnapshot {
    let tuple = Tuple {
        netns: NETNS,
        local: format!("{LOCAL_IP}:{}", 40000 + pid % 20000)
            .parse()
            .expect("address"),
        remote: APISERVER.parse().expect("address"),
    };
    let suspects = match state {
        State::Stale | State::Blackholed => vec![tuple.local],
        _ => Vec::new(),
    };
    ClientSnapshot {
        key: (pid, start_time_ticks),
        process: process(pid, start_time_ticks),
        pod: None,
        verdict: Verdict {
            state,
            since,
            reason: format!("judged {state}"),
            is_client: true,
            endpoint: Some(APISERVER.to_owned()),
            suspects,
            resource: None,
        },
        connections: vec![ConnectionSnapshot {
            tuple,
            endpoint: endpoint(APISERVER),
            tcp_state: tcp_state::ESTABLISHED,
            established_at: None,
            last_payload: None,
            bytes_received: 0,
            retransmits: 0,
            streams: Vec::new(),
            gap: None,
        }],
        recent_failures: 0,
        selected: false,
        visibility: crate::kernel::probed::Visibility::Connection {
            why: "not a Go program".into(),
        },
        streams_judged: false,
    }
}

/// A snapshot taken at `at` listing `clients`, every endpoint reachable.
pub fn snapshot(at: Instant, clients: Vec<ClientSnapshot>) -> Snapshot {
    Snapshot {
        at,
        clients,
        ..Snapshot::empty()
    }
}

/// A fake procfs tree (`root` stands for `/proc`) in a fresh temporary directory, removed on
/// drop.
pub struct FakeProc {
    pub root: PathBuf,
}

impl FakeProc {
    /// An empty tree; `name` tells the trees of different tests apart.
    pub fn new(name: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "lifeline-fakeproc-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create fake proc root");
        Self { root }
    }

    pub fn procfs(&self) -> Procfs {
        Procfs::new(&self.root)
    }

    /// Writes `<root>/<pid>/<file>`.
    pub fn file(&self, pid: u32, file: &str, contents: impl AsRef<[u8]>) -> &Self {
        let path = self.root.join(pid.to_string()).join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create dir");
        std::fs::write(path, contents).expect("write fake proc file");
        self
    }

    /// A process as [`Procfs`] reads it: the given comm, cmdline, start time and cgroup file;
    /// `tgid` in its status (differs from `pid` for a thread).
    pub fn process(
        &self,
        pid: u32,
        tgid: u32,
        comm: &str,
        cmdline: &[u8],
        start: u64,
        cgroup: &str,
    ) -> &Self {
        self.file(
            pid,
            "stat",
            format!(
                "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 {start} 12345678 456 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n"
            ),
        );
        self.file(pid, "comm", format!("{comm}\n"));
        self.file(pid, "cmdline", cmdline);
        self.file(pid, "cgroup", cgroup);
        self.file(
            pid,
            "status",
            format!("Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{tgid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t1\n"),
        );
        self.file(pid, "ns/net", "")
    }

    /// A process as the node's components are looked for: its comm, its arguments
    /// (NUL-terminated), and empty `root/` and `cwd/` directories standing for its root and
    /// working directory.
    pub fn command(&self, pid: u32, comm: &str, args: &[&str]) -> &Self {
        let p = self.root.join(pid.to_string());
        std::fs::create_dir_all(p.join("root")).expect("pid dir");
        std::fs::create_dir_all(p.join("cwd")).expect("cwd");
        self.file(pid, "comm", format!("{comm}\n"));
        self.file(pid, "cmdline", args.join("\0") + "\0")
    }

    /// Writes `path` as process `pid` sees it: under `<pid>/root` if absolute, `<pid>/cwd` if
    /// relative.
    pub fn seen_by(&self, pid: u32, path: &str, text: &str) -> &Self {
        match path.strip_prefix('/') {
            Some(rel) => self.file(pid, &format!("root/{rel}"), text),
            None => self.file(pid, &format!("cwd/{path}"), text),
        }
    }

    /// Creates `<root>/<pid>/fd/<fd>` -> `target`.
    pub fn fd(&self, pid: u32, fd: u32, target: &str) -> &Self {
        let dir = self.root.join(pid.to_string()).join("fd");
        std::fs::create_dir_all(&dir).expect("create fd dir");
        symlink(target, dir.join(fd.to_string())).expect("create fd symlink");
        self
    }
}

impl Drop for FakeProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
