//! The OpenSSL-client uprobes (`ebpf/src/openssl.rs`): loaded with the other programs,
//! attached to one libssl file at a time by symbol, detached when no client maps that file
//! any more.
use std::path::Path;

use aya::{
    programs::{trace_point::TracePointLinkId, uprobe::UProbeAttachLocation, TracePoint},
    Ebpf,
};

use lifeline_common::SslCall;

use super::{
    object::{program_of, Error, Result},
    uprobes::{self, Links},
};

/// Program and the exported function it goes on (entry, except `ssl_read_ret`: returns),
/// in the order they are attached: a request is judged from its request line on
/// (`ssl_write`), so the probes that see its response are attached before it, never after
/// (the client runs meanwhile; see `go_probes::Sites::each`).
pub const SITES: [(&str, &str); 9] = [
    ("ssl_set_fd", "SSL_set_fd"),
    // Python and curl bind a descriptor with SSL_set_fd; the read and write halves alone
    // are rare, and an unknown SSL * is simply not followed.
    ("ssl_set_fd", "SSL_set_rfd"),
    ("ssl_free", "SSL_free"),
    ("ssl_read_ret", "SSL_read"),
    ("ssl_read_ret", "SSL_read_ex"),
    ("ssl_read", "SSL_read"),
    ("ssl_read_ex", "SSL_read_ex"),
    ("ssl_write", "SSL_write"),
    ("ssl_write", "SSL_write_ex"),
];

const PROGRAMS: [&str; 6] = [
    "ssl_set_fd",
    "ssl_free",
    "ssl_write",
    "ssl_read",
    "ssl_read_ex",
    "ssl_read_ret",
];

/// Binds an `SSL *` set up before its library was probed to its descriptor (see
/// `ebpf/src/openssl.rs`); attached while any libssl is probed.
const SYSCALLS_PROGRAM: &str = "ssl_sys_enter_rw";
/// The system calls OpenSSL's socket BIO reads and writes with (`readsocket`/`writesocket`).
const SYSCALLS: [&str; 2] = ["sys_enter_read", "sys_enter_write"];

/// The system-call tracepoints; give them back to
/// [`Probes::detach_ssl_syscalls`](super::programs::Probes::detach_ssl_syscalls).
#[derive(Debug)]
pub struct SyscallLinks(Vec<TracePointLinkId>);

/// Loads the programs (not attached).
pub(super) fn load(ebpf: &mut Ebpf) -> Result<()> {
    uprobes::load(ebpf, &PROGRAMS)?;
    let name = SYSCALLS_PROGRAM;
    let program: &mut TracePoint = program_of(ebpf, name)?;
    program.load().map_err(|source| Error::Program { name, source })?;
    Ok(())
}

/// Attaches every site in `library` (all processes that map it): all or nothing.
pub(super) fn attach(ebpf: &mut Ebpf, library: &Path) -> Result<Links> {
    let places = SITES.map(|(name, symbol)| (name, UProbeAttachLocation::Symbol(symbol)));
    uprobes::attach(ebpf, library, places)
}

/// Attaches the system-call tracepoints that bind older `SSL *`s: all or nothing.
pub(super) fn attach_syscalls(ebpf: &mut Ebpf) -> Result<SyscallLinks> {
    let name = SYSCALLS_PROGRAM;
    let mut links = SyscallLinks(Vec::new());
    for syscall in SYSCALLS {
        let attached = program_of::<TracePoint>(ebpf, name).and_then(|p| {
            p.attach("syscalls", syscall)
                .map_err(|source| Error::Program { name, source })
        });
        match attached {
            Ok(link) => links.0.push(link),
            Err(err) => {
                detach_syscalls(ebpf, links);
                return Err(err);
            }
        }
    }
    Ok(links)
}

pub(super) fn detach_syscalls(ebpf: &mut Ebpf, links: SyscallLinks) {
    for link in links.0 {
        if let Ok(p) = program_of::<TracePoint>(ebpf, SYSCALLS_PROGRAM) {
            if let Err(err) = p.detach(link) {
                tracing::warn!("detaching {SYSCALLS_PROGRAM}: {err}");
            }
        }
    }
}

/// Whether an SSL call on an `SSL *` of unknown descriptor began at or after `since_ns`
/// (kernel monotonic time): the system-call tracepoints would bind it.
pub(super) fn unbound_since(ebpf: &Ebpf, since_ns: u64) -> bool {
    let Some(map) = ebpf.map("SSL_UNBOUND") else {
        return false;
    };
    let Ok(calls) = aya::maps::HashMap::<_, u64, SslCall>::try_from(map) else {
        return false;
    };
    let recent = calls
        .iter()
        .filter_map(std::result::Result::ok)
        .any(|(_, call)| call.at_ns >= since_ns);
    recent
}

#[cfg(test)]
mod tests {
    use super::SITES;

    /// Attached in [`SITES`] order: every probe that sees a response before the one that
    /// names a request.
    #[test]
    fn the_probes_that_see_responses_are_attached_before_the_request_line_probe() {
        let first_write = SITES.iter().position(|(p, _)| *p == "ssl_write").unwrap();
        let last_other = SITES.iter().rposition(|(p, _)| *p != "ssl_write").unwrap();
        assert!(last_other < first_write, "{SITES:?}");
    }
}
