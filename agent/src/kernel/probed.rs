//! The files that clients' probes go on: a Go client's binary (`golang.rs`), an OpenSSL
//! client's libssl (`openssl.rs`). A file is known by device and inode, so one attachment
//! serves every process, in any container, that runs or maps it. It is probed when its first
//! client is seen and its probes come off when no client has used it for [`LINGER`]: tools
//! that run again and again (a `kubectl` in a script) are followed from their first request.
//! A file that could not be probed is looked at again after [`RETRY_UNPROBED`] (a newer file
//! under the same inode is the same file only if it was rewritten in place). A process that
//! is not a client pays nothing, and every client whose file is not probed keeps the
//! connection-level judgement, with the reason in the API.
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Probes stay on a file this long after its last client went away.
pub const LINGER: Duration = Duration::from_secs(300);

/// A file that could not be probed is looked at again after this long.
pub const RETRY_UNPROBED: Duration = Duration::from_secs(600);

/// A client process: pid and start time (pids are reused).
pub type Client = (u32, u64);

/// A file, by device and inode.
type FileId = (u64, u64);

/// How a client is seen (SPEC "Streams": `visibility`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visibility {
    /// Its streams are followed: its binary (or TLS library) is probed; `client` says which
    /// kind of client it is ("Go HTTP/2 client (go1.23.4)").
    Streams { client: String },
    /// Only its connections: why.
    Connection { why: String },
}

impl Visibility {
    pub fn as_str(&self) -> &'static str {
        match self {
            Visibility::Streams { .. } => "streams",
            Visibility::Connection { .. } => "connection",
        }
    }
}

/// One kind of client, and how its file is found and probed.
pub trait Runtime {
    /// What a probed file keeps: its links, and what the API says of its clients.
    type Probed;
    /// What attaches the probes (the loaded programs).
    type Kernel;
    /// What the file is, for logs ("Go binary").
    const FILE: &'static str;

    /// The file the probes for client `pid` go on, as the agent can open it (through
    /// `/proc/PID`): Ok(None) when the client has none (not this kind of client), Err when the
    /// process went away.
    fn file_of(pid: u32) -> std::io::Result<Option<PathBuf>>;

    /// Probes `file`, first seen for client `pid`: Err says why it cannot be; None when the
    /// process went away meanwhile (nothing is concluded about the file).
    fn probe(kernel: &Mutex<Self::Kernel>, file: &Path, pid: u32) -> Option<Result<Self::Probed, String>>;

    /// Its attached uprobes (for logs and the bench).
    fn sites(probed: &Self::Probed) -> usize;

    /// Takes the probes off.
    fn unprobe(kernel: &mut Self::Kernel, probed: Self::Probed);
}

enum File<P> {
    Probed {
        probed: P,
        unused_since: Option<Instant>,
    },
    Unprobed {
        why: String,
        since: Instant,
    },
}

/// What is known of one client's file.
pub enum Seen<'a, P> {
    /// The client was not looked at yet, or has no file of this kind.
    Nothing,
    Probed(&'a P),
    Unprobed(&'a str),
}

/// The probed files of one kind and the clients that use them.
pub struct ProbedFiles<R: Runtime> {
    files: HashMap<FileId, File<R::Probed>>,
    /// Each client's file; None: it has none of this kind.
    clients: HashMap<Client, Option<FileId>>,
}

impl<R: Runtime> Default for ProbedFiles<R> {
    fn default() -> Self {
        Self {
            files: HashMap::new(),
            clients: HashMap::new(),
        }
    }
}

impl<R: Runtime> ProbedFiles<R> {
    /// Makes the probes follow `clients`: probes files new among them, takes the probes off
    /// files none of them has used for [`LINGER`]. Returns how many files it probed.
    pub fn reconcile(&mut self, kernel: &Mutex<R::Kernel>, clients: &HashSet<Client>, now: Instant) -> usize {
        self.clients.retain(|key, _| clients.contains(key));
        let mut probed = 0;
        for &key in clients {
            if self.clients.contains_key(&key) {
                continue;
            }
            let pid = key.0;
            let file = match R::file_of(pid) {
                Ok(Some(file)) => file,
                Ok(None) => {
                    self.clients.insert(key, None);
                    continue;
                }
                Err(_) => continue,
            };
            let Ok(meta) = std::fs::metadata(&file) else {
                continue;
            };
            let id = (meta.dev(), meta.ino());
            self.clients.insert(key, Some(id));
            let retry = matches!(self.files.get(&id), Some(File::Unprobed { since, .. }) if now.saturating_duration_since(*since) >= RETRY_UNPROBED);
            if self.files.contains_key(&id) && !retry {
                continue;
            }
            match R::probe(kernel, &file, pid) {
                Some(Ok(p)) => {
                    probed += 1;
                    self.files.insert(
                        id,
                        File::Probed {
                            probed: p,
                            unused_since: None,
                        },
                    );
                    tracing::info!(
                        kind = R::FILE,
                        files = self.probed().count(),
                        uprobes = self.sites(),
                        "files probed"
                    );
                }
                Some(Err(why)) => {
                    tracing::info!(pid, "streams not followed for this client: {why}");
                    self.files.insert(id, File::Unprobed { why, since: now });
                }
                // The next client that uses the file brings it back.
                None => {
                    self.clients.remove(&key);
                }
            }
        }
        let used: HashSet<FileId> = self.clients.values().flatten().copied().collect();
        let mut gone = Vec::new();
        for (id, file) in &mut self.files {
            match file {
                File::Probed { unused_since, .. } => {
                    if used.contains(id) {
                        *unused_since = None;
                    } else if now.saturating_duration_since(*unused_since.get_or_insert(now)) >= LINGER {
                        gone.push(*id);
                    }
                }
                File::Unprobed { .. } if !used.contains(id) => gone.push(*id),
                File::Unprobed { .. } => {}
            }
        }
        for id in gone {
            if let Some(File::Probed { probed, .. }) = self.files.remove(&id) {
                R::unprobe(&mut kernel.lock().unwrap_or_else(PoisonError::into_inner), probed);
                tracing::info!(file = ?id, "no client has used this {} for {}s: its probes are detached", R::FILE, LINGER.as_secs());
            }
        }
        probed
    }

    /// What is known of client `key`'s file.
    pub fn seen(&self, key: Client) -> Seen<'_, R::Probed> {
        match self
            .clients
            .get(&key)
            .copied()
            .flatten()
            .and_then(|id| self.files.get(&id))
        {
            Some(File::Probed { probed, .. }) => Seen::Probed(probed),
            Some(File::Unprobed { why, .. }) => Seen::Unprobed(why),
            None => Seen::Nothing,
        }
    }

    /// The probed files.
    pub fn probed(&self) -> impl Iterator<Item = &R::Probed> {
        self.files.values().filter_map(|f| match f {
            File::Probed { probed, .. } => Some(probed),
            File::Unprobed { .. } => None,
        })
    }

    /// Attached uprobes in all.
    pub fn sites(&self) -> usize {
        self.probed().map(R::sites).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, fs};

    use super::*;

    /// Files probed and unprobed, by name; a file named "bad" cannot be probed.
    #[derive(Default)]
    struct Kernel {
        attached: Vec<String>,
        probes: usize,
    }

    thread_local! {
        /// The file each test pid "runs" (None: not this kind of client).
        static FILES: RefCell<HashMap<u32, Option<PathBuf>>> = RefCell::new(HashMap::new());
    }

    struct Fake;

    impl Runtime for Fake {
        type Probed = String;
        type Kernel = Kernel;
        const FILE: &'static str = "test file";

        fn file_of(pid: u32) -> std::io::Result<Option<PathBuf>> {
            FILES
                .with(|f| f.borrow().get(&pid).cloned())
                .ok_or_else(|| std::io::ErrorKind::NotFound.into())
        }

        fn probe(kernel: &Mutex<Kernel>, file: &Path, _pid: u32) -> Option<Result<String, String>> {
            let mut kernel = kernel.lock().unwrap();
            kernel.probes += 1;
            let name = file.file_name()?.to_string_lossy().into_owned();
            if name == "bad" {
                return Some(Err("cannot".into()));
            }
            kernel.attached.push(name.clone());
            Some(Ok(name))
        }

        fn sites(_: &String) -> usize {
            1
        }

        fn unprobe(kernel: &mut Kernel, name: String) {
            kernel.attached.retain(|n| *n != name);
        }
    }

    #[test]
    fn a_file_is_probed_once_for_all_its_clients_and_lingers_after_the_last() {
        let dir = std::env::temp_dir().join(format!("lifeline-probed-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (a, bad) = (dir.join("a"), dir.join("bad"));
        fs::write(&a, "").unwrap();
        fs::write(&bad, "").unwrap();
        FILES.with(|f| {
            f.borrow_mut().extend([
                (1, Some(a.clone())),
                (2, Some(a.clone())),
                (3, Some(bad.clone())),
                (4, None),
            ])
        });
        let kernel = Mutex::new(Kernel::default());
        let mut files = ProbedFiles::<Fake>::default();
        let t0 = Instant::now();
        let clients = |keys: &[u32]| keys.iter().map(|&pid| (pid, 7)).collect::<HashSet<Client>>();

        assert_eq!(files.reconcile(&kernel, &clients(&[1, 2, 3, 4]), t0), 1);
        assert_eq!(kernel.lock().unwrap().attached, ["a"]);
        assert_eq!(
            kernel.lock().unwrap().probes,
            2,
            "a once for both clients, bad once"
        );
        assert!(matches!(files.seen((1, 7)), Seen::Probed(n) if n == "a"));
        assert!(matches!(files.seen((2, 7)), Seen::Probed(n) if n == "a"));
        assert!(matches!(files.seen((3, 7)), Seen::Unprobed("cannot")));
        assert!(
            matches!(files.seen((4, 7)), Seen::Nothing),
            "no file of this kind"
        );
        assert!(
            matches!(files.seen((1, 8)), Seen::Nothing),
            "another process with the pid"
        );

        // Its clients gone, the file keeps its probes for LINGER, then loses them.
        files.reconcile(&kernel, &clients(&[]), t0 + Duration::from_secs(1));
        files.reconcile(&kernel, &clients(&[]), t0 + LINGER);
        assert_eq!(kernel.lock().unwrap().attached, ["a"], "lingering");
        files.reconcile(&kernel, &clients(&[1]), t0 + LINGER + Duration::from_secs(2));
        assert_eq!(
            kernel.lock().unwrap().probes,
            2,
            "a client back within LINGER: no new probe"
        );
        files.reconcile(&kernel, &clients(&[]), t0 + LINGER * 2);
        files.reconcile(&kernel, &clients(&[]), t0 + LINGER * 3 + Duration::from_secs(3));
        assert!(
            kernel.lock().unwrap().attached.is_empty(),
            "detached after LINGER unused"
        );
        assert_eq!(files.sites(), 0);

        // A file that could not be probed is tried again only after RETRY_UNPROBED.
        let t1 = t0 + LINGER * 4;
        files.reconcile(&kernel, &clients(&[3]), t1);
        files.reconcile(&kernel, &clients(&[3, 5]), t1 + Duration::from_secs(1));
        let probes = kernel.lock().unwrap().probes;
        FILES.with(|f| f.borrow_mut().insert(6, Some(bad.clone())));
        files.reconcile(&kernel, &clients(&[3, 6]), t1 + Duration::from_secs(2));
        assert_eq!(kernel.lock().unwrap().probes, probes, "not retried yet");
        FILES.with(|f| f.borrow_mut().insert(9, Some(bad.clone())));
        files.reconcile(
            &kernel,
            &clients(&[3, 6, 9]),
            t1 + RETRY_UNPROBED + Duration::from_secs(1),
        );
        assert_eq!(kernel.lock().unwrap().probes, probes + 1, "retried");
        let _ = fs::remove_dir_all(&dir);
    }
}
