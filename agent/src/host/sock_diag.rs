//! Client for the kernel's `NETLINK_SOCK_DIAG` inet_diag interface: dump, look up
//! and destroy TCP sockets of one network namespace. Layouts follow
//! `include/uapi/linux/{netlink,sock_diag,inet_diag,tcp}.h`; netlink headers are
//! host-endian, ports and addresses network-endian.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use crate::host::netns;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
/// Attribute carrying `struct tcp_info`; requested with bit `INET_DIAG_INFO - 1` of `idiag_ext`.
const INET_DIAG_INFO: u16 = 2;
/// `[INET_DIAG_NOCOOKIE; 2]`: match a socket whatever its cookie.
const NO_COOKIE: u64 = !0;

const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
/// `struct inet_diag_msg`; attributes follow it.
const DIAG_MSG_LEN: usize = 72;
/// Large enough for the biggest dump datagram the kernel builds (it sizes them
/// after the reader's buffer, capped at 32 KiB).
const RECV_BUF_LEN: usize = 32 * 1024;
/// Exact lookups sent in one datagram by [`DiagSocket::lookup_many`]. Each answer is a
/// datagram of its own of about 2 KiB of socket memory: 64 fit the default receive buffer
/// (`net.core.rmem_default`, 208 KiB) with room to spare.
pub const LOOKUP_BATCH: usize = 64;
/// Room for one exact-lookup answer (`inet_diag_msg`, `tcp_info` and a few small attributes:
/// ~450 bytes on Linux 6.x) in the batch receive buffer.
const ANSWER_SLOT: usize = 2048;

thread_local! {
    /// Receive buffer of [`DiagSocket::lookup_many`]: one slot per answer of a batch, so a
    /// batch is received with one `recvmmsg` (one per thread, not per socket).
    static ANSWERS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating a NETLINK_SOCK_DIAG socket")]
    Socket(#[source] io::Error),
    #[error("creating a NETLINK_SOCK_DIAG socket in another netns")]
    Netns(#[from] netns::Error),
    #[error("sending the sock_diag {op} request")]
    Send { op: &'static str, source: io::Error },
    #[error("receiving the sock_diag {op} reply")]
    Recv { op: &'static str, source: io::Error },
    #[error("sock_diag {op} reply datagram of {len} bytes exceeds the {room}-byte buffer")]
    Truncated {
        op: &'static str,
        len: usize,
        room: usize,
    },
    #[error("kernel failed sock_diag {op} with errno {errno} ({})", io::Error::from_raw_os_error(*errno))]
    Kernel { op: &'static str, errno: i32 },
    #[error("malformed {what} in a sock_diag reply")]
    Malformed { what: &'static str },
    #[error("unsupported address family {0} in sock_diag")]
    Family(u16),
    #[error("sock_diag needs one address family for both ends, got {local} and {remote}")]
    FamilyMismatch { local: SocketAddr, remote: SocketAddr },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One TCP socket as reported by inet_diag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSocketInfo {
    /// `libc::AF_INET` or `libc::AF_INET6`.
    pub family: u16,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Kernel `TCP_*` state number (`lifeline_common::tcp_state`).
    pub state: u8,
    /// Socket inode, as in `/proc/<pid>/fd/N -> socket:[inode]`; 0 for
    /// time-wait and request sockets, which have no file.
    pub inode: u64,
    pub uid: u32,
    /// Kernel socket cookie (stable for the socket's lifetime, unique per boot).
    pub cookie: u64,
    /// Absent for sockets without full TCP state (time-wait, request sockets).
    pub tcp: Option<TcpInfo>,
}

/// Selected `struct tcp_info` fields. An older kernel may send a shorter
/// struct: fields beyond the length it returned read as 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Payload bytes received and acknowledged (`tcpi_bytes_received`).
    pub bytes_received: u64,
    /// Payload bytes acknowledged by the peer (`tcpi_bytes_acked`; the kernel
    /// also counts the SYN, so a fresh client reports 1).
    pub bytes_acked: u64,
    /// Payload bytes sent, retransmissions included (`tcpi_bytes_sent`, Linux 4.19+).
    pub bytes_sent: u64,
    /// Payload bytes retransmitted (`tcpi_bytes_retrans`, Linux 4.19+).
    pub bytes_retrans: u64,
    /// Milliseconds since the last data was received.
    pub last_data_recv_ms: u32,
    /// Milliseconds since the last data was sent.
    pub last_data_sent_ms: u32,
    /// Milliseconds since the last ACK was received.
    pub last_ack_recv_ms: u32,
    /// Segments received carrying data.
    pub data_segs_in: u32,
    /// Segments sent carrying data, retransmissions included.
    pub data_segs_out: u32,
    /// All segments received.
    pub segs_in: u32,
    /// Retransmitted segments over the connection's lifetime.
    pub total_retrans: u32,
    /// Consecutive unrecovered RTO timeouts right now.
    pub retransmits: u8,
    /// Smoothed round-trip time in microseconds.
    pub rtt_us: u32,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Bytes written by the process and not sent yet (`tcpi_notsent_bytes`).
    pub notsent_bytes: u32,
    /// Unanswered zero-window or keepalive probes.
    pub probes: u8,
    /// Current RTO backoff exponent.
    pub backoff: u8,
}

/// A `NETLINK_SOCK_DIAG` socket. It answers about the network namespace it was
/// created in. Requests are serialised, so it may be shared between threads.
#[derive(Debug)]
pub struct DiagSocket {
    fd: OwnedFd,
    /// Reusable receive buffer and last sequence number; the lock keeps
    /// concurrent requests from interleaving their replies.
    io: Mutex<Io>,
}

#[derive(Debug)]
struct Io {
    buf: Vec<u8>,
    seq: u32,
}

/// The fields of a request that vary between operations.
struct Request {
    kind: u16,
    flags: u16,
    family: u16,
    ext: u8,
    states: u32,
    /// `(local, remote)` of the one socket addressed; `None` in dumps.
    sockets: Option<(SocketAddr, SocketAddr)>,
    /// In dumps: only sockets with this remote port (0: any).
    remote_port: u16,
    /// Cookie the addressed socket must have, or [`NO_COOKIE`].
    cookie: u64,
}

impl DiagSocket {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self> {
        // SAFETY: plain syscall without pointers; the result is checked below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(Error::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let io = Mutex::new(Io {
            buf: vec![0; RECV_BUF_LEN],
            seq: 0,
        });
        Ok(DiagSocket { fd, io })
    }

    /// Opens a socket inside the network namespace that `ns_path` refers to.
    pub fn open_in(ns_path: &Path) -> Result<Self> {
        netns::run_in_netns(ns_path, Self::open)?
    }

    /// All TCP sockets of `family` (`AF_INET`/`AF_INET6`) whose state bit is set
    /// in `states` (`1 << TCP_*`), with `tcp_info` where the kernel has it.
    pub fn dump(&self, family: u16, states: u32) -> Result<Vec<TcpSocketInfo>> {
        self.dump_filtered(family, states, 0)
    }

    /// A dump; `remote_port` 0 for any.
    fn dump_filtered(&self, family: u16, states: u32, remote_port: u16) -> Result<Vec<TcpSocketInfo>> {
        if family != libc::AF_INET as u16 && family != libc::AF_INET6 as u16 {
            return Err(Error::Family(family));
        }
        let request = Request {
            kind: SOCK_DIAG_BY_FAMILY,
            flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
            family,
            ext: 1 << (INET_DIAG_INFO - 1),
            states,
            sockets: None,
            remote_port,
            cookie: NO_COOKIE,
        };
        let mut found = Vec::new();
        self.transact("dump", &request, |msg| {
            found.push(parse_diag_msg(msg)?);
            Ok(())
        })?;
        Ok(found)
    }

    /// [`dump`](Self::dump) of the sockets whose remote port is `port` only (the kernel
    /// filters: other sockets are not copied out).
    pub fn dump_to_port(&self, family: u16, states: u32, port: u16) -> Result<Vec<TcpSocketInfo>> {
        self.dump_filtered(family, states, port)
    }

    /// The one TCP socket with exactly these addresses, or `None` if there is none.
    /// (The kernel falls back to a listener bound to `local` when no connection
    /// matches; such an answer is discarded here.)
    pub fn lookup(&self, local: SocketAddr, remote: SocketAddr) -> Result<Option<TcpSocketInfo>> {
        let ext = 1 << (INET_DIAG_INFO - 1);
        let request = Request::exact(SOCK_DIAG_BY_FAMILY, ext, local, remote, NO_COOKIE)?;
        let mut found = None;
        if_exists(self.transact("lookup", &request, |msg| {
            found = Some(parse_diag_msg(msg)?);
            Ok(())
        }))?;
        Ok(found.filter(|info| info.local == local && info.remote == remote))
    }

    /// [`lookup`](Self::lookup) for many sockets, answers in the same order: the requests of
    /// up to [`LOOKUP_BATCH`] sockets go in one datagram (the kernel answers each in turn), so
    /// a round costs two system calls per batch and one receive per answer instead of two
    /// system calls and a wake-up per socket.
    pub fn lookup_many(&self, pairs: &[(SocketAddr, SocketAddr)]) -> Result<Vec<Option<TcpSocketInfo>>> {
        let mut found = Vec::with_capacity(pairs.len());
        for chunk in pairs.chunks(LOOKUP_BATCH) {
            self.lookup_chunk(chunk, &mut found)?;
        }
        Ok(found)
    }

    fn lookup_chunk(
        &self,
        chunk: &[(SocketAddr, SocketAddr)],
        found: &mut Vec<Option<TcpSocketInfo>>,
    ) -> Result<()> {
        const OP: &str = "batched lookup";
        let ext = 1 << (INET_DIAG_INFO - 1);
        let requests = chunk
            .iter()
            .map(|(local, remote)| Request::exact(SOCK_DIAG_BY_FAMILY, ext, *local, *remote, NO_COOKIE))
            .collect::<Result<Vec<_>>>()?;
        let mut io = self.io.lock().unwrap_or_else(PoisonError::into_inner);
        let Io { seq, .. } = &mut *io;
        let first = seq.wrapping_add(1);
        let mut msg = Vec::with_capacity(requests.len() * (NLMSG_HDRLEN + REQ_LEN));
        for (i, request) in requests.iter().enumerate() {
            *seq = first.wrapping_add(i as u32);
            msg.extend_from_slice(&request.encode(*seq));
        }
        self.send(OP, &msg)?;
        let mut answers: Vec<Option<Option<TcpSocketInfo>>> = vec![None; chunk.len()];
        let mut pending = chunk.len();
        let mut outcome = Ok(());
        let mut scratch = ANSWERS.with_borrow_mut(std::mem::take);
        scratch.resize(LOOKUP_BATCH * ANSWER_SLOT, 0);
        while pending > 0 {
            let datagrams = match self.recv_many(OP, &mut scratch, pending.min(LOOKUP_BATCH)) {
                Ok(d) => d,
                Err(err) => {
                    ANSWERS.with_borrow_mut(|b| *b = scratch);
                    return Err(err);
                }
            };
            for (start, len) in datagrams {
                let mut rest = &scratch[start..start + len];
                while !rest.is_empty() {
                    let (header, payload, next) = split_nlmsg(rest)?;
                    rest = next;
                    let index = header.seq.wrapping_sub(first) as usize;
                    let Some(slot) = answers.get_mut(index).filter(|a| a.is_none()) else {
                        continue; // left over from an earlier, abandoned request
                    };
                    let answer = match header.kind as i32 {
                        libc::NLMSG_ERROR => match read_i32(payload, 0).wrapping_neg() {
                            0 | libc::ENOENT | libc::ESTALE => None,
                            errno => {
                                outcome = outcome.and(Err(Error::Kernel { op: OP, errno }));
                                None
                            }
                        },
                        kind if kind < libc::NLMSG_MIN_TYPE => continue,
                        _ => match parse_diag_msg(payload) {
                            Ok(info) => {
                                let (local, remote) = chunk[index];
                                Some(info).filter(|i| i.local == local && i.remote == remote)
                            }
                            Err(err) => {
                                outcome = outcome.and(Err(err));
                                None
                            }
                        },
                    };
                    *slot = Some(answer);
                    pending -= 1;
                }
            }
        }
        ANSWERS.with_borrow_mut(|b| *b = scratch);
        outcome?;
        found.extend(answers.into_iter().map(Option::flatten));
        Ok(())
    }

    /// Aborts the TCP socket with exactly these addresses (its owner then gets
    /// `ECONNABORTED`, the peer a RST). `Ok(false)` if there is no such socket.
    /// The socket is first looked up and then destroyed by cookie, so that the
    /// kernel's listener fallback can never abort a listening socket instead.
    pub fn destroy(&self, local: SocketAddr, remote: SocketAddr) -> Result<bool> {
        let Some(target) = self.lookup(local, remote)? else {
            return Ok(false);
        };
        let mut request = Request::exact(SOCK_DESTROY, 0, local, remote, target.cookie)?;
        request.flags |= libc::NLM_F_ACK as u16;
        if_exists(self.transact("destroy", &request, |_| Ok(())))
    }

    /// Sends `request` and feeds every reply payload to `on_msg` until the
    /// reply ends: `NLMSG_DONE`, `NLMSG_ERROR` (an ack if errno is 0), or a
    /// message that is not part of a multi-part reply. On an error from
    /// `on_msg` the reply is still drained, then the first error is returned.
    fn transact(
        &self,
        op: &'static str,
        request: &Request,
        mut on_msg: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut io = self.io.lock().unwrap_or_else(PoisonError::into_inner);
        let Io { buf, seq } = &mut *io;
        *seq = seq.wrapping_add(1);
        self.send(op, &request.encode(*seq))?;
        let mut outcome = Ok(());
        loop {
            let len = self.recv(op, buf)?;
            let mut rest = &buf[..len];
            while !rest.is_empty() {
                let (header, payload, next) = split_nlmsg(rest)?;
                rest = next;
                if header.seq != *seq {
                    continue; // left over from an earlier, abandoned request
                }
                let errno = match header.kind as i32 {
                    libc::NLMSG_DONE | libc::NLMSG_ERROR => read_i32(payload, 0).wrapping_neg(),
                    kind if kind < libc::NLMSG_MIN_TYPE => continue, // NOOP, OVERRUN
                    _ => {
                        let result = on_msg(payload);
                        outcome = outcome.and(result);
                        if header.flags & libc::NLM_F_MULTI as u16 != 0 {
                            continue;
                        }
                        0
                    }
                };
                return outcome.and(match errno {
                    0 => Ok(()),
                    errno => Err(Error::Kernel { op, errno }),
                });
            }
        }
    }

    fn send(&self, op: &'static str, msg: &[u8]) -> Result<()> {
        let kernel = netlink_addr();
        loop {
            // SAFETY: `msg` and `kernel` are valid for the lengths passed.
            let sent = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    msg.as_ptr().cast(),
                    msg.len(),
                    0,
                    (&raw const kernel).cast(),
                    size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            match sent {
                n if n >= 0 => return Ok(()),
                _ => {
                    retry_on_eintr(io::Error::last_os_error()).map_err(|source| Error::Send { op, source })?
                }
            }
        }
    }

    /// Receives up to `count` datagrams (at least one, waiting for it) into the
    /// [`ANSWER_SLOT`]-sized slots of `buf` with one `recvmmsg`; returns `(offset, length)` of
    /// each that came from the kernel.
    fn recv_many(&self, op: &'static str, buf: &mut [u8], count: usize) -> Result<Vec<(usize, usize)>> {
        let count = count.min(buf.len() / ANSWER_SLOT).max(1);
        loop {
            let mut iovs: Vec<libc::iovec> = buf
                .chunks_mut(ANSWER_SLOT)
                .take(count)
                .map(|slot| libc::iovec {
                    iov_base: slot.as_mut_ptr().cast(),
                    iov_len: slot.len(),
                })
                .collect();
            let mut names = vec![netlink_addr(); count];
            // SAFETY: all-zero is a valid mmsghdr; the pointers are set right below.
            let mut headers: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; count];
            for ((h, iov), name) in headers.iter_mut().zip(&mut iovs).zip(&mut names) {
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_name = (name as *mut libc::sockaddr_nl).cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_nl>() as u32;
            }
            // SAFETY: `headers` points at `count` iovecs and names that outlive the call.
            let got = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    headers.as_mut_ptr(),
                    count as u32,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            let Ok(got) = usize::try_from(got) else {
                retry_on_eintr(io::Error::last_os_error()).map_err(|source| Error::Recv { op, source })?;
                continue;
            };
            let mut datagrams = Vec::with_capacity(got);
            for (i, (h, name)) in headers.iter().zip(&names).enumerate().take(got) {
                if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    return Err(Error::Truncated {
                        op,
                        len: h.msg_len as usize,
                        room: ANSWER_SLOT,
                    });
                }
                if name.nl_pid == 0 {
                    datagrams.push((i * ANSWER_SLOT, h.msg_len as usize));
                }
            }
            return Ok(datagrams);
        }
    }

    /// Receives one datagram from the kernel into `buf`; returns its length.
    /// Datagrams from other netlink ports are dropped.
    fn recv(&self, op: &'static str, buf: &mut [u8]) -> Result<usize> {
        loop {
            let mut from = netlink_addr();
            let mut from_len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: `buf`, `from` and `from_len` are valid for writes of the sizes passed.
            let got = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                    (&raw mut from).cast(),
                    &mut from_len,
                )
            };
            match usize::try_from(got) {
                Ok(len) if len > buf.len() => {
                    return Err(Error::Truncated {
                        op,
                        len,
                        room: buf.len(),
                    })
                }
                Ok(len) if from.nl_pid == 0 => return Ok(len),
                Ok(_) => continue,
                Err(_) => {
                    retry_on_eintr(io::Error::last_os_error()).map_err(|source| Error::Recv { op, source })?
                }
            }
        }
    }
}

impl Request {
    /// A request addressing the one socket `local` ↔ `remote` (with `cookie`).
    fn exact(kind: u16, ext: u8, local: SocketAddr, remote: SocketAddr, cookie: u64) -> Result<Self> {
        if local.is_ipv4() != remote.is_ipv4() {
            return Err(Error::FamilyMismatch { local, remote });
        }
        Ok(Request {
            kind,
            flags: libc::NLM_F_REQUEST as u16,
            family: family_of(&local),
            ext,
            states: !0,
            sockets: Some((local, remote)),
            remote_port: 0,
            cookie,
        })
    }

    /// `struct nlmsghdr` followed by `struct inet_diag_req_v2`.
    fn encode(&self, seq: u32) -> [u8; NLMSG_HDRLEN + REQ_LEN] {
        let mut msg = [0u8; NLMSG_HDRLEN + REQ_LEN];
        msg[0..4].copy_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
        msg[4..6].copy_from_slice(&self.kind.to_ne_bytes());
        msg[6..8].copy_from_slice(&self.flags.to_ne_bytes());
        msg[8..12].copy_from_slice(&seq.to_ne_bytes());
        let req = &mut msg[NLMSG_HDRLEN..];
        req[0] = self.family as u8;
        req[1] = libc::IPPROTO_TCP as u8;
        req[2] = self.ext;
        req[4..8].copy_from_slice(&self.states.to_ne_bytes());
        let id = &mut req[8..]; // struct inet_diag_sockid
        if let Some((local, remote)) = self.sockets {
            id[0..2].copy_from_slice(&local.port().to_be_bytes());
            id[2..4].copy_from_slice(&remote.port().to_be_bytes());
            id[4..20].copy_from_slice(&ip_to_bytes(local.ip()));
            id[20..36].copy_from_slice(&ip_to_bytes(remote.ip()));
        } else {
            id[2..4].copy_from_slice(&self.remote_port.to_be_bytes());
        }
        id[40..44].copy_from_slice(&(self.cookie as u32).to_ne_bytes());
        id[44..48].copy_from_slice(&((self.cookie >> 32) as u32).to_ne_bytes());
        msg
    }
}

/// Parses the payload of one `SOCK_DIAG_BY_FAMILY` reply: `struct inet_diag_msg`
/// followed by attributes, of which `INET_DIAG_INFO` (`struct tcp_info`) is used.
pub fn parse_diag_msg(msg: &[u8]) -> Result<TcpSocketInfo> {
    if msg.len() < DIAG_MSG_LEN {
        return Err(Error::Malformed {
            what: "inet_diag_msg (too short)",
        });
    }
    let family = u16::from(msg[0]);
    let ip_at = |offset: usize| -> Result<IpAddr> {
        match i32::from(family) {
            libc::AF_INET => Ok(Ipv4Addr::from(field::<4>(msg, offset)).into()),
            libc::AF_INET6 => Ok(Ipv6Addr::from(field::<16>(msg, offset)).into()),
            _ => Err(Error::Family(family)),
        }
    };
    let local = SocketAddr::new(ip_at(8)?, u16::from_be_bytes(field(msg, 4)));
    let remote = SocketAddr::new(ip_at(24)?, u16::from_be_bytes(field(msg, 6)));
    let cookie = u64::from(read_u32(msg, 44)) | (u64::from(read_u32(msg, 48)) << 32);

    let mut tcp = None;
    let mut attrs = &msg[DIAG_MSG_LEN..];
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes(field(attrs, 0)));
        let kind = u16::from_ne_bytes(field(attrs, 2));
        if len < 4 || len > attrs.len() {
            return Err(Error::Malformed {
                what: "rtattr length",
            });
        }
        if kind == INET_DIAG_INFO {
            tcp = Some(TcpInfo::parse(&attrs[4..len]));
        }
        attrs = attrs.get(align4(len)..).unwrap_or_default();
    }
    Ok(TcpSocketInfo {
        family,
        local,
        remote,
        state: msg[1],
        inode: u64::from(read_u32(msg, 68)),
        uid: read_u32(msg, 64),
        cookie,
        tcp,
    })
}

impl TcpInfo {
    /// Reads the fields from `struct tcp_info` bytes at their uapi offsets;
    /// fields past the end of `raw` (older kernels) are 0.
    pub fn parse(raw: &[u8]) -> Self {
        let u64_at = |offset| u64::from_ne_bytes(field(raw, offset));
        TcpInfo {
            retransmits: raw.get(2).copied().unwrap_or(0),
            probes: raw.get(3).copied().unwrap_or(0),
            backoff: raw.get(4).copied().unwrap_or(0),
            unacked: read_u32(raw, 24),
            last_data_sent_ms: read_u32(raw, 44),
            last_data_recv_ms: read_u32(raw, 52),
            last_ack_recv_ms: read_u32(raw, 56),
            rtt_us: read_u32(raw, 68),
            total_retrans: read_u32(raw, 100),
            bytes_acked: u64_at(120),
            bytes_received: u64_at(128),
            segs_in: read_u32(raw, 140),
            notsent_bytes: read_u32(raw, 144),
            data_segs_in: read_u32(raw, 152),
            data_segs_out: read_u32(raw, 156),
            bytes_sent: u64_at(200),
            bytes_retrans: u64_at(208),
        }
    }
}

/// Maps the kernel's "no such socket" (`ENOENT`, or `ESTALE` when the socket
/// with those addresses has another cookie) to `Ok(false)`.
fn if_exists(result: Result<()>) -> Result<bool> {
    match result {
        Ok(()) => Ok(true),
        Err(Error::Kernel {
            errno: libc::ENOENT | libc::ESTALE,
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Header fields of one netlink message that the reply loop needs.
struct NlHeader {
    kind: u16,
    flags: u16,
    seq: u32,
}

/// Splits the first netlink message off `buf`: its header, its payload and the
/// rest of the buffer after alignment padding.
fn split_nlmsg(buf: &[u8]) -> Result<(NlHeader, &[u8], &[u8])> {
    let len = read_u32(buf, 0) as usize;
    if buf.len() < NLMSG_HDRLEN || len < NLMSG_HDRLEN || len > buf.len() {
        return Err(Error::Malformed {
            what: "nlmsghdr length",
        });
    }
    let header = NlHeader {
        kind: u16::from_ne_bytes(field(buf, 4)),
        flags: u16::from_ne_bytes(field(buf, 6)),
        seq: read_u32(buf, 8),
    };
    Ok((
        header,
        &buf[NLMSG_HDRLEN..len],
        buf.get(align4(len)..).unwrap_or_default(),
    ))
}

/// `N` bytes of `buf` at `offset`, or zeros if `buf` ends before.
fn field<const N: usize>(buf: &[u8], offset: usize) -> [u8; N] {
    buf.get(offset..offset + N)
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; N])
}

fn read_u32(buf: &[u8], offset: usize) -> u32 {
    u32::from_ne_bytes(field(buf, offset))
}

fn read_i32(buf: &[u8], offset: usize) -> i32 {
    i32::from_ne_bytes(field(buf, offset))
}

fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// The 16-byte `idiag_src`/`idiag_dst` form: IPv4 in the first 4 bytes.
fn ip_to_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut bytes = [0; 16];
            bytes[..4].copy_from_slice(&v4.octets());
            bytes
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn family_of(addr: &SocketAddr) -> u16 {
    if addr.is_ipv4() {
        libc::AF_INET as u16
    } else {
        libc::AF_INET6 as u16
    }
}

/// The kernel's netlink address (port 0).
fn netlink_addr() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain integers, for which all-zero is valid.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr
}

/// `Ok` (retry) for `EINTR`, the error otherwise.
fn retry_on_eintr(error: io::Error) -> io::Result<()> {
    match error.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        _ => Err(error),
    }
}

#[cfg(test)]
mod tests;
