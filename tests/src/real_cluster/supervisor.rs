//! Components restarted when they exit, as systemd (`Restart=always`) or the kubelet (static
//! pods) restart them on a real control-plane host. kube-controller-manager and kube-scheduler
//! exit by design when they lose their leader-election lease (an apiserver unreachable for
//! longer than the renew deadline); on a real host they come back, and so they do here. Every
//! exit is recorded, so a test can require that none happened.
use std::{
    ffi::OsString,
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use super::Daemon;

/// How often the supervisor looks, and how long it waits before a restart.
const TICK: Duration = Duration::from_millis(200);
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// One exit of a supervised component.
#[derive(Clone, Debug)]
pub struct Exit {
    pub name: String,
    pub pid: u32,
    /// How the process ended (`exit status: 255`, a signal).
    pub status: String,
    /// Its last error lines then.
    pub log_tail: String,
}

struct Component {
    daemon: Daemon,
    argv: Vec<OsString>,
    exited_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    components: Vec<Component>,
    exits: Vec<Exit>,
}

/// The supervised components; stopped (newest first) on drop.
pub struct Supervisor {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    log_dir: std::path::PathBuf,
}

impl Supervisor {
    pub fn new(log_dir: &Path) -> Supervisor {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (state2, stop2, dir) = (state.clone(), stop.clone(), log_dir.to_path_buf());
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                tick(&state2, &dir);
                thread::sleep(TICK);
            }
        });
        Supervisor {
            state,
            stop,
            thread: Some(thread),
            log_dir: log_dir.to_path_buf(),
        }
    }

    /// Starts `argv` as component `name`; returns its pid.
    pub fn start(&self, name: &str, argv: Vec<OsString>) -> u32 {
        let daemon = Daemon::spawn(name, command(&argv), &self.log_dir);
        let pid = daemon.pid();
        self.lock().components.push(Component {
            daemon,
            argv,
            exited_at: None,
        });
        pid
    }

    /// The current pid of component `name`.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.lock()
            .components
            .iter()
            .find(|c| c.daemon.name() == name)
            .map(|c| c.daemon.pid())
    }

    /// Every exit so far.
    pub fn exits(&self) -> Vec<Exit> {
        self.lock().exits.clone()
    }

    /// Stops component `name` (SIGTERM) and stops supervising it.
    pub fn stop(&self, name: &str) {
        let taken = {
            let mut s = self.lock();
            let at = s.components.iter().position(|c| c.daemon.name() == name);
            at.map(|at| s.components.remove(at))
        };
        let mut c = taken.unwrap_or_else(|| panic!("no component named {name}"));
        c.daemon.stop(libc::SIGTERM, Duration::from_secs(10));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn command(argv: &[OsString]) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// Records the exits, and restarts what exited [`RESTART_DELAY`] ago.
fn tick(state: &Mutex<State>, log_dir: &Path) {
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    let State { components, exits } = &mut *s;
    for c in components.iter_mut() {
        match c.exited_at {
            None => {
                if let Some(status) = c.daemon.exited() {
                    let exit = Exit {
                        name: c.daemon.name().to_owned(),
                        pid: c.daemon.pid(),
                        status: status.to_string(),
                        log_tail: c.daemon.log_errors(5),
                    };
                    eprintln!(
                        "supervisor: {} (pid {}) exited with {}; restarting it in {RESTART_DELAY:?}. Its last lines:\n{}",
                        exit.name, exit.pid, exit.status, exit.log_tail
                    );
                    exits.push(exit);
                    c.exited_at = Some(Instant::now());
                }
            }
            Some(at) if at.elapsed() >= RESTART_DELAY => {
                let name = c.daemon.name().to_owned();
                c.daemon = Daemon::spawn(&name, command(&c.argv), log_dir);
                c.exited_at = None;
                eprintln!("supervisor: {name} restarted as pid {}", c.daemon.pid());
            }
            Some(_) => {}
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut s = self.lock();
        while let Some(mut c) = s.components.pop() {
            c.daemon.stop(libc::SIGTERM, Duration::from_secs(5));
        }
    }
}
