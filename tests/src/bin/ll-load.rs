//! `ll-load`: connection load for the performance suite and `cargo xtask bench`; run it inside
//! a network namespace with `ip netns exec`.
//!
//! ```text
//! ll-load serve  --listen ADDR [--close|--echo] [--push-every S] accept forever (--close: close each at once; --echo: echo what each sends)
//! ll-load churn  --connect ADDR --seconds S [--threads N] connect, wait for the server's close, repeat
//! ll-load pingpong --connect ADDR --seconds S [--threads N] connect, 50 round trips of 100 bytes (an --echo server), close, repeat
//! ll-load hold   --connect ADDR --count N [--threads N] [--send-every S]  open N connections at once and hold them
//! ll-load refuse --connect ADDR --seconds S [--rate R] [--threads N]  connects that are refused
//! ```
//!
//! `serve` prints `listening LOCAL`; with `--push-every S` it writes 200 bytes on every
//! connection it holds every S seconds, spread over the interval (payload that clients receive,
//! as a busy watch's events). `churn` and `refuse` print `done CONNECTS FAILED` at the
//! end (with `--linger`, they then wait for stdin to close, so an observer can look at the
//! process before it exits). With `--send-every S`, `hold` writes a 200-byte request on every
//! connection every S seconds (the server never answers: a client waiting for replies). `hold` prints `connected LOCAL` for every connection, then `held N failed F`, and keeps
//! them open until its stdin closes or reads `exit`. The listener's backlog is 4096, so a burst
//! of connects is not throttled by SYN retries.
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

struct Args {
    mode: String,
    addr: SocketAddr,
    seconds: f64,
    threads: usize,
    count: usize,
    rate: Option<f64>,
    close: bool,
    echo: bool,
    linger: bool,
    send_every: Option<f64>,
    push_every: Option<f64>,
}

fn parse() -> Args {
    let mut argv = std::env::args().skip(1);
    let mode = argv.next().expect("usage: ll-load serve|churn|hold|refuse ...");
    let mut args = Args {
        mode,
        addr: "127.0.0.1:0".parse().expect("addr"),
        seconds: 5.0,
        threads: 2,
        count: 1,
        rate: None,
        close: false,
        echo: false,
        linger: false,
        send_every: None,
        push_every: None,
    };
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" | "--connect" => args.addr = value().parse().expect("ADDR"),
            "--seconds" => args.seconds = value().parse().expect("--seconds S"),
            "--threads" => args.threads = value().parse().expect("--threads N"),
            "--count" => args.count = value().parse().expect("--count N"),
            "--rate" => args.rate = Some(value().parse().expect("--rate R")),
            "--close" => args.close = true,
            "--echo" => args.echo = true,
            "--linger" => args.linger = true,
            "--send-every" => args.send_every = Some(value().parse().expect("--send-every S")),
            "--push-every" => args.push_every = Some(value().parse().expect("--push-every S")),
            other => panic!("ll-load: unknown argument {other}"),
        }
    }
    args
}

fn main() {
    let args = parse();
    match args.mode.as_str() {
        "serve" => serve(&args),
        "churn" => repeat(&args, churn_once),
        "pingpong" => repeat(&args, pingpong_once),
        "refuse" => repeat(&args, refuse_once),
        "hold" => hold(&args),
        other => panic!("ll-load: unknown mode {other}"),
    }
}

/// A listener with a backlog of 4096 (std's is 128).
fn listen(addr: SocketAddr) -> TcpListener {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscalls on a descriptor this function owns; sockaddr sizes match.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as u32,
        );
        let rc = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as u16,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                libc::bind(fd, (&raw const sin).cast(), size_of::<libc::sockaddr_in>() as u32)
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as u16,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: 0,
                };
                libc::bind(
                    fd,
                    (&raw const sin6).cast(),
                    size_of::<libc::sockaddr_in6>() as u32,
                )
            }
        };
        assert!(rc == 0, "bind {addr}: {}", std::io::Error::last_os_error());
        assert!(
            libc::listen(fd, 4096) == 0,
            "listen: {}",
            std::io::Error::last_os_error()
        );
        TcpListener::from_raw_fd(fd)
    }
}

fn serve(args: &Args) {
    let listener = listen(args.addr);
    println!("listening {}", listener.local_addr().expect("local_addr"));
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    if let Some(every) = args.push_every {
        let held = held.clone();
        thread::spawn(move || push(&held, Duration::from_secs_f64(every)));
    }
    for stream in listener.incoming() {
        match stream {
            // Closing first leaves TIME_WAIT on this side, so churning clients never run out
            // of ports.
            Ok(s) if args.close => drop(s),
            Ok(s) if args.echo => {
                thread::spawn(move || echo(s));
            }
            Ok(s) => held.lock().expect("lock").push(s),
            Err(e) => eprintln!("ll-load: accept: {e}"),
        }
    }
}

/// Writes 200 bytes on each of `held` once per `every`, one connection after the other spread
/// over the interval; a connection whose write fails is dropped.
fn push(held: &std::sync::Mutex<Vec<TcpStream>>, every: Duration) {
    let payload = [b'x'; 200];
    loop {
        let n = held.lock().expect("lock").len();
        if n == 0 {
            thread::sleep(every);
            continue;
        }
        let gap = every / n as u32;
        let start = Instant::now();
        for i in 0..n {
            let mut all = held.lock().expect("lock");
            if i < all.len() && all[i].write_all(&payload).is_err() {
                all.swap_remove(i);
            }
            drop(all);
            let next = start + gap * (i as u32 + 1);
            thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }
}

/// One connection: connect, wait for the server to close, close. True if it connected.
fn churn_once(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let mut buf = [0u8; 64];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    true
}

/// Round trips per connection of `pingpong`.
const PINGPONG_ROUNDS: usize = 50;

/// One connection of `pingpong`: [`PINGPONG_ROUNDS`] round trips of 100 bytes, each a segment
/// that arrives on an established socket at either end. True if all of them came back.
fn pingpong_once(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_nodelay(true);
    let mut buf = [b'p'; 100];
    (0..PINGPONG_ROUNDS).all(|_| s.write_all(&buf).is_ok() && s.read_exact(&mut buf).is_ok())
}

/// Writes back whatever `s` sends until it closes.
fn echo(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut buf) {
        if s.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// One connect that is expected to be refused. True if it (unexpectedly) connected.
fn refuse_once(addr: SocketAddr) -> bool {
    TcpStream::connect(addr).is_ok()
}

/// Runs `once` from `threads` threads for `seconds` (at `rate` per second overall, if given);
/// prints `done CONNECTS FAILED`.
fn repeat(args: &Args, once: fn(SocketAddr) -> bool) {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs_f64(args.seconds);
    let per_thread_gap = args
        .rate
        .map(|r| Duration::from_secs_f64(args.threads as f64 / r));
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            let (ok, failed, addr) = (ok.clone(), failed.clone(), args.addr);
            thread::spawn(move || {
                let mut next = Instant::now();
                while Instant::now() < end {
                    if let Some(gap) = per_thread_gap {
                        next += gap;
                        if let Some(wait) = next.checked_duration_since(Instant::now()) {
                            thread::sleep(wait);
                        }
                    }
                    let counter = if once(addr) { &ok } else { &failed };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker panicked");
    }
    println!(
        "done {} {}",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    if args.linger {
        wait_for_exit();
    }
}

/// Returns when stdin closes or reads `exit`.
fn wait_for_exit() {
    for line in std::io::stdin().lock().lines() {
        if line.map_or(true, |l| l.trim() == "exit") {
            break;
        }
    }
}

fn hold(args: &Args) {
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            let (next, stop, addr, count) = (next.clone(), stop.clone(), args.addr, args.count as u64);
            thread::spawn(move || {
                let mut mine = Vec::new();
                let mut failed = 0;
                while !stop.load(Ordering::Relaxed) && next.fetch_add(1, Ordering::Relaxed) < count {
                    match TcpStream::connect(addr) {
                        Ok(s) => mine.push(s),
                        Err(e) => {
                            eprintln!("ll-load: connect {addr}: {e}");
                            failed += 1;
                        }
                    }
                }
                (mine, failed)
            })
        })
        .collect();
    let mut held = Vec::new();
    let mut failed = 0;
    for w in workers {
        let (mine, f) = w.join().expect("worker panicked");
        held.extend(mine);
        failed += f;
    }
    let mut out = String::new();
    for s in &held {
        out.push_str(&format!("connected {}\n", s.local_addr().expect("local_addr")));
    }
    print!("{out}");
    println!("held {} failed {failed}", held.len());
    if let Some(every) = args.send_every {
        let writers: Vec<TcpStream> = held.iter().filter_map(|s| s.try_clone().ok()).collect();
        thread::spawn(move || {
            let request = [b'r'; 200];
            loop {
                for mut s in &writers {
                    let _ = s.write_all(&request);
                }
                thread::sleep(Duration::from_secs_f64(every));
            }
        });
    }
    wait_for_exit();
}
