use super::*;
use crate::testkit::FakeProc;
use std::fs;
use std::os::unix::fs::symlink;

const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const UID_: &str = "5f3c2b1a_9d8e_4c7b_a6f5_e4d3c2b1a098";

#[test]
fn stat_start_time() {
    let cases: &[(&str, Option<u64>)] = &[
        (
            "1 (systemd) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 42 1 2 3",
            Some(42),
        ),
        (
            "77 (my (weird) proc) ) R 1 77 77 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 12345678 456\n",
            Some(987654),
        ),
        (
            "9 (a b c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 7777777777",
            Some(7777777777),
        ),
        // Too few fields, no parenthesis, junk in the field.
        ("1 (x) S 0 1 1", None),
        ("1 x S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 42", None),
        ("1 (x) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 4x2", None),
        ("", None),
    ];
    for &(stat, want) in cases {
        assert_eq!(parse_stat_start_time(stat), want, "stat {stat:?}");
    }
}

#[test]
fn stat_fields() {
    let line = |state: &str, threads: u32| {
        format!("7 (a) b) {state} 1 7 7 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 {threads} 0 4242 1 2\n")
    };
    assert_eq!(
        parse_stat(&line("S", 3)),
        Some(Stat {
            state: 'S',
            num_threads: 3,
            start_time: 4242
        })
    );
    assert!(parse_stat(&line("Z", 1)).unwrap().is_dead());
    assert!(parse_stat(&line("X", 0)).unwrap().is_dead());
    assert!(
        !parse_stat(&line("Z", 2)).unwrap().is_dead(),
        "main thread exited, another runs: alive"
    );
    assert!(!parse_stat(&line("R", 1)).unwrap().is_dead());
    assert_eq!(parse_stat(&line("SS", 1)), None);
    assert_eq!(parse_stat(&line("S", 1).replace(" 1 0 4242", " x 0 4242")), None);
}

#[test]
fn status_tgid() {
    assert_eq!(
        parse_status_tgid("Name:\tx\nUmask:\t0022\nState:\tS\nTgid:\t1234\nNgid:\t0\nPid:\t1240\n"),
        Some(1234)
    );
    assert_eq!(parse_status_tgid("Name:\tx\nPid:\t1\n"), None);
    assert_eq!(parse_status_tgid("Tgid:\tabc\n"), None);
}

#[test]
fn cmdline() {
    let cases: &[(&[u8], &str)] = &[
        (
            b"/usr/bin/kubelet\0--v=2\0--config=/var/lib/kubelet/config.yaml\0",
            "/usr/bin/kubelet --v=2 --config=/var/lib/kubelet/config.yaml",
        ),
        (b"", ""),
        (b"\0", ""),
        (
            b"nginx: master process /usr/sbin/nginx\0\0\0\0\0\0",
            "nginx: master process /usr/sbin/nginx",
        ),
        (b"a\0\0b\0", "a  b"),
        (b"no-trailing-nul", "no-trailing-nul"),
        (b"bad\xffutf8\0x\0", "bad\u{fffd}utf8 x"),
    ];
    for &(raw, want) in cases {
        assert_eq!(format_cmdline(raw), want, "cmdline {raw:?}");
    }
}

#[test]
fn cgroup_selection() {
    let pod = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"
    );
    let v1_pod = format!("/kubepods/burstable/pod5f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098/{CID}");
    let cases: Vec<(String, Option<String>)> = vec![
        // Pure v2.
        (format!("0::{pod}\n"), Some(pod.clone())),
        ("0::/user.slice/user-1000.slice/session-2.scope\n".into(), Some("/user.slice/user-1000.slice/session-2.scope".into())),
        ("0::/\n".into(), Some("/".into())),
        // Hybrid, systemd driver: the same path in v2 and v1.
        (
            format!("12:pids:{pod}\n11:cpu,cpuacct:{pod}\n1:name=systemd:{pod}\n0::{pod}\n"),
            Some(pod.clone()),
        ),
        // Hybrid, cgroupfs driver with the container left in the runtime's service in v2.
        (
            format!("12:pids:{v1_pod}\n5:cpu,cpuacct:{v1_pod}\n1:name=systemd:{v1_pod}\n0::/system.slice/containerd.service\n"),
            Some(v1_pod.clone()),
        ),
        // Legacy v1 with an unused v2 hierarchy: skip the root.
        (
            "12:pids:/system.slice/sshd.service\n4:cpu,cpuacct:/system.slice/sshd.service\n1:name=systemd:/system.slice/sshd.service\n0::/\n".into(),
            Some("/system.slice/sshd.service".into()),
        ),
        // v1 without name=systemd: pids, then cpu.
        (
            "3:memory:/m\n2:cpu,cpuacct:/c\n1:pids:/p\n".into(),
            Some("/p".into()),
        ),
        ("3:memory:/m\n2:cpu,cpuacct:/c\n".into(), Some("/c".into())),
        ("3:memory:/m\n2:cpuset:/s\n".into(), None),
        (String::new(), None),
        ("garbage\n".into(), None),
    ];
    for (file, want) in cases {
        assert_eq!(select_cgroup_path(&file), want.as_deref(), "cgroup file {file:?}");
    }
}

#[test]
fn socket_links() {
    assert_eq!(parse_socket_link(b"socket:[1234]"), Some(1234));
    assert_eq!(
        parse_socket_link(b"socket:[18446744073709551615]"),
        Some(u64::MAX)
    );
    assert_eq!(parse_socket_link(b"socket:[18446744073709551616]"), None);
    assert_eq!(parse_socket_link(b"socket:[]"), None);
    assert_eq!(parse_socket_link(b"socket:[12a]"), None);
    assert_eq!(parse_socket_link(b"socket:[12"), None);
    assert_eq!(parse_socket_link(b"pipe:[1234]"), None);
    assert_eq!(parse_socket_link(b"anon_inode:[eventfd]"), None);
    assert_eq!(parse_socket_link(b"/dev/null"), None);
}

#[test]
fn fake_process() {
    let fake = FakeProc::new("process");
    let cgroup = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
    );
    fake.process(
        100,
        100,
        "my (weird) proc",
        b"/bin/app\0--flag\0value with space\0",
        5555,
        &cgroup,
    );
    // Thread 101 of process 100, named differently.
    fake.process(
        101,
        100,
        "worker",
        b"/bin/app\0--flag\0value with space\0",
        5556,
        &cgroup,
    );
    // A kernel thread.
    fake.process(2, 2, "kthreadd", b"", 3, "0::/\n");

    let procfs = fake.procfs();
    let info = procfs.process(100).expect("process 100");
    assert_eq!(info.pid, 100);
    assert_eq!(info.comm, "my (weird) proc");
    assert_eq!(info.cmdline, "/bin/app --flag value with space");
    assert_eq!(info.start_time_ticks, 5555);
    assert_eq!(
        info.cgroup,
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope")
    );
    let container = info.container.as_ref().expect("container");
    assert_eq!(container.runtime, container::Runtime::Containerd);
    assert_eq!(container.id, CID);
    assert!(info.netns.is_some());

    // A thread id is resolved to its process.
    assert_eq!(procfs.tgid_of(101).expect("tgid of 101"), 100);
    assert_eq!(procfs.process(101).expect("process of thread 101"), info);

    let kthread = procfs.process(2).expect("process 2");
    assert_eq!(kthread.comm, "kthreadd");
    assert_eq!(kthread.cmdline, "");
    assert_eq!(kthread.cgroup, "/");
    assert_eq!(kthread.container, None);

    assert!(procfs.is_alive(100, 5555));
    assert!(!procfs.is_alive(100, 5554));
    assert!(!procfs.is_alive(999, 5555));

    assert!(matches!(procfs.process(999), Err(Error::Gone { pid: 999 })));
    assert!(matches!(procfs.tgid_of(999), Err(Error::Gone { pid: 999 })));

    // Exists but malformed.
    fake.file(300, "status", "Name:\tx\n");
    assert!(matches!(
        procfs.tgid_of(300),
        Err(Error::Malformed { path, .. }) if path == fake.root.join("300/status")
    ));
    fake.file(301, "status", "Tgid:\t301\n");
    fake.file(301, "stat", "301 (x) S 1\n");
    assert!(matches!(procfs.process(301), Err(Error::Malformed { .. })));
    // Exists but a file is missing: gone mid-read.
    fake.file(302, "status", "Tgid:\t302\n");
    fake.file(
        302,
        "stat",
        "302 (x) S 1 302 302 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 9 1 2\n",
    );
    assert!(matches!(procfs.process(302), Err(Error::Gone { pid: 302 })));
    // No network namespace link (main thread exited, other threads alive).
    fake.process(304, 304, "leader-gone", b"", 8, "0::/\n");
    fs::remove_file(fake.root.join("304/ns/net")).expect("remove ns/net");
    assert_eq!(procfs.process(304).expect("process 304").netns, None);
    // An unreadable file that is not "not found": a directory where a file should be.
    fake.file(303, "status", "Tgid:\t303\n");
    fake.file(303, "stat/x", "");
    assert!(matches!(
        procfs.process(303),
        Err(Error::Read { pid: 303, path, .. }) if path == fake.root.join("303/stat")
    ));
}

#[test]
fn liveness_says_exited_only_on_evidence() {
    let fake = FakeProc::new("process");
    let procfs = fake.procfs();
    fake.process(100, 100, "app", b"app\0", 5555, "0::/\n");
    assert!(matches!(procfs.liveness(100, 5555), Liveness::Alive));
    assert!(
        matches!(procfs.liveness(100, 5554), Liveness::Exited),
        "pid recycled"
    );
    assert!(matches!(procfs.liveness(999, 1), Liveness::Exited), "no such pid");

    let stat = |state: &str, threads: u32| {
        format!("101 (app) {state} 1 101 101 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 {threads} 0 77 1 2\n")
    };
    fake.file(101, "stat", stat("Z", 1));
    assert!(matches!(procfs.liveness(101, 77), Liveness::Exited), "zombie");
    assert!(!procfs.is_alive(101, 77));
    fake.file(101, "stat", stat("Z", 4));
    assert!(
        matches!(procfs.liveness(101, 77), Liveness::Alive),
        "main thread gone, others running"
    );

    // A stat that cannot be read for another reason than absence says nothing.
    fake.file(102, "stat/x", "");
    assert!(matches!(
        procfs.liveness(102, 1),
        Liveness::Unknown(Error::Read { pid: 102, .. })
    ));
    assert!(!procfs.is_alive(102, 1), "unknown is not known alive");
    fake.file(103, "stat", "garbage");
    assert!(matches!(
        procfs.liveness(103, 1),
        Liveness::Unknown(Error::Malformed { .. })
    ));
}

#[test]
fn a_real_zombie_has_exited() {
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    let procfs = Procfs::default();
    // Not reaped yet: a zombie once it has exited.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let start = loop {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("zombie stat");
        let stat = parse_stat(&stat).expect("stat parses");
        if stat.state == 'Z' {
            break stat.start_time;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} never became a zombie"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(matches!(procfs.liveness(pid, start), Liveness::Exited));
    assert!(matches!(procfs.process(pid), Err(Error::Gone { .. })));
    child.wait().expect("reap");
}

/// Set in the child process of [`out_of_descriptors_is_unknown_not_exited`].
const EMFILE_CHILD: &str = "LIFELINE_TEST_EMFILE_CHILD";

#[test]
fn out_of_descriptors_is_unknown_not_exited() {
    // Exhausting descriptors would disturb the tests running beside this one: do it in a
    // child process running only `emfile_child`.
    // The test's path without the crate name: `host::process::tests::emfile_child`.
    let child_test = format!(
        "{}::emfile_child",
        module_path!()
            .split_once("::")
            .map_or(module_path!(), |(_, rest)| rest)
    );
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", &child_test, "--nocapture", "--test-threads=1"])
        .env(EMFILE_CHILD, "1")
        .output()
        .expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("EMFILE seen"), "the child did not run: {text}");
}

/// Runs only as the child of [`out_of_descriptors_is_unknown_not_exited`].
#[test]
fn emfile_child() {
    if std::env::var_os(EMFILE_CHILD).is_none() {
        return;
    }
    // A low limit of this child's own, whatever the hard limit.
    let low = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: a valid rlimit; lowering needs no privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let procfs = Procfs::default();
    let me = procfs.process(std::process::id()).expect("own process");
    let mut held = Vec::new();
    let emfile = loop {
        match fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => break e,
        }
        assert!(held.len() < 256, "no descriptor limit?");
    };
    assert_eq!(emfile.raw_os_error(), Some(libc::EMFILE));
    let liveness = procfs.liveness(me.pid, me.start_time_ticks);
    drop(held);
    assert!(
        matches!(&liveness, Liveness::Unknown(Error::Read { source, .. }) if source.raw_os_error() == Some(libc::EMFILE)),
        "{liveness:?}"
    );
    assert!(matches!(
        procfs.liveness(me.pid, me.start_time_ticks),
        Liveness::Alive
    ));
    println!("EMFILE seen");
}

#[test]
fn shown_command_lines_are_redacted_and_bounded() {
    assert_eq!(
        shown_cmdline(b"app\0--token=s3cr3t\0--password\0hunter2\0--v=2\0"),
        "app --token=<redacted> --password <redacted> --v=2"
    );
    let mut huge = b"app\0".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 200 * 1024));
    let shown = shown_cmdline(&huge);
    assert!(shown.len() <= MAX_CMDLINE, "{}", shown.len());
    assert!(shown.starts_with("app aaa") && shown.ends_with(redact::TRUNCATED));
}

#[test]
fn fake_socket_owners() {
    let fake = FakeProc::new("process");
    fake.fd(100, 0, "/dev/null");
    fake.fd(100, 3, "socket:[1234]");
    fake.fd(100, 4, "socket:[5678]");
    fake.fd(100, 5, "pipe:[1234]");
    // The same socket twice in one process (dup).
    fake.fd(100, 6, "socket:[1234]");
    // Shared with another process (fork).
    fake.fd(200, 7, "socket:[1234]");
    fake.fd(200, 8, "anon_inode:[eventfd]");
    // Unwanted socket only.
    fake.fd(300, 3, "socket:[9999]");
    // Malformed links.
    fake.fd(300, 4, "socket:[12x]");
    fake.fd(300, 5, "socket:[");
    // A process without an fd directory, and one whose fd is a file, not a directory.
    fake.file(400, "stat", "");
    fake.file(500, "fd", "");
    // Non-pid entries, including one with a socket-looking fd tree.
    fake.file(0, "ignored", "");
    fs::create_dir_all(fake.root.join("sys/fd")).expect("mkdir");
    symlink("socket:[1234]", fake.root.join("sys/fd/3")).expect("symlink");
    symlink("100", fake.root.join("self")).expect("symlink");
    // Threads are not scanned.
    fs::create_dir_all(fake.root.join("100/task/101/fd")).expect("mkdir");
    symlink("socket:[5678]", fake.root.join("100/task/101/fd/9")).expect("symlink");

    let wanted: HashSet<u64> = [1234, 5678, 4242].into();
    let mut owners = fake.procfs().socket_owners(&wanted);
    for pids in owners.values_mut() {
        pids.sort_unstable();
    }
    let want: HashMap<u64, Vec<u32>> = [(1234, vec![100, 200]), (5678, vec![100])].into();
    assert_eq!(owners, want);

    assert!(fake.procfs().socket_owners(&HashSet::new()).is_empty());
    assert!(Procfs::new(fake.root.join("missing"))
        .socket_owners(&wanted)
        .is_empty());
}

/// The test binary's process name: its file name truncated to 15 bytes.
fn own_comm() -> String {
    let exe = std::env::current_exe().expect("current exe");
    let name = exe.file_name().expect("exe file name").as_bytes();
    String::from_utf8_lossy(&name[..name.len().min(15)]).into_owned()
}

#[test]
fn real_self() {
    let procfs = Procfs::default();
    let pid = std::process::id();
    let info = procfs.process(pid).expect("own process");
    assert_eq!(info.pid, pid);
    assert_eq!(info.comm, own_comm());
    assert!(!info.cmdline.is_empty());
    assert!(info.cgroup.starts_with('/'), "cgroup {:?}", info.cgroup);
    let netns = fs::metadata("/proc/self/ns/net").expect("own netns").ino();
    assert_eq!(info.netns, Some(netns));
    assert!(info.start_time_ticks > 0);
    assert!(procfs.is_alive(pid, info.start_time_ticks));
    assert!(!procfs.is_alive(pid, info.start_time_ticks + 1));
}

#[test]
fn real_thread() {
    let procfs = Procfs::default();
    let pid = std::process::id();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("lifeline-thread".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            tx.send(u32::try_from(tid).expect("tid fits u32"))
                .expect("send tid");
            std::thread::park();
        })
        .expect("spawn thread");
    let tid = rx.recv().expect("receive tid");
    assert_ne!(tid, pid);
    assert_eq!(procfs.tgid_of(tid).expect("tgid of own thread"), pid);
    let info = procfs.process(tid).expect("process of own thread");
    assert_eq!(info.pid, pid);
    assert_eq!(info.comm, own_comm());
    thread.thread().unpark();
    thread.join().expect("join thread");
}

#[test]
fn real_socket_owner() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind listener");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let target = fs::read_link(format!("/proc/self/fd/{fd}")).expect("readlink own fd");
    let inode = parse_socket_link(target.as_os_str().as_bytes()).expect("socket link");
    let owners = Procfs::default().socket_owners(&[inode].into());
    assert_eq!(owners.get(&inode), Some(&vec![std::process::id()]));
}
