//! The Go-client uprobes (`ebpf/src/gotls.rs`): loaded with the other programs, attached to
//! one binary at a time at the file offsets `host::gobin` found in it, detached when no
//! client runs that binary any more.
use std::path::Path;

use aya::{programs::uprobe::UProbeAttachLocation, Ebpf};

use super::{
    object::Result,
    uprobes::{self, Links},
};

pub const WRITE_HEADER: &str = "go_write_header";
pub const TLS_WRITE: &str = "go_tls_write";
pub const TLS_READ: &str = "go_tls_read";
pub const FRAME_HEADER: &str = "go_frame_header";
pub const PROGRAMS: [&str; 4] = [WRITE_HEADER, TLS_WRITE, TLS_READ, FRAME_HEADER];

/// Where in one binary each program goes: file offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sites {
    /// Entries of `(*ClientConn).writeHeader` (Go's bundled HTTP/2 and `x/net/http2`).
    pub write_header: Vec<u64>,
    /// Entry of `crypto/tls.(*Conn).Write`.
    pub tls_write: Vec<u64>,
    /// Entry of `crypto/tls.(*Conn).Read`.
    pub tls_read: Vec<u64>,
    /// Every RET of `readFrameHeader` (both copies).
    pub frame_header_returns: Vec<u64>,
}

impl Sites {
    fn each(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        [
            (WRITE_HEADER, &self.write_header),
            (TLS_WRITE, &self.tls_write),
            (TLS_READ, &self.tls_read),
            (FRAME_HEADER, &self.frame_header_returns),
        ]
        .into_iter()
        .flat_map(|(name, offsets)| offsets.iter().map(move |&offset| (name, offset)))
    }
}

/// Loads the programs (not attached).
pub(super) fn load(ebpf: &mut Ebpf) -> Result<()> {
    uprobes::load(ebpf, &PROGRAMS)
}

/// Attaches every site in `binary` (all processes that run it): all or nothing.
pub(super) fn attach(ebpf: &mut Ebpf, binary: &Path, sites: &Sites) -> Result<Links> {
    let places = sites
        .each()
        .map(|(name, offset)| (name, UProbeAttachLocation::AbsoluteOffset(offset)));
    uprobes::attach(ebpf, binary, places)
}
