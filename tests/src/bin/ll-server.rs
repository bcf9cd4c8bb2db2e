//! `ll-server`: a test TCP server driven over stdin/stdout by the integration harness; run it
//! inside a network namespace with `ip netns exec`.
//!
//! ```text
//! ll-server --listen ADDR        (e.g. 0.0.0.0:0, 127.0.0.1:0, [::1]:0)
//! ```
//!
//! Prints `listening LOCAL` once bound, then `accepted PEER` for each connection it accepts
//! (and reads and discards whatever the peer sends). Commands on stdin, one per line:
//! - `send N` → writes N bytes to every open accepted connection, answers `sent N to K`
//! - `exit` (or end of stdin) → exits 0.
use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

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
                while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
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
