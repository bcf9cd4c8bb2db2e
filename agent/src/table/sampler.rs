//! The sock_diag side of the connection table: the scan that finds connections the kernel
//! events did not report (older than the agent, or lost in a burst), the once-a-second
//! sampling of `tcp_info` for *tracked sockets only*, owner resolution through `/proc/*/fd`
//! for sockets no `connect()` event named, and the liveness check that forgets processes that
//! exited.
//!
//! Sampling uses exact lookups by 4-tuple in the socket's own network namespace, batched
//! ([`DiagSocket::lookup_many`]: 64 requests per datagram, answers read with one `recvmmsg`):
//! the cost grows with the number of apiserver connections, never with the node's other
//! traffic. A namespace with [`DUMP_FROM`] due sockets or more is sampled with dumps
//! filtered on the endpoints' ports instead (cheaper per socket, but a fixed walk of the
//! kernel's whole established hash table per dump). A connection is sampled every second,
//! or [`QUIET_EVERY`](crate::table::QUIET_EVERY) after the last look at it while it is quiet (a watch with nothing to say: see
//! [`Connection::quiet`](crate::table::Connection::quiet); a segment record that shows nothing outstanding is a look too:
//! [`LOOKED_SAMPLE_EVERY`](crate::table::LOOKED_SAMPLE_EVERY)), so idle connections, most of a node's, cost a quarter,
//! and watches that receive events often little more than their records.
//!
//! Scans run at start-up, after an endpoint change, when the kernel's count of lost events
//! grows (the resync that heals a burst), and every [`RESYNC_EVERY`] as a safety net.
use std::{
    collections::{hash_map::Entry, BTreeSet, HashMap, HashSet},
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use lifeline_common::tcp_state;

use crate::{
    host::exits::ExitWatch,
    host::netns,
    host::process::{Liveness, ProcessInfo, Procfs},
    host::sock_diag::{self, DiagSocket},
    kernel::programs::KernelStats,
    table::{ConnectionTable, Map, Sample, Scanned, Set, Tuple},
};

/// How often every namespace is scanned again although no event was lost.
pub const RESYNC_EVERY: Duration = Duration::from_secs(300);
/// Least time between two scans prompted by lost events (a storm may lose events for a
/// while: one scan after each quiet spell is enough).
pub const RESYNC_MIN_GAP: Duration = Duration::from_secs(5);

/// Socket states worth listing: connecting, connected, or closed by the peer only.
const WATCHED_STATES: u32 =
    1 << tcp_state::ESTABLISHED | 1 << tcp_state::SYN_SENT | 1 << tcp_state::CLOSE_WAIT;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("network namespace {inode}: {source}")]
    Diag { inode: u64, source: sock_diag::Error },
    #[error("network namespace {0} has no process or bind mount left to enter it through")]
    NoPath(u64),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One sock_diag socket per network namespace that holds tracked connections.
pub struct Sampler {
    procfs: Procfs,
    exits: ExitWatch,
    sockets: HashMap<u64, DiagSocket>,
    /// The kernel's counters as the event pump publishes them (none in unit tests).
    stats: Option<Arc<KernelStats>>,
    /// Lost events already healed by a scan.
    lost_seen: u64,
    last_scan: Option<Instant>,
}

/// What one sampling round did (for logs and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Connections tracked, and those sampled (every second, or every [`QUIET_EVERY`](crate::table::QUIET_EVERY) while
    /// quiet: see [`Connection::quiet`](crate::table::Connection::quiet)).
    pub tracked: usize,
    pub sampled: usize,
    pub gone: usize,
    pub owners_found: usize,
    pub exited: usize,
    /// Connections a resync scan run in this round added (None: no scan ran).
    pub resync_added: Option<usize>,
    /// Some due connections could not be read.
    pub unread: bool,
}

impl Sampler {
    pub fn new(procfs: Procfs) -> Self {
        Self {
            procfs,
            exits: ExitWatch::default(),
            sockets: HashMap::new(),
            stats: None,
            lost_seen: 0,
            last_scan: None,
        }
    }

    /// Rescans when the kernel's lost-event counter in `stats` grows.
    pub fn with_kernel_stats(mut self, stats: Arc<KernelStats>) -> Self {
        self.lost_seen = stats.get().lost;
        self.stats = Some(stats);
        self
    }

    /// Finds every watched connection that exists, in every network namespace, and merges
    /// them into the table (which skips the ones kernel events already reported). Returns
    /// how many were added.
    pub fn scan(&mut self, table: &Mutex<ConnectionTable>) -> usize {
        self.last_scan = Some(Instant::now());
        let ports: BTreeSet<u16> = table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .endpoints()
            .iter()
            .map(|(e, _)| e.port)
            .collect();
        let mut added = 0;
        for (inode, path) in netns::enumerate() {
            let opened;
            let socket = match self.sockets.get(&inode) {
                Some(socket) => socket,
                None => match DiagSocket::open_in(&path) {
                    Ok(socket) => {
                        opened = socket;
                        &opened
                    }
                    Err(err) => {
                        tracing::warn!(netns = inode, path = %path.display(), "cannot scan namespace: {err}");
                        continue;
                    }
                },
            };
            let started = Instant::now();
            let mut found = Vec::new();
            let mut complete = true;
            for family in [libc::AF_INET as u16, libc::AF_INET6 as u16] {
                for &port in &ports {
                    match socket.dump_to_port(family, WATCHED_STATES, port) {
                        Ok(sockets) => found.extend(sockets.into_iter().map(|s| Scanned {
                            tuple: Tuple {
                                netns: inode,
                                local: s.local,
                                remote: s.remote,
                            },
                            inode: s.inode,
                            tcp_state: u32::from(s.state),
                        })),
                        Err(err) => {
                            complete = false;
                            tracing::warn!(netns = inode, family, port, "sock_diag dump failed: {err}");
                        }
                    }
                }
            }
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            if complete {
                added += table.reconcile_scan(inode, &found, started);
            } else {
                // A partial dump proves nothing gone: only add what it found.
                for s in found {
                    added += usize::from(table.insert_scanned(s.tuple, s.inode, s.tcp_state, started));
                }
            }
        }
        self.resolve_owners(table);
        added
    }

    /// Whether a resync scan is due at `now`: the kernel lost events since the last one (and
    /// [`RESYNC_MIN_GAP`] has passed), or [`RESYNC_EVERY`] has.
    fn resync_due(&self, now: Instant) -> bool {
        let Some(last) = self.last_scan else {
            return false; // the start-up scan is the caller's
        };
        let since = now.duration_since(last);
        let lost = self.stats.as_ref().map_or(0, |s| s.get().lost);
        since >= RESYNC_EVERY || (lost > self.lost_seen && since >= RESYNC_MIN_GAP)
    }

    /// One sampling round: inbound counters of every tracked socket, owners of new ones,
    /// processes that exited; and a resync scan when one is due.
    pub fn sample(&mut self, table: &Mutex<ConnectionTable>) -> Round {
        let mut round = Round::default();
        if self.resync_due(Instant::now()) {
            let lost = self.stats.as_ref().map_or(0, |s| s.get().lost);
            if lost > self.lost_seen {
                tracing::warn!(
                    lost = lost - self.lost_seen,
                    "kernel events were lost: rescanning every namespace"
                );
            }
            self.lost_seen = lost;
            round.resync_added = Some(self.scan(table));
        }
        let cpu0 = thread_cpu_time();
        let t0 = Instant::now();
        let (tracked, targets) = {
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            let targets = table
                .sample_targets(t0)
                .map(|due| (due, table.namespaces().clone()));
            (table.connection_count(), targets)
        };
        round.tracked = tracked;
        // None: nothing is due (every connection quiet and read lately): nothing to read.
        let samples = targets.map_or_else(Vec::new, |(due, namespaces)| {
            self.read(due, &namespaces, &mut round)
        });
        let unread = std::mem::take(&mut round.unread);
        round.sampled = samples.len();
        let t1 = Instant::now();
        let now = Instant::now();
        {
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            for (tuple, sample) in samples {
                table.apply_sample(&tuple, sample, now);
            }
            if unread {
                table.unread_due();
            }
        }
        let t2 = Instant::now();
        round.owners_found = self.resolve_owners(table);
        round.exited = self.forget_exited(table);
        tracing::debug!(
            tracked = round.tracked,
            sampled = round.sampled,
            look_up_us = (t1 - t0).as_micros() as u64,
            apply_us = (t2 - t1).as_micros() as u64,
            owners_us = t2.elapsed().as_micros() as u64,
            cpu_us = thread_cpu_time().saturating_sub(cpu0).as_micros() as u64,
            "sampling round"
        );
        round
    }

    /// Reads the sockets of `due` (and, from a dump, the others it finds) in their namespaces.
    fn read(&mut self, due: Vec<Tuple>, tracked: &Set<u64>, round: &mut Round) -> Vec<(Tuple, Sample)> {
        let mut by_netns: HashMap<u64, Vec<Tuple>> = HashMap::new();
        for t in due {
            by_netns.entry(t.netns).or_default().push(t);
        }
        // Do not keep namespaces alive (a socket pins its netns) once nothing is tracked there.
        self.sockets.retain(|inode, _| tracked.contains(inode));
        let mut samples = Vec::new();
        for (inode, targets) in by_netns {
            let socket = match self.socket_for(inode) {
                Ok(socket) => socket,
                Err(err) => {
                    tracing::debug!("{err}");
                    round.unread = true;
                    continue;
                }
            };
            let found = match look_up(socket, &targets, DUMP_FROM) {
                Ok(found) => found,
                Err(err) => {
                    tracing::debug!(netns = inode, "sock_diag sampling failed: {err}");
                    round.unread = true;
                    continue;
                }
            };
            for (tuple, info) in found {
                let sample = match info {
                    Some(s) => Sample::Found {
                        inode: s.inode,
                        tcp_state: u32::from(s.state),
                        tcp: s.tcp,
                    },
                    None => Sample::Gone,
                };
                round.gone += usize::from(sample == Sample::Gone);
                samples.push((tuple, sample));
            }
        }
        samples
    }

    fn socket_for(&mut self, inode: u64) -> Result<&DiagSocket> {
        match self.sockets.entry(inode) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => {
                let path = netns::enumerate()
                    .into_iter()
                    .find_map(|(i, path)| (i == inode).then_some(path))
                    .ok_or(Error::NoPath(inode))?;
                let socket = DiagSocket::open_in(&path).map_err(|source| Error::Diag { inode, source })?;
                Ok(e.insert(socket))
            }
        }
    }

    /// Attributes connections that no `connect()` event named, through their socket inode.
    fn resolve_owners(&self, table: &Mutex<ConnectionTable>) -> usize {
        let ownerless = table.lock().unwrap_or_else(PoisonError::into_inner).ownerless();
        let inodes: HashSet<u64> = ownerless.iter().filter_map(|(_, inode)| *inode).collect();
        if inodes.is_empty() {
            return 0;
        }
        let owners = self.procfs.socket_owners(&inodes);
        // Read once per process: one client may hold thousands of the connections.
        let mut infos: HashMap<u32, Option<ProcessInfo>> = HashMap::new();
        let mut found = Vec::new();
        for (tuple, inode) in ownerless {
            // Several processes can share a socket (fork); the lowest pid is usually the one
            // that opened it.
            let Some(pid) = inode
                .and_then(|i| owners.get(&i))
                .and_then(|pids| pids.iter().min())
            else {
                continue;
            };
            let info = infos
                .entry(*pid)
                .or_insert_with(|| match self.procfs.process(*pid) {
                    Ok(info) => Some(info),
                    Err(err) => {
                        tracing::debug!(pid, "owner vanished: {err}");
                        None
                    }
                });
            if let Some(info) = info {
                found.push((tuple, info.clone()));
            }
        }
        let n = found.len();
        if n > 0 {
            table
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .set_owners(found, Instant::now());
        }
        n
    }

    /// Forgets the owners that exited. An owner whose `/proc` entry cannot be read for any
    /// other reason than its absence (out of descriptors, say) is kept as it is, and said.
    fn forget_exited(&mut self, table: &Mutex<ConnectionTable>) -> usize {
        let owners = table.lock().unwrap_or_else(PoisonError::into_inner).owners();
        let mut exited = Vec::new();
        let mut unknown = 0;
        let verdicts = self.exits.check(&self.procfs, &owners);
        for ((pid, _), liveness) in owners.into_iter().zip(verdicts) {
            match liveness {
                Liveness::Exited => exited.push(pid),
                Liveness::Alive => {}
                Liveness::Unknown(err) => {
                    unknown += 1;
                    tracing::debug!(pid, "cannot tell whether the process is alive, keeping it: {err}");
                }
            }
        }
        if unknown > 0 {
            tracing::warn!(
                unknown,
                "cannot read /proc for some clients (see debug logs); what is known about them is kept"
            );
        }
        if !exited.is_empty() {
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            for pid in &exited {
                table.forget_process(*pid, now);
            }
        }
        exited.len()
    }
}

/// CPU time the calling thread has used (what a round costs, whatever else the machine does).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain syscall filling a timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Tracked sockets in one namespace from which it is sampled with dumps filtered on the remote
/// port instead of exact lookups. Measured on a 2-core VM (release build, one namespace):
/// exact lookups cost ~4 µs per socket, a dump ~2.5 µs per matching socket plus a fixed
/// ~0.4 ms per dump for the walk of the kernel's established hash table (every TCP socket of
/// the node, whichever namespace): the dump wins from about 300-500 sockets, and its fixed part
/// grows with the node's other sockets, so it is kept for namespaces with many.
pub const DUMP_FROM: usize = 512;

/// States a tracked socket can be in: all but listeners and request sockets.
const SAMPLED_STATES: u32 = !(1 << tcp_state::LISTEN | 1 << 12);

/// The sockets of one namespace whose sample is due, in their order, as sock_diag reports
/// them now (`None`: gone). Below `dump_from` due sockets, exact lookups of those; from there
/// on, one dump per (family, remote port) among them, which the kernel filters by port: it
/// walks its whole established hash table (a fixed cost per namespace) but builds one reply
/// datagram per ~80 sockets instead of one per socket, and it answers for every other socket
/// to that port too, due or not, at no extra cost: those follow (the table ignores any it
/// does not track).
fn look_up(
    socket: &DiagSocket,
    due: &[Tuple],
    dump_from: usize,
) -> sock_diag::Result<Vec<(Tuple, Option<sock_diag::TcpSocketInfo>)>> {
    if due.len() < dump_from {
        let pairs: Vec<(SocketAddr, SocketAddr)> = due.iter().map(|t| (t.local, t.remote)).collect();
        return Ok(due.iter().copied().zip(socket.lookup_many(&pairs)?).collect());
    }
    let Some(netns) = due.first().map(|t| t.netns) else {
        return Ok(Vec::new());
    };
    let family = |a: &SocketAddr| {
        if a.is_ipv4() {
            libc::AF_INET as u16
        } else {
            libc::AF_INET6 as u16
        }
    };
    let dumps: BTreeSet<(u16, u16)> = due.iter().map(|t| (family(&t.local), t.remote.port())).collect();
    let mut found: Map<_, _> = Map::default();
    for (family, port) in dumps {
        for s in socket.dump_to_port(family, SAMPLED_STATES, port)? {
            found.insert((s.local, s.remote), s);
        }
    }
    let mut samples: Vec<_> = due
        .iter()
        .map(|t| (*t, found.remove(&(t.local, t.remote))))
        .collect();
    samples.extend(found.into_values().map(|s| {
        (
            Tuple {
                netns,
                local: s.local,
                remote: s.remote,
            },
            Some(s),
        )
    }));
    Ok(samples)
}

/// Shared handle used by the agent's tasks.
pub type SharedTable = Arc<Mutex<ConnectionTable>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::netns::{run_in_netns, TestNetns};
    use crate::kernel::programs::KernelCounters;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn rescans_after_lost_events_and_every_few_minutes() {
        let stats = Arc::new(KernelStats::default());
        stats.set(KernelCounters {
            lost: 7,
            ..Default::default()
        });
        let mut sampler = Sampler::new(Procfs::default()).with_kernel_stats(stats.clone());
        let t0 = Instant::now();
        assert!(!sampler.resync_due(t0), "the start-up scan is the caller's");
        sampler.last_scan = Some(t0);
        assert!(
            !sampler.resync_due(t0 + RESYNC_MIN_GAP),
            "losses before start are not ours"
        );
        stats.set(KernelCounters {
            lost: 9,
            ..Default::default()
        });
        assert!(
            !sampler.resync_due(t0 + RESYNC_MIN_GAP / 2),
            "at most one per gap"
        );
        assert!(sampler.resync_due(t0 + RESYNC_MIN_GAP), "events lost: rescan");
        sampler.lost_seen = 9;
        assert!(!sampler.resync_due(t0 + RESYNC_EVERY / 2));
        assert!(sampler.resync_due(t0 + RESYNC_EVERY), "the periodic safety net");
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn dumps_and_lookups_sample_the_same_sockets() {
        let ns = TestNetns::new();
        let inode = netns::netns_inode(&ns.path).expect("netns inode");
        let (listener, clients) = run_in_netns(&ns.path, || {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = listener.local_addr().expect("addr");
            let clients: Vec<TcpStream> = (0..20)
                .map(|_| TcpStream::connect(addr).expect("connect"))
                .collect();
            (listener, clients)
        })
        .expect("enter netns");
        let mut tuples: Vec<Tuple> = clients
            .iter()
            .map(|c| Tuple {
                netns: inode,
                local: c.local_addr().unwrap(),
                remote: c.peer_addr().unwrap(),
            })
            .collect();
        let gone = Tuple {
            remote: SocketAddr::new(tuples[0].remote.ip(), 1),
            ..tuples[0]
        };
        tuples.insert(5, gone);
        let socket = DiagSocket::open_in(&ns.path).expect("sock_diag");
        let by_lookups = look_up(&socket, &tuples, usize::MAX).expect("lookups");
        let by_dumps = look_up(&socket, &tuples, 0).expect("dumps");
        let summary =
            |found: &[(Tuple, Option<sock_diag::TcpSocketInfo>)]| -> Vec<Option<(SocketAddr, u8, bool)>> {
                assert_eq!(
                    found.iter().map(|f| f.0).collect::<Vec<_>>(),
                    tuples,
                    "answers in order"
                );
                found
                    .iter()
                    .map(|(_, f)| f.as_ref().map(|i| (i.local, i.state, i.tcp.is_some())))
                    .collect()
            };
        assert_eq!(summary(&by_lookups), summary(&by_dumps));
        assert!(by_dumps[5].1.is_none(), "the tuple nobody has");
        assert_eq!(by_dumps.iter().filter(|f| f.1.is_some()).count(), 20);
        // Lookups ask only for what is due; a dump answers for those first, in their order,
        // then for every other socket it found (the other 13 clients; the server's side of
        // each connection goes to another port).
        let due: Vec<Tuple> = tuples.iter().step_by(3).copied().collect();
        let looked_up = look_up(&socket, &due, usize::MAX).expect("lookups");
        assert_eq!(looked_up.iter().map(|f| f.0).collect::<Vec<_>>(), due);
        let dumped = look_up(&socket, &due, 1).expect("dumps");
        assert_eq!(
            dumped.iter().map(|f| f.0).take(due.len()).collect::<Vec<_>>(),
            due
        );
        let mut others: Vec<Tuple> = dumped[due.len()..].iter().map(|f| f.0).collect();
        others.sort_by_key(|t| t.local);
        let mut expected: Vec<Tuple> = tuples
            .iter()
            .filter(|t| !due.contains(t) && **t != gone)
            .copied()
            .collect();
        expected.sort_by_key(|t| t.local);
        assert_eq!(others, expected, "the others found, once each");
        assert!(dumped[due.len()..].iter().all(|f| f.1.is_some()));
        drop(listener);
    }
}
