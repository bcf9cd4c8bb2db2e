//! `ll-client`: a test TCP client driven over stdin/stdout by the integration harness.
//!
//! ```text
//! ll-client [--wait-go] [--ack-small] [--connect-timeout SECS] [--connect ADDR]... [-- IGNORED...]
//! ```
//!
//! Arguments after `--` are ignored: they only put text on the command line (secrets to be
//! redacted, a long command line).
//!
//! Connects (each attempt bounded by `--connect-timeout`, default 5 s) to every `--connect` address in order (the same address may repeat), printing
//! `connected LOCAL PEER` (or `failed ADDR ERROR`) for each, then `ready`. With `--wait-go` it
//! first prints `waiting` and connects only after reading a `go` line, so the harness can move
//! it into a cgroup before it opens any socket. Every connection is held open and whatever
//! arrives on it is read and discarded; with `--ack-small`, a read of at most 48 bytes (a
//! keepalive-sized record: an HTTP/2 PING) is answered at once with 38 bytes (its ack).
//!
//! Commands on stdin, one per line, each answered on stdout:
//! - `connect ADDR` → `connected LOCAL PEER` | `failed ADDR ERROR`
//! - `close LOCAL_PORT` → `closed LOCAL` | `error ...`
//! - `send LOCAL_PORT N` → writes N bytes on that connection (a request) → `sent N` | `error ...`
//! - `exit` (or end of stdin) → exits 0.
//!
//! Connections are dialled from a thread named `ll-dialer` and read by threads named
//! `ll-reader`, so an agent that reports a thread's name instead of the process's is caught.
use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

fn main() {
    let mut wait_go = false;
    let mut ack_small = false;
    let mut initial = Vec::new();
    let mut timeout = Duration::from_secs(5);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--wait-go" => wait_go = true,
            "--ack-small" => ack_small = true,
            "--connect-timeout" => {
                let secs: u64 = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--connect-timeout needs SECS");
                timeout = Duration::from_secs(secs);
            }
            "--connect" => initial.push(args.next().expect("--connect needs ADDR")),
            "--" => break,
            other => panic!("ll-client: unknown argument {other}"),
        }
    }

    let mut lines = std::io::stdin().lock().lines();
    if wait_go {
        println!("waiting");
        match lines.next() {
            Some(Ok(line)) if line.trim() == "go" => {}
            other => panic!("ll-client: expected `go`, got {other:?}"),
        }
    }
    let mut conns: Vec<(SocketAddr, TcpStream)> = Vec::new();
    for addr in &initial {
        connect(addr, timeout, ack_small, &mut conns);
    }
    println!("ready");

    for line in lines {
        let line = line.expect("read stdin");
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("connect"), Some(addr)) => connect(addr, timeout, ack_small, &mut conns),
            (Some("send"), Some(port)) => {
                let port: u16 = port.parse().expect("send LOCAL_PORT N");
                let n: usize = words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("send LOCAL_PORT N");
                match conns.iter_mut().find(|(local, _)| local.port() == port) {
                    Some((_, stream)) => match stream.write_all(&vec![b'r'; n]) {
                        Ok(()) => println!("sent {n}"),
                        Err(e) => println!("error {e}"),
                    },
                    None => println!("error no connection with local port {port}"),
                }
            }
            (Some("close"), Some(port)) => {
                let port: u16 = port.parse().expect("close LOCAL_PORT");
                match conns.iter().position(|(local, _)| local.port() == port) {
                    Some(i) => {
                        let (local, stream) = conns.remove(i);
                        // Shutting down both halves wakes the reader thread, which then drops
                        // its clone; dropping ours closes the descriptor.
                        let _ = stream.shutdown(Shutdown::Both);
                        drop(stream);
                        println!("closed {local}");
                    }
                    None => println!("error no connection with local port {port}"),
                }
            }
            (Some("exit"), _) => break,
            _ => println!("error unknown command {line:?}"),
        }
    }
}

fn connect(addr: &str, timeout: Duration, ack_small: bool, conns: &mut Vec<(SocketAddr, TcpStream)>) {
    let target: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => return println!("failed {addr} {e}"),
    };
    let dialled = thread::Builder::new()
        .name("ll-dialer".into())
        .spawn(move || TcpStream::connect_timeout(&target, timeout))
        .expect("spawn dialer")
        .join()
        .expect("dialer panicked");
    let stream = match dialled {
        Ok(s) => s,
        Err(e) => return println!("failed {addr} {e}"),
    };
    // A connection reset right after the handshake has no peer any more.
    let (local, peer) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => (local, peer),
        (Err(e), _) | (_, Err(e)) => return println!("failed {addr} {e}"),
    };
    let mut reader = stream.try_clone().expect("clone stream");
    let mut acker = stream.try_clone().expect("clone stream");
    thread::Builder::new()
        .name("ll-reader".into())
        .spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                if ack_small && n <= 48 {
                    let _ = acker.write_all(&[b'a'; 38]);
                }
            }
        })
        .expect("spawn reader");
    conns.push((local, stream));
    println!("connected {local} {peer}");
}
