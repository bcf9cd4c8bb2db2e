//! Decoding the kernel's ring-buffer records into typed events.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use lifeline_common::{
    direction, header_field, protocol, EventKind, ExecEvent, FrameEvent, HeaderEvent, SegmentEvent,
    SockEvent, AF_INET, AF_INET6, HEADER_VALUE_MAX,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "ring buffer record of {0} bytes, expected {state} or {segment}",
        state = std::mem::size_of::<SockEvent>(),
        segment = std::mem::size_of::<SegmentEvent>()
    )]
    Size(usize),
    #[error("ring buffer record with unknown kind {0}")]
    Kind(u32),
    #[error("ring buffer record with unknown address family {0}")]
    Family(u16),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What happened, as decoded from a [`SockEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    State {
        old: u32,
        new: u32,
    },
    Retransmit {
        state: u32,
    },
    /// A segment arrived on the established connection: `len` bytes of payload, when the
    /// client had sent up to `snd_nxt`, had it acknowledged up to `snd_una` and written up to
    /// `write_seq` (see [`SegmentEvent`]).
    Segment {
        len: u16,
        snd_nxt: u32,
        snd_una: u32,
        write_seq: u32,
        srtt_us: u32,
    },
}

/// One kernel event about a socket to an apiserver endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    pub at: Instant,
    /// Kernel address of the socket: its identity while it lives.
    pub sk: u64,
    pub netns: u64,
    pub change: Change,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The process that caused the event, when it ran in that process's context (connect).
    pub owner_tgid: Option<u32>,
    /// Thread name of the task on the CPU (diagnostics only).
    pub thread_comm: String,
    /// `sock.sk_err` at the event (positive errno, 0 for none): why a connect failed or a
    /// connection ended.
    pub sk_err: i32,
    /// `tcp_sock.bytes_received` at the event.
    pub bytes_received: u64,
}

/// Converts kernel CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`) into `Instant`s.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    base_instant: Instant,
    base_ns: u64,
}

impl MonotonicClock {
    pub fn new() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let base_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        Self {
            base_instant: Instant::now(),
            base_ns,
        }
    }

    pub fn instant(&self, ns: u64) -> Instant {
        match ns.checked_sub(self.base_ns) {
            Some(after) => self.base_instant + Duration::from_nanos(after),
            None => self.base_instant - Duration::from_nanos(self.base_ns - ns),
        }
    }
}

/// The socket's address in its own family (see [`decode`]).
fn address(family: u16, a: [u8; 16]) -> Result<IpAddr> {
    match family {
        AF_INET => Ok(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
        // Kept in the socket's own form: a dual-stack socket (every JVM) connects to
        // `::ffff:a.b.c.d`, and sock_diag, the start-up scan and SOCK_DESTROY know it only
        // by that AF_INET6 tuple. Endpoint matching treats the mapped address as IPv4.
        AF_INET6 => Ok(IpAddr::V6(Ipv6Addr::from(a))),
        f => Err(Error::Family(f)),
    }
}

fn decode_segment(bytes: &[u8], clock: &MonotonicClock) -> Result<KernelEvent> {
    // SAFETY: the caller checked the length; SegmentEvent is plain old data; unaligned read.
    let raw: SegmentEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    if raw.kind != EventKind::Segment as u32 {
        return Err(Error::Kind(raw.kind));
    }
    Ok(KernelEvent {
        at: clock.instant(raw.timestamp_ns),
        sk: raw.sk,
        netns: u64::from(raw.netns),
        change: Change::Segment {
            len: raw.data_len,
            snd_nxt: raw.snd_nxt,
            snd_una: raw.snd_una,
            write_seq: raw.write_seq,
            srtt_us: raw.srtt_us,
        },
        local: SocketAddr::new(address(raw.family, raw.saddr)?, raw.sport),
        remote: SocketAddr::new(address(raw.family, raw.daddr)?, raw.dport),
        owner_tgid: None,
        thread_comm: String::new(),
        sk_err: 0,
        bytes_received: 0,
    })
}

/// An HTTP/2 frame header a Go client wrote or read on a watched connection (see
/// [`FrameEvent`]): the frame's header only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub at: Instant,
    pub sk: u64,
    pub tgid: u32,
    pub goroutine: u64,
    pub stream_id: u32,
    pub frame_type: u8,
    pub flags: u8,
    pub length: u32,
    /// The client sent it (else it read it).
    pub sent: bool,
    /// An OpenSSL client's HTTP/1.1 message mapped onto a frame of stream 1 (see
    /// [`lifeline_common::protocol::HTTP1`]), not an HTTP/2 frame.
    pub http1: bool,
}

/// Which request header a [`Header`] carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderField {
    Method,
    Path,
}

/// A request's `:method` or `:path` as a Go client encoded it (see [`HeaderEvent`]). The
/// value is what the kernel copied: at most [`HEADER_VALUE_MAX`] bytes (`cut` when longer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub at: Instant,
    pub tgid: u32,
    pub goroutine: u64,
    pub field: HeaderField,
    pub value: String,
    pub cut: bool,
}

/// One record of the kernel's ring buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Socket(KernelEvent),
    Frame(Frame),
    Header(Header),
    /// Process `tgid` began running a program, at `at`.
    Exec {
        tgid: u32,
        at: Instant,
    },
}

/// Decodes any record, telling the kinds apart by their sizes (all differ).
pub fn decode_record(bytes: &[u8], clock: &MonotonicClock) -> Result<Record> {
    if bytes.len() == std::mem::size_of::<FrameEvent>() {
        // SAFETY: the length matches; FrameEvent is plain old data; unaligned read.
        let raw: FrameEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        if raw.kind != EventKind::Frame as u32 {
            return Err(Error::Kind(raw.kind));
        }
        return Ok(Record::Frame(Frame {
            at: clock.instant(raw.timestamp_ns),
            sk: raw.sk,
            tgid: raw.tgid,
            goroutine: raw.goroutine,
            stream_id: raw.stream_id,
            frame_type: raw.frame_type,
            flags: raw.flags,
            length: raw.length,
            sent: raw.direction == direction::SENT,
            http1: raw.protocol == protocol::HTTP1,
        }));
    }
    if bytes.len() == std::mem::size_of::<ExecEvent>() {
        // SAFETY: as above, for ExecEvent.
        let raw: ExecEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        if raw.kind != EventKind::Exec as u32 {
            return Err(Error::Kind(raw.kind));
        }
        return Ok(Record::Exec {
            tgid: raw.tgid,
            at: clock.instant(raw.timestamp_ns),
        });
    }
    if bytes.len() == std::mem::size_of::<HeaderEvent>() {
        // SAFETY: as above, for HeaderEvent.
        let raw: HeaderEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        if raw.kind != EventKind::Header as u32 {
            return Err(Error::Kind(raw.kind));
        }
        let field = match raw.field {
            header_field::METHOD => HeaderField::Method,
            header_field::PATH => HeaderField::Path,
            other => return Err(Error::Kind(other)),
        };
        let len = (raw.value_len as usize).min(HEADER_VALUE_MAX);
        return Ok(Record::Header(Header {
            at: clock.instant(raw.timestamp_ns),
            tgid: raw.tgid,
            goroutine: raw.goroutine,
            field,
            value: String::from_utf8_lossy(&raw.value[..len]).into_owned(),
            cut: raw.value_len as usize > HEADER_VALUE_MAX,
        }));
    }
    decode(bytes, clock).map(Record::Socket)
}

pub fn decode(bytes: &[u8], clock: &MonotonicClock) -> Result<KernelEvent> {
    if bytes.len() == std::mem::size_of::<SegmentEvent>() {
        return decode_segment(bytes, clock);
    }
    if bytes.len() != std::mem::size_of::<SockEvent>() {
        return Err(Error::Size(bytes.len()));
    }
    // SAFETY: the length matches and SockEvent is plain old data; the read is unaligned-safe.
    let raw: SockEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let change = match raw.kind {
        k if k == EventKind::StateChange as u32 => Change::State {
            old: raw.old_state,
            new: raw.new_state,
        },
        k if k == EventKind::Retransmit as u32 => Change::Retransmit { state: raw.new_state },
        k => return Err(Error::Kind(k)),
    };
    let ip = |a: [u8; 16]| address(raw.family, a);
    let comm_len = raw.comm.iter().position(|b| *b == 0).unwrap_or(raw.comm.len());
    Ok(KernelEvent {
        at: clock.instant(raw.timestamp_ns),
        sk: raw.sk,
        netns: u64::from(raw.netns),
        change,
        local: SocketAddr::new(ip(raw.saddr)?, raw.sport),
        remote: SocketAddr::new(ip(raw.daddr)?, raw.dport),
        owner_tgid: (raw.in_process_context != 0 && raw.tgid != 0).then_some(raw.tgid),
        thread_comm: String::from_utf8_lossy(&raw.comm[..comm_len]).into_owned(),
        sk_err: raw.sk_err as i32,
        bytes_received: raw.bytes_received,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeline_common::{tcp_state, COMM_LEN};

    fn raw(kind: u32, family: u16) -> SockEvent {
        let mut comm = [0u8; COMM_LEN];
        comm[..9].copy_from_slice(b"ll-client");
        let mut saddr = [0u8; 16];
        saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        let mut daddr = saddr;
        daddr[3] = 2;
        SockEvent {
            timestamp_ns: 5,
            sk: 0xffff_8880_1234_5678,
            bytes_received: 1234,
            netns: 4026531840,
            kind,
            tgid: 42,
            pid: 43,
            old_state: tcp_state::CLOSE,
            new_state: tcp_state::SYN_SENT,
            sk_err: 0,
            _pad: 0,
            family,
            sport: 40000,
            dport: 6443,
            in_process_context: 1,
            saddr,
            daddr,
            comm,
        }
    }

    fn bytes(ev: &SockEvent) -> Vec<u8> {
        // SAFETY: SockEvent is repr(C) plain data without padding.
        unsafe {
            std::slice::from_raw_parts(
                (ev as *const SockEvent).cast::<u8>(),
                std::mem::size_of::<SockEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn decodes_a_connect() {
        let clock = MonotonicClock::new();
        let ev = decode(&bytes(&raw(EventKind::StateChange as u32, AF_INET)), &clock).unwrap();
        assert_eq!(
            ev.change,
            Change::State {
                old: tcp_state::CLOSE,
                new: tcp_state::SYN_SENT
            }
        );
        assert_eq!(ev.local, "127.0.0.1:40000".parse().unwrap());
        assert_eq!(ev.remote, "127.0.0.2:6443".parse().unwrap());
        assert_eq!(ev.owner_tgid, Some(42));
        assert_eq!(ev.thread_comm, "ll-client");
        assert_eq!(ev.netns, 4026531840);
        assert_eq!((ev.sk_err, ev.bytes_received), (0, 1234));
    }

    #[test]
    fn softirq_events_name_no_owner_and_mapped_v6_keeps_its_family() {
        let clock = MonotonicClock::new();
        let mut r = raw(EventKind::Retransmit as u32, AF_INET6);
        r.in_process_context = 0;
        r.sk_err = libc::ECONNREFUSED as u32;
        r.saddr = Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped().octets();
        r.daddr = Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets();
        let ev = decode(&bytes(&r), &clock).unwrap();
        assert_eq!(ev.owner_tgid, None);
        assert_eq!(ev.sk_err, libc::ECONNREFUSED);
        assert_eq!(
            ev.remote,
            "[::ffff:10.0.0.1]:6443".parse().unwrap(),
            "the socket's own AF_INET6 form, which sock_diag knows it by"
        );
        assert_eq!(ev.local, "[::ffff:10.0.0.2]:40000".parse().unwrap());
        assert!(matches!(ev.change, Change::Retransmit { .. }));
    }

    #[test]
    fn rejects_malformed_records() {
        let clock = MonotonicClock::new();
        assert_eq!(decode(&[0u8; 7], &clock), Err(Error::Size(7)));
        assert_eq!(decode(&bytes(&raw(99, AF_INET)), &clock), Err(Error::Kind(99)));
        assert_eq!(decode(&bytes(&raw(1, 3)), &clock), Err(Error::Family(3)));
    }
}
