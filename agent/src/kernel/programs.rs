//! Loads and attaches the kernel programs and owns their maps. Dropping [`Probes`] detaches
//! every program (the links belong to the loaded object).
use std::collections::BTreeSet;

use aya::{
    maps::{lpm_trie::Key, LpmTrie, MapData, MapError, PerCpuArray, RingBuf},
    programs::{ProgramError, TracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use lifeline_common::{counter, EndpointKey, KernelOffsets};

use crate::endpoint::{Endpoint, EndpointSet};

/// The object built from `ebpf/` by the build script.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lifeline"));

/// The tracepoints lifeline attaches to: (program name, category, tracepoint).
pub const TRACEPOINTS: [(&str, &str, &str); 2] = [
    ("inet_sock_set_state", "sock", "inet_sock_set_state"),
    ("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb"),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this lifeline binary was built with AYA_BUILD_SKIP: it carries no eBPF programs")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] EbpfError),
    #[error("eBPF object has no {kind} named {name}")]
    Missing { kind: &'static str, name: &'static str },
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
    #[error("map {name}: {source}")]
    Map { name: &'static str, source: MapError },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Counters kept by the kernel programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub sent: u64,
    pub lost: u64,
}

/// The loaded, attached programs and the maps userspace keeps using.
pub struct Probes {
    // Field order: maps before the object, so they are released before the programs detach.
    endpoints: LpmTrie<MapData, EndpointKey, u8>,
    counters: PerCpuArray<MapData, u64>,
    installed: BTreeSet<Endpoint>,
    _logger_task: Option<tokio::task::JoinHandle<()>>,
    _ebpf: Ebpf,
}

impl Probes {
    /// Loads the programs with this kernel's offsets and attaches them. Returns the event ring.
    /// Must be called inside a tokio runtime (kernel log messages are forwarded by a task).
    pub fn load(offsets: &KernelOffsets) -> Result<(Self, RingBuf<MapData>)> {
        if EBPF_OBJECT.is_empty() {
            return Err(Error::NoObject);
        }
        let mut ebpf = EbpfLoader::new()
            .override_global("OFFSETS", offsets, true)
            .load(EBPF_OBJECT)
            .map_err(Error::Load)?;
        let logger_task = forward_kernel_logs(&mut ebpf);
        for (name, category, tracepoint) in TRACEPOINTS {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(Error::Missing {
                    kind: "program",
                    name,
                })?
                .try_into()
                .map_err(|source| Error::Program { name, source })?;
            program.load().map_err(|source| Error::Program { name, source })?;
            program
                .attach(category, tracepoint)
                .map_err(|source| Error::Program { name, source })?;
        }
        let endpoints = take_map(&mut ebpf, "ENDPOINTS", LpmTrie::try_from)?;
        let counters = take_map(&mut ebpf, "COUNTERS", PerCpuArray::try_from)?;
        let events = take_map(&mut ebpf, "EVENTS", RingBuf::try_from)?;
        let probes = Self {
            endpoints,
            counters,
            installed: BTreeSet::new(),
            _logger_task: logger_task,
            _ebpf: ebpf,
        };
        Ok((probes, events))
    }

    /// Makes the kernel's endpoint map equal to `set`: adds what is new, removes what is gone.
    pub fn set_endpoints(&mut self, set: &EndpointSet) -> Result<()> {
        let wanted: BTreeSet<Endpoint> = set.iter().map(|(e, _)| *e).collect();
        for gone in self.installed.difference(&wanted) {
            let (bits, data) = gone.kernel_key();
            match self.endpoints.remove(&Key::new(bits, data)) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(source) => {
                    return Err(Error::Map {
                        name: "ENDPOINTS",
                        source,
                    })
                }
            }
        }
        for new in wanted.difference(&self.installed) {
            let (bits, data) = new.kernel_key();
            self.endpoints
                .insert(&Key::new(bits, data), 1, 0)
                .map_err(|source| Error::Map {
                    name: "ENDPOINTS",
                    source,
                })?;
        }
        self.installed = wanted;
        Ok(())
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
        })
    }
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
