//! Loads and attaches the kernel programs and owns their maps. Dropping [`Probes`] detaches
//! every program (the links belong to the loaded object).
use std::collections::BTreeSet;

use aya::{
    maps::{lpm_trie::Key, LpmTrie, MapData, MapError, PerCpuArray, RingBuf},
    programs::{ProgramError, TracePoint},
    Ebpf, EbpfError, EbpfLoader,
};
use lifeline_common::{counter, EndpointKey, KernelOffsets, MAX_ENDPOINTS};

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
    #[error("{wanted} endpoints: the kernel map holds at most {MAX_ENDPOINTS}")]
    Capacity { wanted: usize },
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

    /// Makes the kernel's endpoint map equal to `set`: removes what is gone, then adds what is
    /// new. All or nothing: a set larger than the map is refused before the map is touched, and
    /// if the kernel refuses a change midway, the changes made so far are undone, so the map
    /// still holds the previous set.
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
        self.installed = wanted;
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{endpoint::Source, kernel::offsets};

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

    #[tokio::test]
    #[ignore = "needs root: run by cargo xtask test"]
    async fn the_endpoint_map_is_all_or_nothing() {
        let (mut probes, _ring) = Probes::load(&offsets::discover().expect("offsets")).expect("load");
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
}
