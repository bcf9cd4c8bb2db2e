//! From the kernel's stream records to connections: a Go client's goroutine encodes a
//! request's `:method` and `:path` (header records), then writes the HEADERS frame that opens
//! its stream (a frame record from the same goroutine, naming the socket). The pairing is per
//! (process, goroutine); a frame finds its connection by the socket's kernel address.
//!
//! An OpenSSL client's HTTP/1.1 request comes the same way (its thread in place of the
//! goroutine), as stream 1 of its connection; a new request line on the connection replaces
//! the previous request.
use std::{
    collections::{HashMap, VecDeque},
    time::Instant,
};

use super::{
    gaps::{Gap, GapCause},
    streams::{
        frame, request::Request, Loss, MAX_OPEN_PER_NODE, MAX_OPEN_PER_PROCESS, MAX_PENDING,
        MAX_PENDING_PER_PROCESS, PENDING_TTL,
    },
    ConnId, ConnectionTable,
};

/// How often, at most, the node's bound sweeps out every request past its TTL.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
use crate::kernel::events::{Frame, Header, HeaderField};

/// What one goroutine encoded last.
#[derive(Clone, Debug, Default)]
struct Encoded {
    at: Option<Instant>,
    /// Which note made it: its place in [`Process::order`].
    seq: u64,
    method: Option<String>,
    path: Option<(String, bool)>,
}

/// One process's requests waiting for their HEADERS frame, and the order they came in.
#[derive(Debug, Default)]
struct Process {
    by_goroutine: HashMap<u64, Encoded>,
    /// (goroutine, seq) oldest first; an entry whose seq no longer matches is gone.
    order: VecDeque<(u64, u64)>,
}

impl Process {
    /// Forgets the oldest request still waiting; whether there was one.
    fn evict_oldest(&mut self) -> bool {
        while let Some((g, seq)) = self.order.pop_front() {
            if self.by_goroutine.get(&g).is_some_and(|e| e.seq == seq) {
                self.by_goroutine.remove(&g);
                return true;
            }
        }
        false
    }
}

/// Requests encoded, waiting for their HEADERS frame: at most [`MAX_PENDING_PER_PROCESS`] a
/// process and [`MAX_PENDING`] in all. At a bound the oldest request goes, the process's own
/// at its bound, the oldest of the process holding the most at the node's: one busy binary
/// costs its own requests' names, never another client's.
#[derive(Debug, Default)]
pub(super) struct Pending {
    processes: HashMap<u32, Process>,
    total: usize,
    seq: u64,
    /// Requests forgotten at a bound before their HEADERS frame came.
    pub evicted: u64,
    /// When requests past their TTL were last swept out at the node's bound.
    swept: Option<Instant>,
}

impl Pending {
    fn note(&mut self, h: &Header) {
        self.seq += 1;
        let seq = self.seq;
        let process = self.processes.entry(h.tgid).or_default();
        let known = process.by_goroutine.contains_key(&h.goroutine);
        if !known && process.by_goroutine.len() >= MAX_PENDING_PER_PROCESS && process.evict_oldest() {
            self.total -= 1;
            self.evicted += 1;
        }
        let process = self.processes.get_mut(&h.tgid).expect("inserted above");
        let entry = process.by_goroutine.entry(h.goroutine).or_insert_with(|| {
            self.total += 1;
            Encoded::default()
        });
        // A `:method` starts the next request of this goroutine.
        if h.field == HeaderField::Method {
            *entry = Encoded::default();
        }
        entry.at = Some(h.at);
        entry.seq = seq;
        match h.field {
            HeaderField::Method => entry.method = Some(h.value.clone()),
            HeaderField::Path => entry.path = Some((h.value.clone(), h.cut)),
        }
        process.order.push_back((h.goroutine, seq));
        if process.order.len() > 4 * MAX_PENDING_PER_PROCESS {
            // Superseded places pile up when goroutines write many headers: drop them.
            let live = &process.by_goroutine;
            process
                .order
                .retain(|(g, s)| live.get(g).is_some_and(|e| e.seq == *s));
        }
        while self.total > MAX_PENDING {
            self.evict_at_node_bound(h.at);
        }
    }

    /// Over the node's bound: every request past its TTL goes (a sweep of all of them, at
    /// most once a second: a flood held at the bound must not cost a sweep a header); if none
    /// went, the oldest of the process that holds the most.
    fn evict_at_node_bound(&mut self, now: Instant) {
        let sweep_due = self
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY);
        if sweep_due && self.sweep_expired(now) > 0 {
            return;
        }
        let heaviest = self
            .processes
            .iter_mut()
            .max_by_key(|(_, p)| p.by_goroutine.len())
            .map(|(_, p)| p);
        if let Some(p) = heaviest {
            if p.evict_oldest() {
                self.total -= 1;
                self.evicted += 1;
            }
        }
    }

    /// Forgets every request past its TTL at `now`; how many.
    fn sweep_expired(&mut self, now: Instant) -> usize {
        self.swept = Some(now);
        let cutoff = now.checked_sub(PENDING_TTL);
        let mut expired = 0;
        for p in self.processes.values_mut() {
            let before = p.by_goroutine.len();
            p.by_goroutine
                .retain(|_, e| e.at.zip(cutoff).is_none_or(|(at, cut)| at >= cut));
            expired += before - p.by_goroutine.len();
        }
        self.processes.retain(|_, p| !p.by_goroutine.is_empty());
        self.total -= expired;
        self.evicted += expired as u64;
        expired
    }

    fn take(&mut self, tgid: u32, goroutine: u64, now: Instant) -> Option<Request> {
        let process = self.processes.get_mut(&tgid)?;
        let e = process.by_goroutine.remove(&goroutine)?;
        self.total -= 1;
        if process.by_goroutine.is_empty() {
            self.processes.remove(&tgid);
        }
        if e.at
            .is_some_and(|at| now.saturating_duration_since(at) > PENDING_TTL)
        {
            return None;
        }
        let (path, cut) = e.path?;
        Some(Request::parse(e.method.as_deref().unwrap_or("GET"), &path, cut))
    }

    /// Records of `tgid` were lost: a request of it waiting now may lack a header.
    pub(super) fn forget_process(&mut self, tgid: u32) {
        if let Some(p) = self.processes.remove(&tgid) {
            self.total -= p.by_goroutine.len();
        }
    }

    /// Anyone's records may have been lost.
    pub(super) fn forget_all(&mut self) {
        self.processes.clear();
        self.total = 0;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.processes.values().map(|p| p.by_goroutine.len()).sum()
    }
}

impl ConnectionTable {
    /// Requests waiting for their HEADERS frame (for tests).
    #[cfg(test)]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

impl ConnectionTable {
    /// A request header a Go client encoded.
    pub fn apply_header(&mut self, h: &Header) {
        self.pending.note(h);
    }

    /// A frame a Go client wrote or read (or a marker, see `streams::frame`). Frames of
    /// sockets the table does not know are dropped. Returns the cause when the kernel said it
    /// lost frames of a connection it was following: a gap in that connection's evidence,
    /// for the caller to count.
    pub fn apply_frame(&mut self, f: &Frame) -> Option<GapCause> {
        let request = (f.sent && f.frame_type == frame::HEADERS)
            .then(|| self.pending.take(f.tgid, f.goroutine, f.at))
            .flatten();
        let &id = self.by_sk.get(&f.sk)?;
        let conn = self.conns.get_mut(&id)?;
        if f.http1 {
            conn.streams.http1 = true;
            // Every byte an OpenSSL client reads is seen once its libssl is probed.
            if !conn.streams.reading {
                conn.streams.apply(f.at, false, frame::READING, 0, 0, None);
            }
            // One request at a time: a request line ends the previous request's stream
            // (its response was read whole, or it is abandoned).
            if f.sent && f.frame_type == frame::HEADERS {
                conn.streams
                    .apply(f.at, true, frame::RST_STREAM, 0, f.stream_id, None);
            }
        }
        // Whose streams these are: the socket's owner (what a count walks), else the writer.
        let owner = conn.owner.unwrap_or(f.tgid);
        if conn.streams.opens(f.sent, f.frame_type, f.flags, f.stream_id) {
            self.make_room(owner, id, f.at);
        }
        let conn = self.conns.get_mut(&id)?;
        let (open, dropped) = (conn.streams.open_count(), conn.streams.dropped);
        let lost = conn
            .streams
            .apply(f.at, f.sent, f.frame_type, f.flags, f.stream_id, request)
            .map(|loss| match loss {
                Loss::LostPlace => GapCause::LostPlace,
                Loss::ReaderForgotten => GapCause::ReaderForgotten,
            });
        if let Some(cause) = lost {
            conn.gap = Some(Gap::extended(conn.gap, cause, 1, f.at));
        }
        // The connection's own bound forgot one: said as the process's is.
        let forgotten = conn.streams.dropped - dropped;
        if forgotten > 0 {
            conn.gap = Some(Gap::extended(conn.gap, GapCause::StreamBound, forgotten, f.at));
        }
        let now_open = conn.streams.open_count();
        if now_open != open {
            let count = self.open_streams.entry(owner).or_default();
            count.counted = (count.counted + now_open).saturating_sub(open);
        }
        lost
    }

    /// Connection `conn` left the table: its open streams leave its owner's count.
    pub(super) fn streams_gone(&mut self, conn: &super::Connection) {
        let Some(owner) = conn.owner else { return };
        if let Some(count) = self.open_streams.get_mut(&owner) {
            count.counted = count.counted.saturating_sub(conn.streams.open_count());
        }
    }

    /// A stream of process `tgid` is about to open on connection `id`. At the process's
    /// bound ([`MAX_OPEN_PER_PROCESS`]) one of its own open streams is forgotten first, on
    /// that connection if it holds any, else on the process's fullest: a gap in the evidence
    /// of that connection (`stream_bound`), never a neighbour's. At the node's bound
    /// ([`MAX_OPEN_PER_NODE`]) the process holding the most open streams gives up one of its
    /// own the same way (the one opening, if it is among the fullest): a process below it
    /// never loses a stream to make room.
    fn make_room(&mut self, tgid: u32, id: ConnId, at: Instant) {
        let mut count = self.open_streams.get(&tgid).copied().unwrap_or_default();
        if count.counted >= MAX_OPEN_PER_PROCESS && count.trusted == 0 {
            // The count follows opens, ends and connections leaving; a walk of the table
            // corrects what it may miss (streams of one process written by another), once
            // per RECOUNT_EVERY new streams at the bound: a process opening streams at its
            // bound never makes every stream cost a walk.
            count = OpenCount {
                counted: self.open_of(tgid),
                trusted: RECOUNT_EVERY,
            };
            self.open_streams.insert(tgid, count);
        }
        if count.counted >= MAX_OPEN_PER_PROCESS {
            let forgot = self.forget_one_of(tgid, Some(id), at);
            self.open_streams.insert(
                tgid,
                OpenCount {
                    counted: count.counted - usize::from(forgot),
                    trusted: count.trusted - 1,
                },
            );
        }
        // The node's bound: the sum over the processes that hold streams (a few hundred at
        // most, walked only when a stream opens).
        let total: usize = self.open_streams.values().map(|c| c.counted).sum();
        if total < MAX_OPEN_PER_NODE {
            return;
        }
        let Some(fullest) = self
            .open_streams
            .iter()
            .max_by_key(|&(&pid, c)| (c.counted, pid == tgid))
            .map(|(&pid, _)| pid)
        else {
            return;
        };
        let forgot = self.forget_one_of(fullest, (fullest == tgid).then_some(id), at);
        // Its count ran ahead of its streams if none was there to forget: counted anew.
        let open = (!forgot).then(|| self.open_of(fullest));
        let count = self.open_streams.entry(fullest).or_default();
        match open {
            None => count.counted -= 1,
            Some(open) => {
                *count = OpenCount {
                    counted: open,
                    trusted: RECOUNT_EVERY,
                }
            }
        }
    }

    /// Process `tgid`'s open streams, all its connections walked.
    fn open_of(&self, tgid: u32) -> usize {
        self.connections_of(tgid).map(|c| c.streams.open_count()).sum()
    }

    /// Forgets one open stream of process `tgid`: on connection `here` (one of the process's
    /// own) if it holds one, else on the process's fullest connection. A gap in the evidence
    /// of that connection (`stream_bound`). Whether one was forgotten.
    fn forget_one_of(&mut self, tgid: u32, here: Option<ConnId>, at: Instant) -> bool {
        let here = here.filter(|id| self.conns.get(id).is_some_and(|c| c.streams.open_count() > 0));
        let victim = if here.is_some() {
            here
        } else {
            self.conns
                .iter()
                .filter(|(_, c)| c.owner == Some(tgid))
                .max_by_key(|(_, c)| c.streams.open_count())
                .map(|(v, _)| *v)
        };
        let Some(conn) = victim.and_then(|v| self.conns.get_mut(&v)) else {
            return false;
        };
        let forgot = conn.streams.forget_one();
        if forgot {
            conn.gap = Some(Gap::extended(conn.gap, GapCause::StreamBound, 1, at));
        }
        forgot
    }
}

/// New streams a process at its bound opens between two walks that count its open streams.
const RECOUNT_EVERY: u32 = 64;

/// A process's open streams as the table counts them (opens, ends, its connections leaving),
/// made exact by a walk of its connections now and then at the bound.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OpenCount {
    counted: usize,
    /// New streams still taken at the bound on the last walk's word, without another.
    trusted: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(goroutine: u64, field: HeaderField, value: &str, at: Instant) -> Header {
        Header {
            at,
            tgid: 7,
            goroutine,
            field,
            value: value.into(),
            cut: false,
        }
    }

    #[test]
    fn a_goroutines_method_and_path_pair_with_its_next_headers_frame_only() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.note(&header(1, HeaderField::Method, "GET", t0));
        p.note(&header(2, HeaderField::Method, "PUT", t0));
        p.note(&header(1, HeaderField::Path, "/api/v1/pods?watch=true", t0));
        p.note(&header(2, HeaderField::Path, "/api/v1/nodes/n1", t0));
        let first = p.take(7, 1, t0).expect("goroutine 1's request");
        assert_eq!(first.describe(), "watch pods (all namespaces)");
        assert!(p.take(7, 1, t0).is_none(), "taken once");
        assert!(
            p.take(8, 2, t0).is_none(),
            "another process's goroutine of the same address"
        );
        assert_eq!(p.take(7, 2, t0).unwrap().describe(), "update nodes");
        p.note(&header(3, HeaderField::Path, "/api/v1/pods", t0));
        assert!(
            p.take(7, 3, t0 + PENDING_TTL * 2).is_none(),
            "too old to be this frame's"
        );
    }

    /// An OpenSSL client's HTTP/1.1 messages as the kernel sends them (`ebpf/src/openssl.rs`).
    fn http1(lab: &crate::testkit::Lab, ms: u64, sk: u64, sent: bool, frame_type: u8, flags: u8) -> Frame {
        Frame {
            at: lab.at(ms),
            sk,
            tgid: 7,
            goroutine: 70,
            stream_id: 1,
            frame_type,
            flags,
            length: 100,
            sent,
            http1: true,
        }
    }

    #[test]
    fn an_http1_request_replaces_the_previous_one_and_its_terminator_ends_it() {
        let mut lab = crate::testkit::Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        let request = |lab: &mut crate::testkit::Lab, ms: u64, method: &str, path: &str| {
            let at = lab.at(ms);
            lab.table.apply_header(&Header {
                at,
                tgid: 7,
                goroutine: 70,
                field: HeaderField::Method,
                value: method.into(),
                cut: false,
            });
            lab.table.apply_header(&Header {
                at,
                tgid: 7,
                goroutine: 70,
                field: HeaderField::Path,
                value: path.into(),
                cut: false,
            });
            let f = http1(lab, ms, 0xa, true, frame::HEADERS, 0);
            lab.table.apply_frame(&f);
        };
        let open = |lab: &crate::testkit::Lab| -> Vec<(String, bool, bool)> {
            let conn = lab.table.connections().next().expect("the connection");
            conn.streams
                .open()
                .map(|s| {
                    (
                        s.request.as_ref().map(Request::describe).unwrap_or_default(),
                        s.response_at.is_some(),
                        s.whole,
                    )
                })
                .collect()
        };
        request(&mut lab, 10, "GET", "/api/v1/namespaces/default/pods");
        let f = http1(&lab, 12, 0xa, false, frame::HEADERS, 0);
        lab.table.apply_frame(&f);
        assert_eq!(open(&lab), vec![("list pods in default".to_string(), true, true)]);
        // A plain response has no terminator: the next request line replaces it.
        request(&mut lab, 20, "GET", "/api/v1/pods?timeoutSeconds=5&watch=True");
        assert_eq!(
            open(&lab),
            vec![("watch pods (all namespaces)".to_string(), false, true)]
        );
        let f = http1(&lab, 22, 0xa, false, frame::HEADERS, 0);
        lab.table.apply_frame(&f);
        // The chunked body's terminator ends the watch.
        let f = http1(&lab, 5000, 0xa, false, 0, frame::END_STREAM);
        lab.table.apply_frame(&f);
        assert!(open(&lab).is_empty());
        let conn = lab.table.connections().next().expect("the connection");
        assert_eq!(conn.streams.ended, 2);
    }

    /// A frame of process `tgid` on socket `sk`.
    fn h2(
        lab: &crate::testkit::Lab,
        ms: u64,
        (sk, tgid): (u64, u32),
        sent: bool,
        id: u32,
        flags: u8,
    ) -> Frame {
        Frame {
            at: lab.at(ms),
            sk,
            tgid,
            goroutine: 70,
            stream_id: id,
            frame_type: frame::HEADERS,
            flags,
            length: 10,
            sent,
            http1: false,
        }
    }

    /// Socket `sk`'s connection: its open streams, and its gap (cause, records) if any.
    fn open_and_gap(lab: &crate::testkit::Lab, sk: u64) -> (usize, Option<(GapCause, u64)>) {
        let c = lab
            .table
            .connections()
            .find(|c| c.sk == Some(sk))
            .expect("connection");
        (c.streams.open_count(), c.gap.map(|g| (g.cause, g.records)))
    }

    #[test]
    fn a_process_past_its_stream_bound_forgets_its_own_streams_and_says_so() {
        use crate::table::gaps::GapCause;
        let mut lab = crate::testkit::Lab::new();
        // Process 7 on six connections, a neighbour (8) on one.
        let flooder: Vec<u64> = (0..6).map(|i| 0xa0 + i).collect();
        for (i, sk) in flooder.iter().enumerate() {
            lab.connect(0, *sk, 40000 + i as u16, 7);
        }
        lab.connect(0, 0xb0, 41000, 8);
        let open = open_and_gap;
        let mut ids = [1u32; 7];
        let mut start = |lab: &mut crate::testkit::Lab, conn: usize, n: usize, ms: u64| {
            let sk = if conn == 6 { 0xb0 } else { flooder[conn] };
            let tgid = if conn == 6 { 8 } else { 7 };
            for _ in 0..n {
                let f = h2(lab, ms, (sk, tgid), true, ids[conn], 0);
                lab.table.apply_frame(&f);
                ids[conn] += 2;
            }
        };
        start(&mut lab, 6, 10, 5);
        // 500, 499, 498 and 497 on four connections and the rest on a fifth: the process's
        // bound exactly.
        for conn in 0..4 {
            start(&mut lab, conn, 500 - conn, 10);
        }
        start(&mut lab, 4, MAX_OPEN_PER_PROCESS - 1994, 10);
        assert_eq!(open(&lab, flooder[4]), (54, None));
        // One more on the fifth: one of its own goes, and that connection says so.
        start(&mut lab, 4, 1, 20);
        assert_eq!(open(&lab, flooder[4]), (54, Some((GapCause::StreamBound, 1))));
        // On the sixth, which holds none: the fullest gives up its oldest (stream 1).
        start(&mut lab, 5, 1, 30);
        assert_eq!(open(&lab, flooder[5]), (1, None));
        assert_eq!(open(&lab, flooder[0]), (499, Some((GapCause::StreamBound, 1))));
        for (conn, sk) in flooder.iter().enumerate().take(4).skip(1) {
            assert_eq!(open(&lab, *sk), (500 - conn, None));
        }
        // The neighbour keeps its streams and its whole evidence.
        assert_eq!(open(&lab, 0xb0), (10, None));
        // Streams that end make room again: counted anew, nothing more forgotten.
        for id in (3..=201).step_by(2) {
            let f = h2(&lab, 40, (flooder[0], 7), false, id, frame::END_STREAM);
            lab.table.apply_frame(&f);
        }
        start(&mut lab, 5, 100, 50);
        let total: usize = flooder.iter().map(|sk| open(&lab, *sk).0).sum();
        assert_eq!(total, MAX_OPEN_PER_PROCESS);
        assert_eq!(open(&lab, flooder[0]), (399, Some((GapCause::StreamBound, 1))));
        assert_eq!(open(&lab, flooder[4]), (54, Some((GapCause::StreamBound, 1))));
        assert_eq!(open(&lab, flooder[5]), (101, None));
        // A connection that leaves takes its streams out of the count: room for 499 more.
        lab.close(60, flooder[1], 40001);
        start(&mut lab, 5, 400, 70);
        assert_eq!(open(&lab, flooder[5]), (501, None));
        let total: usize = [0, 2, 3, 4, 5].map(|c| open(&lab, flooder[c]).0).iter().sum();
        assert_eq!(total, MAX_OPEN_PER_PROCESS - 99);
    }

    #[test]
    fn at_the_nodes_stream_bound_the_fullest_process_pays_never_a_smaller_one() {
        use crate::table::{gaps::GapCause, streams::MAX_OPEN};
        let mut lab = crate::testkit::Lab::new();
        let per = MAX_OPEN_PER_PROCESS / MAX_OPEN;
        let fullest = (MAX_OPEN_PER_NODE / MAX_OPEN_PER_PROCESS) as u32;
        // Eight processes, each at its own bound on four connections: the node's bound.
        let mut port = 40000;
        let mut sks = Vec::new();
        for tgid in 10..10 + fullest {
            for c in 0..per as u64 {
                let sk = u64::from(tgid) << 8 | c;
                lab.connect(0, sk, port, tgid);
                port += 1;
                for i in 0..MAX_OPEN as u32 {
                    lab.table
                        .apply_frame(&h2(&lab, 10, (sk, tgid), true, 2 * i + 1, 0));
                }
                sks.push((tgid, sk));
            }
        }
        let state = open_and_gap;
        let held = |lab: &crate::testkit::Lab, tgid: u32| -> usize {
            sks.iter()
                .filter(|(t, _)| *t == tgid)
                .map(|(_, sk)| state(lab, *sk).0)
                .sum()
        };
        for tgid in 10..10 + fullest {
            assert_eq!(
                held(&lab, tgid),
                MAX_OPEN_PER_PROCESS,
                "nothing forgotten below the bounds"
            );
        }
        // A small neighbour opens ten: it keeps them all; the fullest give up one each.
        lab.connect(20, 0xbee, 50000, 99);
        for i in 0..10u32 {
            lab.table
                .apply_frame(&h2(&lab, 20, (0xbee, 99), true, 2 * i + 1, 0));
        }
        assert_eq!(state(&lab, 0xbee), (10, None), "the neighbour keeps its streams");
        let counts: Vec<usize> = (10..10 + fullest).map(|t| held(&lab, t)).collect();
        assert_eq!(counts.iter().sum::<usize>() + 10, MAX_OPEN_PER_NODE, "{counts:?}");
        let (least, most) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(
            most - least <= 1,
            "the fullest paid, one each in turn: {counts:?}"
        );
        let gaps: u64 = sks
            .iter()
            .filter_map(|(_, sk)| state(&lab, *sk).1)
            .map(|(cause, records)| {
                assert_eq!(cause, GapCause::StreamBound);
                records
            })
            .sum();
        assert_eq!(gaps, 10, "each forgotten stream said as a gap of its connection");
        // One of the fullest opening more pays itself, in a tie too: nobody else loses one.
        let opener = 10 + counts.iter().position(|c| c == most).unwrap() as u32;
        let &(_, osk) = sks.iter().find(|(t, _)| *t == opener).unwrap();
        for i in 0..5u32 {
            lab.table
                .apply_frame(&h2(&lab, 30, (osk, opener), true, 5001 + 2 * i, 0));
        }
        let after: Vec<usize> = (10..10 + fullest).map(|t| held(&lab, t)).collect();
        assert_eq!(after, counts, "{opener} forgot its own");
        assert_eq!(state(&lab, 0xbee), (10, None));
    }

    #[test]
    fn a_connection_past_its_stream_bound_says_what_it_forgot() {
        use crate::table::{gaps::GapCause, streams::MAX_OPEN};
        let mut lab = crate::testkit::Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        for i in 0..MAX_OPEN as u32 + 88 {
            let f = h2(&lab, 10, (0xa, 7), true, 2 * i + 1, 0);
            lab.table.apply_frame(&f);
        }
        let c = lab.table.connections().next().expect("the connection");
        assert_eq!(c.streams.open_count(), MAX_OPEN);
        assert_eq!(
            c.gap.map(|g| (g.cause, g.records)),
            Some((GapCause::StreamBound, 88))
        );
    }

    /// The kernel losing its place on a followed connection is a gap of that connection,
    /// said to the caller to count; the neighbour's evidence stays whole.
    #[test]
    fn a_lost_place_is_that_connections_gap_and_is_counted() {
        use crate::table::gaps::GapCause;
        let mut lab = crate::testkit::Lab::new();
        lab.connect(0, 0xa, 40000, 7);
        lab.connect(0, 0xb, 40001, 8);
        for sk in [(0xa, 7), (0xb, 8)] {
            assert_eq!(lab.table.apply_frame(&h2(&lab, 10, sk, true, 1, 0)), None);
        }
        let lost = Frame {
            frame_type: frame::LOST_PLACE,
            stream_id: 0,
            ..h2(&lab, 20, (0xa, 7), true, 0, 0)
        };
        assert_eq!(lab.table.apply_frame(&lost), Some(GapCause::LostPlace));
        let gaps: Vec<_> = lab
            .table
            .connections()
            .map(|c| (c.tuple.local.port(), c.gap.map(|g| (g.cause, g.records))))
            .collect();
        assert!(
            gaps.contains(&(40000, Some((GapCause::LostPlace, 1)))),
            "{gaps:?}"
        );
        assert!(gaps.contains(&(40001, None)), "{gaps:?}");
    }

    fn of(tgid: u32, goroutine: u64, path: &str, at: Instant) -> Header {
        Header {
            tgid,
            ..header(goroutine, HeaderField::Path, path, at)
        }
    }

    #[test]
    fn one_flooding_process_costs_its_own_requests_never_another_clients() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        // A quiet client's request, waiting for its HEADERS frame.
        p.note(&of(7, 1, "/api/v1/pods?watch=true", t0));
        // A flood of requests never sent, from another process: ten times its bound.
        for g in 0..(MAX_PENDING_PER_PROCESS as u64 * 10) {
            p.note(&of(9, 1000 + g, "/api/v1/configmaps", t0));
            assert!(p.len() <= MAX_PENDING_PER_PROCESS + 1);
        }
        assert_eq!(p.evicted, MAX_PENDING_PER_PROCESS as u64 * 9);
        assert_eq!(p.total, p.len());
        // The flooder keeps its newest requests, the quiet client its own.
        let newest = 1000 + MAX_PENDING_PER_PROCESS as u64 * 10 - 1;
        assert!(p.take(9, newest, t0).is_some());
        assert!(p.take(9, 1000, t0).is_none(), "the flooder's oldest went first");
        assert_eq!(
            p.take(7, 1, t0).unwrap().describe(),
            "watch pods (all namespaces)"
        );
    }

    #[test]
    fn the_node_bound_takes_the_heaviest_process_oldest_first() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        p.note(&of(7, 1, "/api/v1/pods?watch=true", t0));
        // Many processes, each within its own bound, together past the node's.
        let per = MAX_PENDING_PER_PROCESS as u64 - 1;
        let processes = (MAX_PENDING as u64 / per) + 2;
        for tgid in 0..processes {
            for g in 0..per {
                p.note(&of(
                    100 + tgid as u32,
                    g,
                    "/api/v1/nodes",
                    t0 + std::time::Duration::from_millis(g),
                ));
                assert!(p.total <= MAX_PENDING);
            }
        }
        assert_eq!(p.total, p.len());
        assert!(p.evicted > 0);
        assert!(p.take(7, 1, t0).is_some(), "the lone client's request stays");
        // Past their TTL, the old ones go together when the bound is reached again.
        let later = t0 + PENDING_TTL * 2;
        p.note(&of(8, 1, "/api/v1/pods", later));
        for g in 0..per {
            p.note(&of(100, 10_000 + g, "/api/v1/nodes", later));
        }
        assert!(p.take(8, 1, later).is_some());
    }

    #[test]
    fn a_goroutines_next_method_replaces_its_request_without_growing() {
        let t0 = Instant::now();
        let mut p = Pending::default();
        for _ in 0..(MAX_PENDING_PER_PROCESS * 8) {
            p.note(&header(1, HeaderField::Method, "GET", t0));
            p.note(&header(1, HeaderField::Path, "/api/v1/pods", t0));
        }
        assert_eq!((p.len(), p.total, p.evicted), (1, 1, 0));
        assert!(p.processes[&7].order.len() <= 4 * MAX_PENDING_PER_PROCESS + 1);
    }
}
