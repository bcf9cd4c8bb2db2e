use super::*;
use crate::host::netns::{run_in_netns, TestNetns};
use lifeline_common::tcp_state;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;

const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;
const ESTABLISHED: u32 = 1 << tcp_state::ESTABLISHED;

/// A hand-built `inet_diag_msg` followed by a MEMINFO attribute (ignored)
/// and an `INET_DIAG_INFO` attribute holding `tcp_info` bytes.
fn diag_msg(local: SocketAddr, remote: SocketAddr, tcp_info: &[u8]) -> Vec<u8> {
    let mut msg = vec![0u8; DIAG_MSG_LEN];
    msg[0] = family_of(&local) as u8;
    msg[1] = tcp_state::ESTABLISHED as u8;
    msg[4..6].copy_from_slice(&local.port().to_be_bytes());
    msg[6..8].copy_from_slice(&remote.port().to_be_bytes());
    msg[8..24].copy_from_slice(&ip_to_bytes(local.ip()));
    msg[24..40].copy_from_slice(&ip_to_bytes(remote.ip()));
    msg[44..48].copy_from_slice(&0x1122_3344u32.to_ne_bytes());
    msg[48..52].copy_from_slice(&0x5566_7788u32.to_ne_bytes());
    msg[64..68].copy_from_slice(&1000u32.to_ne_bytes());
    msg[68..72].copy_from_slice(&424242u32.to_ne_bytes());
    for (kind, body) in [(1u16, &[9u8; 16][..]), (INET_DIAG_INFO, tcp_info)] {
        msg.extend_from_slice(&(4 + body.len() as u16).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(body);
        msg.resize(align4(msg.len()), 0);
    }
    msg
}

/// A `struct tcp_info` of `len` bytes with recognisable values in the used fields.
fn tcp_info(len: usize) -> Vec<u8> {
    let mut raw = vec![0u8; 232];
    raw[2..5].copy_from_slice(&[3, 4, 5]);
    for (offset, value) in [
        (24, 6u32),
        (44, 12),
        (52, 7),
        (56, 13),
        (68, 8),
        (100, 9),
        (140, 10),
        (144, 15),
        (152, 11),
        (156, 14),
    ] {
        raw[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
    }
    raw[120..128].copy_from_slice(&(1u64 << 40).to_ne_bytes());
    raw[128..136].copy_from_slice(&((1u64 << 41) + 1).to_ne_bytes());
    raw[200..208].copy_from_slice(&((1u64 << 42) + 2).to_ne_bytes());
    raw[208..216].copy_from_slice(&((1u64 << 43) + 3).to_ne_bytes());
    raw.truncate(len);
    raw
}

#[test]
fn parses_ipv4_message_with_tcp_info() {
    let local: SocketAddr = "10.0.0.1:40000".parse().expect("addr");
    let remote: SocketAddr = "10.96.0.1:443".parse().expect("addr");
    let info = parse_diag_msg(&diag_msg(local, remote, &tcp_info(232))).expect("parse");
    let expected_tcp = TcpInfo {
        retransmits: 3,
        probes: 4,
        backoff: 5,
        unacked: 6,
        last_data_recv_ms: 7,
        rtt_us: 8,
        total_retrans: 9,
        segs_in: 10,
        notsent_bytes: 15,
        data_segs_in: 11,
        last_data_sent_ms: 12,
        last_ack_recv_ms: 13,
        data_segs_out: 14,
        bytes_acked: 1 << 40,
        bytes_received: (1 << 41) + 1,
        bytes_sent: (1 << 42) + 2,
        bytes_retrans: (1 << 43) + 3,
    };
    let expected = TcpSocketInfo {
        family: AF_INET,
        local,
        remote,
        state: tcp_state::ESTABLISHED as u8,
        inode: 424242,
        uid: 1000,
        cookie: 0x5566_7788_1122_3344,
        tcp: Some(expected_tcp),
    };
    assert_eq!(info, expected);
}

#[test]
fn parses_ipv6_message_with_short_tcp_info() {
    let local: SocketAddr = "[fd00::1]:40000".parse().expect("addr");
    let remote: SocketAddr = "[fd00::2]:6443".parse().expect("addr");
    // 104 bytes: tcp_info as of Linux 2.6, up to tcpi_total_retrans.
    let info = parse_diag_msg(&diag_msg(local, remote, &tcp_info(104))).expect("parse");
    assert_eq!((info.family, info.local, info.remote), (AF_INET6, local, remote));
    let tcp = info.tcp.expect("tcp_info present");
    assert_eq!((tcp.rtt_us, tcp.total_retrans), (8, 9));
    assert_eq!(
        (tcp.bytes_acked, tcp.bytes_received, tcp.segs_in, tcp.data_segs_in),
        (0, 0, 0, 0)
    );
}

#[test]
fn rejects_malformed_messages() {
    let local: SocketAddr = "10.0.0.1:1".parse().expect("addr");
    let mut msg = diag_msg(local, local, &tcp_info(232));
    assert!(
        parse_diag_msg(&msg[..DIAG_MSG_LEN - 1]).is_err(),
        "short inet_diag_msg"
    );
    msg[DIAG_MSG_LEN..DIAG_MSG_LEN + 2].copy_from_slice(&2u16.to_ne_bytes());
    assert!(parse_diag_msg(&msg).is_err(), "rtattr shorter than its header");
    msg[0] = libc::AF_UNIX as u8;
    assert!(matches!(parse_diag_msg(&msg), Err(Error::Family(_))));
}

#[test]
fn splits_a_buffer_of_several_messages() {
    let mut buf = Vec::new();
    for (seq, payload_len) in [(7u32, 5usize), (8, 0)] {
        buf.extend_from_slice(&((NLMSG_HDRLEN + payload_len) as u32).to_ne_bytes());
        buf.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        buf.extend_from_slice(&(libc::NLM_F_MULTI as u16).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend(std::iter::repeat_n(0xab, payload_len));
        buf.resize(align4(buf.len()), 0);
    }
    let (first, payload, rest) = split_nlmsg(&buf).expect("first");
    assert_eq!(
        (first.seq, first.kind, payload.len()),
        (7, SOCK_DIAG_BY_FAMILY, 5)
    );
    let (second, payload, rest) = split_nlmsg(rest).expect("second");
    assert_eq!((second.seq, payload.len(), rest.len()), (8, 0, 0));
    assert!(
        split_nlmsg(&buf[..NLMSG_HDRLEN + 2]).is_err(),
        "length beyond buffer"
    );
}

#[test]
fn encodes_exact_request() {
    let local: SocketAddr = "10.0.0.1:40000".parse().expect("addr");
    let remote: SocketAddr = "10.96.0.1:443".parse().expect("addr");
    let req = Request::exact(SOCK_DESTROY, 0, local, remote, 0x1_0000_0002).expect("request");
    let msg = req.encode(77);
    assert_eq!(read_u32(&msg, 0) as usize, msg.len());
    assert_eq!(
        (u16::from_ne_bytes(field(&msg, 4)), read_u32(&msg, 8)),
        (SOCK_DESTROY, 77)
    );
    let id = &msg[NLMSG_HDRLEN + 8..];
    assert_eq!(field::<4>(id, 0), [0x9c, 0x40, 0x01, 0xbb], "ports big-endian");
    assert_eq!(
        (field::<4>(id, 4), field::<4>(id, 20)),
        ([10, 0, 0, 1], [10, 96, 0, 1])
    );
    assert_eq!(
        (read_u32(id, 40), read_u32(id, 44)),
        (2, 1),
        "cookie low word first"
    );
    let v6: SocketAddr = "[::1]:1".parse().expect("addr");
    assert!(matches!(
        Request::exact(SOCK_DESTROY, 0, local, v6, NO_COOKIE),
        Err(Error::FamilyMismatch { .. })
    ));
}

/// A listener, a client connected to it and the accepted server side.
struct Conn {
    listener: TcpListener,
    client: TcpStream,
    server: TcpStream,
}

fn connect_in(ns: &TestNetns, ip: IpAddr) -> Conn {
    run_in_netns(&ns.path, || {
        let listener = TcpListener::bind((ip, 0)).expect("bind listener in test netns");
        let addr = listener.local_addr().expect("listener address");
        let client = TcpStream::connect(addr).expect("connect client in test netns");
        let (server, _) = listener.accept().expect("accept in test netns");
        Conn {
            listener,
            client,
            server,
        }
    })
    .expect("enter test netns")
}

/// The inode from the `/proc/self/fd/N -> socket:[inode]` link.
fn socket_inode(socket: &impl AsRawFd) -> u64 {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", socket.as_raw_fd())).expect("read fd link");
    let link = link.to_str().expect("utf-8 fd link");
    link.strip_prefix("socket:[")
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|ino| ino.parse().ok())
        .unwrap_or_else(|| panic!("fd link {link:?} is not socket:[N]"))
}

fn dump_lookup_destroy(ip: IpAddr) {
    let ns = TestNetns::new();
    let mut conn = connect_in(&ns, ip);
    let (local, remote) = (
        conn.client.local_addr().expect("local"),
        conn.client.peer_addr().expect("peer"),
    );
    let sent = [0x5a; 3000];
    conn.server.write_all(&sent).expect("server write");
    let mut got = [0; 3000];
    conn.client.read_exact(&mut got).expect("client read");

    let diag = DiagSocket::open_in(&ns.path).expect("open sock_diag in test netns");
    let family = family_of(&local);
    let established = diag.dump(family, ESTABLISHED).expect("dump established");
    assert_eq!(
        established.len(),
        2,
        "client and server side only: {established:#?}"
    );
    let client: Vec<_> = established.iter().filter(|s| s.local == local).collect();
    let [client] = client[..] else {
        panic!("client {local} not dumped exactly once: {established:#?}")
    };
    let uid = std::fs::metadata("/proc/self").expect("stat /proc/self").uid();
    assert_eq!(
        (client.family, client.remote, client.state, client.uid),
        (family, remote, tcp_state::ESTABLISHED as u8, uid)
    );
    assert_eq!(client.inode, socket_inode(&conn.client), "inode of client socket");
    let tcp = client.tcp.expect("tcp_info for an established socket");
    assert_eq!(
        tcp.bytes_received,
        sent.len() as u64,
        "bytes received by client: {tcp:?}"
    );
    assert!(
        tcp.data_segs_in >= 1 && tcp.segs_in >= tcp.data_segs_in,
        "{tcp:?}"
    );

    let listeners = diag.dump(family, 1 << tcp_state::LISTEN).expect("dump listeners");
    let listen_addr = conn.listener.local_addr().expect("listener address");
    assert_eq!(
        listeners.iter().map(|s| s.local).collect::<Vec<_>>(),
        [listen_addr]
    );

    let looked_up = diag
        .lookup(local, remote)
        .expect("lookup")
        .expect("client found by lookup");
    assert_eq!((looked_up.inode, looked_up.cookie), (client.inode, client.cookie));
    assert_eq!(looked_up.tcp.map(|t| t.bytes_received), Some(sent.len() as u64));
    let nowhere = SocketAddr::new(remote.ip(), 1);
    assert_eq!(
        diag.lookup(local, nowhere).expect("lookup of unknown 4-tuple"),
        None
    );
    // The kernel would answer this with the listener; it must not count as found.
    assert_eq!(
        diag.lookup(listen_addr, nowhere)
            .expect("lookup next to listener"),
        None
    );
    assert!(!diag
        .destroy(listen_addr, nowhere)
        .expect("destroy next to listener"));
    assert_eq!(
        diag.dump(family, 1 << tcp_state::LISTEN)
            .expect("dump listeners")
            .len(),
        1
    );

    assert!(
        diag.destroy(local, remote).expect("destroy client"),
        "client socket destroyed"
    );
    let err = conn
        .client
        .read(&mut got)
        .expect_err("read after destroy must fail");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
        ),
        "read after destroy: {err}"
    );
    assert_eq!(diag.lookup(local, remote).expect("lookup after destroy"), None);
    assert!(
        !diag.destroy(local, remote).expect("second destroy"),
        "nothing left to destroy"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv4_dump_lookup_destroy() {
    dump_lookup_destroy(Ipv4Addr::LOCALHOST.into());
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv6_dump_lookup_destroy() {
    dump_lookup_destroy(Ipv6Addr::LOCALHOST.into());
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn host_netns_does_not_see_test_netns_sockets() {
    let ns = TestNetns::new();
    let conn = connect_in(&ns, Ipv4Addr::LOCALHOST.into());
    let (local, remote) = (
        conn.client.local_addr().expect("local"),
        conn.client.peer_addr().expect("peer"),
    );
    let inode = socket_inode(&conn.client);
    let inside = DiagSocket::open_in(&ns.path).expect("open sock_diag in test netns");
    assert!(inside
        .lookup(local, remote)
        .expect("lookup in test netns")
        .is_some());
    let host = DiagSocket::open().expect("open sock_diag in host netns");
    let dumped = host.dump(AF_INET, !0).expect("dump host netns");
    assert!(
        dumped.iter().all(|s| s.inode != inode),
        "host dump shows test netns socket {inode}"
    );
    let found = host.lookup(local, remote).expect("lookup in host netns");
    assert!(
        found.is_none_or(|s| s.inode != inode),
        "host lookup finds test netns socket"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn batched_lookups_answer_each_socket_in_order() {
    let ns = TestNetns::new();
    let conns: Vec<_> = (0..150)
        .map(|_| connect_in(&ns, Ipv4Addr::LOCALHOST.into()))
        .collect();
    let diag = DiagSocket::open_in(&ns.path).expect("open sock_diag in test netns");
    // Every third pair does not exist (a port nobody uses): `None` in its place.
    let mut pairs = Vec::new();
    for c in &conns {
        let (local, remote) = (c.client.local_addr().unwrap(), c.client.peer_addr().unwrap());
        pairs.push((local, remote));
        if pairs.len() % 3 == 2 {
            pairs.push((local, SocketAddr::new(remote.ip(), 1)));
        }
    }
    assert!(pairs.len() > 3 * LOOKUP_BATCH, "several batches");
    let found = diag.lookup_many(&pairs).expect("batched lookups");
    assert_eq!(found.len(), pairs.len());
    for ((local, remote), answer) in pairs.iter().zip(&found) {
        match answer {
            Some(info) => assert_eq!((info.local, info.remote), (*local, *remote)),
            None => assert_eq!(remote.port(), 1, "{local} -> {remote} not found"),
        }
    }
    let single = diag
        .lookup(pairs[0].0, pairs[0].1)
        .expect("lookup")
        .expect("found");
    assert_eq!(found[0].as_ref().map(|i| i.cookie), Some(single.cookie));
    assert_eq!(
        found.iter().filter(|f| f.is_none()).count(),
        pairs.len() - conns.len()
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn dump_spans_many_datagrams() {
    let ns = TestNetns::new();
    let conns: Vec<_> = (0..150)
        .map(|_| connect_in(&ns, Ipv6Addr::LOCALHOST.into()))
        .collect();
    let diag = DiagSocket::open_in(&ns.path).expect("open sock_diag in test netns");
    let dumped = diag.dump(AF_INET6, ESTABLISHED).expect("dump");
    assert_eq!(dumped.len(), 2 * conns.len(), "both ends of every connection");
    let mut cookies: Vec<_> = dumped.iter().map(|s| s.cookie).collect();
    cookies.sort_unstable();
    cookies.dedup();
    assert_eq!(cookies.len(), dumped.len(), "each socket dumped once");
}
