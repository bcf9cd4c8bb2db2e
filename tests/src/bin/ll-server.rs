//! `ll-server`: a test TCP server driven over stdin/stdout by the integration harness; run it
//! inside a network namespace with `ip netns exec`.
//!
//! ```text
//! ll-server --listen ADDR        (e.g. 0.0.0.0:0, 127.0.0.1:0, [::1]:0)
//! ```
//!
//! Prints `listening LOCAL` once bound, then `accepted PEER` for each connection it accepts
//! (and reads and discards whatever the peer sends; a connection that opens with a TLS
//! handshake is closed, as a plain TCP service would). Commands on stdin, one per line:
//! - `send N` → writes N bytes to every open accepted connection, answers `sent N to K`
//! - `exit` (or end of stdin) → exits 0.
use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = match (args.next().as_deref(), args.next()) {
        (Some("--listen"), Some(addr)) => addr,
        _ => panic!("usage: ll-server --listen ADDR"),
    };
    let listener = TcpListener::bind(&addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    println!("listening {}", listener.local_addr().expect("local_addr"));

    let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let accepted = conns.clone();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            println!("accepted {}", stream.peer_addr().expect("peer_addr"));
            let mut reader = stream.try_clone().expect("clone stream");
            thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                let mut first = true;
                while let Ok(n @ 1..) = reader.read(&mut buf) {
                    // A TLS ClientHello (the agent's own reachability probe) gets what a plain
                    // TCP service gives it: the connection closes. Left unanswered, it would
                    // look like a stopped apiserver (the kernel accepts, nothing answers the
                    // handshake), which the probe rightly counts as unreachable.
                    if first && buf[..n].starts_with(&[TLS_HANDSHAKE_RECORD]) {
                        let _ = reader.shutdown(Shutdown::Both);
                        break;
                    }
                    first = false;
                }
            });
            stream
                .set_write_timeout(Some(Duration::from_secs(5)))
                .expect("set_write_timeout");
            accepted.lock().unwrap().push(stream);
        }
    });

    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read stdin");
        let mut words = line.split_whitespace();
        match (words.next(), words.next().map(str::parse::<usize>)) {
            (Some("send"), Some(Ok(n))) => {
                let payload = vec![b'x'; n];
                let mut conns = conns.lock().unwrap();
                // A connection the peer closed fails the write and is forgotten.
                conns.retain_mut(|s| s.write_all(&payload).is_ok());
                println!("sent {n} to {}", conns.len());
            }
            (Some("exit"), _) => break,
            _ => println!("error unknown command {line:?}"),
        }
    }
}
