//! Types shared by lifeline's kernel programs (`lifeline-ebpf`) and the userspace agent.
//!
//! Every type is `#[repr(C)]` with explicit padding fields and no `bool`, so the kernel and
//! userspace agree on the layout byte for byte. The `user` feature adds `aya::Pod` impls.
#![no_std]

/// Longest task name the kernel keeps (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// Maximum number of endpoint prefixes userspace may install in [`EndpointKey`] form.
pub const MAX_ENDPOINTS: u32 = 4096;

/// Address family values as the kernel reports them.
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// Bits of an [`EndpointKey`] before the address: the destination port.
pub const ENDPOINT_PORT_BITS: u32 = 16;

/// Data half of the `ENDPOINTS` longest-prefix-match key: the destination port (big endian)
/// followed by the destination address as IPv6 (IPv4 as `::ffff:a.b.c.d`). The prefix length
/// covers the port (16 bits, always exact) plus the address prefix, so one trie holds IPv4 and
/// IPv6 hosts and CIDRs, and an IPv4 endpoint also matches a dual-stack socket that connects to
/// its IPv4-mapped address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointKey {
    pub port_be: [u8; 2],
    pub addr: [u8; 16],
}

/// What the kernel saw happen to a watched socket.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A TCP state transition (`sock/inet_sock_set_state`).
    StateChange = 1,
    /// A segment was retransmitted (`tcp/tcp_retransmit_skb`).
    Retransmit = 2,
    /// A segment arrived on an established connection (`tcp/tcp_probe`): a [`SegmentEvent`].
    Segment = 3,
    /// An HTTP/2 frame a Go client wrote or read on a watched connection: a [`FrameEvent`].
    Frame = 4,
    /// A request's `:method` or `:path` as a Go client encoded it, or the method and path of
    /// an OpenSSL client's HTTP/1.1 request line: a [`HeaderEvent`].
    Header = 5,
    /// A process began running a program (`sched/sched_process_exec`): an [`ExecEvent`].
    Exec = 6,
}

/// A process that began running a program: userspace looks at the program at once, so that a
/// Go client's first requests are seen (the agent's `kernel/probed.rs`, "at start"). Nothing
/// but the process leaves the kernel: the program is read through `/proc/PID/exe`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    pub timestamp_ns: u64,
    /// [`EventKind::Exec`] as u32.
    pub kind: u32,
    pub tgid: u32,
}

/// Who sent an HTTP/2 frame of a [`FrameEvent`].
pub mod direction {
    /// The client wrote it (requests, its own RST_STREAM or GOAWAY).
    pub const SENT: u8 = 0;
    /// The client read it (response headers, data, the server's RST_STREAM or GOAWAY).
    pub const RECEIVED: u8 = 1;
}

/// One HTTP/2 frame of a Go client's watched connection, read from the client's own plaintext:
/// only the 9-byte frame header (type, flags, stream, length) leaves the kernel, never a
/// payload. Sent for HEADERS, RST_STREAM and GOAWAY in both directions, for DATA that ends a
/// stream, and for other DATA received at most once per [`FRAME_COALESCE_NS`] per stream.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FrameEvent {
    /// Kernel time (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// Kernel address of the connection's `struct sock`.
    pub sk: u64,
    /// The goroutine (`g`, register R14 in Go's ABI) that wrote or read the frame: pairs a
    /// request's HEADERS frame with the [`HeaderEvent`]s its goroutine encoded just before.
    pub goroutine: u64,
    /// [`EventKind::Frame`] as u32.
    pub kind: u32,
    pub tgid: u32,
    pub stream_id: u32,
    /// Payload length from the frame header.
    pub length: u32,
    pub frame_type: u8,
    pub flags: u8,
    /// [`direction`].
    pub direction: u8,
    /// [`protocol`]: HTTP/2 frames of a Go client, or an HTTP/1.1 client's messages mapped
    /// onto frames (see [`protocol::HTTP1`]).
    pub protocol: u8,
    pub _pad: [u8; 4],
}

/// Which protocol a [`FrameEvent`] describes.
pub mod protocol {
    /// An HTTP/2 frame header, as read from a Go client.
    pub const HTTP2: u8 = 0;
    /// An HTTP/1.1 message of an OpenSSL client, as a frame of stream 1 (one request at a
    /// time per connection): a request line written is a HEADERS frame sent, a status line
    /// read a HEADERS frame received, the chunked body's terminator a DATA frame received
    /// with END_STREAM, other bytes read a DATA frame received (coalesced).
    pub const HTTP1: u8 = 1;
    /// In the flags of an HTTP/1.1 response's HEADERS record: its headers say
    /// `Transfer-Encoding: chunked`, so its end (the terminator) can be seen.
    pub const HTTP1_CHUNKED: u8 = 0x80;
}

/// DATA frames received on one stream within this long of the last one sent are not sent:
/// one per second is enough to know that the stream is alive.
pub const FRAME_COALESCE_NS: u64 = 1_000_000_000;

/// Where Go's `readFrameHeader(buf, r)` keeps `buf`'s pointer, above RSP, at the error check
/// after its read (every Go release read so far: `agent/src/host/gobin/call_check.rs`).
pub const GO_FRAME_BUF_SLOT: u64 = 0x50;

/// Where it keeps the data word of `r` (the framer's `*bufio.Reader`), above RSP at the same
/// check: 32 bytes above `buf`, so one read of 40 bytes from `GO_FRAME_BUF_SLOT` gets both.
pub const GO_FRAME_READER_SLOT: u64 = 0x70;

/// Longest `:path` value the kernel copies (a longer one is cut, and says so by its length).
pub const HEADER_VALUE_MAX: usize = 512;

/// Which request header a [`HeaderEvent`] carries: only these two are ever read.
pub mod header_field {
    pub const METHOD: u32 = 1;
    pub const PATH: u32 = 2;
}

/// A request's `:method` or `:path`, as the Go client's HTTP/2 transport encoded it
/// (`(*ClientConn).writeHeader`), before HPACK: no other header's name or value leaves the
/// kernel. The HEADERS frame that carries the request follows from the same goroutine.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HeaderEvent {
    pub timestamp_ns: u64,
    pub goroutine: u64,
    /// [`EventKind::Header`] as u32.
    pub kind: u32,
    pub tgid: u32,
    /// [`header_field`].
    pub field: u32,
    /// Length of the whole value; only the first [`HEADER_VALUE_MAX`] bytes are in `value`.
    pub value_len: u32,
    pub value: [u8; HEADER_VALUE_MAX],
}

/// Key of maps kept per goroutine of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoroutineKey {
    pub goroutine: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// An OpenSSL connection of one process: the `SSL *` (map `SSL_FDS` and the per-connection
/// coalescing of reads).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SslKey {
    pub ssl: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// An `SSL_read`/`SSL_read_ex` in progress on a watched socket, by thread (map `SSL_READS`):
/// what its return probe needs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SslRead {
    pub sk: u64,
    pub ssl: u64,
    /// The caller's buffer.
    pub buf: u64,
    /// `SSL_read_ex`'s `size_t *readbytes`; 0 for `SSL_read` (the count is its result).
    pub readbytes: u64,
}

/// An SSL call whose `SSL *` has no known descriptor yet, by thread (map `SSL_UNBOUND`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SslCall {
    pub ssl: u64,
    pub buf: u64,
    pub len: u64,
    /// 1 for `SSL_write`/`SSL_write_ex`, 0 for reads.
    pub write: u64,
    /// When the call began (`bpf_ktime_get_ns`): userspace attaches the system-call
    /// tracepoints that bind it while such calls are recent.
    pub at_ns: u64,
}

/// Key of the per-stream coalescing map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamKey {
    pub sk: u64,
    pub stream_id: u32,
    pub _pad: u32,
}

/// Inbound payload per segment up to which a segment may be a keepalive-sized record (an
/// HTTP/2 PING, PING ack, SETTINGS ack, WINDOW_UPDATE or RST_STREAM in one TLS record: 35–46
/// bytes); the kernel uses it only to coalesce the segments of one long answer.
pub const KEEPALIVE_RECORD_BYTES: u32 = 48;

/// A segment that continues an answer (payload, nothing sent since) within this long of the
/// last one sent is not sent again: the answer is already known.
pub const SEGMENT_COALESCE_NS: u64 = 1_000_000_000;

/// One segment that arrived on a watched established connection, in arrival order: the
/// *ordered* evidence of requests and answers. `snd_nxt` is how far the client had sent when
/// it arrived, so bytes sent between two segments are known to lie between them. Sent for
/// every segment with payload, and for a segment without payload only when the client sent
/// something since the last one sent (its acknowledgement times the request); the segments of
/// one long answer are coalesced (see [`SEGMENT_COALESCE_NS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SegmentEvent {
    /// Kernel time of arrival (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// Kernel address of the `struct sock`.
    pub sk: u64,
    /// [`EventKind::Segment`] as u32.
    pub kind: u32,
    /// Inode number of the socket's network namespace.
    pub netns: u32,
    /// The client's `snd_nxt` when the segment arrived (sequence space).
    pub snd_nxt: u32,
    /// The client's `snd_una` when the segment arrived (before its acknowledgement counted):
    /// what was sent but not acknowledged yet lies between the two.
    pub snd_una: u32,
    /// The client's `write_seq` when the segment arrived: what it wrote but the kernel has not
    /// sent yet lies between `snd_nxt` and it. All three equal: nothing unsent, nothing
    /// unacknowledged (the agent counts such a segment as a look at the connection).
    pub write_seq: u32,
    /// Smoothed round-trip time, microseconds.
    pub srtt_us: u32,
    /// TCP payload of the segment, bytes.
    pub data_len: u16,
    pub family: u16,
    /// Host byte order.
    pub sport: u16,
    /// Host byte order.
    pub dport: u16,
    /// IPv4 in the first 4 bytes.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// What the kernel remembers per watched socket between segments (map `SEGMENTS`, keyed by
/// the socket's kernel address).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SegmentState {
    pub last_sent_ns: u64,
    /// `snd_nxt` of the last segment sent.
    pub snd_nxt: u32,
    pub netns: u32,
    /// Whether the last segment sent carried more than keepalive-sized payload.
    pub payload: u32,
    /// The process of a muted connection (see [`MUTE_AFTER`]); 0 for one that is reported.
    pub muted_tgid: u32,
}

/// Index of counters in the `COUNTERS` array map.
pub mod counter {
    /// Events dropped because the ring buffer was full.
    pub const LOST: u32 = 0;
    /// Events submitted (all kinds).
    pub const SENT: u32 = 1;
    /// Connects held back because their process was over its event budget (see
    /// [`CONNECT_BUDGET`](super::CONNECT_BUDGET)); each is sent later if it connects.
    pub const DEFERRED: u32 = 2;
    /// Held-back connects that failed: counted in `FAILURES`, never sent as events.
    pub const AGGREGATED: u32 = 3;
    /// Lost records whose loss could not be written to `LOSSES` (the map was full): they may
    /// have concerned any connection, so userspace forgets every connection's waits.
    pub const UNSCOPED: u32 = 4;
    pub const LEN: u32 = 5;
}

/// Why a record was not sent (`LossKey::cause`).
pub mod loss_cause {
    /// The ring buffer was full.
    pub const RING_FULL: u16 = 1;
    /// Its process was over its stream record budget ([`STREAM_BUDGET`](super::STREAM_BUDGET)).
    pub const RATE_LIMITED: u16 = 2;
}

/// Key of the `LOSSES` map: records lost about one socket, or one process, for one cause. The
/// value is a count per CPU that only grows; userspace reads differences and removes keys
/// that stopped growing.
///
/// The most precise scope the program had: `sk` (the socket's kernel address) when known;
/// else `tgid` (a header record, which knows its process and goroutine only).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LossKey {
    pub sk: u64,
    /// 0 where the program runs for no process in particular (softirq).
    pub tgid: u32,
    pub cause: u16,
    pub _pad: [u16; 5],
}

/// Entries of the `LOSSES` map. Beyond them a loss is counted node-wide (`counter::UNSCOPED`).
pub const MAX_LOSSES: u32 = 4096;

/// Stream records (frames and headers from the uprobes) each process may send per
/// [`BUDGET_WINDOW_NS`] by default (the agent's `--stream-record-budget`); beyond it they are dropped and counted as its loss
/// (`loss_cause::RATE_LIMITED`). A request costs about five records (`:method`, `:path`, its
/// HEADERS both ways, the END_STREAM), and DATA frames are coalesced per stream
/// ([`FRAME_COALESCE_NS`]): 20,000 is a client sending ~4,000 requests a second, well above
/// what client-go's rate limits let a controller send (kube-controller-manager: 20/s by
/// default), so one process's flood costs its own visibility, not its neighbours'.
pub const STREAM_BUDGET: u32 = 20_000;

/// Connect events per process (tgid) and [`BUDGET_WINDOW_NS`] that are sent at once. Beyond
/// it, a connect is held back in the kernel until it ends its SYN_SENT phase: if it connects,
/// the connect and the establishment are sent then (an established connection is never
/// aggregated away); if it fails, it is only counted per (process, endpoint, errno) in
/// `FAILURES`, which userspace reads every second. One process's connect storm therefore
/// costs a few events per second, and cannot crowd other processes' events out of the ring.
pub const CONNECT_BUDGET: u32 = 32;
/// Connections a process may close itself per window (while over its connect budget) before
/// its held-back connects that connect are *muted* instead of sent: none of their events
/// (state changes, segments) are, each counted as its process's loss
/// (`loss_cause::RATE_LIMITED`). A process that connects and closes thousands of times a
/// second then costs the ring little more than its budget each second, and its own visibility
/// only: the table learns of a muted connection that lives on from the periodic sock_diag
/// scan, and the API calls the process's evidence incomplete while its muted connections are
/// active. A process that opens thousands of connections and keeps them (a pool) closes
/// none and is never muted; no client reconnecting with backoff comes near (client-go backs
/// off to seconds between attempts).
pub const MUTE_AFTER: u32 = 4 * CONNECT_BUDGET;
/// The budget's window.
pub const BUDGET_WINDOW_NS: u64 = 1_000_000_000;

/// Words of the `WATCHED_PORTS` bitmap: one bit per TCP port (bit `port % 64` of word
/// `port / 64`), set for the ports of the configured endpoints. The programs test it first,
/// before reading anything else about a socket.
pub const PORT_WORDS: u32 = 65536 / 64;

/// A connect held back by the budget, until it leaves SYN_SENT (map `DEFERRED`, keyed by the
/// socket's kernel address): what the connect event would have carried.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeferredConnect {
    pub timestamp_ns: u64,
    pub tgid: u32,
    pub pid: u32,
    pub comm: [u8; COMM_LEN],
}

/// A process's use of its connect budget (map `BUDGETS`, keyed by tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub window_start_ns: u64,
    pub used: u32,
    /// Connections the process closed itself in the window (`close()`: to FIN_WAIT1 or
    /// LAST_ACK), for [`MUTE_AFTER`].
    pub closed: u32,
}

/// Key of the `FAILURES` map: failed connects of one process to one destination, for one
/// reason. The value is a count (u64) that only grows; userspace reads differences.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FailureKey {
    pub tgid: u32,
    /// Inode of the socket's network namespace.
    pub netns: u32,
    /// `sock.sk_err` when the connect ended (positive errno, 0 if the process gave up).
    pub sk_err: u32,
    pub family: u16,
    /// Host byte order.
    pub dport: u16,
    /// IPv4 in the first 4 bytes.
    pub daddr: [u8; 16],
}

/// One event from the kernel, sent through the `EVENTS` ring buffer.
///
/// `tgid`/`pid`/`comm` are those of the task on the CPU. They name the socket's owner only for
/// transitions that run in process context (CLOSE→SYN_SENT on `connect()`, ESTABLISHED→FIN_WAIT1
/// or →CLOSE on `close()`); packet-driven ones run in softirq, where they name a bystander.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockEvent {
    /// Kernel time of the event (`bpf_ktime_get_ns`, CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// Kernel address of the `struct sock`: stable for the socket's lifetime.
    pub sk: u64,
    /// `tcp_sock.bytes_received` at the event: tells userspace whether data arrived between
    /// its last sample and a close (a GOAWAY right before the client's own close).
    pub bytes_received: u64,
    /// Inode number of the socket's network namespace.
    pub netns: u32,
    /// [`EventKind`] as u32.
    pub kind: u32,
    pub tgid: u32,
    pub pid: u32,
    /// Old and new TCP state (kernel `TCP_*` numbers); for a retransmit, both are the state.
    pub old_state: u32,
    pub new_state: u32,
    /// `sock.sk_err` at the event (positive errno): why a connect or connection ended
    /// (`ECONNREFUSED`, `ETIMEDOUT`, `ECONNRESET`, `EHOSTUNREACH`, ...); 0 when none.
    pub sk_err: u32,
    pub _pad: u32,
    pub family: u16,
    /// Host byte order.
    pub sport: u16,
    /// Host byte order.
    pub dport: u16,
    /// 1 when `tgid`/`comm` were taken in process context that owns the socket (see above).
    pub in_process_context: u16,
    /// Source and destination address; IPv4 in the first 4 bytes.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub comm: [u8; COMM_LEN],
}

/// Kernel structure offsets the programs need, found at start-up from the running kernel's
/// BTF and tracepoint `format` files (aya's Rust eBPF has no CO-RE relocations). Set as the
/// global `OFFSETS` before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `struct sock_common.skc_net` (a `possible_net_t`, whose first field is `struct net *`).
    pub sock_common_skc_net: u32,
    /// `struct net.ns` + `struct ns_common.inum`.
    pub net_ns_inum: u32,
    /// `struct sock.sk_err`.
    pub sock_sk_err: u32,
    /// `struct sock_common.skc_state` (one byte).
    pub sock_common_skc_state: u32,
    /// `struct sock.sk_error_queue`, `struct sk_buff_head.prev` (its newest skb),
    /// `struct sk_buff.cb` and `struct sock_exterr_skb.ee` (whose first field is `ee_errno`):
    /// the errno of the ICMP error queued on a connecting socket.
    pub sock_sk_error_queue: u32,
    pub sk_buff_head_prev: u32,
    pub sk_buff_cb: u32,
    pub sock_exterr_skb_ee: u32,
    /// `struct tcp_sock.bytes_received`.
    pub tcp_sock_bytes_received: u32,
    /// Fields of `sock/inet_sock_set_state`.
    pub set_state: SetStateOffsets,
    /// Fields of `tcp/tcp_retransmit_skb`.
    pub retransmit: RetransmitOffsets,
    /// What the segment program reads from the socket and the segment.
    pub segment: SegmentOffsets,
    /// From a task's descriptor to its socket, for the uprobes on Go clients.
    pub files: FileOffsets,
}

/// `task->files->fdt->fd[n]->private_data` (a `struct socket`) `->sk`: how a uprobe that knows
/// a descriptor number finds the socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOffsets {
    pub task_struct_files: u32,
    pub files_struct_fdt: u32,
    pub fdtable_max_fds: u32,
    pub fdtable_fd: u32,
    pub file_private_data: u32,
    pub socket_sk: u32,
}

/// Where the segment program (the raw tracepoint `tcp_probe`, whose arguments are the
/// `struct sock *` and the `struct sk_buff *`) reads what it needs, from the kernel's BTF: the
/// socket's addresses and ports, how far the client had sent, and the segment's length. A raw
/// tracepoint builds no record, so a segment of an unrelated socket costs one read of its
/// destination port and a bitmap test; and every kernel gives the socket's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentOffsets {
    /// `struct sock_common`: `skc_daddr`, `skc_rcv_saddr` (IPv4), `skc_v6_daddr`,
    /// `skc_v6_rcv_saddr`, `skc_dport` (network order), `skc_num` (host order), `skc_family`.
    pub skc_daddr: u32,
    pub skc_rcv_saddr: u32,
    pub skc_v6_daddr: u32,
    pub skc_v6_rcv_saddr: u32,
    pub skc_dport: u32,
    pub skc_num: u32,
    pub skc_family: u32,
    /// `struct tcp_sock`: `snd_nxt`, `snd_una`, `write_seq`, `srtt_us` (×8).
    pub tcp_snd_nxt: u32,
    pub tcp_snd_una: u32,
    pub tcp_write_seq: u32,
    pub tcp_srtt_us: u32,
    /// `struct sk_buff`: `len` and `data` (the TCP header, where `tcp_probe` fires).
    pub skb_len: u32,
    pub skb_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetStateOffsets {
    pub skaddr: u32,
    pub oldstate: u32,
    pub newstate: u32,
    pub sport: u32,
    pub dport: u32,
    pub family: u32,
    pub protocol: u32,
    pub saddr: u32,
    pub daddr: u32,
    pub saddr_v6: u32,
    pub daddr_v6: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetransmitOffsets {
    pub skaddr: u32,
    pub state: u32,
    pub sport: u32,
    pub dport: u32,
    pub family: u32,
    pub saddr: u32,
    pub daddr: u32,
    pub saddr_v6: u32,
    pub daddr_v6: u32,
    /// `struct sock_common.skc_family`, read from the socket where the record has no `family`
    /// field (5.10: then `family` is 0).
    pub sock_common_skc_family: u32,
}

/// TCP state numbers (include/net/tcp_states.h).
pub mod tcp_state {
    pub const ESTABLISHED: u32 = 1;
    pub const SYN_SENT: u32 = 2;
    pub const SYN_RECV: u32 = 3;
    pub const FIN_WAIT1: u32 = 4;
    pub const FIN_WAIT2: u32 = 5;
    pub const TIME_WAIT: u32 = 6;
    pub const CLOSE: u32 = 7;
    pub const CLOSE_WAIT: u32 = 8;
    pub const LAST_ACK: u32 = 9;
    pub const LISTEN: u32 = 10;
    pub const CLOSING: u32 = 11;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C), contain only integers and byte arrays, and have no
    // implicit padding (checked by the size assertions below).
    unsafe impl aya::Pod for super::EndpointKey {}
    unsafe impl aya::Pod for super::SockEvent {}
    unsafe impl aya::Pod for super::SegmentEvent {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::FailureKey {}
    unsafe impl aya::Pod for super::LossKey {}
    unsafe impl aya::Pod for super::FrameEvent {}
    unsafe impl aya::Pod for super::HeaderEvent {}
    unsafe impl aya::Pod for super::SslKey {}
    unsafe impl aya::Pod for super::SslRead {}
    unsafe impl aya::Pod for super::SslCall {}
}

const _: () = assert!(core::mem::size_of::<EndpointKey>() == 18);
const _: () = assert!(core::mem::size_of::<SockEvent>() == 8 * 3 + 4 * 8 + 2 * 4 + 16 * 3);
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 36 + 52 + 40 + 48 + 24);
const _: () = assert!(core::mem::size_of::<FrameEvent>() == 8 * 3 + 4 * 4 + 8);
const _: () = assert!(core::mem::size_of::<ExecEvent>() == 16);
const _: () = assert!(core::mem::size_of::<HeaderEvent>() == 16 + 16 + HEADER_VALUE_MAX);
const _: () = assert!(core::mem::size_of::<SegmentEvent>() == 8 * 2 + 4 * 6 + 2 * 4 + 16 * 2);
const _: () = assert!(core::mem::size_of::<SegmentState>() == 8 + 4 * 4);
const _: () = assert!(core::mem::size_of::<DeferredConnect>() == 16 + COMM_LEN);
const _: () = assert!(core::mem::size_of::<Budget>() == 16);
const _: () = assert!(core::mem::size_of::<FailureKey>() == 16 + 16);
