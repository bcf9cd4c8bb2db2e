//! The sock_diag side of the connection table: the start-up scan that finds connections older
//! than the agent, the once-a-second sampling of `tcp_info` for *tracked sockets only* (exact
//! lookups by 4-tuple in the socket's own network namespace, so the cost grows with the
//! number of apiserver connections, never with the node's other traffic), owner resolution
//! through `/proc/*/fd` for sockets no `connect()` event named, and the liveness check that
//! forgets processes that exited.
use std::{
    collections::{hash_map::Entry, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use lifeline_common::tcp_state;

use crate::{
    netns,
    process::{Liveness, Procfs},
    sock_diag::{self, DiagSocket},
    table::{ConnectionTable, Sample, Scanned, Tuple},
};

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
    sockets: HashMap<u64, DiagSocket>,
}

/// What one sampling round did (for logs and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub sampled: usize,
    pub gone: usize,
    pub owners_found: usize,
    pub exited: usize,
}

impl Sampler {
    pub fn new(procfs: Procfs) -> Self {
        Self {
            procfs,
            sockets: HashMap::new(),
        }
    }

    /// Finds every watched connection that already exists, in every network namespace, and
    /// adds it to the table (the table skips ones that kernel events already reported).
    /// Returns how many were added.
    pub fn scan(&mut self, table: &Mutex<ConnectionTable>) -> usize {
        let mut added = 0;
        for (inode, path) in netns::enumerate() {
            let socket = match DiagSocket::open_in(&path) {
                Ok(socket) => socket,
                Err(err) => {
                    tracing::warn!(netns = inode, path = %path.display(), "cannot scan namespace: {err}");
                    continue;
                }
            };
            let started = Instant::now();
            let mut found = Vec::new();
            let mut complete = true;
            for family in [libc::AF_INET as u16, libc::AF_INET6 as u16] {
                match socket.dump(family, WATCHED_STATES) {
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
                        tracing::warn!(netns = inode, family, "sock_diag dump failed: {err}");
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

    /// One sampling round: inbound counters of every tracked socket, owners of new ones,
    /// processes that exited.
    pub fn sample(&mut self, table: &Mutex<ConnectionTable>) -> Round {
        let mut round = Round::default();
        let targets = table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sample_targets();
        let mut by_netns: HashMap<u64, Vec<Tuple>> = HashMap::new();
        for t in targets {
            by_netns.entry(t.netns).or_default().push(t);
        }
        // Do not keep namespaces alive (a socket pins its netns) once nothing is tracked there.
        self.sockets.retain(|inode, _| by_netns.contains_key(inode));
        let mut samples = Vec::new();
        for (inode, tuples) in by_netns {
            let socket = match self.socket_for(inode) {
                Ok(socket) => socket,
                Err(err) => {
                    tracing::debug!("{err}");
                    continue;
                }
            };
            for tuple in tuples {
                let sample = match socket.lookup(tuple.local, tuple.remote) {
                    Ok(Some(s)) => Sample::Found {
                        inode: s.inode,
                        tcp_state: u32::from(s.state),
                        tcp: s.tcp,
                    },
                    Ok(None) => Sample::Gone,
                    Err(err) => {
                        tracing::debug!(netns = inode, "sock_diag lookup failed: {err}");
                        continue;
                    }
                };
                round.gone += usize::from(sample == Sample::Gone);
                samples.push((tuple, sample));
            }
        }
        round.sampled = samples.len();
        let now = Instant::now();
        {
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            for (tuple, sample) in samples {
                table.apply_sample(&tuple, sample, now);
            }
        }
        round.owners_found = self.resolve_owners(table);
        round.exited = self.forget_exited(table);
        round
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
        let mut found = 0;
        for (tuple, inode) in ownerless {
            // Several processes can share a socket (fork); the lowest pid is usually the one
            // that opened it.
            let Some(pid) = inode
                .and_then(|i| owners.get(&i))
                .and_then(|pids| pids.iter().min())
            else {
                continue;
            };
            match self.procfs.process(*pid) {
                Ok(info) => {
                    table
                        .lock()
                        .expect("table lock")
                        .set_owner(&tuple, info, Instant::now());
                    found += 1;
                }
                Err(err) => tracing::debug!(pid, "owner vanished: {err}"),
            }
        }
        found
    }

    /// Forgets the owners that exited. An owner whose `/proc` entry cannot be read for any
    /// other reason than its absence (out of descriptors, say) is kept as it is, and said.
    fn forget_exited(&self, table: &Mutex<ConnectionTable>) -> usize {
        let owners = table.lock().unwrap_or_else(PoisonError::into_inner).owners();
        let mut exited = Vec::new();
        let mut unknown = 0;
        for (pid, start) in owners {
            match self.procfs.liveness(pid, start) {
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

/// Shared handle used by the agent's tasks.
pub type SharedTable = Arc<Mutex<ConnectionTable>>;
