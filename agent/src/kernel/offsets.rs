//! Structure and tracepoint-field offsets of the running kernel.
//!
//! aya's Rust eBPF has no CO-RE relocations, so the programs read fields at offsets that
//! userspace finds at start-up: `struct` member offsets from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), tracepoint field offsets from the tracepoints' `format` files.
//! Nothing is hard-coded: a kernel whose layout differs gets its own numbers, and one that lacks
//! a field fails here with a message naming it.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use btf_rs::{Btf, Type};
use lifeline_common::{KernelOffsets, RetransmitOffsets, SetStateOffsets};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kernel BTF at {path}: {source}")]
    Btf { path: String, source: btf_rs::Error },
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF: struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("tracepoint {0} not found under {roots:?} (is tracefs mounted? `mount -t tracefs tracefs /sys/kernel/tracing`)", roots = TRACEFS_ROOTS)]
    NoTracepoint(String),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("tracepoint {tracepoint}: no field {field} in its format file")]
    NoField { tracepoint: String, field: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Finds every offset the programs need on this kernel.
pub fn discover() -> Result<KernelOffsets> {
    let btf = Btf::from_file(VMLINUX_BTF).map_err(|source| Error::Btf {
        path: VMLINUX_BTF.into(),
        source,
    })?;
    let set_state = TracepointFormat::read("sock", "inet_sock_set_state")?;
    let retransmit = TracepointFormat::read("tcp", "tcp_retransmit_skb")?;
    Ok(KernelOffsets {
        sock_common_skc_net: member_offset(&btf, "sock_common", "skc_net")?,
        net_ns_inum: member_offset(&btf, "net", "ns")? + member_offset(&btf, "ns_common", "inum")?,
        sock_sk_err: member_offset(&btf, "sock", "sk_err")?,
        tcp_sock_bytes_received: member_offset(&btf, "tcp_sock", "bytes_received")?,
        set_state: SetStateOffsets {
            skaddr: set_state.offset("skaddr")?,
            oldstate: set_state.offset("oldstate")?,
            newstate: set_state.offset("newstate")?,
            sport: set_state.offset("sport")?,
            dport: set_state.offset("dport")?,
            family: set_state.offset("family")?,
            protocol: set_state.offset("protocol")?,
            saddr: set_state.offset("saddr")?,
            daddr: set_state.offset("daddr")?,
            saddr_v6: set_state.offset("saddr_v6")?,
            daddr_v6: set_state.offset("daddr_v6")?,
            _pad: 0,
        },
        retransmit: RetransmitOffsets {
            skaddr: retransmit.offset("skaddr")?,
            state: retransmit.offset("state")?,
            sport: retransmit.offset("sport")?,
            dport: retransmit.offset("dport")?,
            family: retransmit.offset("family")?,
            saddr: retransmit.offset("saddr")?,
            daddr: retransmit.offset("daddr")?,
            saddr_v6: retransmit.offset("saddr_v6")?,
            daddr_v6: retransmit.offset("daddr_v6")?,
            _pad: 0,
        },
    })
}

/// Byte offset of `member` in `struct strukt`, looking through anonymous structs and unions.
pub fn member_offset(btf: &Btf, strukt: &str, member: &str) -> Result<u32> {
    let types = btf.resolve_types_by_name(strukt).unwrap_or_default();
    let structs: Vec<&btf_rs::Struct> = types
        .iter()
        .filter_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })
        .collect();
    if structs.is_empty() {
        return Err(Error::NoStruct(strukt.into()));
    }
    let found = structs.iter().find_map(|s| find_member(btf, s, member));
    found.map(|bits| bits / 8).ok_or_else(|| Error::NoMember {
        strukt: strukt.into(),
        member: member.into(),
    })
}

/// Bit offset of a named member, recursing into anonymous members.
fn find_member(btf: &Btf, s: &btf_rs::Struct, name: &str) -> Option<u32> {
    s.members.iter().find_map(|m| {
        let member_name = btf.resolve_name(m).unwrap_or_default();
        if member_name == name {
            return Some(m.bit_offset());
        }
        if !member_name.is_empty() {
            return None;
        }
        match btf.resolve_chained_type(m).ok()? {
            Type::Struct(inner) | Type::Union(inner) => {
                find_member(btf, &inner, name).map(|off| off + m.bit_offset())
            }
            _ => None,
        }
    })
}

/// The field offsets of one tracepoint, from its `format` file.
pub struct TracepointFormat {
    name: String,
    fields: HashMap<String, u32>,
}

impl TracepointFormat {
    pub fn path(category: &str, name: &str) -> Option<PathBuf> {
        TRACEFS_ROOTS
            .iter()
            .map(|root| {
                Path::new(root)
                    .join("events")
                    .join(category)
                    .join(name)
                    .join("format")
            })
            .find(|p| p.exists())
    }

    pub fn read(category: &str, name: &str) -> Result<Self> {
        let full = format!("{category}/{name}");
        let path = Self::path(category, name).ok_or_else(|| Error::NoTracepoint(full.clone()))?;
        let text = fs::read_to_string(&path).map_err(|source| Error::Read { path, source })?;
        Ok(Self::parse(full, &text))
    }

    /// Parses lines like `field:__u8 saddr[4]; offset:32; size:4; signed:0;` (tab separated).
    pub fn parse(name: String, text: &str) -> Self {
        let fields = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.trim().split(';');
                let decl = parts.next()?.strip_prefix("field:")?;
                let offset = parts.next()?.trim().strip_prefix("offset:")?.parse().ok()?;
                let ident = decl.rsplit(' ').next()?;
                let ident = ident.split('[').next()?;
                Some((ident.to_owned(), offset))
            })
            .collect();
        Self { name, fields }
    }

    pub fn offset(&self, field: &str) -> Result<u32> {
        self.fields.get(field).copied().ok_or_else(|| Error::NoField {
            tracepoint: self.name.clone(),
            field: field.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "name: inet_sock_set_state\nID: 2287\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;\n\
\nprint fmt: \"family=%s\"\n";

    #[test]
    fn parses_format_files() {
        let f = TracepointFormat::parse("sock/inet_sock_set_state".into(), FORMAT);
        assert_eq!(f.offset("skaddr").unwrap(), 8);
        assert_eq!(f.offset("saddr_v6").unwrap(), 40);
        assert_eq!(f.offset("common_type").unwrap(), 0);
        let err = f.offset("daddr").unwrap_err().to_string();
        assert!(
            err.contains("sock/inet_sock_set_state") && err.contains("daddr"),
            "{err}"
        );
    }

    /// Reads the real kernel's BTF: runs wherever /sys/kernel/btf/vmlinux is readable.
    #[test]
    fn finds_offsets_in_this_kernels_btf() {
        let btf = Btf::from_file(VMLINUX_BTF).expect("this kernel has BTF");
        let skc_net = member_offset(&btf, "sock_common", "skc_net").unwrap();
        assert!(skc_net > 0 && skc_net < 136, "{skc_net}");
        // skc_daddr is the first member of an anonymous union at offset 0.
        assert_eq!(member_offset(&btf, "sock_common", "skc_daddr").unwrap(), 0);
        // skc_dport sits inside an anonymous struct inside an anonymous union.
        assert!(member_offset(&btf, "sock_common", "skc_dport").unwrap() > 0);
        let err = member_offset(&btf, "sock_common", "no_such_field")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no_such_field"), "{err}");
        assert!(matches!(
            member_offset(&btf, "no_such_struct_x", "a"),
            Err(Error::NoStruct(_))
        ));
    }
}
