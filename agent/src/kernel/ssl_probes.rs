//! The OpenSSL-client uprobes (`ebpf/src/openssl.rs`): loaded with the other programs,
//! attached to the libssl of one client process at a time (and, to bind its older
//! connections, to its libc's `read` and `write` for a while), detached when it goes. The read
//! and write probes go on the library's internal read and write functions where it has them
//! as `host/sslbin.rs` finds them (a place the kernel emulates), else on the exported entries.
use std::{collections::HashSet, num::NonZeroU32, path::Path};

use aya::{programs::uprobe::UProbeAttachLocation, Ebpf};

use lifeline_common::SslCall;

use crate::host::sslbin::{self, Internals};

use super::{
    object::Result,
    uprobes::{self, Links},
};

/// Program and the exported function it goes on (entry, except `ssl_read_ret`: returns; the
/// read and write probes only where the library's internal functions cannot take them, see
/// `sites`), in the order they are attached: a request is judged from its request line on
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

/// Binds an `SSL *` set up before its process's probes to its descriptor (see
/// `ebpf/src/openssl.rs`), at the libc functions OpenSSL's socket BIO reads and writes with
/// (`readsocket`/`writesocket`).
const BINDING_PROGRAM: &str = "ssl_libc_rw";
const BINDING_SITES: [&str; 2] = ["read", "write"];

/// Loads the programs (not attached).
pub(super) fn load(ebpf: &mut Ebpf) -> Result<()> {
    uprobes::load(ebpf, &PROGRAMS)?;
    uprobes::load(ebpf, &[BINDING_PROGRAM])
}

/// The sites of a libssl in [`SITES`] order: the binding and freeing ones, then the read
/// probes and the write probe, each pair on the internal function `internals` found for it
/// (file offsets; the same programs: the internal read function takes `SSL_read_ex`'s
/// arguments), else on the exported entries.
fn sites(internals: Internals) -> Vec<(&'static str, UProbeAttachLocation<'static>)> {
    let exported = |programs: &'static [&'static str]| {
        SITES
            .iter()
            .filter(move |(program, _)| programs.contains(program))
            .map(|&(program, symbol)| (program, UProbeAttachLocation::Symbol(symbol)))
    };
    let mut sites: Vec<_> = exported(&["ssl_set_fd", "ssl_free"]).collect();
    match internals.read {
        Some(at) => sites.extend([
            ("ssl_read_ret", UProbeAttachLocation::AbsoluteOffset(at)),
            ("ssl_read_ex", UProbeAttachLocation::AbsoluteOffset(at)),
        ]),
        None => sites.extend(exported(&["ssl_read_ret", "ssl_read", "ssl_read_ex"])),
    }
    match internals.write {
        Some(at) => sites.push(("ssl_write", UProbeAttachLocation::AbsoluteOffset(at))),
        None => sites.extend(exported(&["ssl_write"])),
    }
    sites
}

/// Attaches every site in `library` for client process `pid` alone: all or nothing. A
/// libssl is shared by every process on the node that speaks TLS (or every container of one
/// base image): probed for the whole file, each of them would pay a trap per SSL call
/// (issue 26).
pub(super) fn attach(ebpf: &mut Ebpf, library: &Path, pid: NonZeroU32) -> Result<Links> {
    let internals = sslbin::internals(library).unwrap_or_else(|err| {
        // The attach by symbol says what is wrong with the file, if anything is.
        tracing::debug!("{err}");
        Internals::default()
    });
    tracing::debug!(library = %library.display(), ?internals, "where the OpenSSL read and write probes go");
    uprobes::attach(ebpf, library, uprobes::Scope::Process(pid), sites(internals))
}

/// Attaches the binding probe to `libc`'s `read` and `write` for client process `pid` alone:
/// all or nothing.
pub(super) fn attach_binding(ebpf: &mut Ebpf, libc: &Path, pid: NonZeroU32) -> Result<Links> {
    let places = BINDING_SITES.map(|symbol| (BINDING_PROGRAM, UProbeAttachLocation::Symbol(symbol)));
    uprobes::attach(ebpf, libc, uprobes::Scope::Process(pid), places)
}

/// The processes (tgids) with an SSL call on an `SSL *` of unknown descriptor that began at or
/// after `since_ns` (kernel monotonic time): their binding probe would bind it.
pub(super) fn unbound_since(ebpf: &Ebpf, since_ns: u64) -> HashSet<u32> {
    let Some(map) = ebpf.map("SSL_UNBOUND") else {
        return HashSet::new();
    };
    let Ok(calls) = aya::maps::HashMap::<_, u64, SslCall>::try_from(map) else {
        return HashSet::new();
    };
    calls
        .iter()
        .filter_map(std::result::Result::ok)
        .filter(|(_, call)| call.at_ns >= since_ns)
        .map(|(thread, _)| (thread >> 32) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{sites, Internals, SITES};

    /// Attached in [`SITES`] order on any placement: every probe that sees a response before
    /// the one that names a request, and the programs of the exported entries (but `ssl_read`,
    /// whose arguments the internal read function does not take).
    #[test]
    fn the_probes_that_see_responses_are_attached_before_the_request_line_probe() {
        for read in [None, Some(1)] {
            for write in [None, Some(2)] {
                let programs: Vec<&str> = sites(Internals { read, write }).iter().map(|(p, _)| *p).collect();
                let first_write = programs.iter().position(|p| *p == "ssl_write").unwrap();
                let last_other = programs.iter().rposition(|p| *p != "ssl_write").unwrap();
                assert!(last_other < first_write, "{programs:?}");
                let theirs: BTreeSet<_> = SITES
                    .iter()
                    .map(|(p, _)| *p)
                    .filter(|p| read.is_none() || *p != "ssl_read")
                    .collect();
                assert_eq!(programs.iter().copied().collect::<BTreeSet<_>>(), theirs);
                let expected = if read.is_some() { 5 } else { 7 } + if write.is_some() { 1 } else { 2 };
                assert_eq!(programs.len(), expected, "{programs:?}");
            }
        }
    }
}
