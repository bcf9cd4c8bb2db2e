//! Hardening suite: hostile input, exhausted resources, missing privileges and partial failures
//! never blind the agent, and never make it misjudge a client. Root only; each test has its own
//! agent, ports and namespaces, so tests may run in parallel. Resource limits and privileges
//! are taken away from the real agent binary with `ulimit` and `capsh --drop` (libcap2-bin).
//!
//! Run: `cargo build -p lifeline -p lifeline-integration --bins &&
//! cargo test -p lifeline-integration --test hardening -- --test-threads=2`
use std::fs;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use lifeline_integration::*;
use serde_json::Value;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn loopback_server() -> Server {
    Server::spawn(None, "127.0.0.1:0")
}

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// `sh -c 'SHELL_LINE && exec "$0" "$@"'`: runs the agent after SHELL_LINE (a `ulimit`).
fn after(shell_line: &str) -> [String; 3] {
    [
        "sh".into(),
        "-c".into(),
        format!(r#"{shell_line} && exec "$0" "$@""#),
    ]
}

/// `capsh --drop=CAPS -- -c 'exec "$0" "$@"'`: runs the agent without CAPS (comma-separated).
fn without(caps: &str) -> [String; 5] {
    [
        "capsh".into(),
        format!("--drop={caps}"),
        "--".into(),
        "-c".into(),
        r#"exec "$0" "$@""#.into(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The soft and hard open-file limits of `pid`.
fn fd_limits(pid: u32) -> (u64, u64) {
    let text = fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open files line");
    let numbers: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Raises this test process's own soft open-file limit to its hard limit (for floods).
fn raise_own_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers; raising the soft limit up to the hard one needs no privilege.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
    }
}

/// A TCP connection to `to` from the local address `from`.
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    s.connect_timeout(&to.into(), secs(2.0))?;
    Ok(s.into())
}

/// `n` connections to `to`, spread over the loopback sources 127.0.`net`.1 to 127.0.`net`.40
/// (more than one address so the per-peer cap does not stop them before the global one).
fn flood(to: SocketAddr, net: u8, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|i| connect_from(Ipv4Addr::new(127, 0, net, 1 + (i % 40) as u8), to).ok())
        .collect()
}

/// Whether the peer closed `s`, waiting at most `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// GET `path` from `from` with an optional bearer token: (status, body).
fn get_as(
    from: Ipv4Addr,
    to: SocketAddr,
    path: &str,
    bearer: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut s = connect_from(from, to)?;
    s.set_read_timeout(Some(secs(5.0)))?;
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {to}\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Ok((status, body))
}

/// Waits until the agent's log contains every needle; returns the log.
fn wait_log(agent: &Agent, timeout: Duration, needles: &[&str]) -> String {
    wait_until(timeout, &format!("the agent's log to show {needles:?}"), || {
        let log = agent.stderr();
        if needles.iter().all(|n| log.contains(n)) {
            Ok(log)
        } else {
            Err(Shown(log))
        }
    })
}

fn state_of(clients: &[Value], pid: u32) -> Option<String> {
    find_pid(clients, pid).map(|c| c["state"].as_str().unwrap_or_default().to_owned())
}

/// A config file written atomically (by rename), as editors and ConfigMap updates do.
fn write_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).expect("write");
    fs::rename(&tmp, path).expect("rename");
}

/// 1. Out of descriptors is not "the process exited". With the soft limit at 1024 (or even a
///    hard limit of 300), 1100 idle connections to the HTTP port make the agent forget nothing:
///    it raised its soft limit to the hard one at start, and never spends more than a quarter
///    of its descriptors on HTTP connections. (On the original agent every client was
///    forgotten: `/proc/<pid>/stat` failing with EMFILE was read as an exit.)
#[test]
fn running_out_of_descriptors_forgets_no_client() {
    init!();
    raise_own_fd_limit();
    for (shell_line, cap) in [("ulimit -Sn 1024", 256), ("ulimit -n 300", 75)] {
        let server = loopback_server();
        let wrapper = after(shell_line);
        let agent = Agent::launch(
            &strs(&wrapper),
            &args(&["--endpoint", &server.addr.to_string(), "--min-client-age", "1s"]),
            LOOPBACK,
            true,
        );
        let clients: Vec<Client> = (0..4)
            .map(|_| Client::spawn(None, &[server.addr, server.addr, server.addr]))
            .collect();
        let want = expected(&clients.iter().collect::<Vec<_>>());
        agent.wait_table(secs(3.0), &want);
        thread::sleep(secs(1.5));
        let baseline = open_fds(agent.pid());

        let held = flood(agent.addr, 1, 1100);
        assert!(held.len() > 1000, "only {} connections opened", held.len());
        // Five ticks with the flood at the door.
        let start = Instant::now();
        let mut most = 0;
        while start.elapsed() < secs(5.0) {
            most = most.max(open_fds(agent.pid()));
            thread::sleep(secs(0.1));
        }
        assert!(
            most <= baseline + cap + 8,
            "{shell_line}: {most} descriptors open during the flood (baseline {baseline}, HTTP cap {cap})"
        );
        drop(held);

        // Every client and connection is still there, and none is judged unhealthy.
        let seen = agent.wait_table(secs(12.0), &want);
        for c in &clients {
            assert_eq!(
                state_of(&seen, c.pid()).as_deref(),
                Some("healthy"),
                "{:?}",
                Pretty(&seen)
            );
        }
        agent.hold_table(secs(2.0), &want);
        let log = agent.stderr();
        assert!(
            !log.contains("Too many open files"),
            "{shell_line}: the agent ran out:\n{log}"
        );
        let (soft, hard) = fd_limits(agent.pid());
        assert_eq!(
            soft, hard,
            "{shell_line}: the soft limit is raised to the hard one"
        );
    }
}

/// 1 (and issue 8): a zombie is gone. A client killed and not reaped by its parent stays a
/// zombie in /proc; the agent forgets it at once instead of keeping it (and alerting on it as
/// `disconnected`).
#[test]
fn a_zombie_client_is_forgotten() {
    init!();
    let server = loopback_server();
    let agent = Agent::start_with(&args(&[
        "--endpoint",
        &server.addr.to_string(),
        "--min-client-age",
        "1s",
        "--disconnect-grace",
        "2s",
    ]));
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_ll-client"))
        .args(["--connect", &server.addr.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn ll-client");
    let pid = child.id();
    agent.wait_clients(secs(4.0), "the client judged", |c| {
        let reason = find_pid(c, pid)?["reason"].as_str()?.to_owned();
        (!reason.contains("not judged")).then_some(())
    });

    // SAFETY: plain syscall on our own child. Not reaped: it stays a zombie.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    wait_until(secs(3.0), "the client to be a zombie", || {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        {
            Ok(())
        } else {
            Err(Shown(stat))
        }
    });
    let killed = Instant::now();
    agent.wait_clients(secs(3.0), "the zombie forgotten", |c| {
        find_pid(c, pid).is_none().then_some(())
    });
    eprintln!("zombie forgotten {:?} after the kill", killed.elapsed());
    // Past the disconnect grace: not listed (as `disconnected`) again.
    agent.hold_table(secs(3.0), &Table::new());
    assert!(
        fs::metadata(format!("/proc/{pid}")).is_ok(),
        "still a zombie, not reaped"
    );
    child.wait().expect("reap");
}

/// 2. A reload is all or nothing. A valid YAML file with 100,001 endpoints and a 1 s
///    `stale_after` is refused as a whole: the thresholds stay, and the kernel map is left as
///    it was, so endpoints can still be added afterwards. An empty file is refused too.
#[test]
fn a_refused_reload_changes_nothing() {
    init!();
    let (s1, s2) = (loopback_server(), loopback_server());
    let (e1, e2) = (s1.addr.to_string(), s2.addr.to_string());
    let dir = TempDir::new();
    let config = dir.path().join("lifeline.yaml");
    let good = |endpoints: &[&str]| {
        let list: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
        format!(
            "endpoints: [{}]\nthresholds:\n  stale_after: 60s\n  min_client_age: 1s\n",
            list.join(", ")
        )
    };
    write_file(&config, &good(&[&e1]));
    let agent = Agent::start_with(&args(&["--config", &config.display().to_string()]));
    let c1 = Client::spawn(None, &[s1.addr]);
    agent.wait_clients(secs(4.0), "c1 judged healthy", |c| {
        let c1v = find_pid(c, c1.pid())?;
        (c1v["state"] == "healthy" && !c1v["reason"].as_str()?.contains("not judged")).then_some(())
    });

    let mut huge = String::from("thresholds:\n  stale_after: 1s\n  min_client_age: 1s\nendpoints:\n");
    for i in 0..100_001u32 {
        huge.push_str(&format!(
            "  - \"10.{}.{}.{}:443\"\n",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        ));
    }
    write_file(&config, &huge);
    agent.signal(libc::SIGHUP);
    wait_log(&agent, secs(20.0), &["config not reloaded"]);
    // A 1 s stale_after would make the silent c1 stale within 2 s: it was not applied.
    hold(secs(3.0), "c1 healthy under the old thresholds", || {
        let c = agent.clients();
        match state_of(&c, c1.pid()).as_deref() {
            Some("healthy") => Ok(()),
            _ => Err(Shown(format!("{:?}", Pretty(&c)))),
        }
    });
    assert_eq!(agent.endpoints(), vec![(e1.clone(), "config".to_owned())]);
    wait_log(
        &agent,
        secs(1.0),
        &["endpoints: 100001 endpoints", "at most 4096"],
    );

    // The kernel map still takes new endpoints: a connection to e2 is seen.
    write_file(&config, &good(&[&e1, &e2]));
    agent.signal(libc::SIGHUP);
    let c2 = Client::spawn(None, &[s2.addr]);
    agent.wait_table(secs(5.0), &expected(&[&c1, &c2]));

    // An empty file (a ConfigMap key emptied by mistake) is refused, as at start-up.
    write_file(&config, "");
    agent.signal(libc::SIGHUP);
    wait_log(&agent, secs(5.0), &["lifeline.yaml is empty"]);
    agent.hold_table(secs(1.0), &expected(&[&c1, &c2]));
    let mut want = vec![(e1, "config".to_owned()), (e2, "config".to_owned())];
    want.sort();
    assert_eq!(agent.endpoints(), want);
}

/// 2. Too many endpoints at start-up exit 2, naming the key (or the flags) and the limit.
#[test]
fn too_many_endpoints_at_start_exit_2_naming_the_key_and_the_limit() {
    init!();
    let dir = TempDir::new();
    let config = dir.path().join("many.yaml");
    let list: Vec<String> = (0..4097u32)
        .map(|i| format!("\"10.9.{}.{}:443\"", i >> 8, i & 255))
        .collect();
    write_file(&config, &format!("endpoints: [{}]\n", list.join(", ")));
    let listen = format!("127.0.0.1:{}", free_port());
    let out = lifeline(&[
        "run",
        "--config",
        &config.display().to_string(),
        "--listen",
        &listen,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("many.yaml: endpoints: 4097 endpoints") && stderr.contains("at most 4096"),
        "{stderr}"
    );

    let mut cli = vec!["run".to_owned(), "--listen".into(), listen];
    for i in 0..4097u32 {
        cli.push("--endpoint".into());
        cli.push(format!("10.8.{}.{}:443", i >> 8, i & 255));
    }
    let out = lifeline(&strs(&cli));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("too many apiserver endpoints: 4097") && stderr.contains("at most 4096"),
        "{stderr}"
    );
}

/// Issue 9 item 2: the agent follows its config file without SIGHUP, as mounted from a
/// ConfigMap (`config.yaml` → `..data/config.yaml`, `..data` swapped to a new directory).
#[test]
fn a_configmap_update_is_applied_without_a_signal() {
    init!();
    let (s1, s2) = (loopback_server(), loopback_server());
    let dir = TempDir::new();
    let version = |name: &str, endpoints: &[&Server]| {
        let list: Vec<String> = endpoints.iter().map(|s| format!("\"{}\"", s.addr)).collect();
        fs::create_dir_all(dir.path().join(name)).expect("mkdir");
        fs::write(
            dir.path().join(name).join("config.yaml"),
            format!("endpoints: [{}]\n", list.join(", ")),
        )
        .expect("write");
    };
    version("..2026_01_01", &[&s1]);
    std::os::unix::fs::symlink("..2026_01_01", dir.path().join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/config.yaml", dir.path().join("config.yaml")).expect("symlink");
    let agent = Agent::start_with(&args(&[
        "--config",
        &dir.path().join("config.yaml").display().to_string(),
    ]));
    assert_eq!(
        agent.endpoints(),
        vec![(s1.addr.to_string(), "config".to_owned())]
    );

    // What the kubelet does: a new timestamped directory, then an atomic swap of `..data`.
    version("..2026_01_02", &[&s1, &s2]);
    std::os::unix::fs::symlink("..2026_01_02", dir.path().join("..data_tmp")).expect("symlink");
    fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).expect("swap");
    let swapped = Instant::now();
    let mut want = vec![
        (s1.addr.to_string(), "config".to_owned()),
        (s2.addr.to_string(), "config".to_owned()),
    ];
    want.sort();
    wait_until(secs(5.0), "the new endpoints in force", || {
        let e = agent.endpoints();
        if e == want {
            Ok(())
        } else {
            Err(e)
        }
    });
    eprintln!("applied {:?} after the swap", swapped.elapsed());
    wait_log(&agent, secs(1.0), &["config reloaded (the config file changed)"]);
    let c2 = Client::spawn(None, &[s2.addr]);
    agent.wait_table(secs(3.0), &expected(&[&c2]));
}

/// 3. The HTTP server has limits: slow senders and idle connections are closed after the
///    header timeout (10 s), a flood holds at most the connection cap, and answers are bounded
///    (a 200 KiB command line is cut at 4 KiB).
#[test]
fn the_http_server_sheds_slow_and_idle_connections_and_bounds_answers() {
    init!();
    raise_own_fd_limit();
    let server = loopback_server();
    let agent = Agent::start_with(&args(&["--endpoint", &server.addr.to_string()]));
    // 200 KiB in four arguments (one argument may not exceed 128 KiB).
    let long_arg = "a".repeat(50 * 1024);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ll-client"));
    cmd.args(["--connect", &server.addr.to_string(), "--"])
        .args([&long_arg; 4])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut long = cmd.spawn().expect("spawn ll-client");
    let long_pid = long.id();
    agent.wait_clients(secs(3.0), "the long command line listed", |c| {
        find_pid(c, long_pid).map(|_| ())
    });
    let (status, body) = agent.get("/api/v1/clients");
    assert_eq!(status, 200);
    assert!(body.len() < 16 * 1024, "answer of {} bytes", body.len());
    let clients: Vec<Value> = serde_json::from_str(&body).expect("JSON");
    let cmdline = find_pid(&clients, long_pid).unwrap()["cmdline"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        cmdline.len() <= 4096 && cmdline.ends_with("…[truncated]"),
        "{} bytes",
        cmdline.len()
    );
    let _ = long.kill();
    let _ = long.wait();

    let rss_before = rss_kib(agent.pid());
    let fds_before = open_fds(agent.pid());
    // Slowloris: 20 connections each sending one byte of a request head per second.
    let mut slow: Vec<(TcpStream, Option<Duration>)> = (0..20)
        .map(|i| {
            (
                connect_from(Ipv4Addr::new(127, 0, 3, 1 + i), agent.addr).expect("slow"),
                None,
            )
        })
        .collect();
    // And 2000 idle connections from 80 addresses.
    let idle = flood(agent.addr, 2, 2000);
    let started = Instant::now();
    let head = b"GET /api/v1/clients HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut most_fds = 0;
    for second in 0..16 {
        for (s, closed) in slow.iter_mut().filter(|(_, c)| c.is_none()) {
            if s.write_all(&head[second..=second]).is_err() || closed_within(s, secs(0.01)) {
                *closed = Some(started.elapsed());
            }
        }
        most_fds = most_fds.max(open_fds(agent.pid()));
        thread::sleep(secs(1.0).saturating_sub(started.elapsed().saturating_sub(secs(second as f64))));
    }
    let kept: Vec<usize> = (0..slow.len()).filter(|i| slow[*i].1.is_none()).collect();
    assert!(kept.is_empty(), "slow senders still open after 16 s: {kept:?}");
    let latest = slow.iter().filter_map(|(_, c)| *c).max().unwrap();
    assert!(latest < secs(13.0), "slow senders closed only after {latest:?}");
    assert!(
        most_fds <= fds_before + 256 + 8,
        "{most_fds} descriptors during 2020 connections (before: {fds_before})"
    );
    let rss_during = rss_kib(agent.pid());
    assert!(
        rss_during < rss_before + 16 * 1024,
        "RSS grew from {rss_before} KiB to {rss_during} KiB"
    );
    // The idle flood is gone by now too, and the server answers.
    drop(idle);
    wait_until(secs(3.0), "the flood's descriptors released", || {
        let n = open_fds(agent.pid());
        if n <= fds_before + 4 {
            Ok(())
        } else {
            Err(n)
        }
    });
    assert_eq!(agent.get("/healthz").0, 200);
}

/// A copy of ll-client under the file name `name` (its comm is the name's first 15 bytes).
fn renamed_client(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    fs::copy(env!("CARGO_BIN_EXE_ll-client"), &path).expect("copy ll-client");
    path
}

/// 5 and issue 9 item 5. Secrets on a command line never reach the API, the logs or `lifeline
/// status`, and a process named `"ll\nERROR forged"` (or with ESC sequences) writes no forged
/// log line and sends nothing to the terminal; `--log-format json` keeps every value exact on
/// one line.
#[test]
fn secrets_and_hostile_names_never_reach_outputs() {
    init!();
    let server = loopback_server();
    let dir = TempDir::new();
    let names = ["ll\nERROR forged", "ll\u{1b}[2J\u{1b}]0;x"];
    let secrets = [
        "s3cr3t-token-value",
        "hunter2-password",
        "AKIAsecretKEY",
        "pw-in-url",
    ];
    let tail = [
        "--token=s3cr3t-token-value",
        "--password",
        "hunter2-password",
        "AWS_SECRET_ACCESS_KEY=AKIAsecretKEY",
        "https://admin:pw-in-url@db.example/x",
    ];
    let common = [
        "--endpoint",
        &server.addr.to_string(),
        "--disconnect-grace",
        "1s",
        "--min-client-age",
        "1s",
    ];
    let text_agent = Agent::start_with(&args(&common));

    let mut children: Vec<Child> = names
        .iter()
        .map(|name| {
            Command::new(renamed_client(dir.path(), name))
                .args(["--connect", &server.addr.to_string(), "--"])
                .args(tail)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn renamed client")
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    // A state change of each is logged with its name: the apiserver side closes their
    // connections (they never do: CLOSE_WAIT), they are disconnected after the grace.
    let both_in = |agent: &Agent, state: &str| {
        agent.wait_clients(secs(8.0), &format!("both clients {state}"), |c| {
            pids.iter()
                .all(|p| {
                    find_pid(c, *p).is_some_and(|c| {
                        c["state"] == state && !c["reason"].as_str().unwrap_or("").contains("not judged yet")
                    })
                })
                .then_some(())
        });
    };
    both_in(&text_agent, "healthy");
    drop(server);
    both_in(&text_agent, "disconnected");

    // The API: names exactly as they are (JSON escapes them), command lines redacted.
    let clients = text_agent.clients();
    for (pid, name) in pids.iter().zip(names) {
        let c = find_pid(&clients, *pid).unwrap();
        assert_eq!(c["comm"], name);
        let cmdline = c["cmdline"].as_str().unwrap();
        for redacted in [
            "--token=<redacted>",
            "--password <redacted>",
            "AWS_SECRET_ACCESS_KEY=<redacted>",
            "https://admin:<redacted>@db.example/x",
        ] {
            assert!(cmdline.contains(redacted), "{cmdline}");
        }
    }
    let (_, raw) = text_agent.get("/api/v1/clients");
    let (_, metrics) = text_agent.get("/metrics");
    // The text log: one line per event, no forged line, no ESC, no secret.
    let log = text_agent.stderr();
    assert!(log.contains(r"comm=ll\nERROR forged"), "{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("ERROR forged")),
        "forged line:\n{log}"
    );
    assert!(!log.contains('\u{1b}'), "ESC in the log:\n{log:?}");
    // `lifeline status`: the same, plus SINCE and REASON.
    let status = lifeline(&["status", "--server", &text_agent.url()]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let table = String::from_utf8_lossy(&status.stdout).into_owned();
    assert_eq!(
        table.lines().count(),
        3,
        "header and one row per connection:\n{table}"
    );
    assert!(
        table.lines().next().unwrap().contains("SINCE") && table.contains("REASON"),
        "{table}"
    );
    assert!(!table.chars().any(|c| c.is_control() && c != '\n'), "{table:?}");
    // JSON logs: every line one object; the name exact.
    let mut json_args = args(&common);
    json_args.push("--log-format".into());
    json_args.push("json".into());
    let json_agent = Agent::start_with(&json_args);
    both_in(&json_agent, "disconnected");
    let json_log = json_agent.stderr();
    let events: Vec<Value> = json_log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(events.iter().any(|e| e["comm"] == names[0]), "{json_log}");
    for secret in secrets {
        for (what, text) in [
            ("API", &raw),
            ("metrics", &metrics),
            ("log", &log),
            ("JSON log", &json_log),
            ("status", &table),
        ] {
            assert!(!text.contains(secret), "{secret} in the {what}:\n{text}");
        }
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A namespace linked to the host by a veth pair: the host end has 10.249.N.1, the namespace's
/// 10.249.N.2. Connections from the host to 10.249.N.1 come from a non-loopback address.
struct HostLink {
    _ns: NetNs,
    host_ip: Ipv4Addr,
}

impl HostLink {
    fn new() -> HostLink {
        let ns = NetNs::new();
        let n = 1 + (std::process::id() % 250) as u8;
        let (outside, inside) = (format!("llk{}h{n}", std::process::id() % 1000), "llk-in");
        run(Command::new("ip").args([
            "link", "add", &outside, "type", "veth", "peer", "name", inside, "netns", &ns.name,
        ]));
        let host_ip = Ipv4Addr::new(10, 249, n, 1);
        run(Command::new("ip").args(["addr", "add", &format!("{host_ip}/24"), "dev", &outside]));
        run(Command::new("ip").args(["link", "set", &outside, "up"]));
        ns.run(&["ip", "addr", "add", &format!("10.249.{n}.2/24"), "dev", inside]);
        ns.run(&["ip", "link", "set", inside, "up"]);
        HostLink { _ns: ns, host_ip }
    }
}

/// Issue 9 item 5: `/metrics`, `/healthz` and `/readyz` answer anyone; the client API (command
/// lines) only loopback peers, or bearers of the `--api-token-file` token.
#[test]
fn the_client_api_answers_loopback_or_the_token_only() {
    init!();
    let server = loopback_server();
    let _client = Client::spawn(None, &[server.addr]);
    let link = HostLink::new();
    let dir = TempDir::new();
    let token = dir.path().join("token");
    fs::write(&token, "the-api-token\n").expect("token file");
    let endpoint = server.addr.to_string();
    let anywhere = IpAddr::from([0, 0, 0, 0]);
    let closed = Agent::launch(&[], &args(&["--endpoint", &endpoint]), anywhere, true);
    let mut open = None;
    for token_file in [None, Some(&token)] {
        // The agent with a token is started after the one without has been checked.
        let agent = match token_file {
            None => &closed,
            Some(file) => open.insert(Agent::launch(
                &[],
                &args(&[
                    "--endpoint",
                    &endpoint,
                    "--api-token-file",
                    &file.display().to_string(),
                ]),
                anywhere,
                true,
            )),
        };
        let outside = SocketAddr::from((link.host_ip, agent.addr.port()));
        let get = |path: &str, bearer: Option<&str>| get_as(link.host_ip, outside, path, bearer).expect(path);
        for path in ["/metrics", "/healthz", "/readyz"] {
            assert_eq!(get(path, None).0, 200, "{path} from a non-loopback peer");
        }
        let (_, metrics) = get("/metrics", None);
        assert!(!metrics.contains("--connect"), "a command line in the metrics");
        assert_eq!(agent.get("/api/v1/clients").0, 200, "loopback needs no token");
        let (status, body) = get("/api/v1/clients", None);
        let (wrong, _) = get("/api/v1/endpoints", Some("not-the-token"));
        let (right, listed) = get("/api/v1/clients", Some("the-api-token"));
        if token_file.is_none() {
            assert_eq!((status, wrong, right), (403, 403, 403), "{body}");
            assert!(body.contains("loopback peers only"), "{body}");
        } else {
            assert_eq!((status, wrong, right), (401, 401, 200), "{body}");
            assert!(listed.contains("ll-client"), "{listed}");
        }
    }
    // `lifeline status` from a non-loopback address needs --token-file.
    let open = open.expect("the agent with a token");
    let url = format!("http://{}:{}", link.host_ip, open.addr.port());
    let out = lifeline(&["status", "--server", &url]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lifeline(&[
        "status",
        "--server",
        &url,
        "--token-file",
        &token.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ll-client"));
}

/// The agent run without `cap` on `endpoint` (ready or not: it answers `/healthz`), after
/// checking that it says it is blind to `what`: `/readyz` 503 naming the capability,
/// `lifeline_agent_blind{what} 1` and only that one, an error in the log.
fn blind_agent(cap: &str, endpoint: SocketAddr, what: &str) -> Agent {
    let agent = Agent::launch(
        &strs(&without(cap)),
        &args(&["--endpoint", &endpoint.to_string()]),
        LOOPBACK,
        false,
    );
    let (status, body) = agent.get("/readyz");
    assert_eq!(status, 503, "{body}");
    let missing = format!("{} missing", cap.to_uppercase());
    assert!(
        body.contains(&format!("blind ({what})")) && body.contains(&missing),
        "{body}"
    );
    let (_, metrics) = agent.get("/metrics");
    for other in ["other_netns", "socket_owners"] {
        let value = if other == what { 1 } else { 0 };
        let series = format!("lifeline_agent_blind{{what=\"{other}\"}} {value}");
        assert!(metrics.contains(&series), "{series}:\n{metrics}");
    }
    assert!(agent.stderr().contains("running blind"), "{}", agent.stderr());
    agent
}

/// 6. Without CAP_SYS_ADMIN the agent cannot enter other network namespaces: it runs, but says
///    so, and still scans and samples its own namespace: a host client older than the agent is
///    found and its inbound bytes are counted.
#[test]
fn without_cap_sys_admin_the_agent_is_blind_to_other_namespaces_and_says_so() {
    init!();
    let mut server = loopback_server();
    let client = Client::spawn(None, &[server.addr]);
    let agent = blind_agent("cap_sys_admin", server.addr, "other_netns");
    agent.wait_table(secs(3.0), &expected(&[&client]));
    // The agent's own reachability probe may hold a connection to the server too.
    assert!(server.send(3000) >= 1);
    agent.wait_clients(secs(4.0), "3000 bytes received", |c| {
        let k = connections(find_pid(c, client.pid())?).first()?.clone();
        (k["bytes_received"].as_u64()? >= 3000).then_some(())
    });
}

/// 6. Without CAP_SYS_PTRACE the agent cannot tell who holds a socket it did not see opened:
///    it says so, and a client that connects later is still attributed (from its connect()).
#[test]
fn without_cap_sys_ptrace_the_agent_is_blind_to_older_owners_and_says_so() {
    init!();
    let server = loopback_server();
    let _older = Client::spawn(None, &[server.addr]);
    let agent = blind_agent("cap_sys_ptrace", server.addr, "socket_owners");
    let newer = Client::spawn(None, &[server.addr]);
    agent.wait_table(secs(3.0), &expected(&[&newer]));
}

/// 6. `lifeline check` fails only for what the agent cannot run without, and names what each
///    missing privilege costs; `run` refuses a remediation mode it could not carry out; and the
///    agent runs without CAP_SYS_RESOURCE and with no lockable memory at all.
#[test]
fn check_and_run_agree_on_each_privilege() {
    init!();
    let check = |wrapper: &[String]| {
        let out = lifeline_via(&strs(wrapper), &["check"], secs(20.0));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = check(&without("cap_net_admin"));
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("CAP_NET_ADMIN missing") && text.contains("reset and restart"),
        "{text}"
    );
    let (code, text) = check(&without("cap_sys_admin,cap_sys_ptrace"));
    assert_eq!(code, Some(0), "{text}");
    for needle in [
        "[WARN]",
        "CAP_SYS_ADMIN missing",
        "CAP_SYS_PTRACE missing",
        "degraded",
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    let (code, text) = check(&without("cap_bpf,cap_sys_admin"));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("[FAIL]") && text.contains("CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN missing"),
        "{text}"
    );
    let (code, text) = check(&without("cap_sys_resource"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("CAP_SYS_RESOURCE: not needed"), "{text}");

    let server = loopback_server();
    let dir = TempDir::new();
    let config = dir.path().join("reset.yaml");
    write_file(&config, "remediation:\n  mode: reset\n");
    let listen = format!("127.0.0.1:{}", free_port());
    let run_args = [
        "run",
        "--config",
        &config.display().to_string(),
        "--endpoint",
        &server.addr.to_string(),
        "--listen",
        &listen,
    ];
    let out = lifeline_via(&strs(&without("cap_net_admin")), &run_args, secs(20.0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("remediation.mode reset needs CAP_NET_ADMIN"),
        "{stderr}"
    );
    // A dry run needs nothing.
    let dry = Agent::launch(
        &strs(&without("cap_net_admin")),
        &args(&[
            "--config",
            &config.display().to_string(),
            "--endpoint",
            &server.addr.to_string(),
            "--dry-run",
        ]),
        LOOPBACK,
        true,
    );
    drop(dry);

    // No CAP_SYS_RESOURCE and RLIMIT_MEMLOCK 0: ready all the same.
    let wrapper = [
        "sh",
        "-c",
        r#"ulimit -l 0 && exec capsh --drop=cap_sys_resource -- -c 'exec "$0" "$@"' "$0" "$@""#,
    ];
    let agent = Agent::launch(
        &wrapper,
        &args(&["--endpoint", &server.addr.to_string()]),
        LOOPBACK,
        true,
    );
    let client = Client::spawn(None, &[server.addr]);
    agent.wait_table(secs(3.0), &expected(&[&client]));
}
