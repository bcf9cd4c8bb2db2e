//! Structure and tracepoint-field offsets of the running kernel.
//!
//! aya's Rust eBPF has no CO-RE relocations, so the programs read fields at offsets that
//! userspace finds at start-up: `struct` member offsets from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), tracepoint field offsets from the tracepoints' `format` files.
//! Nothing is hard-coded: a kernel whose layout differs gets its own numbers. A field that a
//! kernel's record lacks and that is found elsewhere exactly is read there ([`Fallback`]: the
//! address family on 5.10); one that cannot be replaced fails here with a message naming it.
//! The segment program is a raw tracepoint (no record): everything it reads is a BTF member.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use lifeline_common::{FileOffsets, KernelOffsets, RetransmitOffsets, SegmentOffsets, SetStateOffsets};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kernel BTF at {path}: {source}")]
    BtfRead { path: String, source: std::io::Error },
    #[error("kernel BTF at {path}: {what}")]
    BtfFormat { path: String, what: &'static str },
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
    let btf = Btf::from_file(VMLINUX_BTF)?;
    let member = |strukt: &str, name: &str| member_offset(&btf, strukt, name);
    let (set_state, retransmit) = tracepoint_offsets(
        &TracepointFormat::read("sock", "inet_sock_set_state")?,
        &TracepointFormat::read("tcp", "tcp_retransmit_skb")?,
        &member,
    )?;
    let segment = segment_offsets(&member)?;
    // Only for the optional error-report program: a kernel without them still runs the rest
    // (all zero: the program is then not attached, see `programs::Probes::load`).
    let error_report = error_report_offsets(&btf)
        .inspect_err(|err| tracing::warn!("offsets for the error-report program: {err}"))
        .ok();
    let offsets = KernelOffsets {
        sock_common_skc_net: member("sock_common", "skc_net")?,
        net_ns_inum: member("net", "ns")? + member("ns_common", "inum")?,
        sock_sk_err: member("sock", "sk_err")?,
        sock_common_skc_state: error_report.map_or(0, |o| o[0]),
        sock_sk_error_queue: error_report.map_or(0, |o| o[1]),
        sk_buff_head_prev: error_report.map_or(0, |o| o[2]),
        sk_buff_cb: error_report.map_or(0, |o| o[3]),
        sock_exterr_skb_ee: error_report.map_or(0, |o| o[4]),
        tcp_sock_bytes_received: member("tcp_sock", "bytes_received")?,
        set_state,
        retransmit,
        segment,
        files: FileOffsets {
            task_struct_files: member("task_struct", "files")?,
            files_struct_fdt: member("files_struct", "fdt")?,
            fdtable_max_fds: member("fdtable", "max_fds")?,
            fdtable_fd: member("fdtable", "fd")?,
            file_private_data: member("file", "private_data")?,
            socket_sk: member("socket", "sk")?,
        },
    };
    for fallback in fallbacks(&offsets) {
        tracing::info!("{fallback}");
    }
    Ok(offsets)
}

/// A field some kernels' tracepoint records lack, read from another source instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// `tcp/tcp_retransmit_skb` has no `family` (5.10): the socket's `skc_family` is read.
    RetransmitFamilyFromSocket,
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fallback::RetransmitFamilyFromSocket => {
                "tcp/tcp_retransmit_skb has no family field: the address family is read from the \
                 socket (sock_common.skc_family); nothing lost"
            }
        })
    }
}

/// The fallbacks `offsets` use on this kernel.
pub fn fallbacks(offsets: &KernelOffsets) -> Vec<Fallback> {
    let mut out = Vec::new();
    if offsets.retransmit.family == 0 {
        out.push(Fallback::RetransmitFamilyFromSocket);
    }
    out
}

/// The two tracepoints' field offsets from their format files; `member` gives a struct
/// member's offset from the BTF, for the fields a record lacks and the socket has.
pub fn tracepoint_offsets(
    set_state: &TracepointFormat,
    retransmit: &TracepointFormat,
    member: &dyn Fn(&str, &str) -> Result<u32>,
) -> Result<(SetStateOffsets, RetransmitOffsets)> {
    let set_state = SetStateOffsets {
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
    };
    // 5.10's record has no `family` (6.1's has): the program reads the socket's.
    let (family, skc_family) = match retransmit.offset("family") {
        Ok(at) => (at, 0),
        Err(_) => (0, member("sock_common", "skc_family")?),
    };
    let retransmit = RetransmitOffsets {
        skaddr: retransmit.offset("skaddr")?,
        state: retransmit.offset("state")?,
        sport: retransmit.offset("sport")?,
        dport: retransmit.offset("dport")?,
        family,
        saddr: retransmit.offset("saddr")?,
        daddr: retransmit.offset("daddr")?,
        saddr_v6: retransmit.offset("saddr_v6")?,
        daddr_v6: retransmit.offset("daddr_v6")?,
        sock_common_skc_family: skc_family,
    };
    Ok((set_state, retransmit))
}

/// What the segment program reads from `struct sock` and `struct sk_buff` (every kernel since
/// 4.16 passes both to `tcp_probe`, whatever its record holds).
pub fn segment_offsets(member: &dyn Fn(&str, &str) -> Result<u32>) -> Result<SegmentOffsets> {
    let common = |name: &str| member("sock_common", name);
    Ok(SegmentOffsets {
        skc_daddr: common("skc_daddr")?,
        skc_rcv_saddr: common("skc_rcv_saddr")?,
        skc_v6_daddr: common("skc_v6_daddr")?,
        skc_v6_rcv_saddr: common("skc_v6_rcv_saddr")?,
        skc_dport: common("skc_dport")?,
        skc_num: common("skc_num")?,
        skc_family: common("skc_family")?,
        tcp_snd_nxt: member("tcp_sock", "snd_nxt")?,
        tcp_snd_una: member("tcp_sock", "snd_una")?,
        tcp_write_seq: member("tcp_sock", "write_seq")?,
        tcp_srtt_us: member("tcp_sock", "srtt_us")?,
        skb_len: member("sk_buff", "len")?,
        skb_data: member("sk_buff", "data")?,
    })
}

/// `skc_state`, `sk_error_queue`, `sk_buff_head.prev`, `sk_buff.cb`, `sock_exterr_skb.ee`.
fn error_report_offsets(btf: &Btf) -> Result<[u32; 5]> {
    Ok([
        member_offset(btf, "sock_common", "skc_state")?,
        member_offset(btf, "sock", "sk_error_queue")?,
        member_offset(btf, "sk_buff_head", "prev")?,
        member_offset(btf, "sk_buff", "cb")?,
        member_offset(btf, "sock_exterr_skb", "ee")?,
    ])
}

/// Byte offset of `member` in `struct strukt`, looking through anonymous structs and unions.
pub fn member_offset(btf: &Btf, strukt: &str, member: &str) -> Result<u32> {
    let structs: Vec<u32> = btf.structs_named(strukt).collect();
    if structs.is_empty() {
        return Err(Error::NoStruct(strukt.into()));
    }
    let found = structs
        .iter()
        .find_map(|id| btf.member_bit_offset(*id, member, 0));
    found.map(|bits| bits / 8).ok_or_else(|| Error::NoMember {
        strukt: strukt.into(),
        member: member.into(),
    })
}

/// The kernel's BTF, read just enough to find member offsets: a type's kind, name and members.
///
/// (A full BTF library builds every type of vmlinux, ~130,000, as objects: tens of MiB of heap
/// at start-up for five offsets. This keeps the raw bytes and one index entry per type.)
pub struct Btf {
    data: Vec<u8>,
    /// Byte offset of each type in `data`, by type id (id 0 is `void`).
    types: Vec<usize>,
    strings: usize,
    strings_end: usize,
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
/// Kinds that only qualify another type (typedef, volatile, const, restrict, type tag).
const KIND_QUALIFIERS: [u32; 5] = [8, 9, 10, 11, 18];

impl Btf {
    pub fn from_file(path: &str) -> Result<Self> {
        let data = fs::read(path).map_err(|source| Error::BtfRead {
            path: path.into(),
            source,
        })?;
        Self::parse(data).map_err(|what| Error::BtfFormat {
            path: path.into(),
            what,
        })
    }

    /// Indexes raw BTF (`struct btf_header`, types, strings; little or native endian).
    pub fn parse(data: Vec<u8>) -> std::result::Result<Self, &'static str> {
        let u32_at = |o: usize| -> std::result::Result<usize, &'static str> {
            data.get(o..o + 4)
                .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")) as usize)
                .ok_or("truncated")
        };
        if data.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]])) != Some(BTF_MAGIC) {
            return Err("not BTF (bad magic)");
        }
        let hdr_len = u32_at(4)?;
        let (type_off, type_len) = (hdr_len + u32_at(8)?, u32_at(12)?);
        let (str_off, str_len) = (hdr_len + u32_at(16)?, u32_at(20)?);
        if data.len() < type_off + type_len || data.len() < str_off + str_len {
            return Err("sections beyond the end of the data");
        }
        let mut types = vec![0];
        let mut at = type_off;
        while at < type_off + type_len {
            types.push(at);
            let info = u32_at(at + 4)?;
            let (kind, vlen) = ((info >> 24) & 0x1f, info & 0xffff);
            let extra = match kind {
                1 | 14 | 17 => 4,             // int, var, decl tag
                3 => 12,                      // array
                4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                6 | 13 => 8 * vlen,           // enum, func proto
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                _ => return Err("unknown type kind"),
            };
            at += 12 + extra;
        }
        Ok(Self {
            data,
            types,
            strings: str_off,
            strings_end: str_off + str_len,
        })
    }

    fn u32_at(&self, o: usize) -> u32 {
        u32::from_ne_bytes(self.data[o..o + 4].try_into().expect("4 bytes"))
    }

    fn name(&self, name_off: u32) -> &[u8] {
        let start = self.strings + name_off as usize;
        let rest = self.data.get(start..self.strings_end).unwrap_or_default();
        &rest[..rest.iter().position(|b| *b == 0).unwrap_or(rest.len())]
    }

    /// (kind, kind_flag, vlen, size-or-type) of type `id`.
    fn header(&self, id: u32) -> Option<(u32, bool, u32, u32)> {
        let at = *self.types.get(id as usize).filter(|_| id != 0)?;
        let info = self.u32_at(at + 4);
        Some((
            (info >> 24) & 0x1f,
            info >> 31 == 1,
            info & 0xffff,
            self.u32_at(at + 8),
        ))
    }

    /// Ids of the structs called `name`.
    fn structs_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = u32> + 'a {
        (1..self.types.len() as u32).filter(move |id| {
            self.header(*id).is_some_and(|(kind, ..)| kind == KIND_STRUCT)
                && self.name(self.u32_at(self.types[*id as usize])) == name.as_bytes()
        })
    }

    /// Bit offset of `member` in struct or union `id` (plus `base`), through anonymous members.
    fn member_bit_offset(&self, id: u32, member: &str, base: u32) -> Option<u32> {
        let (kind, kind_flag, vlen, _) = self.header(id)?;
        if kind != KIND_STRUCT && kind != KIND_UNION {
            return None;
        }
        let first = self.types[id as usize] + 12;
        (0..vlen as usize).find_map(|i| {
            let m = first + 12 * i;
            let (name_off, type_id, offset) = (self.u32_at(m), self.u32_at(m + 4), self.u32_at(m + 8));
            let bits = base + if kind_flag { offset & 0xff_ffff } else { offset };
            match self.name(name_off) {
                n if n == member.as_bytes() => Some(bits),
                [] => self.member_bit_offset(self.resolve(type_id)?, member, bits),
                _ => None,
            }
        })
    }

    /// `id` with typedefs and qualifiers stripped.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let (kind, _, _, next) = self.header(id)?;
            if !KIND_QUALIFIERS.contains(&kind) {
                return Some(id);
            }
            id = next;
        }
        None
    }
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

    /// Parses lines like `field:__u8 saddr[4]; offset:32; size:4; signed:0;` (tab separated;
    /// 5.10's tcp_probe sizes its arrays `[sizeof(struct sockaddr_in6)]`).
    pub fn parse(name: String, text: &str) -> Self {
        let fields = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.trim().split(';');
                let decl = parts.next()?.strip_prefix("field:")?;
                let offset = parts.next()?.trim().strip_prefix("offset:")?.parse().ok()?;
                // The array size goes first: it may hold spaces.
                let decl = match decl.strip_suffix(']') {
                    Some(array) => array.split('[').next()?,
                    None => decl,
                };
                let ident = decl.trim_end().rsplit(' ').next()?;
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

    /// Raw BTF: `types` as (name, info, size/type, trailing words), and the string table.
    fn raw_btf(types: &[(&str, u32, u32, &[u32])]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut name_off = |n: &str| {
            if n.is_empty() {
                return 0;
            }
            let off = strings.len() as u32;
            strings.extend_from_slice(n.as_bytes());
            strings.push(0);
            off
        };
        let mut body = Vec::new();
        for (name, info, size, extra) in types {
            for word in [name_off(name), *info, *size].iter().chain(extra.iter()) {
                body.extend_from_slice(&word.to_ne_bytes());
            }
        }
        let mut data = Vec::new();
        data.extend_from_slice(&BTF_MAGIC.to_ne_bytes());
        data.extend_from_slice(&[1, 0]);
        for word in [
            24u32,
            0,
            body.len() as u32,
            body.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&word.to_ne_bytes());
        }
        data.extend_from_slice(&body);
        data.extend_from_slice(&strings);
        data
    }

    #[test]
    fn reads_member_offsets_through_anonymous_members_and_typedefs() {
        let strukt = |vlen: u32| KIND_STRUCT << 24 | vlen;
        // Type names go into the string table in order, so member names can point at them:
        // "int" 1, "inner" 5, "inner_t" 11, "outer" 19, "x" 25, "y" 27, "a" 29.
        // 1: int; 2: struct inner { int x @32 bits }; 3: typedef inner_t -> 2;
        // 4: union { inner_t (anonymous) @0; int y @0 }; 5: struct outer { int a @0;
        // union (anonymous) @64 } with kind_flag (bit offsets in the low 24 bits).
        let data = raw_btf(&[
            ("int", 1 << 24, 4, &[32]),
            ("inner", strukt(1), 8, &[25, 1, 32]),
            ("inner_t", 8 << 24, 2, &[]),
            ("", KIND_UNION << 24 | 2, 8, &[0, 3, 0, 27, 1, 0]),
            ("outer", strukt(2) | 1 << 31, 16, &[29, 1, 0, 0, 4, 64 | 3 << 24]),
            ("x", 1 << 24, 4, &[32]),
            ("y", 1 << 24, 4, &[32]),
            ("a", 1 << 24, 4, &[32]),
        ]);
        let btf = Btf::parse(data).expect("parse");
        assert_eq!(btf.name(25), b"x");
        assert_eq!(member_offset(&btf, "outer", "a").unwrap(), 0);
        assert_eq!(
            member_offset(&btf, "outer", "x").unwrap(),
            (64 + 32) / 8,
            "through the union and the typedef"
        );
        assert_eq!(member_offset(&btf, "outer", "y").unwrap(), 8);
        assert!(matches!(
            member_offset(&btf, "outer", "z"),
            Err(Error::NoMember { .. })
        ));
        assert!(matches!(
            member_offset(&btf, "inner_t", "x"),
            Err(Error::NoStruct(_))
        ));
        assert_eq!(Btf::parse(vec![0; 24]).err(), Some("not BTF (bad magic)"));
        let mut truncated = raw_btf(&[("int", 1 << 24, 4, &[32])]);
        truncated.truncate(30);
        assert!(Btf::parse(truncated).is_err());
    }

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

    /// Debian 11's 5.10.223 (`linux-image-5.10.0-32-cloud-amd64`), its format files as the
    /// kernel printed them (the print fmt lines left out).
    const SET_STATE_5_10: &str = "name: inet_sock_set_state\nID: 1308\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:int oldstate;\toffset:16;\tsize:4;\tsigned:1;\n\
\tfield:int newstate;\toffset:20;\tsize:4;\tsigned:1;\n\
\tfield:__u16 sport;\toffset:24;\tsize:2;\tsigned:0;\n\
\tfield:__u16 dport;\toffset:26;\tsize:2;\tsigned:0;\n\
\tfield:__u16 family;\toffset:28;\tsize:2;\tsigned:0;\n\
\tfield:__u16 protocol;\toffset:30;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr[4];\toffset:32;\tsize:4;\tsigned:0;\n\
\tfield:__u8 daddr[4];\toffset:36;\tsize:4;\tsigned:0;\n\
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;\n\
\tfield:__u8 daddr_v6[16];\toffset:56;\tsize:16;\tsigned:0;\n";
    const RETRANSMIT_5_10: &str = "name: tcp_retransmit_skb\nID: 1306\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:__u16 sport;\toffset:28;\tsize:2;\tsigned:0;\n\
\tfield:__u16 dport;\toffset:30;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr[4];\toffset:32;\tsize:4;\tsigned:0;\n\
\tfield:__u8 daddr[4];\toffset:36;\tsize:4;\tsigned:0;\n\
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;\n\
\tfield:__u8 daddr_v6[16];\toffset:56;\tsize:16;\tsigned:0;\n";
    /// BTF members as a fake kernel's: `skc_family` at 16.
    fn members(strukt: &str, member: &str) -> Result<u32> {
        match (strukt, member) {
            ("sock_common", "skc_family") => Ok(16),
            _ => Err(Error::NoMember {
                strukt: strukt.into(),
                member: member.into(),
            }),
        }
    }

    fn formats(set_state: &str, retransmit: &str) -> [TracepointFormat; 2] {
        [
            TracepointFormat::parse("sock/inet_sock_set_state".into(), set_state),
            TracepointFormat::parse("tcp/tcp_retransmit_skb".into(), retransmit),
        ]
    }

    #[test]
    fn on_5_10_the_family_comes_from_the_socket() {
        let [s, r] = formats(SET_STATE_5_10, RETRANSMIT_5_10);
        let (set_state, retransmit) = tracepoint_offsets(&s, &r, &members).expect("5.10 runs");
        assert_eq!((set_state.family, set_state.daddr_v6), (28, 56));
        assert_eq!(
            retransmit.family, 0,
            "no family field: the program reads the socket's"
        );
        assert_eq!(retransmit.sock_common_skc_family, 16);
        assert_eq!(
            (retransmit.skaddr, retransmit.dport, retransmit.daddr_v6),
            (16, 30, 56)
        );
        let offsets = KernelOffsets {
            retransmit,
            ..KernelOffsets::default()
        };
        assert_eq!(fallbacks(&offsets), [Fallback::RetransmitFamilyFromSocket]);
    }

    #[test]
    fn a_record_with_the_fields_reads_them_and_falls_back_on_nothing() {
        // 6.18's record: a `family` (appended here to 5.10's).
        let retransmit = format!("{RETRANSMIT_5_10}\tfield:__u16 family;\toffset:72;\tsize:2;\tsigned:0;\n");
        let [s, r] = formats(SET_STATE_5_10, &retransmit);
        let none = |strukt: &str, member: &str| -> Result<u32> {
            Err(Error::NoMember {
                strukt: strukt.into(),
                member: member.into(),
            })
        };
        let (_, retransmit) = tracepoint_offsets(&s, &r, &none).expect("no BTF member needed");
        assert_eq!((retransmit.family, retransmit.sock_common_skc_family), (72, 0));
        let offsets = KernelOffsets {
            retransmit,
            ..KernelOffsets::default()
        };
        assert!(fallbacks(&offsets).is_empty());
    }

    #[test]
    fn a_field_with_no_replacement_is_named() {
        // A record field the programs cannot do without.
        let set_state = SET_STATE_5_10.replace("newstate", "other");
        let [s, r] = formats(&set_state, RETRANSMIT_5_10);
        let err = tracepoint_offsets(&s, &r, &members).unwrap_err().to_string();
        assert_eq!(
            err,
            "tracepoint sock/inet_sock_set_state: no field newstate in its format file"
        );
        // A socket member the segment program reads.
        let err = segment_offsets(&members).unwrap_err().to_string();
        assert_eq!(err, "kernel BTF: struct sock_common has no member skc_daddr");
        // No family in tcp_retransmit_skb and none in the socket's BTF either.
        let [s, r] = formats(SET_STATE_5_10, RETRANSMIT_5_10);
        let no_family = |strukt: &str, member: &str| match member {
            "skc_family" => Err(Error::NoMember {
                strukt: strukt.into(),
                member: member.into(),
            }),
            _ => members(strukt, member),
        };
        let err = tracepoint_offsets(&s, &r, &no_family).unwrap_err().to_string();
        assert_eq!(err, "kernel BTF: struct sock_common has no member skc_family");
    }

    /// Reads the real kernel's BTF: runs wherever /sys/kernel/btf/vmlinux is readable.
    #[test]
    fn finds_offsets_in_this_kernels_btf() {
        let btf = Btf::from_file(VMLINUX_BTF).expect("this kernel has BTF");
        // tcp_sock starts with inet_connection_sock, which starts with inet_sock: a member
        // deep in it is beyond sock_common.
        assert!(member_offset(&btf, "tcp_sock", "bytes_received").unwrap() > 1000);
        assert!(member_offset(&btf, "net", "ns").is_ok());
        let skc_net = member_offset(&btf, "sock_common", "skc_net").unwrap();
        assert!(skc_net > 0 && skc_net < 136, "{skc_net}");
        // skc_daddr is the first member of an anonymous union at offset 0.
        assert_eq!(member_offset(&btf, "sock_common", "skc_daddr").unwrap(), 0);
        // skc_dport sits inside an anonymous struct inside an anonymous union, with skc_num
        // after it (the 32-bit `skc_portpair`).
        let member = |strukt: &str, name: &str| member_offset(&btf, strukt, name);
        let segment = segment_offsets(&member).expect("the segment program's members");
        assert_eq!(segment.skc_num, segment.skc_dport + 2, "{segment:?}");
        assert!(segment.skc_v6_daddr > segment.skc_family, "{segment:?}");
        assert!(
            segment.tcp_snd_una > 1000 && segment.tcp_write_seq > 1000 && segment.skb_data > segment.skb_len,
            "{segment:?}"
        );
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
