//! The Go-client uprobes (`ebpf/src/gotls.rs`): loaded with the other programs, attached to
//! one binary at a time at the file offsets `host::gobin` found in it, detached when no
//! client runs that binary any more.
use std::path::Path;

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};

use super::programs::{program_of, Error, Probes, Result};

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
        let tag = |name: &'static str, v: &'_ Vec<u64>| v.iter().map(move |o| (name, *o)).collect::<Vec<_>>();
        tag(WRITE_HEADER, &self.write_header)
            .into_iter()
            .chain(tag(TLS_WRITE, &self.tls_write))
            .chain(tag(TLS_READ, &self.tls_read))
            .chain(tag(FRAME_HEADER, &self.frame_header_returns))
    }

    pub fn count(&self) -> usize {
        self.each().count()
    }
}

/// The uprobes attached to one binary; give them back to [`Probes::detach_go`].
#[derive(Debug)]
pub struct Links(Vec<(&'static str, UProbeLinkId)>);

/// Loads the programs (not attached).
pub(super) fn load(ebpf: &mut Ebpf) -> Result<()> {
    for name in PROGRAMS {
        let program: &mut UProbe = program_of(ebpf, name)?;
        program.load().map_err(|source| Error::Program { name, source })?;
    }
    Ok(())
}

impl Probes {
    /// Why the Go-client programs cannot be used, if they cannot.
    pub fn go_unavailable(&self) -> Option<&str> {
        self.go_loaded.as_ref().err().map(String::as_str)
    }

    /// Attaches every site in `binary` (all processes that run it): all or nothing.
    pub fn attach_go(&mut self, binary: &Path, sites: &Sites) -> Result<Links> {
        if let Err(why) = &self.go_loaded {
            return Err(Error::GoUnavailable(why.clone()));
        }
        let mut links = Links(Vec::new());
        for (name, offset) in sites.each() {
            let attached = program_of::<UProbe>(&mut self.ebpf, name).and_then(|p| {
                p.attach(
                    UProbeAttachLocation::AbsoluteOffset(offset),
                    binary,
                    UProbeScope::AllProcesses,
                )
                .map_err(|source| Error::Program { name, source })
            });
            match attached {
                Ok(link) => links.0.push((name, link)),
                Err(err) => {
                    self.detach_go(links);
                    return Err(err);
                }
            }
        }
        Ok(links)
    }

    /// Detaches what [`attach_go`](Self::attach_go) attached.
    pub fn detach_go(&mut self, links: Links) {
        for (name, link) in links.0 {
            if let Ok(p) = program_of::<UProbe>(&mut self.ebpf, name) {
                if let Err(err) = p.detach(link) {
                    tracing::warn!("detaching {name}: {err}");
                }
            }
        }
    }
}
