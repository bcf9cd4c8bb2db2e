//! The Go-client uprobes (`ebpf/src/gotls.rs`): loaded with the other programs, attached to
//! one binary at a time at the file offsets `host::gobin` found in it, detached when no
//! client runs that binary any more.
use std::path::Path;

use aya::{
    programs::{uprobe::UProbeAttachLocation, TracePoint},
    Ebpf,
};

use super::{
    object::{program_of, Error, Result},
    uprobes::{self, Links},
};

pub const WRITE_HEADER: &str = "go_write_header";
pub const TLS_WRITE: &str = "go_tls_write";
pub const TLS_READ: &str = "go_tls_read";
pub const FRAME_HEADER: &str = "go_frame_header";
pub const FRAME_READ: &str = "go_frame_read";
pub const FRAME_CONN: &str = "go_frame_conn";
pub const FRAME_RESULT: &str = "go_frame_result";
pub const HEADERS_SENT: &str = "go_headers_sent";
pub const RESET_SENT: &str = "go_reset_sent";
pub const PROGRAMS: [&str; 9] = [
    WRITE_HEADER,
    HEADERS_SENT,
    RESET_SENT,
    TLS_WRITE,
    TLS_READ,
    FRAME_HEADER,
    FRAME_READ,
    FRAME_CONN,
    FRAME_RESULT,
];

/// Where in one binary each program goes: file offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sites {
    /// Entries of `(*ClientConn).writeHeader` (Go's bundled HTTP/2 and `x/net/http2`).
    pub write_header: Vec<u64>,
    /// Entries of `(*ClientConn).writeHeaders` and `(*ClientConn).writeStreamReset` of every
    /// copy, where each copy writes every request's HEADERS and every RST_STREAM through them
    /// (`host::gobin::http2::writes`): the written frames the judgement needs, from registers.
    pub headers_sent: Vec<u64>,
    pub resets_sent: Vec<u64>,
    /// Entry of `crypto/tls.(*Conn).Write`, unless `headers_sent` and `resets_sent` are the
    /// write probes: the frame headers read from what it is given.
    pub tls_write: Vec<u64>,
    /// Entry of `crypto/tls.(*Conn).Read`, unless `frame_results` and `frame_conn_reads` are
    /// the frame probes.
    pub tls_read: Vec<u64>,
    /// The error check after `(*Framer).ReadFrame`'s header read, in each copy where the
    /// header is still in the result registers there and the framer kept at RBP+16
    /// (`host::gobin::frame_result`): the frames and which connection, with no read of the
    /// client's memory for a known reader.
    pub frame_results: Vec<u64>,
    /// The error check after `readFrameHeader`'s read in every other copy, where each keeps
    /// both its `buf` and its reader where `go_frame_conn` reads them: the frames and which
    /// connection they came from, in one probe (`tls_read` then stays empty).
    pub frame_conn_reads: Vec<u64>,
    /// The error check after `readFrameHeader`'s read, in each copy where it was found
    /// (`host::gobin::call_check`: a probe there costs the client a sixteenth of one on a RET).
    pub frame_header_reads: Vec<u64>,
    /// Every RET of the copies of `readFrameHeader` where it was not.
    pub frame_header_returns: Vec<u64>,
}

impl Sites {
    /// Every (program, offset), in the order they are attached. The client runs while they
    /// are attached one by one, and a stream is judged once its connection's reads are
    /// followed (`READING`, `FRESH`) and its request was named: so the probes that see its
    /// end (`FRAME_RESULT`, `FRAME_CONN`, `FRAME_READ`, `FRAME_HEADER`) and name it
    /// (`WRITE_HEADER`), and `RESET_SENT`, which ends streams too, come first, the ones that
    /// start the evidence (`TLS_READ`, then `HEADERS_SENT` or `TLS_WRITE`, which also say
    /// `FRESH`) last. (`FRAME_RESULT` and `FRAME_CONN` say `READING` too, but only of a
    /// connection whose record `HEADERS_SENT` or `TLS_WRITE` made.)
    /// The other way round, a request sent between the last two attachments had its response
    /// unseen and was called stuck (CI, kube-controller-manager probed during its start-up).
    fn each(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        [
            (FRAME_RESULT, &self.frame_results),
            (FRAME_CONN, &self.frame_conn_reads),
            (FRAME_READ, &self.frame_header_reads),
            (FRAME_HEADER, &self.frame_header_returns),
            (WRITE_HEADER, &self.write_header),
            (RESET_SENT, &self.resets_sent),
            (TLS_READ, &self.tls_read),
            (HEADERS_SENT, &self.headers_sent),
            (TLS_WRITE, &self.tls_write),
        ]
        .into_iter()
        .flat_map(|(name, offsets)| offsets.iter().map(move |&offset| (name, offset)))
    }
}

/// Loads the programs (not attached).
pub(super) fn load(ebpf: &mut Ebpf) -> Result<()> {
    uprobes::load(ebpf, &PROGRAMS)
}

/// The tracepoint that says a process began running a program (`ebpf/src/exec.rs`), so that
/// a client-go binary is probed before its first request (`probed.rs`, "at start").
pub const EXEC: &str = "sched_process_exec";

/// Loads and attaches [`EXEC`] for the rest of the agent's life (its link goes with the
/// object).
pub(super) fn attach_exec(ebpf: &mut Ebpf) -> Result<()> {
    let name = EXEC;
    let program: &mut TracePoint = program_of(ebpf, name)?;
    program.load().map_err(|source| Error::Program { name, source })?;
    program
        .attach("sched", "sched_process_exec")
        .map(drop)
        .map_err(|source| Error::Program { name, source })
}

/// Attaches every site in `binary` (all processes that run it): all or nothing.
pub(super) fn attach(ebpf: &mut Ebpf, binary: &Path, sites: &Sites) -> Result<Links> {
    let places = sites
        .each()
        .map(|(name, offset)| (name, UProbeAttachLocation::AbsoluteOffset(offset)));
    uprobes::attach(ebpf, binary, uprobes::Scope::File, places)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order [`Sites::each`] gives is the order of attachment: what sees a stream's end
    /// before what makes it judged.
    #[test]
    fn the_probes_that_see_responses_are_attached_before_the_ones_that_start_evidence() {
        let sites = Sites {
            write_header: vec![1, 2],
            headers_sent: vec![11],
            resets_sent: vec![12],
            tls_write: vec![3],
            tls_read: vec![4],
            frame_results: vec![10],
            frame_conn_reads: vec![9],
            frame_header_reads: vec![8],
            frame_header_returns: vec![5, 6, 7],
        };
        let order: Vec<_> = sites.each().collect();
        assert_eq!(
            order,
            [
                (FRAME_RESULT, 10),
                (FRAME_CONN, 9),
                (FRAME_READ, 8),
                (FRAME_HEADER, 5),
                (FRAME_HEADER, 6),
                (FRAME_HEADER, 7),
                (WRITE_HEADER, 1),
                (WRITE_HEADER, 2),
                (RESET_SENT, 12),
                (TLS_READ, 4),
                (HEADERS_SENT, 11),
                (TLS_WRITE, 3),
            ]
        );
    }
}
