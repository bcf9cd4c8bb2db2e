//! The event pump: kernel events → connection table, on a thread of its own.
//!
//! It never runs on the tokio runtime that serves `/healthz`: under any event rate the HTTP
//! side keeps its two worker threads. Events are taken from the ring in batches of up to
//! [`BATCH`]: decoded and their owners resolved without the table lock, then applied under one
//! lock, so the sampler and the HTTP handlers wait at most one batch. Owners are cached for
//! [`OWNER_TTL`], so a process that opens 10,000 connections costs one `/proc` read, not
//! 10,000.
//!
//! Once a second it also reads the connect failures the kernel aggregated for processes over
//! their event budget (see `lifeline_common::CONNECT_BUDGET`), the records the kernel lost per
//! socket or process (`LOSSES`: each charged to the connections it concerned, see
//! `table/gaps.rs`), and the kernel's counters, which it publishes in [`KernelStats`] (the
//! sampler rescans when `lost` grows).
use std::{
    collections::HashMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::maps::{MapData, PerCpuHashMap, RingBuf};
use lifeline_common::{FailureKey, LossKey, AF_INET, AF_INET6};

use crate::{
    act::metrics::Metrics,
    app::workers::Refresher,
    cluster::Cluster,
    host::process::{ProcessInfo, Procfs},
    kernel::{
        events::{self, Change, MonotonicClock, Record},
        golang::GoTracer,
        programs::{KernelFeed, KernelStats, Probes},
    },
    table::sampler::SharedTable,
    table::{
        gaps::{GapCause, GapScope},
        Applied, FailureReason,
    },
};

/// Most events applied under one lock of the table.
pub const BATCH: usize = 1024;
/// How long a resolved owner (or the absence of one) is reused.
pub const OWNER_TTL: Duration = Duration::from_secs(1);
/// Owners cached at most (processes that connected within [`OWNER_TTL`]).
const OWNER_CACHE_MAX: usize = 4096;
/// Longest a record may wait in the ring. Segment and stream records do not wake the pump
/// (ebpf `lazy_wakeup`): nothing waits for one sooner, since the once-a-second judgement times
/// them by their kernel timestamps. A wakeup per segment cost a busy node's 600 answers a
/// second a context switch each, most of the agent's CPU; a wakeup per stream record cost the
/// probed client ~13 µs in its own thread (the interrupt taken inside the probe, on this VM).
/// Connects, state changes, retransmits and execs force a wakeup (`URGENT_WAKEUP`), even behind
/// unread records; a drain applies everything in ring order.
pub const DRAIN_EVERY: Duration = Duration::from_millis(250);
/// How often aggregated failures and counters are read (and the stop flag checked when no
/// event comes).
pub const TICK: Duration = Duration::from_secs(1);

/// What the pump writes to and reads from besides the kernel.
pub struct PumpContext {
    pub table: SharedTable,
    pub metrics: Arc<Metrics>,
    pub procfs: Procfs,
    pub cluster: Option<Cluster>,
    pub probes: Arc<Mutex<Probes>>,
    pub stats: Arc<KernelStats>,
    /// Told after every drain that changed the table, so clients are judged at once.
    pub refresher: Refresher,
    /// The Go probes' files, told of every process that starts running a program (None: the
    /// exec records are not sent, or there are no Go probes).
    pub go_at_start: Option<Arc<Mutex<GoTracer>>>,
}

/// The running pump; dropping it stops the thread (within [`TICK`]).
pub struct Pump {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    pub fn spawn(feed: KernelFeed, ctx: PumpContext) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            clock: MonotonicClock::new(),
            owners: OwnerCache::new(ctx.procfs.clone()),
            failures_seen: HashMap::new(),
            losses_seen: HashMap::new(),
            loss_log: HashMap::new(),
            stop: stop.clone(),
            feed,
            ctx,
        };
        let thread = std::thread::Builder::new()
            .name("event-pump".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Worker {
    clock: MonotonicClock,
    owners: OwnerCache,
    /// Last value read of every `FAILURES` entry (the kernel's counts only grow).
    failures_seen: HashMap<FailureKey, u64>,
    /// Last value read of every `LOSSES` entry.
    losses_seen: HashMap<LossKey, u64>,
    /// Per cause and scope: when losses were last logged, and what came since unlogged.
    loss_log: HashMap<(GapCause, &'static str), LossLog>,
    stop: Arc<AtomicBool>,
    feed: KernelFeed,
    ctx: PumpContext,
}

impl Worker {
    fn run(mut self) {
        let mut next_tick = Instant::now() + TICK;
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next_tick {
                // Events first: a process's first connects (sent) teach the table the process
                // before its aggregated failures are recorded.
                self.drain();
                self.tick(now);
                next_tick = now + TICK;
            }
            let wait = next_tick.saturating_duration_since(now).min(DRAIN_EVERY);
            match wait_readable(&self.feed.events, wait) {
                Ok(true) => self.drain(),
                Ok(false) => {}
                Err(err) => {
                    tracing::error!("waiting for kernel events: {err}");
                    std::thread::sleep(TICK);
                }
            }
        }
    }

    /// Applies everything in the ring, one batch per table lock.
    fn drain(&mut self) {
        let mut records = Vec::with_capacity(BATCH);
        let mut started: Vec<(u32, Instant)> = Vec::new();
        let mut changed = false;
        loop {
            records.clear();
            started.clear();
            take_batch(&mut self.feed.events, &self.clock, &mut records, &mut started);
            if records.is_empty() && started.is_empty() {
                break;
            }
            // First: a process that has just started sends its first request within ms.
            self.foresee(&started);
            changed |= self.apply(&records);
        }
        if changed {
            self.ctx.refresher.request();
        }
    }

    /// Processes that have just started running a program: the Go probes go on a client-go
    /// binary now, before its first request (`kernel/probed.rs`, `foresee`).
    fn foresee(&mut self, started: &[(u32, Instant)]) {
        let Some(go) = &self.ctx.go_at_start else {
            return;
        };
        for &(pid, exec) in started {
            let mut go = go.lock().unwrap_or_else(PoisonError::into_inner);
            let done = go.foresee(&self.ctx.probes, pid, exec, Instant::now());
            if done.probed + done.failed + done.passed > 0 {
                self.ctx.metrics.count_probed_files("go", done, go.counts());
            }
        }
    }

    /// Applies `records` in ring order under one lock of the table: a socket's records and its
    /// streams' interleave (a connection is established before its first frame, its last
    /// frames come before its close, and its socket's address may be another connection's
    /// after that), and stream and segment records are drained together, lazily, up to
    /// [`DRAIN_EVERY`] after they were sent. True when a record changed more than what the
    /// once-a-second judgement times anyway (segments and streams only move requests and
    /// answers: judging after each would cost a snapshot per segment of a busy client).
    fn apply(&mut self, records: &[Record]) -> bool {
        if records.is_empty() {
            return false;
        }
        let now = Instant::now();
        // Owners are read from /proc before the lock (cached per process).
        let owners: Vec<Option<ProcessInfo>> = records
            .iter()
            .map(|record| match record {
                Record::Socket(ev) => ev.owner_tgid.and_then(|tgid| self.owners.get(tgid, now)),
                _ => None,
            })
            .collect();
        let mut counted = Vec::new();
        let mut lost: HashMap<GapCause, u64> = HashMap::new();
        let (mut changes, mut retransmits, mut segments, mut streams) = (0, 0, 0, 0);
        {
            let mut table = self.ctx.table.lock().unwrap_or_else(PoisonError::into_inner);
            for (record, owner) in records.iter().zip(owners) {
                let ev = match record {
                    Record::Socket(ev) => ev,
                    Record::Frame(f) => {
                        streams += 1;
                        if let Some(cause) = table.apply_frame(f) {
                            *lost.entry(cause).or_default() += 1;
                        }
                        continue;
                    }
                    Record::Header(h) => {
                        streams += 1;
                        table.apply_header(h);
                        continue;
                    }
                    Record::Exec { .. } => continue,
                };
                match ev.change {
                    Change::Retransmit { .. } => retransmits += 1,
                    Change::Segment { .. } => segments += 1,
                    _ => changes += 1,
                }
                let (pid, endpoint, reason) = match table.apply_event(ev, owner) {
                    Some(Applied::Retransmit {
                        pid: Some(pid),
                        endpoint,
                    }) => (pid, endpoint, None),
                    Some(Applied::ConnectFailed {
                        pid,
                        endpoint,
                        reason,
                    }) => (pid, endpoint, Some(reason)),
                    Some(Applied::Retransmit { pid: None, .. }) | None => continue,
                };
                if let Some(p) = table.process(pid) {
                    counted.push((self.labels(&p.info), endpoint, reason));
                }
            }
        }
        let m = &self.ctx.metrics;
        for (kind, n) in [
            ("state_change", changes),
            ("segment", segments),
            ("retransmit", retransmits),
            ("stream", streams),
        ] {
            if n > 0 {
                m.ebpf_events.with_label_values(&[kind]).inc_by(n);
            }
        }
        // Frames the kernel said it lost on a connection it followed: one per occurrence.
        for (cause, n) in lost {
            m.ebpf_records_dropped
                .with_label_values(&[cause.as_str(), GapScope::SOCKET])
                .inc_by(n);
        }
        for (labels, endpoint, reason) in counted {
            match reason {
                None => m.count_retransmit(&labels, &endpoint.to_string()),
                Some(reason) => m.count_connect_failure(&labels, &endpoint.to_string(), reason.as_str()),
            }
        }
        changes + retransmits > 0
    }

    /// Once a second: failures the kernel aggregated, the records it lost, and its counters.
    fn tick(&mut self, now: Instant) {
        match read_failures(&self.feed.failures, &mut self.failures_seen) {
            Ok(fresh) if !fresh.is_empty() => self.record_failures(&fresh, now),
            Ok(_) => {}
            Err(err) => tracing::warn!("reading aggregated connect failures: {err}"),
        }
        match read_losses(&mut self.feed.losses, &mut self.losses_seen) {
            Ok(fresh) if !fresh.is_empty() => self.record_losses(&fresh, now),
            Ok(_) => {}
            // Unread losses: anyone's evidence may have a gap.
            Err(err) => {
                tracing::warn!(
                    "reading the kernel's lost records: {err}; every connection's waits are dropped"
                );
                self.evidence_lost(GapScope::Node, GapCause::Unscoped, 0, now);
            }
        }
        match self
            .ctx
            .probes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counters()
        {
            Ok(c) => {
                let before = self.ctx.stats.get();
                let lost = c.lost.saturating_sub(before.lost);
                if lost > 0 {
                    self.ctx.metrics.ebpf_events_lost.inc_by(lost);
                    tracing::warn!(
                        lost,
                        "the kernel lost events (ring buffer full); the sampler rescans to heal the table"
                    );
                }
                let unscoped = c.unscoped.saturating_sub(before.unscoped);
                if unscoped > 0 {
                    self.ctx
                        .metrics
                        .ebpf_records_dropped
                        .with_label_values(&["unknown", "node"])
                        .inc_by(unscoped);
                    let touched = self.evidence_lost(GapScope::Node, GapCause::Unscoped, unscoped, now);
                    tracing::warn!(
                        unscoped,
                        touched,
                        "the kernel lost records it could not charge to a socket or process (its map of losses was full): every connection's waits are dropped"
                    );
                }
                self.ctx.stats.set(c)
            }
            Err(err) => tracing::warn!("reading kernel counters: {err}"),
        }
    }

    /// Charges the records the kernel lost to the connections they concerned, and counts them.
    fn record_losses(&mut self, fresh: &[(LossKey, u64)], now: Instant) {
        let mut summary: HashMap<(GapCause, &'static str), (u64, usize)> = HashMap::new();
        for (key, records) in fresh {
            let Some(cause) = GapCause::from_kernel(key.cause) else {
                tracing::warn!(
                    cause = key.cause,
                    "a lost-record count with an unknown cause; read as anyone's"
                );
                self.evidence_lost(GapScope::Node, GapCause::Unscoped, *records, now);
                continue;
            };
            let scope = loss_scope(key);
            let touched = self.evidence_lost(scope, cause, *records, now);
            self.ctx
                .metrics
                .ebpf_records_dropped
                .with_label_values(&[cause.as_str(), scope.as_str()])
                .inc_by(*records);
            let entry = summary.entry((cause, scope.as_str())).or_default();
            entry.0 += records;
            entry.1 += touched;
        }
        for ((cause, scope), (records, touched)) in summary {
            let log = self.loss_log.entry((cause, scope)).or_default();
            log.records += records;
            log.connections = log.connections.max(touched);
            if log
                .logged
                .is_some_and(|at| now.saturating_duration_since(at) < LOSS_LOG_EVERY)
            {
                continue;
            }
            tracing::warn!(
                cause = cause.as_str(),
                scope,
                records = log.records,
                connections = log.connections,
                "the kernel lost records (counted since this was last said, at most once a minute): the connections they concerned forget what was pending"
            );
            *log = LossLog {
                logged: Some(now),
                ..LossLog::default()
            };
        }
    }

    fn evidence_lost(&self, scope: GapScope, cause: GapCause, records: u64, now: Instant) -> usize {
        self.ctx
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .evidence_lost(scope, cause, records, now)
    }

    /// Hands the failures counted in the kernel to the table and the metrics. Those of a
    /// process the table does not know (it exited before its first connect event was applied)
    /// are dropped with it.
    fn record_failures(&mut self, fresh: &[(FailureKey, u64)], now: Instant) {
        let mut counted = Vec::new();
        {
            let mut table = self.ctx.table.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, count) in fresh {
                let Some(endpoint) = table.endpoints().matching(failure_remote(key)) else {
                    continue;
                };
                // The kernel aggregates only connects that ended (sk_err set, or given up on).
                let reason = FailureReason::from_errno(key.sk_err as i32, true);
                let count = u32::try_from(*count).unwrap_or(u32::MAX);
                table.record_connect_failures(key.tgid, endpoint, reason, count, now);
                if let Some(p) = table.process(key.tgid) {
                    counted.push((self.labels(&p.info), endpoint, reason, count));
                }
            }
        }
        for (labels, endpoint, reason, count) in counted {
            self.ctx
                .metrics
                .count_connect_failures(&labels, &endpoint.to_string(), reason.as_str(), count);
        }
    }

    /// Metric labels of a process: namespace, pod, container (empty outside Kubernetes), comm.
    fn labels(&self, info: &ProcessInfo) -> [String; 4] {
        match crate::cluster::pod_of(self.ctx.cluster.as_ref(), info) {
            Some(p) => [p.namespace, p.pod, p.container, info.comm.clone()],
            None => [String::new(), String::new(), String::new(), info.comm.clone()],
        }
    }
}

/// Decodes up to [`BATCH`] records from the ring: processes that began running a program into
/// `started`, every other record into `records`, in ring order.
fn take_batch(
    ring: &mut RingBuf<MapData>,
    clock: &MonotonicClock,
    records: &mut Vec<Record>,
    started: &mut Vec<(u32, Instant)>,
) {
    while records.len() + started.len() < BATCH {
        let Some(item) = ring.next() else { return };
        let decoded = events::decode_record(&item, clock);
        drop(item);
        match decoded {
            Ok(Record::Exec { tgid, at }) => started.push((tgid, at)),
            Ok(record) => records.push(record),
            Err(err) => tracing::warn!("dropping a kernel event: {err}"),
        }
    }
}

/// Waits until the ring has data or `timeout` passes; true when it has data.
fn wait_readable(ring: &RingBuf<MapData>, timeout: Duration) -> io::Result<bool> {
    let mut fd = libc::pollfd {
        fd: ring.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = poll_millis(timeout);
    // SAFETY: one valid pollfd for the duration of the call.
    match unsafe { libc::poll(&mut fd, 1, ms) } {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => Ok(false),
                _ => Err(err),
            }
        }
    }
}

/// `timeout` in poll(2)'s whole milliseconds, rounded up: rounded down, the last millisecond
/// before a tick would be a loop of polls that return at once (a spin of ~1 ms every second,
/// most of an idle agent's CPU).
fn poll_millis(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

/// The counts that grew since the last read, as `(key, growth)`; `seen` becomes the current
/// values (entries the kernel evicted are forgotten, so `seen` stays as small as the map).
fn read_failures(
    map: &PerCpuHashMap<MapData, FailureKey, u64>,
    seen: &mut HashMap<FailureKey, u64>,
) -> Result<Vec<(FailureKey, u64)>, aya::maps::MapError> {
    let current = per_cpu_sums(map, seen.len())?;
    let fresh = growth(seen, &current);
    *seen = current;
    Ok(fresh)
}

/// How often the losses of one cause and scope are logged at most (they are counted in the
/// metrics and shown per client in the API at once).
const LOSS_LOG_EVERY: Duration = Duration::from_secs(60);

/// Losses of one cause and scope not logged yet.
#[derive(Default)]
struct LossLog {
    logged: Option<Instant>,
    records: u64,
    /// The most connections one read touched.
    connections: usize,
}

/// Reads every `LOSSES` entry (summed over CPUs): what grew since `seen`. An entry that did not
/// grow since the last read is removed, so the map keeps room for new scopes; a loss counted
/// between this read and the removal is missed (a window of microseconds, once per idle key).
fn read_losses(
    map: &mut PerCpuHashMap<MapData, LossKey, u64>,
    seen: &mut HashMap<LossKey, u64>,
) -> Result<Vec<(LossKey, u64)>, aya::maps::MapError> {
    let mut current = per_cpu_sums(map, seen.len())?;
    let fresh = growth(seen, &current);
    for (key, count) in &current {
        if seen.get(key) == Some(count) {
            // Idle for a whole tick: gone from the map, and from what was seen.
            let _ = map.remove(key);
        }
    }
    current.retain(|key, count| seen.get(key) != Some(count));
    *seen = current;
    Ok(fresh)
}

/// Whose records a `LOSSES` key counts, as precisely as the kernel knew.
fn loss_scope(key: &LossKey) -> GapScope {
    if key.sk != 0 {
        GapScope::Socket {
            sk: key.sk,
            tgid: key.tgid,
        }
    } else if key.tgid != 0 {
        GapScope::Process(key.tgid)
    } else {
        GapScope::Node
    }
}

/// Every entry of a per-CPU count map, summed over CPUs.
fn per_cpu_sums<K: aya::Pod + Eq + std::hash::Hash>(
    map: &PerCpuHashMap<MapData, K, u64>,
    capacity: usize,
) -> Result<HashMap<K, u64>, aya::maps::MapError> {
    let mut sums = HashMap::with_capacity(capacity);
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        sums.insert(key, per_cpu.iter().sum());
    }
    Ok(sums)
}

/// What each count grew by from `before` to `after`. A count below its old value was evicted
/// and started again: all of it is new.
fn growth<K: Copy + Eq + std::hash::Hash>(
    before: &HashMap<K, u64>,
    after: &HashMap<K, u64>,
) -> Vec<(K, u64)> {
    after
        .iter()
        .filter_map(|(key, &now)| {
            let old = before.get(key).copied().unwrap_or(0);
            let grew = if now >= old { now - old } else { now };
            (grew > 0).then_some((*key, grew))
        })
        .collect()
}

/// The destination of an aggregated failure, in the socket's own form (like events).
fn failure_remote(key: &FailureKey) -> SocketAddr {
    let ip = match key.family {
        AF_INET => IpAddr::V4(Ipv4Addr::new(
            key.daddr[0],
            key.daddr[1],
            key.daddr[2],
            key.daddr[3],
        )),
        AF_INET6 => IpAddr::V6(Ipv6Addr::from(key.daddr)),
        _ => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, key.dport)
}

/// Resolved owners by tgid, each reused for [`OWNER_TTL`].
struct OwnerCache {
    procfs: Procfs,
    cache: HashMap<u32, (Instant, Option<ProcessInfo>)>,
}

impl OwnerCache {
    fn new(procfs: Procfs) -> Self {
        Self {
            procfs,
            cache: HashMap::new(),
        }
    }

    fn get(&mut self, tgid: u32, now: Instant) -> Option<ProcessInfo> {
        if let Some((at, info)) = self.cache.get(&tgid) {
            if now.duration_since(*at) < OWNER_TTL {
                return info.clone();
            }
        }
        let info = self.procfs.process(tgid).ok();
        if self.cache.len() >= OWNER_CACHE_MAX {
            self.cache
                .retain(|_, (at, _)| now.duration_since(*at) < OWNER_TTL);
        }
        if self.cache.len() < OWNER_CACHE_MAX {
            self.cache.insert(tgid, (now, info.clone()));
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, sk_err: i32) -> FailureKey {
        let mut daddr = [0; 16];
        daddr[..4].copy_from_slice(&[10, 96, 0, 1]);
        FailureKey {
            tgid,
            netns: 1,
            sk_err: sk_err as u32,
            family: AF_INET,
            dport: 443,
            daddr,
        }
    }

    #[test]
    fn a_wait_shorter_than_a_millisecond_still_sleeps() {
        assert_eq!(
            poll_millis(Duration::from_micros(300)),
            1,
            "not a poll that returns at once"
        );
        assert_eq!(poll_millis(Duration::from_micros(1_001)), 2);
        assert_eq!(poll_millis(Duration::from_millis(250)), 250);
        assert_eq!(
            poll_millis(Duration::ZERO),
            0,
            "a tick already due is not waited for"
        );
        assert_eq!(poll_millis(Duration::MAX), i32::MAX);
    }

    #[test]
    fn growth_counts_only_what_is_new() {
        let a = key(1, libc::ECONNREFUSED);
        let b = key(2, libc::ETIMEDOUT);
        let c = key(3, libc::ECONNREFUSED);
        let before = HashMap::from([(a, 10), (b, 5)]);
        let after = HashMap::from([(a, 25), (b, 5), (c, 3)]);
        let mut grew = growth(&before, &after);
        grew.sort_by_key(|(k, _)| k.tgid);
        assert_eq!(grew, vec![(a, 15), (c, 3)], "b did not grow; c is new");
        // Evicted and started again: a count below the old one is all new.
        let restarted = HashMap::from([(a, 4)]);
        assert_eq!(growth(&after, &restarted), vec![(a, 4)]);
    }

    #[test]
    fn a_loss_is_charged_to_the_most_precise_scope_the_kernel_had() {
        let loss = |sk, tgid| LossKey {
            sk,
            tgid,
            cause: lifeline_common::loss_cause::RING_FULL,
            _pad: [0; 5],
        };
        assert_eq!(loss_scope(&loss(0xa, 7)), GapScope::Socket { sk: 0xa, tgid: 7 });
        assert_eq!(loss_scope(&loss(0, 7)), GapScope::Process(7));
        assert_eq!(loss_scope(&loss(0, 0)), GapScope::Node);
    }

    #[test]
    fn failure_destination_keeps_the_socket_family() {
        assert_eq!(
            failure_remote(&key(1, 0)),
            "10.96.0.1:443".parse::<SocketAddr>().unwrap()
        );
        let mut mapped = key(1, 0);
        mapped.family = AF_INET6;
        mapped.daddr = Ipv4Addr::new(10, 96, 0, 1).to_ipv6_mapped().octets();
        assert_eq!(
            failure_remote(&mapped),
            "[::ffff:10.96.0.1]:443".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn owners_are_cached_for_their_ttl() {
        let me = std::process::id();
        let mut cache = OwnerCache::new(Procfs::default());
        let t0 = Instant::now();
        let first = cache.get(me, t0).expect("own process");
        assert_eq!(first.pid, me);
        // A cached entry is returned without reading /proc: a fake one proves it.
        cache.cache.insert(me, (t0, None));
        assert_eq!(cache.get(me, t0 + OWNER_TTL / 2), None);
        assert_eq!(
            cache.get(me, t0 + OWNER_TTL).map(|p| p.pid),
            Some(me),
            "expired: read again"
        );
    }
}
