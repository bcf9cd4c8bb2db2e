use std::{
    io::{self, Read},
    net::{Ipv4Addr, TcpListener, TcpStream},
    os::unix::process::ExitStatusExt,
    process::Command,
    sync::Mutex,
    time::Instant,
};

use super::*;
use crate::{
    act::remediate::{model::Client, NoCluster},
    host::netns::{netns_inode, run_in_netns, TestNetns},
};

fn client(pid: u32, start_time: u64) -> Client {
    Client {
        pid,
        start_time,
        comm: "sleep".into(),
        cmdline: "sleep 30".into(),
        pod: None,
    }
}

fn act(client: Client, action: Action) -> Decision {
    Decision {
        at: Instant::now(),
        client,
        action,
        reason: "stale: test".into(),
        disposition: Disposition::Act,
    }
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "kube-system".into(),
        name: name.into(),
        uid: "uid-1".into(),
    }
}

fn evict_decision(name: &str) -> Decision {
    act(
        Client {
            pod: Some(pod(name)),
            ..client(1, 1)
        },
        Action::Restart {
            target: Target::Pod(pod(name)),
        },
    )
}

#[tokio::test]
#[ignore = "needs root: run by cargo xtask test"]
async fn reset_aborts_the_clients_socket_and_then_finds_it_gone() {
    let ns = TestNetns::new();
    let (_listener, mut conn, _server) = run_in_netns(&ns.path, || {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind in test netns");
        let conn = TcpStream::connect(listener.local_addr().expect("listener address")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        (listener, conn, server)
    })
    .expect("enter test netns");
    let tuple = Tuple {
        netns: netns_inode(&ns.path).expect("inode of test netns"),
        local: conn.local_addr().expect("local"),
        remote: conn.peer_addr().expect("peer"),
    };
    // The socket's owner (this process) is in another netns: found among all of them.
    let owner = client(std::process::id(), 0);
    let reset = Action::Reset { tuples: vec![tuple] };
    let actuator = Actuator::new(NoCluster);
    let outcome = actuator.execute(act(owner.clone(), reset.clone())).await;
    assert_eq!(outcome.result, Resolution::Done("destroyed 1 socket".into()));
    // Without the reset the read would wait for data: time out instead of hanging.
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let err = conn
        .read(&mut [0; 16])
        .expect_err("read after the reset must fail");
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
        ),
        "read after the reset: {err}"
    );
    let again = actuator.execute(act(owner, reset)).await;
    assert_eq!(
        again.result,
        Resolution::Skipped(Skip::Gone("the socket had already been closed".into()))
    );
}

#[test]
fn reset_in_a_namespace_that_is_gone_fails_naming_it() {
    let tuple = Tuple {
        netns: 1,
        local: "10.0.0.2:40000".parse().unwrap(),
        remote: "10.0.0.1:6443".parse().unwrap(),
    };
    let report = reset(&[tuple], None);
    assert_eq!((report.destroyed, report.gone, report.failed.len()), (0, 0, 1));
    assert_eq!(
        report.resolution(),
        Resolution::Failed("no network namespace with inode 1 is left".into())
    );
}

#[test]
fn a_partial_reset_is_done_and_names_what_failed() {
    let report = ResetReport {
        destroyed: 2,
        gone: 1,
        failed: vec![Error::NoNetns { netns: 9 }],
    };
    assert_eq!(
        report.resolution(),
        Resolution::Done(
            "destroyed 2 sockets, 1 already closed, 1 failed: no network namespace with inode 9 is left"
                .into()
        )
    );
}

#[tokio::test]
async fn restart_signals_the_process_only_if_it_is_still_the_same() {
    let mut child = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
    let pid = child.id();
    let procfs = Procfs::default();
    let start = procfs.process(pid).expect("the child in /proc").start_time_ticks;
    let restart = |start_time| Action::Restart {
        target: Target::Process { pid, start_time },
    };
    let actuator = Actuator::new(NoCluster);

    // Another start time: the pid was reused by another process; it is not signalled.
    let other = actuator
        .execute(act(client(pid, start + 1), restart(start + 1)))
        .await;
    assert!(
        matches!(&other.result, Resolution::Skipped(Skip::Gone(why)) if why.contains("another process")),
        "{other:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.try_wait().expect("try_wait").is_none(), "still running");

    let outcome = actuator.execute(act(client(pid, start), restart(start))).await;
    assert_eq!(
        outcome.result,
        Resolution::Done(format!("sent SIGTERM to pid {pid}"))
    );
    let status = child.wait().expect("wait for the child");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    // Reaped: nothing left to signal.
    assert_eq!(
        signal_process(&procfs, pid, start, libc::SIGTERM).expect("signal a gone pid"),
        Signalled::Gone
    );
}

#[tokio::test]
async fn the_restart_signal_is_configurable() {
    let mut child = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
    let pid = child.id();
    let start = Procfs::default()
        .process(pid)
        .expect("the child")
        .start_time_ticks;
    let actuator = Actuator::new(NoCluster).with_signal(libc::SIGKILL);
    let action = Action::Restart {
        target: Target::Process {
            pid,
            start_time: start,
        },
    };
    let outcome = actuator.execute(act(client(pid, start), action)).await;
    assert_eq!(
        outcome.result,
        Resolution::Done(format!("sent SIGKILL to pid {pid}"))
    );
    assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
}

/// Answers every eviction the same way and counts the calls.
struct Fake {
    answer: Option<Result<EvictOutcome, &'static str>>,
    calls: Mutex<Vec<String>>,
}

impl Fake {
    fn answering(answer: Option<Result<EvictOutcome, &'static str>>) -> Self {
        Self {
            answer,
            calls: Mutex::new(Vec::new()),
        }
    }
}

impl Evictor for Fake {
    type Error = io::Error;

    async fn evict(&self, namespace: &str, name: &str) -> Result<EvictOutcome, io::Error> {
        self.calls.lock().unwrap().push(format!("{namespace}/{name}"));
        match &self.answer {
            Some(Ok(outcome)) => Ok(outcome.clone()),
            Some(Err(message)) => Err(io::Error::other(*message)),
            None => std::future::pending().await,
        }
    }
}

#[tokio::test]
async fn evictions_map_to_outcomes() {
    let cases = [
        (
            Some(Ok(EvictOutcome::Evicted)),
            Resolution::Done("pod kube-system/op-0 evicted".into()),
        ),
        (
            Some(Ok(EvictOutcome::Blocked {
                reason: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            })),
            Resolution::Skipped(Skip::Blocked(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            )),
        ),
        (
            Some(Ok(EvictOutcome::NotFound)),
            Resolution::Skipped(Skip::Gone("pod kube-system/op-0 not found".into())),
        ),
        (
            Some(Err("403 Forbidden")),
            Resolution::Failed("evicting pod kube-system/op-0: 403 Forbidden".into()),
        ),
        (
            None,
            Resolution::Failed("evicting pod kube-system/op-0: no answer within 20ms".into()),
        ),
    ];
    for (answer, want) in cases {
        let actuator = Actuator::new(Fake::answering(answer)).with_evict_timeout(Duration::from_millis(20));
        let outcome = actuator.execute(evict_decision("op-0")).await;
        assert_eq!(outcome.result, want);
        assert_eq!(*actuator.evictor.calls.lock().unwrap(), ["kube-system/op-0"]);
    }
}

#[tokio::test]
async fn without_a_cluster_evictions_fail() {
    let outcome = Actuator::new(NoCluster).execute(evict_decision("op-0")).await;
    assert_eq!(
        outcome.result,
        Resolution::Failed("evicting pod kube-system/op-0: no Kubernetes API configured".into())
    );
}

#[tokio::test]
async fn dry_runs_and_skips_do_nothing() {
    let actuator = Actuator::new(Fake::answering(Some(Ok(EvictOutcome::Evicted))));
    let mut dry = evict_decision("op-0");
    dry.disposition = Disposition::DryRun;
    assert_eq!(actuator.execute(dry).await.result, Resolution::DryRun);
    let mut skipped = evict_decision("op-0");
    skipped.disposition = Disposition::Skip(Skip::NotOptedIn);
    assert_eq!(
        actuator.execute(skipped).await.result,
        Resolution::Skipped(Skip::NotOptedIn)
    );
    assert!(actuator.evictor.calls.lock().unwrap().is_empty());
}

#[test]
fn signal_names() {
    assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
    assert_eq!(signal_name(libc::SIGUSR1), "SIGUSR1");
    assert_eq!(signal_name(64), "signal 64");
}
