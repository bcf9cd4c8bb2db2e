//! The loaded eBPF object as every probe set sees it: finding one of its programs by name,
//! and what loading and attaching programs fails with. The bottom of `kernel/`'s programs:
//! `programs.rs` (the owner, [`Probes`](super::programs::Probes)) uses the probe sets
//! (`go_probes.rs`, `ssl_probes.rs`), which use `uprobes.rs`, which uses this; never back.
use aya::{
    maps::MapError,
    programs::{Program, ProgramError},
    Ebpf, EbpfError,
};
use lifeline_common::MAX_ENDPOINTS;

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
    #[error("kernel BTF for the typed tracepoint {name}: {source}")]
    Btf {
        name: &'static str,
        source: aya::BtfError,
    },
    #[error("the Go-client programs did not load: {0}")]
    GoUnavailable(String),
    #[error("the OpenSSL-client programs did not load: {0}")]
    SslUnavailable(String),
    #[error("{wanted} endpoints: the kernel map holds at most {MAX_ENDPOINTS}")]
    Capacity { wanted: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Program `name` of `ebpf` as its kind `P` (a tracepoint, a raw tracepoint).
pub(super) fn program_of<'e, P>(ebpf: &'e mut Ebpf, name: &'static str) -> Result<&'e mut P>
where
    &'e mut P: TryFrom<&'e mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(Error::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(|source| Error::Program { name, source })
}
