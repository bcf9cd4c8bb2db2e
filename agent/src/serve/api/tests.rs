use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpStream},
};

use super::*;

#[test]
fn loopback_peers_and_the_token_bearers_read_the_client_api() {
    let peer = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 40000));
    let closed = Access::loopback_only();
    for ip in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
        assert_eq!(closed.allows(peer(ip), None), Verdict::Allowed, "{ip}");
    }
    assert_eq!(closed.allows(peer("10.0.0.7"), None), Verdict::LoopbackOnly);
    assert_eq!(
        closed.allows(peer("10.0.0.7"), Some(b"Bearer x")),
        Verdict::LoopbackOnly
    );
    assert_eq!(closed.allows(None, None), Verdict::LoopbackOnly, "unknown peer");

    let open = Access {
        token: Some((*b"s3cr3t").into()),
    };
    assert_eq!(
        open.allows(peer("10.0.0.7"), Some(b"Bearer s3cr3t")),
        Verdict::Allowed
    );
    assert_eq!(
        open.allows(peer("10.0.0.7"), Some(b"Bearer s3cr3t ")),
        Verdict::Allowed
    );
    for wrong in [
        &b"Bearer s3cr3"[..],
        b"Bearer s3cr3tt",
        b"Basic s3cr3t",
        b"s3cr3t",
        b"",
    ] {
        assert_eq!(open.allows(peer("10.0.0.7"), Some(wrong)), Verdict::NeedsToken);
    }
    assert_eq!(open.allows(peer("10.0.0.7"), None), Verdict::NeedsToken);
}

#[test]
fn the_token_file_is_trimmed_and_must_not_be_empty() {
    let dir = std::env::temp_dir().join(format!("lifeline-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "abc\n").unwrap();
    let access = Access::with_token_file(&file).unwrap();
    assert_eq!(access.token.as_deref(), Some(&b"abc"[..]));
    std::fs::write(&file, " \n").unwrap();
    let err = Access::with_token_file(&file).err().unwrap().to_string();
    assert!(err.contains("is empty"), "{err}");
    let err = Access::with_token_file(&dir.join("missing"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("missing"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_connection_cap_follows_the_descriptor_limit() {
    let limits = |fds| {
        let l = Limits::for_fd_limit(fds);
        (l.max_connections, l.max_per_peer)
    };
    assert_eq!(limits(1 << 20), (256, 32));
    assert_eq!(limits(400), (100, 25));
    assert_eq!(limits(10), (8, 2));
}

/// A server of `/healthz` with `limits`, stopped when the returned sender is dropped.
async fn server(limits: Limits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let app = Router::new().route("/healthz", get(|| async { "ok\n" }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(accept_loop(listener, app, limits, async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// A TCP socket bound to `ip` (to connect from another loopback address).
fn socket_from(ip: Ipv4Addr) -> socket2::Socket {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(ip.into(), 0).into()).unwrap();
    s
}

/// GET /healthz on a fresh connection (blocking: run in spawn_blocking).
fn healthz(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Whether the server closed `s` (read returns 0 or an error) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed_and_the_cap_holds() {
    let limits = Limits {
        max_connections: 6,
        max_per_peer: 4,
        header_timeout: Duration::from_millis(500),
        max_lifetime: Duration::from_secs(60),
    };
    let (addr, _stop) = server(limits).await;
    tokio::task::spawn_blocking(move || {
        // Four idle connections take every slot of 127.0.0.1; a fifth is closed at once,
        // while another address still gets in, up to the global cap.
        let mut idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        let mut fifth = TcpStream::connect(addr).unwrap();
        assert!(
            closed_within(&mut fifth, Duration::from_millis(300)),
            "over the peer cap"
        );
        let other = || {
            let s = socket_from(Ipv4Addr::new(127, 0, 0, 2));
            s.connect(&addr.into()).unwrap();
            TcpStream::from(s)
        };
        let mut others: Vec<TcpStream> = (0..3).map(|_| other()).collect();
        assert!(
            !closed_within(&mut others[0], Duration::from_millis(200)),
            "another peer refused"
        );
        assert!(
            closed_within(&mut others[2], Duration::from_millis(300)),
            "over the global cap"
        );
        drop(others);
        // Idle ones are closed after the header timeout, which frees the slots.
        for s in &mut idle {
            assert!(closed_within(s, Duration::from_secs(2)), "idle connection kept");
        }
        assert!(healthz(addr).unwrap().ends_with("ok\n"));

        // Slowloris: a byte every 100 ms never completes a head within 500 ms.
        let mut slow = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        let mut closed = false;
        for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if slow.write_all(&[*b]).is_err() || closed_within(&mut slow, Duration::from_millis(100)) {
                closed = true;
                break;
            }
        }
        assert!(closed, "slow sender kept for {:?}", started.elapsed());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );

        // Oversized heads are refused.
        let mut big = TcpStream::connect(addr).unwrap();
        let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 4 * MAX_HEAD));
        let _ = big.write_all(&request);
        let mut answer = String::new();
        let _ = big.read_to_string(&mut answer);
        assert!(!answer.contains("200 OK"), "{answer}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_closed_after_its_lifetime() {
    let limits = Limits {
        max_connections: 4,
        max_per_peer: 4,
        header_timeout: Duration::from_secs(30),
        max_lifetime: Duration::from_millis(300),
    };
    let (addr, _stop) = server(limits).await;
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        assert!(closed_within(&mut s, Duration::from_secs(3)));
    })
    .await
    .unwrap();
}
