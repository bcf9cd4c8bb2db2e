//! sock_diag scans merged into the connection table: a namespace's sockets reconciled with
//! what the table holds (`reconcile_scan`), a socket found at start-up (`insert_scanned`), and
//! the owners of scanned connections, found through their socket inodes (`ownerless`,
//! `set_owners`).
use std::{
    collections::{BTreeSet, HashMap},
    net::SocketAddr,
    time::Instant,
};

use lifeline_common::tcp_state;

use super::{process::end_of, ConnId, Connection, ConnectionTable, Map, Origin, Scanned, Tuple};
use crate::host::process::ProcessInfo;

impl ConnectionTable {
    /// Merges a scan of one network namespace: every socket to a watched endpoint that
    /// exists there now, taken after `started`. Adds what is missing (connections older than
    /// the agent, or whose events were lost), applies state changes whose events were lost
    /// (a socket found in CLOSE_WAIT was closed by the peer), and removes entries the scan
    /// proves gone (older than the scan, not found). Returns how many entries were added.
    pub fn reconcile_scan(&mut self, netns: u64, found: &[Scanned], started: Instant) -> usize {
        self.upcoming = None;
        let mut added = 0;
        let mut present = std::collections::HashSet::new();
        // What this scan added: a connect whose event came first may be one of them.
        let mut new = Vec::new();
        for s in found.iter().filter(|s| s.tuple.netns == netns) {
            let Some(endpoint) = self.endpoints.matching(s.tuple.remote) else {
                continue;
            };
            present.insert(s.tuple);
            match self.by_tuple.get(&s.tuple).copied() {
                Some(id) => {
                    let conn = self.conns.get_mut(&id).expect("indexed");
                    conn.inode = Some(s.inode).filter(|i| *i != 0).or(conn.inode);
                    conn.vanished_at = None;
                    let old = conn.tcp_state;
                    if old != s.tcp_state {
                        conn.tcp_state = s.tcp_state;
                        if let Some(end) = end_of(old, s.tcp_state, 0) {
                            self.end_connection(id, Some(end), started);
                        }
                        if let Some(pid) = self.conns[&id].owner {
                            self.update_connected(pid, started);
                        }
                    }
                }
                None => {
                    let id = self.insert(s.tuple, endpoint, Origin::Scan, started);
                    let conn = self.conns.get_mut(&id).expect("inserted");
                    conn.inode = Some(s.inode).filter(|i| *i != 0);
                    conn.tcp_state = s.tcp_state;
                    added += 1;
                    new.push(id);
                }
            }
        }
        added -= self.merge_connects(netns, &new, started);
        // Entries of this namespace older than the scan that it did not find are gone; a
        // connect whose port was never learned (its events were lost) too.
        let gone: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.tuple.netns == netns && c.first_seen < started && !present.contains(&c.tuple))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(conn) = self.unlink(id) {
                if let Some(pid) = conn.owner {
                    self.update_connected(pid, started);
                }
            }
        }
        added
    }

    /// Connects of namespace `netns` whose entry still lacks its port (an entry is made at
    /// the connect, when the kernel has not chosen it yet, and takes its tuple at the
    /// establishment or failure) met by a scan that found them in SYN_SENT: the scan added
    /// each as a new entry (among `added`), unowned, and would remove the connect's as unseen,
    /// so that a failure of the connect after the scan was nobody's. Where one such connect
    /// and one added socket share a remote address, and that socket is in SYN_SENT, they are
    /// one socket: the connect's entry takes the tuple (keeping its owner and socket address,
    /// gaining the inode) and the added entry goes. Where more sockets to one remote are new
    /// to the table (several connects at once, or one established whose event is still on its
    /// way), which is which is not known: left as before. Returns how many added entries went.
    fn merge_connects(&mut self, netns: u64, added: &[ConnId], started: Instant) -> usize {
        let connect_of = |conns: &Map<ConnId, Connection>, id: &ConnId| {
            conns
                .get(id)
                .filter(|c| c.tcp_state == tcp_state::SYN_SENT)
                .map(|c| c.tuple)
        };
        if !added.iter().any(|id| connect_of(&self.conns, id).is_some()) {
            return 0;
        }
        let mut connecting: HashMap<SocketAddr, Vec<ConnId>> = HashMap::new();
        for (id, c) in &self.conns {
            if c.tuple.netns == netns
                && c.first_seen < started
                && c.tuple.local.port() == 0
                && c.tcp_state == tcp_state::SYN_SENT
            {
                connecting.entry(c.tuple.remote).or_default().push(*id);
            }
        }
        let mut found: HashMap<SocketAddr, Vec<ConnId>> = HashMap::new();
        for id in added {
            if let Some(c) = self.conns.get(id) {
                found.entry(c.tuple.remote).or_default().push(*id);
            }
        }
        let mut merged = 0;
        for (remote, scanned) in found {
            let (Some([connect]), [scanned]) =
                (connecting.get(&remote).map(Vec::as_slice), scanned.as_slice())
            else {
                continue;
            };
            let Some(tuple) = connect_of(&self.conns, scanned) else {
                continue;
            };
            self.retuple(*connect, tuple, started);
            merged += 1;
        }
        merged
    }

    /// Adds a connection found by a scan unless it is already known (the start-up scan of one
    /// socket; [`Self::reconcile_scan`] merges a whole namespace).
    pub fn insert_scanned(&mut self, tuple: Tuple, inode: u64, tcp_state: u32, now: Instant) -> bool {
        self.upcoming = None;
        if self.by_tuple.contains_key(&tuple) {
            return false;
        }
        let Some(endpoint) = self.endpoints.matching(tuple.remote) else {
            return false;
        };
        let id = self.insert(tuple, endpoint, Origin::Scan, now);
        let conn = self.conns.get_mut(&id).expect("inserted");
        conn.inode = Some(inode).filter(|i| *i != 0);
        conn.tcp_state = tcp_state;
        true
    }

    /// Connections whose owner is not known yet, with their socket inode when known: from
    /// the table's index of them, not a walk.
    pub fn ownerless(&self) -> Vec<(Tuple, Option<u64>)> {
        self.ownerless
            .iter()
            .filter_map(|id| self.conns.get(id))
            .filter(|c| c.owner.is_none())
            .map(|c| (c.tuple, c.inode))
            .collect()
    }

    /// Sets the owner of the connection with this tuple (found through its socket inode).
    #[cfg(test)]
    pub fn set_owner(&mut self, tuple: &Tuple, info: ProcessInfo, now: Instant) {
        self.set_owners(vec![(*tuple, info)], now);
    }

    /// Sets the owners of connections found through their socket inodes, then re-derives
    /// what each owner holds once, not once per connection (a controller's thousands of
    /// connections found by the start-up scan).
    pub fn set_owners(&mut self, found: Vec<(Tuple, ProcessInfo)>, now: Instant) {
        let mut touched = BTreeSet::new();
        for (tuple, info) in found {
            let Some(&id) = self.by_tuple.get(&tuple) else {
                continue;
            };
            if Some(info.pid) == self.own_pid {
                self.unlink(id);
                continue;
            }
            touched.insert(info.pid);
            self.attach_owner(id, info, now);
        }
        for pid in touched {
            self.update_connected(pid, now);
        }
    }
}
