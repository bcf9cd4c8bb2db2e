//! Loads and attaches the kernel programs and owns their maps. Dropping [`Probes`] detaches
//! every program (the links belong to the loaded objects).
//!
//! Two objects: the full programs (`ebpf/src/main.rs`) and, attached in front of them, the
//! filter (`ebpf/src/filter.rs`, see `filter.rs` here) that tail-calls them for the endpoints'
//! ports only. When the filter cannot be used (more than [`filter::PORT_SLOTS`] ports, or it
//! fails to load), the full programs are attached directly: their own first test is a port
//! bitmap in a map, a little more expensive per call.
//!
//! [`Probes`] is the one owner of the loaded programs: every method on them is here. The
//! client uprobe sets (`go_probes.rs`, `ssl_probes.rs`) are functions of the eBPF object it
//! calls, over `uprobes.rs` and `object.rs`; none of them imports this file.
use std::{
    collections::{BTreeSet, HashSet},
    num::NonZeroU32,
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::{
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{
        tp_btf::BtfTracePointLinkId, trace_point::TracePointLinkId, BtfTracePoint, ProgramFd, RawTracePoint,
        TracePoint,
    },
    Ebpf, EbpfLoader,
};
use lifeline_common::{counter, EndpointKey, FailureKey, KernelOffsets, LossKey, MAX_ENDPOINTS, PORT_WORDS};

use super::{
    filter::{self, Filter},
    go_probes::{self, Sites},
    object::{program_of, Error, Result},
    ssl_probes,
    uprobes::{self, Links},
};
use crate::endpoint::{Endpoint, EndpointSet};

/// The full programs' object, built from `ebpf/` by the build script (the filter's is
/// [`filter::FILTER_OBJECT`]).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lifeline"));

/// The tracepoints lifeline attaches to: (program name, category, tracepoint).
pub const TRACEPOINTS: [(&str, &str, &str); 2] = [
    ("inet_sock_set_state", "sock", "inet_sock_set_state"),
    ("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb"),
];

/// The segment program: a typed (BTF) raw tracepoint on `tcp_probe` (program and tracepoint
/// share the name), attached while an endpoint is watched. Raw, so that the kernel builds no
/// record for the node's other segments; typed, so that its first test loads the socket's
/// destination port directly, without a helper call.
pub const SEGMENTS: &str = "tcp_probe";

/// The raw tracepoint that remembers errors reported on connecting sockets (program and
/// tracepoint share the name): optional, see [`Probes::load`].
pub const ERROR_REPORT: &str = "inet_sk_error_report";
/// What a kernel without [`ERROR_REPORT`] (5.10) costs.
const ERROR_REPORT_COST: &str = "failed connects ended by an ICMP error the process read first are counted as reason \"timeout\", not \"unreachable\"";

/// Size of the event ring buffer. An event takes 120 bytes in it, so it holds ~35,000: a burst
/// of 10,000 connects (two events each: connect, established) fits whole even while the
/// pump is not scheduled. The kernel allocates it at load; pages the agent has read count in
/// its RSS only once a burst has reached them.
pub const RING_BYTES: u32 = 4 << 20;

/// Counters kept by the kernel programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub sent: u64,
    pub lost: u64,
    /// Connects held back by a process's budget (sent later if they connected).
    pub deferred: u64,
    /// Held-back connects that failed, counted in the `FAILURES` map instead of sent.
    pub aggregated: u64,
    /// Lost records that the `LOSSES` map had no room to say whose they were.
    pub unscoped: u64,
}

/// The kernel's counters as the pump last read them.
#[derive(Debug, Default)]
pub struct KernelStats {
    sent: AtomicU64,
    lost: AtomicU64,
    deferred: AtomicU64,
    aggregated: AtomicU64,
    unscoped: AtomicU64,
}

impl KernelStats {
    pub fn get(&self) -> KernelCounters {
        KernelCounters {
            sent: self.sent.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
            aggregated: self.aggregated.load(Ordering::Relaxed),
            unscoped: self.unscoped.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn set(&self, c: KernelCounters) {
        self.sent.store(c.sent, Ordering::Relaxed);
        self.lost.store(c.lost, Ordering::Relaxed);
        self.deferred.store(c.deferred, Ordering::Relaxed);
        self.aggregated.store(c.aggregated, Ordering::Relaxed);
        self.unscoped.store(c.unscoped, Ordering::Relaxed);
    }
}

/// What the event pump reads from the kernel: the ring of events, the map of failed
/// connects counted there, and the map of records lost per scope and cause.
pub struct KernelFeed {
    pub events: RingBuf<MapData>,
    pub failures: PerCpuHashMap<MapData, FailureKey, u64>,
    pub losses: PerCpuHashMap<MapData, LossKey, u64>,
}

/// Loads and attaches [`ERROR_REPORT`] for the programs' lifetime.
fn attach_error_report(ebpf: &mut Ebpf, offsets: &KernelOffsets) -> Result<()> {
    let name = ERROR_REPORT;
    if offsets.sk_buff_cb == 0 {
        return Err(Error::Missing {
            kind: "kernel BTF offset for",
            name,
        });
    }
    let program: &mut RawTracePoint = program_of(ebpf, name)?;
    program.load().map_err(|source| Error::Program { name, source })?;
    program
        .attach(name)
        .map_err(|source| Error::Program { name, source })?;
    Ok(())
}

/// Loads [`SEGMENTS`] as a typed (BTF) tracepoint. Its load needs the id of the tracepoint's
/// type in the kernel's BTF, which aya finds by parsing the whole of it: ~16 ms and ~20 MiB of
/// heap once at start (released after; the rest of the agent reads BTF with its own small
/// reader, `offsets.rs`).
fn load_segments(ebpf: &mut Ebpf) -> Result<()> {
    let name = SEGMENTS;
    let btf = aya::Btf::from_sys_fs().map_err(|source| Error::Btf { name, source })?;
    let program: &mut BtfTracePoint = program_of(ebpf, name)?;
    program
        .load(name, &btf)
        .map_err(|source| Error::Program { name, source })
}

/// How the full programs are reached.
enum Attachment {
    /// Nothing watched (no endpoint): nothing attached.
    None,
    /// Through the filter, which tail-calls them.
    Filter(Filter),
    /// Attached to the tracepoints themselves (link ids in [`TRACEPOINTS`] order).
    Direct(Vec<TracePointLinkId>),
}

impl Attachment {
    pub fn describe(&self) -> String {
        match self {
            Attachment::None => "nothing attached".into(),
            Attachment::Filter(f) if f.segments() => {
                format!("filter on ports {:?} in front, segments included", f.ports())
            }
            Attachment::Filter(f) => format!("filter on ports {:?} in front", f.ports()),
            Attachment::Direct(_) => "full programs attached directly".into(),
        }
    }
}

/// The loaded, attached programs and the maps userspace keeps using.
pub struct Probes {
    // Field order: maps before the object, so they are released before the programs detach.
    endpoints: LpmTrie<MapData, EndpointKey, u8>,
    ports: Array<MapData, u64>,
    counters: PerCpuArray<MapData, u64>,
    installed: BTreeSet<Endpoint>,
    attachment: Attachment,
    /// The segment program's link while an endpoint is watched.
    segments: Option<BtfTracePointLinkId>,
    offsets: KernelOffsets,
    _logger_task: Option<tokio::task::JoinHandle<()>>,
    /// Whether [`ERROR_REPORT`] is attached; why not, else.
    error_report: std::result::Result<(), String>,
    /// Whether the Go-client uprobes loaded (see `go_probes.rs`); why not, else.
    go_loaded: std::result::Result<(), String>,
    /// Whether the OpenSSL-client uprobes loaded (see `ssl_probes.rs`); why not, else.
    ssl_loaded: std::result::Result<(), String>,
    /// Client processes with OpenSSL-client uprobes of their own attached.
    ssl_processes: usize,
    /// Whether a process whose binary is probed as it starts is held still until its probes
    /// are in (`host/hold.rs`); set by [`attach_exec`](Self::attach_exec).
    hold_starts: bool,
    ebpf: Ebpf,
}

impl Probes {
    /// Loads the programs with this kernel's offsets; they are attached by
    /// [`set_endpoints`](Self::set_endpoints). Returns what the event pump reads. Must be called
    /// inside a tokio runtime (kernel log messages are forwarded by a task).
    pub fn load(offsets: &KernelOffsets, stream_budget: u32) -> Result<(Self, KernelFeed)> {
        if EBPF_OBJECT.is_empty() {
            return Err(Error::NoObject);
        }
        // No kernel BTF for the loader: the programs use no CO-RE relocation (offsets come in
        // through OFFSETS) and attach to plain tracepoints, and parsing vmlinux BTF costs
        // ~100 ms and several MiB of heap that glibc keeps.
        let mut ebpf = EbpfLoader::new()
            .btf(None)
            .override_global("OFFSETS", offsets, true)
            .override_global("STREAM_BUDGET_PER_SECOND", &stream_budget, true)
            .map_max_entries("EVENTS", RING_BYTES)
            .load(EBPF_OBJECT)
            .map_err(Error::Load)?;
        let logger_task = forward_kernel_logs(&mut ebpf);
        for (name, _, _) in TRACEPOINTS {
            let program: &mut TracePoint = program_of(&mut ebpf, name)?;
            program.load().map_err(|source| Error::Program { name, source })?;
        }
        load_segments(&mut ebpf)?;
        // Rare events (socket errors) that only tell the reason of a failed connect: without it
        // an ICMP unreachable that the process read before closing is reported as a timeout.
        let error_report = attach_error_report(&mut ebpf, offsets).map_err(|err| {
            let why = crate::error::chain(&err);
            tracing::warn!("{why}; {ERROR_REPORT_COST}");
            why
        });
        // The Go-client uprobes: loaded now, attached per binary of a client later. A kernel
        // that refuses them keeps the connection-level judgement for every client.
        let go_loaded = go_probes::load(&mut ebpf).map_err(|err| {
            let why = crate::error::chain(&err);
            tracing::warn!("Go clients' streams are not followed: {why}");
            why
        });
        let ssl_loaded = ssl_probes::load(&mut ebpf).map_err(|err| {
            let why = crate::error::chain(&err);
            tracing::warn!("OpenSSL clients' requests are not followed: {why}");
            why
        });
        let endpoints = take_map(&mut ebpf, "ENDPOINTS", LpmTrie::try_from)?;
        let ports = take_map(&mut ebpf, "WATCHED_PORTS", Array::try_from)?;
        let counters = take_map(&mut ebpf, "COUNTERS", PerCpuArray::try_from)?;
        let events = take_map(&mut ebpf, "EVENTS", RingBuf::try_from)?;
        let failures = take_map(&mut ebpf, "FAILURES", PerCpuHashMap::try_from)?;
        let losses = take_map(&mut ebpf, "LOSSES", PerCpuHashMap::try_from)?;
        let probes = Self {
            endpoints,
            ports,
            counters,
            installed: BTreeSet::new(),
            attachment: Attachment::None,
            segments: None,
            offsets: *offsets,
            _logger_task: logger_task,
            error_report,
            go_loaded,
            ssl_loaded,
            ssl_processes: 0,
            hold_starts: false,
            ebpf,
        };
        Ok((
            probes,
            KernelFeed {
                events,
                failures,
                losses,
            },
        ))
    }

    /// How the programs are attached now (for logs and `lifeline check`).
    pub fn attachment(&self) -> String {
        self.attachment.describe()
    }

    /// What the optional programs this kernel refused cost the judgement, one sentence each
    /// (for `lifeline check`); empty when all of them run.
    pub fn degradations(&self) -> Vec<String> {
        [
            (&self.error_report, ERROR_REPORT, ERROR_REPORT_COST),
            (
                &self.go_loaded,
                "the Go-client uprobes",
                "Go clients' streams are not followed: their connections are judged by the kernel's connection evidence only",
            ),
            (
                &self.ssl_loaded,
                "the OpenSSL-client uprobes",
                "OpenSSL clients' requests are not followed: their connections are judged by the kernel's connection evidence only",
            ),
        ]
        .into_iter()
        .filter_map(|(loaded, what, cost)| {
            loaded
                .as_ref()
                .err()
                .map(|why| format!("{what} not available ({why}): {cost}"))
        })
        .collect()
    }

    /// Attaches the programs the way `ports` allows: the filter in front when it can hold
    /// them, else the full programs directly; nothing when there is no port. A new attachment
    /// goes in before the old one comes out, so no event is missed in between.
    fn attach_for(&mut self, ports: &BTreeSet<u16>) -> Result<()> {
        let current = match &self.attachment {
            Attachment::Filter(f) => Some(f.ports()),
            _ => None,
        };
        if current == Some(ports) || (ports.is_empty() && matches!(self.attachment, Attachment::None)) {
            return Ok(());
        }
        let next = if ports.is_empty() {
            Attachment::None
        } else {
            match self.load_filter(ports) {
                Ok(f) => Attachment::Filter(f),
                Err(err) => {
                    if ports.len() <= filter::PORT_SLOTS {
                        tracing::warn!(
                            "the port filter is not usable ({}); attaching the full programs directly",
                            crate::error::chain(&err)
                        );
                    }
                    match &self.attachment {
                        Attachment::Direct(_) => return Ok(()),
                        _ => Attachment::Direct(self.attach_direct()?),
                    }
                }
            }
        };
        // The segment program directly unless the new filter takes segments: attached before
        // the old filter goes, detached once the new one is in.
        let filtered = matches!(&next, Attachment::Filter(f) if f.segments());
        self.attach_segments(!ports.is_empty() && !filtered)?;
        let old = std::mem::replace(&mut self.attachment, next);
        if let Attachment::Direct(links) = old {
            self.detach_direct(links)?;
        }
        tracing::info!("kernel programs: {}", self.attachment.describe());
        Ok(())
    }

    fn load_filter(&self, ports: &BTreeSet<u16>) -> Result<Filter, filter::Error> {
        let fd = |name: &'static str| -> Result<&ProgramFd, filter::Error> {
            let program = self
                .ebpf
                .program(name)
                .ok_or(filter::Error::Elf("a full program is missing"))?;
            program
                .fd()
                .map_err(|source| filter::Error::Program { name, source })
        };
        let offsets = [
            self.offsets.set_state.dport,
            self.offsets.retransmit.dport,
            self.offsets.segment.skc_dport,
        ];
        let targets = filter::Targets {
            set_state: fd(TRACEPOINTS[0].0)?,
            retransmit: fd(TRACEPOINTS[1].0)?,
            segments: fd(SEGMENTS).ok(),
        };
        Filter::attach(filter::FILTER_OBJECT, offsets, ports, targets)
    }

    /// Attaches the segment program (`on`) or detaches it; nothing when it already is so.
    fn attach_segments(&mut self, on: bool) -> Result<()> {
        let name = SEGMENTS;
        let program: &mut BtfTracePoint = program_of(&mut self.ebpf, name)?;
        match (on, self.segments.take()) {
            (true, None) => {
                let link = program
                    .attach()
                    .map_err(|source| Error::Program { name, source })?;
                self.segments = Some(link);
            }
            (false, Some(link)) => program
                .detach(link)
                .map_err(|source| Error::Program { name, source })?,
            (_, link) => self.segments = link,
        }
        Ok(())
    }

    fn tracepoint(&mut self, name: &'static str) -> Result<&mut TracePoint> {
        program_of(&mut self.ebpf, name)
    }

    fn attach_direct(&mut self) -> Result<Vec<TracePointLinkId>> {
        TRACEPOINTS
            .iter()
            .map(|(name, category, tracepoint)| {
                self.tracepoint(name)?
                    .attach(category, tracepoint)
                    .map_err(|source| Error::Program { name, source })
            })
            .collect()
    }

    fn detach_direct(&mut self, links: Vec<TracePointLinkId>) -> Result<()> {
        for ((name, _, _), link) in TRACEPOINTS.iter().zip(links) {
            self.tracepoint(name)?
                .detach(link)
                .map_err(|source| Error::Program { name, source })?;
        }
        Ok(())
    }

    /// Makes the kernel's endpoint map equal to `set`: removes what is gone, adds what is new,
    /// then updates the port bitmap and the attachment. All or nothing for the map: a set
    /// larger than the map is refused before the map is touched, and if the kernel refuses a
    /// change midway, the changes made so far are undone, so the map still holds the previous
    /// set. (A port bit without an address only sends the programs to an LPM lookup that
    /// fails.)
    pub fn set_endpoints(&mut self, set: &EndpointSet) -> Result<()> {
        let wanted: BTreeSet<Endpoint> = set.iter().map(|(e, _)| *e).collect();
        if wanted.len() > MAX_ENDPOINTS as usize {
            return Err(Error::Capacity { wanted: wanted.len() });
        }
        self.apply(wanted)
    }

    /// Removes, adds, and undoes both if the kernel refuses a change.
    fn apply(&mut self, wanted: BTreeSet<Endpoint>) -> Result<()> {
        let gone: Vec<Endpoint> = self.installed.difference(&wanted).copied().collect();
        let new: Vec<Endpoint> = wanted.difference(&self.installed).copied().collect();
        let mut removed = Vec::new();
        let mut added = Vec::new();
        let result = (|| {
            for e in &gone {
                self.remove(e)?;
                removed.push(*e);
            }
            for e in &new {
                self.insert(e)?;
                added.push(*e);
            }
            Ok(())
        })();
        if let Err(err) = result {
            for e in &added {
                if let Err(undo) = self.remove(e) {
                    tracing::error!(endpoint = %e, "rolling back the endpoint map: {undo}");
                }
            }
            for e in &removed {
                if let Err(undo) = self.insert(e) {
                    tracing::error!(endpoint = %e, "rolling back the endpoint map: {undo}");
                }
            }
            return Err(err);
        }
        let old_ports = port_bitmap(&self.installed);
        let new_ports = port_bitmap(&wanted);
        let port_set: BTreeSet<u16> = wanted.iter().map(|e| e.port).collect();
        self.installed = wanted;
        for (index, (old, new)) in old_ports.iter().zip(&new_ports).enumerate() {
            if old != new {
                self.ports
                    .set(index as u32, new, 0)
                    .map_err(|source| Error::Map {
                        name: "WATCHED_PORTS",
                        source,
                    })?;
            }
        }
        self.attach_for(&port_set)
    }

    /// Endpoints in the kernel map now.
    #[cfg(test)]
    pub fn installed(&self) -> &BTreeSet<Endpoint> {
        &self.installed
    }

    fn insert(&mut self, e: &Endpoint) -> Result<()> {
        let (bits, data) = e.kernel_key();
        self.endpoints
            .insert(&Key::new(bits, data), 1, 0)
            .map_err(|source| Error::Map {
                name: "ENDPOINTS",
                source,
            })
    }

    fn remove(&mut self, e: &Endpoint) -> Result<()> {
        let (bits, data) = e.kernel_key();
        match self.endpoints.remove(&Key::new(bits, data)) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(Error::Map {
                name: "ENDPOINTS",
                source,
            }),
        }
    }

    /// How many keys the kernel map holds (walks it: for tests, not hot paths).
    #[cfg(test)]
    pub fn map_len(&self) -> usize {
        self.endpoints.keys().filter(std::result::Result::is_ok).count()
    }

    pub fn counters(&self) -> Result<KernelCounters> {
        let sum = |index: u32| -> Result<u64> {
            let values = self.counters.get(&index, 0).map_err(|source| Error::Map {
                name: "COUNTERS",
                source,
            })?;
            Ok(values.iter().sum())
        };
        Ok(KernelCounters {
            sent: sum(counter::SENT)?,
            lost: sum(counter::LOST)?,
            deferred: sum(counter::DEFERRED)?,
            aggregated: sum(counter::AGGREGATED)?,
            unscoped: sum(counter::UNSCOPED)?,
        })
    }
}

/// The client uprobes (Go, OpenSSL): each set says what it loads and where it attaches
/// (`go_probes.rs`, `ssl_probes.rs`); the loaded object is this owner's.
impl Probes {
    /// Why the Go-client programs cannot be used, if they cannot.
    pub fn go_unavailable(&self) -> Option<&str> {
        self.go_loaded.as_ref().err().map(String::as_str)
    }

    /// Attaches the exec tracepoint ([`go_probes::EXEC`]): from then on the pump hears of
    /// every process that begins running a program. With `hold`, a process whose binary is
    /// probed as it starts is held still until its probes are in.
    pub fn attach_exec(&mut self, hold: bool) -> Result<()> {
        if let Err(why) = &self.go_loaded {
            return Err(Error::GoUnavailable(why.clone()));
        }
        go_probes::attach_exec(&mut self.ebpf)?;
        self.hold_starts = hold;
        Ok(())
    }

    /// Whether a process whose binary is probed as it starts is held still meanwhile.
    pub fn holds_starts(&self) -> bool {
        self.hold_starts
    }

    /// Attaches every site in `binary` (all processes that run it): all or nothing.
    pub fn attach_go(&mut self, binary: &Path, sites: &Sites) -> Result<Links> {
        if let Err(why) = &self.go_loaded {
            return Err(Error::GoUnavailable(why.clone()));
        }
        go_probes::attach(&mut self.ebpf, binary, sites)
    }

    /// Why the OpenSSL-client programs cannot be used, if they cannot.
    pub fn ssl_unavailable(&self) -> Option<&str> {
        self.ssl_loaded.as_ref().err().map(String::as_str)
    }

    /// Attaches every site in `library` for client process `pid` alone: all or nothing. Give
    /// them back to [`detach_ssl`](Self::detach_ssl).
    pub fn attach_ssl(&mut self, library: &Path, pid: NonZeroU32) -> Result<Links> {
        if let Err(why) = &self.ssl_loaded {
            return Err(Error::SslUnavailable(why.clone()));
        }
        let links = ssl_probes::attach(&mut self.ebpf, library, pid)?;
        self.ssl_processes += 1;
        Ok(links)
    }

    /// Client processes with OpenSSL-client uprobes of their own attached.
    pub fn ssl_processes(&self) -> usize {
        self.ssl_processes
    }

    /// Detaches one process's OpenSSL-client uprobes ([`attach_ssl`](Self::attach_ssl)).
    pub fn detach_ssl(&mut self, links: Links) {
        self.ssl_processes = self.ssl_processes.saturating_sub(1);
        self.detach_uprobes(links);
    }

    /// Attaches the probe that binds client process `pid`'s `SSL *`s older than its probes to
    /// `libc`'s `read` and `write`, for that process alone: all or nothing. Give them back to
    /// [`detach_uprobes`](Self::detach_uprobes).
    pub fn attach_ssl_binding(&mut self, libc: &Path, pid: NonZeroU32) -> Result<Links> {
        if let Err(why) = &self.ssl_loaded {
            return Err(Error::SslUnavailable(why.clone()));
        }
        ssl_probes::attach_binding(&mut self.ebpf, libc, pid)
    }

    /// The processes with an SSL call on an `SSL *` of unknown descriptor that began at or
    /// after `since_ns` (kernel monotonic time): their binding probe would bind it.
    pub fn ssl_unbound_since(&self, since_ns: u64) -> HashSet<u32> {
        ssl_probes::unbound_since(&self.ebpf, since_ns)
    }

    /// Detaches uprobes ([`attach_go`](Self::attach_go),
    /// [`attach_ssl_binding`](Self::attach_ssl_binding)).
    pub fn detach_uprobes(&mut self, links: Links) {
        uprobes::detach(&mut self.ebpf, links);
    }
}

/// The `WATCHED_PORTS` words for a set of endpoints.
pub fn port_bitmap<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint>) -> Vec<u64> {
    let mut words = vec![0u64; PORT_WORDS as usize];
    for e in endpoints {
        words[usize::from(e.port / 64)] |= 1 << (e.port % 64);
    }
    words
}

fn take_map<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> std::result::Result<M, MapError>,
) -> Result<M> {
    let map = ebpf.take_map(name).ok_or(Error::Missing { kind: "map", name })?;
    convert(map).map_err(|source| Error::Map { name, source })
}

/// The programs log only on unexpected failures (never on hot paths); forward those to tracing.
fn forward_kernel_logs(ebpf: &mut Ebpf) -> Option<tokio::task::JoinHandle<()>> {
    let logger = match aya_log::EbpfLogger::init(ebpf) {
        Ok(logger) => logger,
        Err(err) => {
            tracing::debug!("kernel log forwarding not available: {err}");
            return None;
        }
    };
    let mut fd = super::readable_fd(logger).ok()?;
    Some(tokio::spawn(async move {
        while let Ok(mut guard) = fd.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        endpoint::Source,
        kernel::{offsets, removals},
    };

    fn set(range: std::ops::Range<u32>) -> EndpointSet {
        let mut set = EndpointSet::default();
        for i in range {
            set.insert(
                Endpoint::exact(Ipv4Addr::from(0x0a00_0000 + i).into(), 443),
                Source::Config,
            );
        }
        set
    }

    /// The programs loaded as the agent loads them (root).
    fn loaded() -> (Probes, KernelFeed) {
        Probes::load(
            &offsets::discover().expect("offsets"),
            lifeline_common::STREAM_BUDGET,
        )
        .expect("load")
    }

    /// The programs loaded, watching a loopback listener of this test's own: them, their ring,
    /// the listener and its port.
    fn watching_a_listener() -> (Probes, KernelFeed, std::net::TcpListener, u16) {
        let (mut probes, feed) = loaded();
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listen");
        let port = listener.local_addr().expect("its address").port();
        let mut endpoints = EndpointSet::default();
        endpoints.insert(Endpoint::exact(Ipv4Addr::LOCALHOST.into(), port), Source::Config);
        probes.set_endpoints(&endpoints).expect("the endpoint");
        (probes, feed, listener, port)
    }

    #[tokio::test]
    #[ignore = "needs root: run by cargo xtask test"]
    async fn the_endpoint_map_is_all_or_nothing() {
        let (mut probes, _ring) = loaded();
        let max = MAX_ENDPOINTS;
        probes.set_endpoints(&set(0..10)).expect("10 endpoints");
        assert_eq!(probes.map_len(), 10);

        // Too many: refused before the map is touched.
        let err = probes.set_endpoints(&set(0..max + 1)).unwrap_err();
        assert!(
            matches!(err, Error::Capacity { wanted } if wanted == max as usize + 1),
            "{err}"
        );
        assert_eq!(probes.map_len(), 10);

        // The kernel refusing midway (here: the map full at the 4097th insert, past the check):
        // everything done so far is undone.
        let wanted: BTreeSet<Endpoint> = set(5..max + 6).iter().map(|(e, _)| *e).collect();
        let err = probes.apply(wanted).unwrap_err();
        assert!(matches!(err, Error::Map { .. }), "{err}");
        assert_eq!(probes.map_len(), 10, "rolled back");
        assert_eq!(probes.installed().len(), 10);
        let installed: Vec<String> = probes.installed().iter().map(ToString::to_string).collect();
        assert_eq!(installed.first().map(String::as_str), Some("10.0.0.0:443"));

        // A full map, then a different full map: removals first make room.
        probes.set_endpoints(&set(0..max)).expect("a full map");
        probes
            .set_endpoints(&set(max..2 * max))
            .expect("another full map");
        assert_eq!(probes.map_len(), max as usize);
    }

    /// Issue 26: segments go through the port filter (no map touched for an unrelated one)
    /// wherever the kernel takes it, as the other tracepoints do; past the filter's ports,
    /// every program is attached directly, and back within them the filter takes over again,
    /// the direct segment program detached.
    #[tokio::test]
    #[ignore = "needs root: run by cargo xtask test"]
    async fn segments_go_through_the_port_filter_and_directly_past_its_ports() {
        let (mut probes, _ring) = loaded();
        probes.set_endpoints(&set(0..1)).expect("one port");
        assert_eq!(
            probes.attachment(),
            "filter on ports {443} in front, segments included"
        );
        assert!(
            probes.segments.is_none(),
            "the segment program is not attached directly"
        );
        let mut many = set(0..1);
        for port in 1..=filter::PORT_SLOTS as u16 {
            many.insert(
                Endpoint::exact(Ipv4Addr::LOCALHOST.into(), 20000 + port),
                Source::Config,
            );
        }
        probes.set_endpoints(&many).expect("nine ports");
        assert_eq!(probes.attachment(), "full programs attached directly");
        assert!(probes.segments.is_some(), "the segment program attached directly");
        probes.set_endpoints(&set(0..1)).expect("one port again");
        assert!(probes.attachment().ends_with("segments included"));
        assert!(probes.segments.is_none());
    }

    /// Issue 26 item 6: a segment record waits in the ring for the pump's next drain
    /// (`app::pump::DRAIN_EVERY`) instead of waking the reader, and a connect's record wakes
    /// it at once, even behind the unread segment (the kernel's default wakeup would not).
    #[tokio::test]
    #[ignore = "needs root: run by cargo xtask test"]
    async fn a_segment_does_not_wake_the_reader_and_a_connect_does_behind_it() {
        use std::{
            io::Write,
            net::TcpStream,
            os::fd::AsRawFd,
            time::{Duration, Instant},
        };

        use crate::kernel::events::{decode_record, Change, MonotonicClock, Record};

        /// Waits in poll(2) for the ring, as the pump does: whether it had data, and when it
        /// returned.
        fn wait(feed: &KernelFeed, timeout: Duration) -> (bool, Duration) {
            let mut fd = libc::pollfd {
                fd: feed.events.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let started = Instant::now();
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as i32) };
            (n == 1, started.elapsed())
        }
        /// The ring's wakeups, edge-triggered: unread data makes it ready once, then only a
        /// wakeup does.
        struct Epoll(std::os::fd::OwnedFd);
        impl Epoll {
            fn new(feed: &KernelFeed) -> Self {
                use std::os::fd::FromRawFd;
                // SAFETY: plain system calls; the new descriptor is owned at once.
                let epoll = Self(unsafe {
                    let fd = libc::epoll_create1(libc::EPOLL_CLOEXEC);
                    assert!(fd >= 0, "epoll_create1: {}", std::io::Error::last_os_error());
                    std::os::fd::OwnedFd::from_raw_fd(fd)
                });
                let mut interest = libc::epoll_event {
                    events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                    u64: 0,
                };
                // SAFETY: both descriptors live; the event is ours.
                let rc = unsafe {
                    libc::epoll_ctl(
                        epoll.0.as_raw_fd(),
                        libc::EPOLL_CTL_ADD,
                        feed.events.as_raw_fd(),
                        &mut interest,
                    )
                };
                assert_eq!(rc, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
                // The data already unread makes it ready once: taken here.
                let _ = epoll.wait_edge(Duration::ZERO);
                epoll
            }
            /// When a wakeup came within `timeout`, if one did.
            fn wait_edge(&self, timeout: Duration) -> Option<Duration> {
                let mut ready = libc::epoll_event { events: 0, u64: 0 };
                let started = Instant::now();
                // SAFETY: one event slot of ours, a live descriptor.
                let n = unsafe {
                    libc::epoll_wait(self.0.as_raw_fd(), &mut ready, 1, timeout.as_millis() as i32)
                };
                (n == 1).then(|| started.elapsed())
            }
        }
        /// Reads the ring empty: whether it held a segment and a connect's record.
        fn drain(feed: &mut KernelFeed, clock: &MonotonicClock) -> (bool, bool) {
            let (mut segment, mut connect) = (false, false);
            while let Some(item) = feed.events.next() {
                if let Ok(Record::Socket(ev)) = decode_record(&item, clock) {
                    segment |= matches!(ev.change, Change::Segment { .. });
                    connect |= !matches!(ev.change, Change::Segment { .. } | Change::Retransmit { .. });
                }
            }
            (segment, connect)
        }

        let (_probes, mut feed, listener, port) = watching_a_listener();
        let clock = MonotonicClock::new();
        let _client = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        std::thread::sleep(Duration::from_millis(100));
        let (_, connected) = drain(&mut feed, &clock);
        assert!(connected, "the connect's records");

        // An answer arrives: its segment record is written without waking the reader, which
        // sleeps its whole timeout and finds it on return, as the pump's drain does.
        let answer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            server.write_all(&[b'x'; 200]).expect("an answer");
            server
        });
        let (had_data, slept) = wait(&feed, Duration::from_millis(1500));
        let _server = answer.join().expect("the answer");
        assert!(had_data, "the segment is in the ring after {slept:?}");
        assert!(
            slept >= Duration::from_millis(1400),
            "woken after {slept:?} by a segment"
        );

        // Unread, it would keep the kernel's default wakeup from waking the reader for the next
        // record; a connect's record wakes it all the same.
        let connecting = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect again")
        });
        // poll(2) returns at once while data is unread: wait on the ring's wakeups alone.
        let epoll = Epoll::new(&feed);
        let woken = epoll.wait_edge(Duration::from_millis(1500));
        let _second = connecting.join().expect("the second connect");
        assert!(
            woken.is_some_and(|after| after < Duration::from_millis(1000)),
            "the connect woke the reader: {woken:?}"
        );
        let (segment, connect) = drain(&mut feed, &clock);
        assert!(
            segment && connect,
            "both records read: segment {segment}, connect {connect}"
        );
    }

    /// Issue 26 item 6: a segment record tells what the client has not sent yet. A client with
    /// nothing to send shows `write_seq`, `snd_nxt` and `snd_una` equal (a look at the
    /// connection, `table::LOOKED_SAMPLE_EVERY`); one whose writes wait behind its peer's full
    /// receive window shows them unsent: `write_seq` ahead of `snd_nxt`.
    #[tokio::test]
    #[ignore = "needs root: run by cargo xtask test"]
    async fn a_segment_record_shows_what_the_client_has_not_sent() {
        use std::{
            io::{ErrorKind, Write},
            net::TcpStream,
            time::Duration,
        };

        use crate::kernel::events::{decode_record, Change, MonotonicClock, Record};

        /// The segment records of the client's socket (local port `port`) in the ring now.
        fn segments(feed: &mut KernelFeed, clock: &MonotonicClock, port: u16) -> Vec<(u32, u32, u32)> {
            let mut found = Vec::new();
            while let Some(item) = feed.events.next() {
                if let Ok(Record::Socket(ev)) = decode_record(&item, clock) {
                    if let Change::Segment {
                        snd_nxt,
                        snd_una,
                        write_seq,
                        len,
                        ..
                    } = ev.change
                    {
                        if ev.local.port() == port && len > 0 {
                            found.push((snd_una, snd_nxt, write_seq));
                        }
                    }
                }
            }
            found
        }

        let (_probes, mut feed, listener, port) = watching_a_listener();
        let clock = MonotonicClock::new();
        let mut client = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
        let local = client.local_addr().expect("the client's address").port();
        let (mut server, _) = listener.accept().expect("accept");

        // Nothing to send: an answer's record shows all three equal.
        client.write_all(b"request").expect("a request");
        std::thread::sleep(Duration::from_millis(100));
        server.write_all(&[b'x'; 200]).expect("an answer");
        std::thread::sleep(Duration::from_millis(100));
        let idle = segments(&mut feed, &clock, local);
        let &(una, nxt, write) = idle.last().expect("the answer's record");
        assert!(
            una == nxt && write == nxt,
            "nothing unsent or unacknowledged: {idle:?}"
        );

        // The server reads nothing: the client writes until its send buffer is full, the
        // server's receive window closes, and what the client wrote last stays unsent.
        client.set_nonblocking(true).expect("non-blocking");
        let chunk = [b'y'; 65536];
        let mut written = 0usize;
        loop {
            match client.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("writing: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let _ = segments(&mut feed, &clock, local);
        server.write_all(&[b'z'; 300]).expect("a second answer");
        std::thread::sleep(Duration::from_millis(100));
        let blocked = segments(&mut feed, &clock, local);
        let &(_, nxt, write) = blocked.last().expect("the second answer's record");
        assert!(
            write.wrapping_sub(nxt) > 0 && write.wrapping_sub(nxt) < 1 << 30,
            "{written} bytes written, some unsent: snd_nxt {nxt}, write_seq {write}"
        );
    }

    /// The links of `probes`' Go-client programs, as the kernel lists them (`bpftool link`):
    /// the object is this test's own, so every one is on the test's file.
    fn go_links(probes: &mut Probes) -> usize {
        let ids: Vec<u32> = go_probes::PROGRAMS
            .iter()
            .map(|&name| {
                program_of::<aya::programs::UProbe>(&mut probes.ebpf, name)
                    .and_then(|p| p.info().map_err(|source| Error::Program { name, source }))
                    .expect("the program's id")
                    .id()
            })
            .collect();
        let out = std::process::Command::new("bpftool")
            .args(["link", "show", "-j"])
            .output()
            .expect("bpftool (cargo xtask setup installs it)");
        assert!(out.status.success(), "bpftool link show: {out:?}");
        let shown: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
        shown
            .iter()
            .filter(|l| l["prog_id"].as_u64().is_some_and(|id| ids.contains(&(id as u32))))
            .count()
    }

    #[tokio::test]
    #[ignore = "needs root: run by cargo xtask test"]
    async fn a_file_probed_again_while_its_probes_come_off_never_has_them_twice() {
        // Its removals must not land in the head start test's timings.
        let _alone = crate::kernel::UPROBE_TESTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut probes, _ring) = loaded();
        // A file nobody maps: the kernel registers uprobes on it without reading its code.
        let dir = std::env::temp_dir().join(format!("lifeline-reprobe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let file = dir.join("client");
        std::fs::write(&file, vec![0x90u8; 64 << 10]).expect("the file");
        let sites = Sites {
            write_header: vec![0x1000],
            headers_sent: vec![0x8000],
            resets_sent: vec![0x9000],
            tls_write: vec![0x2000],
            tls_read: vec![0x3000],
            frame_results: vec![0x7000],
            frame_conn_reads: vec![0x6000],
            frame_header_reads: vec![0x5000],
            frame_header_returns: vec![0x4000, 0x4010, 0x4020],
        };
        let n = 11;
        let links = probes.attach_go(&file, &sites).expect("attach");
        assert_eq!(go_links(&mut probes), n);
        // Off (on their own thread, 60-85 ms each) and on again at once.
        probes.detach_uprobes(links);
        let started = std::time::Instant::now();
        let links = probes.attach_go(&file, &sites).expect("attach again");
        let took = started.elapsed();
        assert_eq!(go_links(&mut probes), n, "one set, not the old beside the new");
        assert!(took >= std::time::Duration::from_millis(20), "{took:?}: no wait");
        probes.detach_uprobes(links);
        let waited = removals::UNDER_WAY
            .wait(
                removals::File::of(&file).expect("the file"),
                std::time::Duration::from_secs(10),
            )
            .expect("removed");
        assert_eq!(go_links(&mut probes), 0, "all removed after {waited:?}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
