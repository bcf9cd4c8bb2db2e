use std::{
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::Held;

/// A child killed when dropped, also when a test fails.
struct Killed(Child);

impl Killed {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A python3 process with four threads spinning, that writes `usr1` to `file` when SIGUSR1
/// comes; returned once its threads have started (its handler is in before them).
fn spinner(file: &std::path::Path) -> Killed {
    let script = "import signal, sys, threading\n\
                  signal.signal(signal.SIGUSR1, lambda *_: open(sys.argv[1], 'w').write('usr1'))\n\
                  def spin():\n    while True: pass\n\
                  for _ in range(3): threading.Thread(target=spin, daemon=True).start()\n\
                  spin()\n";
    let child = Command::new("python3")
        .args(["-c", script])
        .arg(file)
        .stdin(Stdio::null())
        .spawn()
        .map(Killed)
        .expect("python3 (installed by `cargo xtask setup`)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while super::threads(child.id()).map_or(0, |t| t.len()) < 4 {
        assert!(Instant::now() < deadline, "the spinner never started its threads");
        thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Each thread's state letter and the process's CPU ticks (user + system) from /proc.
fn threads_and_ticks(pid: u32) -> (Vec<char>, u64) {
    let mut states = Vec::new();
    for tid in super::threads(pid).expect("the spinner's threads") {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
        states.push(
            crate::host::process::parse_stat(&stat)
                .expect("a thread's stat")
                .state,
        );
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the name.
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (states, ticks)
}

/// Every thread of a busy process stands still while held, and runs again once let go; a
/// signal sent meanwhile is delivered after, not lost.
#[test]
fn a_held_process_stands_still_and_runs_on_with_its_signals_once_let_go() {
    let file = std::env::temp_dir().join(format!("lifeline-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let child = spinner(&file);
    let pid = child.id();

    let held = Held::hold(pid).expect("the spinner held");
    assert_eq!(held.threads(), 4, "every thread is held");
    let (states, before) = threads_and_ticks(pid);
    assert!(
        states.iter().all(|s| *s == 't'),
        "every thread in a ptrace-stop: {states:?}"
    );
    // SAFETY: kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    thread::sleep(Duration::from_millis(300));
    let (_, after) = threads_and_ticks(pid);
    assert_eq!(before, after, "no CPU time passes while held");
    assert!(!file.exists(), "the signal waits while held");
    drop(held);

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (states, ticks) = threads_and_ticks(pid);
        if ticks > after && file.exists() && !states.contains(&'t') {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "let go, the spinner runs on and handles its signal: states {states:?}, ticks {ticks} (held {after}), signalled {}",
            file.exists()
        );
        thread::sleep(Duration::from_millis(20));
    }
    drop(child);
    let _ = std::fs::remove_file(&file);
}

/// A process gone is an error that names it, not a hang.
#[test]
fn a_process_gone_is_not_held() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let err = Held::hold(pid).err().expect("a reaped process cannot be held");
    assert!(err.to_string().contains(&format!("/proc/{pid}/task")), "{err}");
}

/// A process killed while held dies at once, and its parent (not the holder) hears of it as
/// usual: letting go neither hangs nor leaves a zombie behind.
#[test]
fn a_process_killed_while_held_dies_and_its_parent_hears_of_it() {
    let status = std::env::temp_dir().join(format!("lifeline-hold-exit-{}", std::process::id()));
    let _ = std::fs::remove_file(&status);
    // sh, the parent, waits for the spinner and writes how it ended.
    let mut parent = Killed(Command::new("sh")
        .args([
            "-c",
            "python3 -c 'import threading\nfor _ in range(3): threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\nwhile True: pass' & wait $!; echo $? > \"$0\"",
        ])
        .arg(&status)
        .spawn()
        .expect("sh"));
    let sh = parent.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let children = std::fs::read_to_string(format!("/proc/{sh}/task/{sh}/children")).unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<u32>().ok())
        {
            if super::threads(pid).map_or(0, |t| t.len()) >= 4 {
                break pid;
            }
        }
        assert!(Instant::now() < deadline, "the spinner never started under sh");
        thread::sleep(Duration::from_millis(20));
    };

    let held = Held::hold(pid).expect("the spinner held");
    // SAFETY: kill(2) of our grandchild.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    thread::sleep(Duration::from_millis(100));
    let (done, watchdog) = std::sync::mpsc::channel::<()>();
    thread::spawn(move || {
        if watchdog.recv_timeout(Duration::from_secs(10)).is_err() {
            eprintln!("letting go of a killed process hung");
            std::process::abort();
        }
    });
    drop(held);
    let _ = done.send(());

    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&status).is_ok_and(|s| s.ends_with('\n')) {
        assert!(Instant::now() < deadline, "sh never heard of its child's death");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(&status).unwrap().trim(),
        "137",
        "killed by SIGKILL"
    );
    parent.0.wait().unwrap();
    let _ = std::fs::remove_file(&status);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the killed spinner is gone, not a zombie"
    );
}

/// A thread that takes a signal as it is seized stops for that signal, not the interrupt: it
/// is let go with the signal, which its handler then gets (a signal is never swallowed).
#[test]
fn a_signal_taken_as_the_thread_is_seized_is_passed_on() {
    let file = std::env::temp_dir().join(format!("lifeline-hold-signal-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let child = spinner(&file);
    let pid = child.id();
    let tid = pid as i32;
    // SAFETY: ptrace and tgkill of our own child's main thread.
    unsafe {
        assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0), 0);
        assert_eq!(libc::syscall(libc::SYS_tgkill, tid, tid, libc::SIGUSR1), 0);
    }
    let signal = super::wait_stopped(tid);
    assert_eq!(signal, Some(libc::SIGUSR1), "stopped for the signal");
    let held = Held {
        pid,
        threads: [(tid, libc::SIGUSR1)].into(),
        since: Instant::now(),
        _not_send: std::marker::PhantomData,
    };
    thread::sleep(Duration::from_millis(100));
    assert!(!file.exists(), "the signal waits while held");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !file.exists() {
        assert!(Instant::now() < deadline, "the signal was swallowed");
        thread::sleep(Duration::from_millis(20));
    }
    drop(child);
    let _ = std::fs::remove_file(&file);
}

/// Holds `pid` on a thread of its own (a [`Held`] stays on its thread) until `let_go` says
/// so or is dropped: returns that thread's id, once every thread of `pid` is held, and its
/// join handle, which gives the instant it let go.
fn other_tracer(
    pid: u32,
    let_go: std::sync::mpsc::Receiver<()>,
    hold_for: Duration,
) -> (u32, thread::JoinHandle<Instant>) {
    let (tx, held) = std::sync::mpsc::channel();
    let holder = thread::spawn(move || {
        let h = Held::hold(pid).expect("the spinner held by the other tracer");
        // SAFETY: gettid(2) has no arguments.
        let _ = tx.send((unsafe { libc::gettid() } as u32, h.threads()));
        let _ = let_go.recv_timeout(hold_for);
        drop(h);
        Instant::now()
    });
    let (tid, threads) = held.recv().expect("the other tracer held the spinner");
    assert_eq!(threads, 4, "the other tracer holds every thread");
    (tid, holder)
}

/// A process another tracer holds (a second agent holding the same start) is waited for and
/// held as soon as that tracer lets go, every thread of it, not given up at once.
#[test]
fn a_process_another_tracer_holds_is_held_as_soon_as_it_lets_go() {
    let file = std::env::temp_dir().join(format!("lifeline-hold-other-{}", std::process::id()));
    let child = spinner(&file);
    let pid = child.id();
    let (_keep, let_go) = std::sync::mpsc::channel();
    let (_, holder) = other_tracer(pid, let_go, Duration::from_millis(300));
    let held = Held::hold(pid).expect("held once the other tracer let go");
    let got = Instant::now();
    let let_go_at = holder.join().expect("the other tracer");
    assert_eq!(held.threads(), 4, "every thread is held");
    let (states, _) = threads_and_ticks(pid);
    assert!(
        states.iter().all(|s| *s == 't'),
        "every thread stopped: {states:?}"
    );
    // Within a few retries of the other tracer's letting go (each 250 µs), with margin for
    // this machine's scheduling.
    let after = got.duration_since(let_go_at);
    assert!(
        after < Duration::from_millis(100),
        "held {after:?} after the other let go"
    );
    drop(held);
    drop(child);
}

/// A tracer that does not let go within the wait (a debugger) is named, and the wait is
/// bounded: the start goes on unheld.
#[test]
fn a_tracer_that_keeps_the_process_is_named_after_a_bounded_wait() {
    let file = std::env::temp_dir().join(format!("lifeline-hold-kept-{}", std::process::id()));
    let child = spinner(&file);
    let pid = child.id();
    let (stop, let_go) = std::sync::mpsc::channel();
    let (tracer, holder) = other_tracer(pid, let_go, Duration::from_secs(30));
    let since = Instant::now();
    let err = Held::hold(pid)
        .err()
        .expect("a process kept by its tracer is not held");
    let waited = since.elapsed();
    let _ = stop.send(());
    holder.join().expect("the other tracer");
    assert!(
        err.to_string().contains(&format!("traced by {tracer}")),
        "names the tracer {tracer}: {err}"
    );
    assert!(
        waited >= super::WAIT_FOR_TRACER && waited < super::WAIT_FOR_TRACER + Duration::from_millis(500),
        "waited {waited:?}"
    );
    drop(child);
}

/// The answers of a scripted kernel, in order, for [`super::retry_while_traced`].
fn scripted<T: Clone>(answers: &[T]) -> impl FnMut() -> T + '_ {
    let mut next = answers.iter();
    move || next.next().expect("asked more often than scripted").clone()
}

fn eperm() -> Result<(), i32> {
    Err(libc::EPERM)
}

/// A seize refused while another tracer held the thread, whose tracer reads none a moment
/// later (it let go in between), is tried again and succeeds: it is not the kernel's own
/// refusal. The same twice over is.
#[test]
fn a_tracer_letting_go_between_the_refusal_and_the_read_is_no_refusal() {
    let run = |seizes: &[Result<(), i32>], tracers: &[Option<u32>]| {
        let mut seize = scripted(seizes);
        super::retry_while_traced(
            7,
            8,
            || seize().map_err(std::io::Error::from_raw_os_error),
            scripted(tracers),
        )
    };
    // Held by 77, let go between the second refusal and its read.
    assert!(run(&[eperm(), eperm(), Ok(())], &[Some(77), Some(0)]).is_ok());
    // Let go between the first refusal and its read, taken by 78 before the next seize.
    assert!(run(&[eperm(), eperm(), Ok(())], &[Some(0), Some(78)]).is_ok());
    // Refused twice with no tracer: the kernel's own refusal (no privilege, Yama).
    let err = run(&[eperm(), eperm()], &[Some(0), Some(0)]).unwrap_err();
    assert!(matches!(err, super::Error::Seize { pid: 7, tid: 8, .. }), "{err}");
    // A thread gone is said at once.
    let err = run(&[Err(libc::ESRCH)], &[]).unwrap_err();
    assert!(matches!(err, super::Error::Seize { .. }), "{err}");
}
