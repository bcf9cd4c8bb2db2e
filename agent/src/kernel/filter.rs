//! The first test in front of the full programs (`ebpf/src/filter.rs`): the destination port
//! of every TCP state change, retransmit and arriving segment on the node, compared with the
//! endpoints' ports as instruction immediates. (Segments go to a typed raw tracepoint: the port
//! is read through its socket argument, at the offset the kernel's BTF gives. Where a kernel
//! refuses that filter, the segment program is attached directly, its own first test a port
//! bitmap in a map.)
//!
//! aya's Rust eBPF has no CO-RE relocations, and a value read from a map costs a memory access
//! (on this VM ~12 ns per map page, more than bpftrace's whole one-comparison filter). So this
//! module does the relocation itself: it writes this kernel's record offsets and the watched
//! ports into the object's placeholder instructions before loading it, and loads a new copy
//! when the set of ports changes (ports change rarely: 443, 6443; addresses, which change more
//! often, stay in the full programs' LPM map).
use std::collections::BTreeSet;

use aya::{
    maps::ProgramArray,
    programs::{BtfTracePoint, ProgramError, ProgramFd, TracePoint},
    BtfError, Ebpf, EbpfError, EbpfLoader,
};

/// The filter's object, built from `ebpf/src/filter.rs` by the build script; patched and
/// loaded per set of ports.
pub(super) static FILTER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lifeline-filter"));

/// Ports the filter compares with; more than this and the full programs are attached
/// directly (their first test is a port bitmap in a map).
pub const PORT_SLOTS: usize = 8;
/// Placeholder record offsets of `dport` in the filter's `ldxh` instructions.
const SET_STATE_DPORT_PLACEHOLDER: i16 = 0x7ff0;
const RETRANSMIT_DPORT_PLACEHOLDER: i16 = 0x7ff2;
/// Placeholder offset of `skc_dport` in `struct sock`, in the segment filter's `ldxh`.
const SEGMENT_DPORT_PLACEHOLDER: i16 = 0x7ff4;
/// The segment filter, the typed tracepoint it attaches to (`tcp/tcp_probe`), and its map.
const SEGMENT_FILTER: &str = "segment_filter";
const SEGMENT_TRACEPOINT: &str = "tcp_probe";
const SEGMENT_TARGETS: &str = "SEGMENT_TARGETS";
/// Placeholder port of slot `n` in the filter's `jeq` immediates: this plus `n`.
const PORT_PLACEHOLDER: i32 = 0x4c4c_0000;
/// The filter programs, the tracepoints they attach to, and their `TARGETS` index.
pub const FILTERS: [(&str, &str, &str); 2] = [
    ("set_state_filter", "sock", "inet_sock_set_state"),
    ("retransmit_filter", "tcp", "tcp_retransmit_skb"),
];
/// Highest offset a tracepoint program may read (`PERF_MAX_TRACE_SIZE`).
const MAX_RECORD_OFFSET: u32 = 8192;

const LDXH: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const JEQ_K: u8 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const SHF_EXECINSTR: u64 = 0x4;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("filter object: {0}")]
    Elf(&'static str),
    #[error("filter object: expected {expected} {what} to patch, found {found}")]
    Sites {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{count} endpoint ports; the filter holds {PORT_SLOTS}")]
    TooManyPorts { count: usize },
    #[error("no endpoint port to filter on")]
    NoPorts,
    #[error("tracepoint field dport at offset {0}: not an aligned offset a program may load from")]
    Offset(u32),
    #[error("loading the filter object: {0}")]
    Load(#[source] EbpfError),
    #[error("filter program {name}: {source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
    #[error("filter map TARGETS: {0}")]
    Targets(String),
    #[error("the kernel's BTF, for the segment filter: {0}")]
    Btf(#[source] BtfError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A loaded and attached filter; dropping it detaches it.
pub struct Filter {
    ports: BTreeSet<u16>,
    /// Whether it filters segments too (else the segment program is attached directly).
    segments: bool,
    _ebpf: Ebpf,
}

/// The full programs the filter tail-calls (loaded).
pub struct Targets<'a> {
    pub set_state: &'a ProgramFd,
    pub retransmit: &'a ProgramFd,
    /// The segment program, if the filter is to take segments too.
    pub segments: Option<&'a ProgramFd>,
}

impl Filter {
    /// Patches, loads and attaches the filter for `ports`, tail-calling `targets`. The
    /// `dport_offsets` are the records' (`inet_sock_set_state`, `tcp_retransmit_skb`) and the
    /// socket's (`skc_dport`). The segment filter is all or nothing on its own: where the
    /// kernel refuses it, the filter holds the other two ([`segments`](Self::segments) false).
    pub fn attach(
        object: &[u8],
        dport_offsets: [u32; 3],
        ports: &BTreeSet<u16>,
        targets: Targets,
    ) -> Result<Self> {
        let patched = patch(object, dport_offsets, ports)?;
        let mut ebpf = EbpfLoader::new().btf(None).load(&patched).map_err(Error::Load)?;
        let map = ebpf
            .map_mut("TARGETS")
            .ok_or_else(|| Error::Targets("missing".into()))?;
        let mut array = ProgramArray::try_from(map).map_err(|e| Error::Targets(e.to_string()))?;
        for (index, fd) in [targets.set_state, targets.retransmit].into_iter().enumerate() {
            array
                .set(index as u32, fd, 0)
                .map_err(|e| Error::Targets(e.to_string()))?;
        }
        for (name, category, tracepoint) in FILTERS {
            let program: &mut TracePoint = ebpf
                .program_mut(name)
                .ok_or(Error::Elf("a filter program is missing"))?
                .try_into()
                .map_err(|source| Error::Program { name, source })?;
            program.load().map_err(|source| Error::Program { name, source })?;
            program
                .attach(category, tracepoint)
                .map_err(|source| Error::Program { name, source })?;
        }
        let segments = targets
            .segments
            .is_some_and(|target| match attach_segments(&mut ebpf, target) {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(
                        "the segment filter is not usable ({}); the segment program is attached directly",
                        crate::error::chain(&err)
                    );
                    false
                }
            });
        Ok(Self {
            ports: ports.clone(),
            segments,
            _ebpf: ebpf,
        })
    }

    pub fn ports(&self) -> &BTreeSet<u16> {
        &self.ports
    }

    /// Whether it filters segments too.
    pub fn segments(&self) -> bool {
        self.segments
    }
}

/// Loads and attaches the segment filter in front of `target`. Its load needs the kernel's BTF
/// (~16 ms and ~20 MiB of heap while it is parsed, once per set of ports).
fn attach_segments(ebpf: &mut Ebpf, target: &ProgramFd) -> Result<()> {
    let btf = aya::Btf::from_sys_fs().map_err(Error::Btf)?;
    let name = SEGMENT_FILTER;
    fn program(ebpf: &mut Ebpf) -> Result<&mut BtfTracePoint> {
        let name = SEGMENT_FILTER;
        ebpf.program_mut(name)
            .ok_or(Error::Elf("the segment filter is missing"))?
            .try_into()
            .map_err(|source| Error::Program { name, source })
    }
    program(ebpf)?
        .load(SEGMENT_TRACEPOINT, &btf)
        .map_err(|source| Error::Program { name, source })?;
    let map = ebpf
        .map_mut(SEGMENT_TARGETS)
        .ok_or_else(|| Error::Targets(format!("{SEGMENT_TARGETS} missing")))?;
    let mut array = ProgramArray::try_from(map).map_err(|e| Error::Targets(e.to_string()))?;
    array
        .set(0, target, 0)
        .map_err(|e| Error::Targets(format!("{SEGMENT_TARGETS}: {e}")))?;
    program(ebpf)?
        .attach()
        .map_err(|source| Error::Program { name, source })?;
    Ok(())
}

/// The filter object with `dport_offsets` (`inet_sock_set_state`, `tcp_retransmit_skb`, the
/// socket's `skc_dport`) and `ports` written into its placeholders. Unused port slots keep their placeholder: it lies
/// beyond any `u16`, so the verifier proves those comparisons never match and removes them
/// before JIT compilation (one watched port costs one comparison, not eight).
pub fn patch(object: &[u8], dport_offsets: [u32; 3], ports: &BTreeSet<u16>) -> Result<Vec<u8>> {
    if ports.len() > PORT_SLOTS {
        return Err(Error::TooManyPorts { count: ports.len() });
    }
    if ports.is_empty() {
        return Err(Error::NoPorts);
    }
    let slots: Vec<u16> = ports.iter().copied().collect();
    let offset = |o: u32| -> Result<i16> {
        (o.is_multiple_of(2) && o < MAX_RECORD_OFFSET)
            .then_some(o as i16)
            .ok_or(Error::Offset(o))
    };
    let new_offsets = [
        offset(dport_offsets[0])?,
        offset(dport_offsets[1])?,
        offset(dport_offsets[2])?,
    ];
    let placeholders = [
        SET_STATE_DPORT_PLACEHOLDER,
        RETRANSMIT_DPORT_PLACEHOLDER,
        SEGMENT_DPORT_PLACEHOLDER,
    ];

    let mut out = object.to_vec();
    let mut offsets_found = [0usize; 3];
    let mut ports_found = [0usize; PORT_SLOTS];
    for (start, len) in code_sections(object)? {
        for at in (start..start + len).step_by(8) {
            let insn = &mut out[at..at + 8];
            let off = i16::from_le_bytes([insn[2], insn[3]]);
            let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if insn[0] == LDXH {
                if let Some(i) = placeholders.iter().position(|p| *p == off) {
                    insn[2..4].copy_from_slice(&new_offsets[i].to_le_bytes());
                    offsets_found[i] += 1;
                }
            } else if insn[0] == JEQ_K
                && (PORT_PLACEHOLDER..PORT_PLACEHOLDER + PORT_SLOTS as i32).contains(&imm)
            {
                let slot = (imm - PORT_PLACEHOLDER) as usize;
                if let Some(port) = slots.get(slot) {
                    insn[4..8].copy_from_slice(&i32::from(*port).to_le_bytes());
                }
                ports_found[slot] += 1;
            }
        }
    }
    if offsets_found != [1, 1, 1] {
        return Err(Error::Sites {
            what: "dport loads",
            expected: 3,
            found: offsets_found.iter().sum(),
        });
    }
    // The two tracepoint filters and the segment filter.
    let filters = FILTERS.len() + 1;
    if ports_found.iter().any(|n| *n != filters) {
        return Err(Error::Sites {
            what: "port comparisons",
            expected: PORT_SLOTS * filters,
            found: ports_found.iter().sum(),
        });
    }
    Ok(out)
}

/// `(file offset, size)` of every executable section of a little-endian ELF64 object.
fn code_sections(elf: &[u8]) -> Result<Vec<(usize, usize)>> {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        return Err(Error::Elf("not a little-endian ELF64 object"));
    }
    let header = |o| u16_at(o).map(usize::from).ok_or(Error::Elf("truncated header"));
    let shoff = u64_at(0x28).ok_or(Error::Elf("truncated header"))? as usize;
    let (shentsize, shnum) = (header(0x3a)?, header(0x3c)?);
    let mut found = Vec::new();
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        let (Some(flags), Some(offset), Some(size)) = (u64_at(sh + 8), u64_at(sh + 24), u64_at(sh + 32))
        else {
            return Err(Error::Elf("truncated section header"));
        };
        let (offset, size) = (offset as usize, size as usize);
        if flags & SHF_EXECINSTR != 0 {
            if size % 8 != 0 || elf.len() < offset.saturating_add(size) {
                return Err(Error::Elf("code section outside the file"));
            }
            found.push((offset, size));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> &'static [u8] {
        FILTER_OBJECT
    }

    /// The instructions of the patched object's code sections.
    fn insns(elf: &[u8]) -> Vec<[u8; 8]> {
        code_sections(elf)
            .unwrap()
            .into_iter()
            .flat_map(|(start, len)| {
                elf[start..start + len]
                    .chunks(8)
                    .map(|c| c.try_into().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn patches_offsets_and_ports_into_the_built_object() {
        if object().is_empty() {
            return; // AYA_BUILD_SKIP
        }
        let ports = BTreeSet::from([443, 6443]);
        let patched = patch(object(), [26, 30, 12], &ports).expect("patch");
        let all = insns(&patched);
        let loads: Vec<i16> = all
            .iter()
            .filter(|i| i[0] == LDXH)
            .map(|i| i16::from_le_bytes([i[2], i[3]]))
            .collect();
        assert!(
            loads.contains(&26) && loads.contains(&30) && loads.contains(&12),
            "{loads:?}"
        );
        let compared: Vec<i32> = all
            .iter()
            .filter(|i| i[0] == JEQ_K)
            .map(|i| i32::from_le_bytes([i[4], i[5], i[6], i[7]]))
            .collect();
        assert_eq!(
            compared.iter().filter(|p| **p == 443).count(),
            3,
            "slot 0 of the three filters"
        );
        assert_eq!(compared.iter().filter(|p| **p == 6443).count(), 3, "slot 1");
        let unused = (PORT_PLACEHOLDER + 2..PORT_PLACEHOLDER + 8).collect::<Vec<_>>();
        assert_eq!(
            compared.iter().filter(|p| unused.contains(p)).count(),
            3 * 6,
            "spare slots keep a placeholder that matches no port"
        );
        // Patching only touches instruction fields: the rest of the file is unchanged.
        let differing = object().iter().zip(&patched).filter(|(a, b)| a != b).count();
        assert!(differing <= 3 * 2 + 3 * 2 * 4, "{differing} bytes changed");
    }

    #[test]
    fn refuses_what_it_cannot_patch() {
        let one = BTreeSet::from([443]);
        let nine: BTreeSet<u16> = (1..=9).collect();
        assert!(matches!(
            patch(object(), [26, 30, 12], &nine),
            Err(Error::TooManyPorts { count: 9 })
        ));
        assert!(matches!(
            patch(object(), [26, 30, 12], &BTreeSet::new()),
            Err(Error::NoPorts)
        ));
        assert!(matches!(
            patch(object(), [27, 30, 12], &one),
            Err(Error::Offset(27))
        ));
        assert!(matches!(
            patch(object(), [26, 9000, 12], &one),
            Err(Error::Offset(9000))
        ));
        assert!(matches!(
            patch(b"not an elf", [26, 30, 12], &one),
            Err(Error::Elf(_))
        ));
    }

    #[test]
    fn an_object_without_placeholders_is_refused() {
        if object().is_empty() {
            return;
        }
        let once = patch(object(), [26, 30, 12], &BTreeSet::from([443])).expect("patch");
        let err = patch(&once, [26, 30, 12], &BTreeSet::from([443])).expect_err("nothing left to patch");
        assert!(matches!(err, Error::Sites { found: 0, .. }), "{err}");
    }
}
