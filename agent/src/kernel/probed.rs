//! The files that clients' probes go on: a Go client's binary (`golang.rs`), an OpenSSL
//! client's libssl (`openssl.rs`). A file is known by device and inode, and inspected once
//! for all its clients. A Go binary's probes serve every process, in any container, that runs
//! it; a libssl, which every process of the node that speaks TLS maps, has probes of its own
//! for each client process ([`Runtime::join`], [`Runtime::leave`]). A file is probed when its
//! first client is seen and forgotten when no client has used it for [`LINGER`]: tools that
//! run again and again (a `kubectl` in a script) are followed from their first request.
//! A file that could not be probed is looked at again after [`RETRY_UNPROBED`] (a newer file
//! under the same inode is the same file only if it was rewritten in place). A process that
//! is not a client pays nothing, and every client whose file is not probed keeps the
//! connection-level judgement, with the reason in the API.
//!
//! What one node pays for inspections is bounded (issue 25): at most [`MAX_PROBED`] files of
//! one kind keep probes (at the bound, the least recently used file with no live client loses
//! its probes first; if every probed file has live clients, a new file is not probed), and new
//! files are inspected at most [`INSPECTIONS_PER_SECOND`] a second after a burst of
//! [`INSPECTION_BURST`]; one owner (the cgroup of the client: a container) gets at most
//! [`OWNER_INSPECTIONS_PER_SECOND`] after [`OWNER_BURST`], so a pod execing fresh copies in a
//! loop spends its own share, not its neighbours'. A file refused by any is tried again on its next client sighting
//! (the next tick), never refused for good.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Probes stay on a file this long after its last client went away.
pub const LINGER: Duration = Duration::from_secs(300);

/// A file that could not be probed is looked at again after this long.
pub const RETRY_UNPROBED: Duration = Duration::from_secs(600);

/// Files of one kind (Go binaries; libssl) that keep probes at once on a node. A node runs at
/// most ~110 pods; the distinct Go binaries holding apiserver connections on a busy node
/// (kubelet's neighbours: CNI, CSI, kube-proxy, a few dozen controllers and operators) stay
/// well under this. Each probed file keeps its uprobe links and its parsed offsets (tens of
/// KiB), so the bound keeps the agent's memory and attached uprobes flat when a pod execs
/// fresh copies of a binary in a loop.
pub const MAX_PROBED: usize = 64;

/// Files of one kind one owner (a cgroup: a container) keeps probed at once. At it, the
/// owner's own least recently used file with no live client loses its probes first, so a pod's
/// exec loop recycles its own share and never evicts a neighbour's lingering files (a CronJob's
/// kubectl). A container runs one client binary, rarely a few: 16 is far above a healthy one.
pub const MAX_PROBED_PER_OWNER: usize = 16;

/// New files inspected a second, per kind, once the burst is spent. An inspection costs
/// 26–125 ms of CPU and ~6 MB transient for a Go binary (`.gopclntab` scan): 2 a second is at
/// worst a quarter of one core, inside the agent's CPU budget, where a loop of fresh copies
/// would otherwise cost a whole core.
pub const INSPECTIONS_PER_SECOND: f64 = 2.0;

/// New files inspected at once before the rate applies: a node where 16 distinct Go
/// controllers start together has them all probed on the first tick; a 40-controller start
/// has the rest wait ~12 s (they keep connection-level judgement meanwhile, then are probed).
pub const INSPECTION_BURST: f64 = 16.0;

/// New files inspected a second for one owner (a cgroup: a container), once its burst is
/// spent: a pod's loop of fresh copies costs one inspection every 2 s, and leaves the node's
/// rate to the other pods.
pub const OWNER_INSPECTIONS_PER_SECOND: f64 = 0.5;

/// New files inspected at once for one owner: a container runs one client binary, rarely a
/// few (a script with kubectl, helm, a controller's sidecar): 4 are probed at once.
pub const OWNER_BURST: f64 = 4.0;

/// Files inspected a second as processes start running them (at start: before they connect),
/// once the burst is spent. Most programs a node starts are not Go (a look at their ELF headers
/// settles those, uncharged); a Go program that does not link client-go costs one inspection,
/// then is passed over for [`RETRY_UNPROBED`]. A pod starting fresh copies in a loop spends
/// this and its own owner's rate, never the rate of clients that connect.
pub const START_INSPECTIONS_PER_SECOND: f64 = 1.0;

/// Files inspected at once at start before [`START_INSPECTIONS_PER_SECOND`] applies: a node
/// that starts 8 new Go programs together has them all looked at before their first requests.
pub const START_INSPECTION_BURST: f64 = 8.0;

/// Files remembered as passed over at start; beyond, the oldest half is forgotten (each costs
/// one look again).
pub const MAX_PASSED: usize = 4096;

/// A token bucket: `rate` tokens a second, at most `burst` held; it starts full.
#[derive(Clone, Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// Takes one token at `now` if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let ready = self.ready(now);
        if ready {
            self.tokens -= 1.0;
        }
        ready
    }

    /// Whether a token is there at `now` (none taken).
    pub fn ready(&mut self, now: Instant) -> bool {
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.last = Some(self.last.map_or(now, |last| last.max(now)));
        self.tokens >= 1.0
    }

    /// Full at `now`: as if never used.
    fn full(&mut self, now: Instant) -> bool {
        self.ready(now);
        self.tokens >= self.burst
    }
}

/// What one [`ProbedFiles::reconcile`] did with new files (`lifeline_probe_inspections_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inspections {
    /// Inspected and probed.
    pub probed: usize,
    /// Inspected, could not be probed.
    pub failed: usize,
    /// Inspected as its process started ([`ProbedFiles::foresee`]) and passed over: a Go
    /// program that does not link client-go. Charged to the rates like any inspection; the file
    /// is inspected again, as any other, if a process of it connects.
    pub passed: usize,
    /// Not inspected: the rate of new inspections was spent (counted once per file refused).
    pub refused_rate: usize,
    /// Not inspected: [`MAX_PROBED`] files with live clients hold probes (once per file).
    pub refused_bound: usize,
    /// Probed files that lost their probes to make room (least recently used, no live client).
    pub evicted: usize,
    /// Clients added to a file already probed, where probes fire per process
    /// ([`Runtime::join`]): not an inspection.
    pub joined: usize,
}

/// A client process: pid and start time (pids are reused).
pub type Client = (u32, u64);

/// A file, by device and inode: as the kernel keeps its uprobes.
type FileId = crate::kernel::removals::File;

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

    /// Whether `file` may be worth probing when a process starts running it, before it
    /// connects (cheap: decides whether [`probe_at_start`](Self::probe_at_start) is tried and
    /// charged to the rate). Never, unless the runtime says otherwise.
    fn may_probe_at_start(_file: &Path) -> bool {
        false
    }

    /// Probes `file` as process `pid` starts running it, if it is a file worth probing before
    /// any connection: Ok(None) when it is not (it is probed when a client of it connects),
    /// Err when it cannot be, None when the process went away.
    fn probe_at_start(
        _kernel: &Mutex<Self::Kernel>,
        _file: &Path,
        _pid: u32,
    ) -> Option<Result<Option<Self::Probed>, String>> {
        Some(Ok(None))
    }

    /// Who runs client `pid`, for the per-owner rate: its cgroup (a container); None when it
    /// cannot be read (then only the node's rate applies).
    fn owner_of(pid: u32) -> Option<String> {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        crate::host::process::select_cgroup_path(&cgroups).map(str::to_owned)
    }

    /// Whether a file's probes fire per process ([`join`](Self::join), [`leave`](Self::leave)):
    /// then a client that holds no connection any more keeps its own probes until it exits or
    /// [`LINGER`] passes (it dials again after an apiserver restart: its next requests are
    /// seen from the first).
    const PER_PROCESS: bool = false;

    /// Makes the probes of probed file `probed` fire for client `pid` too, if they fire per
    /// process (a shared libssl); called on every reconcile for every client of a probed file,
    /// so it does nothing for a client already added, or one that could not be. Returns
    /// whether it added `pid`. Probes that serve the whole file (a Go binary) have nothing to do.
    fn join(_kernel: &Mutex<Self::Kernel>, _probed: &mut Self::Probed, _pid: u32) -> bool {
        false
    }

    /// Client `pid` of probed file `probed` exited, or held no connection for [`LINGER`]: its
    /// own probes, if any, come off.
    fn leave(_kernel: &Mutex<Self::Kernel>, _probed: &mut Self::Probed, _pid: u32) {}

    /// Whether `client` still runs (the same process: pids are reused).
    fn alive((pid, start): Client) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| crate::host::process::parse_stat_start_time(&stat))
            == Some(start)
    }

    /// Its attached uprobes (for logs and the bench).
    fn sites(probed: &Self::Probed) -> usize;

    /// Takes the probes off.
    fn unprobe(kernel: &mut Self::Kernel, probed: Self::Probed);
}

enum File<P> {
    Probed {
        probed: P,
        unused_since: Option<Instant>,
        /// The owner of the client it was probed for (None: unknown).
        owner: Option<String>,
    },
    Unprobed {
        why: String,
        since: Instant,
    },
    /// Not inspected for a bound (rate or count): tried again on its next client sighting.
    Refused {
        why: String,
        rate: bool,
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
    /// Files that may keep probes at once.
    max_probed: usize,
    /// Files one owner may keep probed at once.
    max_per_owner: usize,
    /// New inspections.
    rate: Bucket,
    /// New inspections per owner (only owners whose bucket is not full).
    owners: HashMap<String, Bucket>,
    /// A new owner's bucket.
    owner_rate: Bucket,
    /// Inspections of files as processes start running them ([`foresee`](Self::foresee)):
    /// their own rate, so that they never delay a connected client's.
    start_rate: Bucket,
    /// Files looked at when a process started running them and not probed then (not worth it,
    /// or not probeable), with when: not looked at again at start for [`RETRY_UNPROBED`].
    passed: HashMap<FileId, Instant>,
    /// Where probes fire per process: former clients that hold no connection now, with their
    /// file and since when (their probes stay; see [`Runtime::PER_PROCESS`]).
    idle: HashMap<Client, (FileId, Instant)>,
}

impl<R: Runtime> Default for ProbedFiles<R> {
    fn default() -> Self {
        Self::with_bounds(
            MAX_PROBED,
            Bucket::new(INSPECTIONS_PER_SECOND, INSPECTION_BURST),
            Bucket::new(OWNER_INSPECTIONS_PER_SECOND, OWNER_BURST),
        )
    }
}

impl<R: Runtime> ProbedFiles<R> {
    /// With other bounds than [`MAX_PROBED`] and the inspection rate (for tests).
    pub fn with_bounds(max_probed: usize, rate: Bucket, owner_rate: Bucket) -> Self {
        Self {
            files: HashMap::new(),
            clients: HashMap::new(),
            max_probed,
            max_per_owner: MAX_PROBED_PER_OWNER,
            rate,
            owners: HashMap::new(),
            owner_rate,
            start_rate: Bucket::new(START_INSPECTIONS_PER_SECOND, START_INSPECTION_BURST),
            passed: HashMap::new(),
            idle: HashMap::new(),
        }
    }

    /// With another bound of files per owner than [`MAX_PROBED_PER_OWNER`] (for tests).
    #[cfg(test)]
    pub fn with_owner_bound(mut self, max_per_owner: usize) -> Self {
        self.max_per_owner = max_per_owner;
        self
    }

    /// Makes the probes follow `clients`: probes files new among them (within the bounds),
    /// takes the probes off files none of them has used for [`LINGER`]. Returns what it did
    /// with new files.
    pub fn reconcile(
        &mut self,
        kernel: &Mutex<R::Kernel>,
        clients: &HashSet<Client>,
        now: Instant,
    ) -> Inspections {
        if R::PER_PROCESS {
            self.settle_idle(kernel, clients, now);
        }
        self.clients.retain(|key, _| clients.contains(key));
        self.mark_used(now);
        let mut done = Inspections::default();
        let mut keys: Vec<Client> = clients.iter().copied().collect();
        // Oldest processes first: a steady client is not starved by a loop of new ones.
        keys.sort_unstable_by_key(|&(pid, start)| (start, pid));
        for key in keys {
            let refused = match self.clients.get(&key) {
                None => false,
                Some(id) => matches!(id.and_then(|id| self.files.get(&id)), Some(File::Refused { .. })),
            };
            if self.clients.contains_key(&key) && !refused {
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
            let Ok(id) = FileId::of(&file) else {
                continue;
            };
            self.clients.insert(key, Some(id));
            if let Some(File::Probed { unused_since, .. }) = self.files.get_mut(&id) {
                // In use again: not to be taken for the least recently used this tick.
                *unused_since = None;
            }
            let retry = match self.files.get(&id) {
                None | Some(File::Refused { .. }) => true,
                Some(File::Unprobed { since, .. }) => now.saturating_duration_since(*since) >= RETRY_UNPROBED,
                Some(File::Probed { .. }) => false,
            };
            if !retry {
                continue;
            }
            // The bounds first: a file refused for one does not spend the rate.
            let owner = R::owner_of(pid);
            let owned = owner.as_ref().map_or(0, |o| self.owned_by(o));
            let owner_full = owner.is_some() && owned >= self.max_per_owner;
            if owner_full && self.least_recently_used(owner.as_deref()).is_none() {
                let why = format!(
                    "not probed: {owned} files ({}) already probed for this container, all with live clients \
                     (bound)",
                    R::FILE
                );
                self.refuse(id, why, false, &mut done);
                continue;
            }
            let held = self.probed().count();
            let room = held < self.max_probed || self.least_recently_used(None).is_some();
            if !room {
                let why = format!(
                    "not probed: {held} files ({}) already probed on this node, all with live clients (bound)",
                    R::FILE
                );
                self.refuse(id, why, false, &mut done);
                continue;
            }
            let owner_waits = owner.as_ref().is_some_and(|o| {
                let template = &self.owner_rate;
                !self
                    .owners
                    .entry(o.clone())
                    .or_insert_with(|| template.clone())
                    .ready(now)
            });
            if owner_waits {
                let why = format!(
                    "not probed yet: new files ({}) are inspected at most {OWNER_INSPECTIONS_PER_SECOND} a second \
                     for one container (rate bound; tried again on the next tick)",
                    R::FILE
                );
                self.refuse(id, why, true, &mut done);
                continue;
            }
            if !self.rate.take(now) {
                let why = format!(
                    "not probed yet: new files ({}) are inspected at most {INSPECTIONS_PER_SECOND} a second on this node \
                     (rate bound; tried again on the next tick)",
                    R::FILE
                );
                self.refuse(id, why, true, &mut done);
                continue;
            }
            if let Some(bucket) = owner.as_ref().and_then(|o| self.owners.get_mut(o)) {
                bucket.take(now);
            }
            match R::probe(kernel, &file, pid) {
                Some(Ok(p)) => {
                    done.probed += 1;
                    let full = if owner_full {
                        Some(owner.as_deref())
                    } else {
                        (self.probed().count() >= self.max_probed).then_some(None)
                    };
                    if let Some(within) = full {
                        if let Some(lru) = self.least_recently_used(within) {
                            self.detach(
                                kernel,
                                lru,
                                "it was the least recently used with no live client, at the bound",
                            );
                            done.evicted += 1;
                        }
                    }
                    self.files.insert(
                        id,
                        File::Probed {
                            probed: p,
                            unused_since: None,
                            owner,
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
                    done.failed += 1;
                    tracing::info!(pid, "streams not followed for this client: {why}");
                    self.files.insert(id, File::Unprobed { why, since: now });
                }
                // The next client that uses the file brings it back.
                None => {
                    self.clients.remove(&key);
                    if matches!(self.files.get(&id), Some(File::Refused { .. })) {
                        self.files.remove(&id);
                    }
                }
            }
        }
        // Every client of a probed file, whenever it first came: followed (a file probed for
        // one client of several, after a refusal, has the others added here).
        for (&(pid, _), id) in &self.clients {
            if let Some(File::Probed { probed, .. }) = id.and_then(|id| self.files.get_mut(&id)) {
                if R::join(kernel, probed, pid) {
                    done.joined += 1;
                }
            }
        }
        self.mark_used(now);
        self.owners.retain(|_, bucket| !bucket.full(now));
        let mut gone = Vec::new();
        for (id, file) in &self.files {
            match file {
                File::Probed {
                    unused_since: Some(since),
                    ..
                } if now.saturating_duration_since(*since) >= LINGER => gone.push(*id),
                File::Probed { .. } => {}
                File::Unprobed { .. } | File::Refused { .. } if !self.is_used(id) => gone.push(*id),
                File::Unprobed { .. } | File::Refused { .. } => {}
            }
        }
        for id in gone {
            self.detach(kernel, id, "no client has used it for LINGER");
        }
        done
    }

    /// Process `pid` has just started running a program, at `exec` (the kernel's exec record): if its
    /// file is new and the runtime says it is worth probing before the process connects (a Go
    /// binary that links client-go), probes it now, so that the process's first requests are
    /// seen. Within the bounds: at one, only the container's own least recently used file
    /// with no live client makes room (never a neighbour's); a file that finds no room, or no
    /// rate, is probed as before when a client of it connects. A file probed at start with no
    /// client lingers [`LINGER`] from then. Returns what it did.
    pub fn foresee(
        &mut self,
        kernel: &Mutex<R::Kernel>,
        pid: u32,
        exec: Instant,
        now: Instant,
    ) -> Inspections {
        let mut done = Inspections::default();
        let Ok(Some(file)) = R::file_of(pid) else {
            return done;
        };
        let Ok(id) = FileId::of(&file) else {
            return done;
        };
        if self.files.contains_key(&id)
            || self
                .passed
                .get(&id)
                .is_some_and(|since| now.saturating_duration_since(*since) < RETRY_UNPROBED)
        {
            return done;
        }
        if !R::may_probe_at_start(&file) {
            self.pass(id, now);
            return done;
        }
        let owner = R::owner_of(pid);
        // At a bound, only the owner's own least recently used file with no live client makes
        // room: a start never costs a neighbour its probes.
        let owner_full = owner
            .as_ref()
            .is_some_and(|o| self.owned_by(o) >= self.max_per_owner);
        let node_full = self.probed().count() >= self.max_probed;
        let room = match (&owner, owner_full || node_full) {
            (_, false) => None,
            (Some(o), true) => match self.least_recently_used(Some(o)) {
                Some(lru) => Some(lru),
                None => return done,
            },
            (None, true) => return done,
        };
        let template = &self.owner_rate;
        let owner_waits = owner.as_ref().is_some_and(|o| {
            !self
                .owners
                .entry(o.clone())
                .or_insert_with(|| template.clone())
                .ready(now)
        });
        if owner_waits || !self.start_rate.take(now) {
            return done;
        }
        if let Some(bucket) = owner.as_ref().and_then(|o| self.owners.get_mut(o)) {
            bucket.take(now);
        }
        let started = Instant::now();
        match R::probe_at_start(kernel, &file, pid) {
            Some(Ok(Some(probed))) => {
                let took = started.elapsed();
                done.probed += 1;
                if let Some(lru) = room {
                    self.detach(
                        kernel,
                        lru,
                        "it was its container's least recently used with no live client, at the bound",
                    );
                    done.evicted += 1;
                }
                self.files.insert(
                    id,
                    File::Probed {
                        probed,
                        unused_since: Some(now),
                        owner,
                    },
                );
                tracing::info!(
                    pid,
                    kind = R::FILE,
                    files = self.probed().count(),
                    uprobes = self.sites(),
                    took_ms = took.as_secs_f64() * 1e3,
                    after_exec_ms = (started + took).saturating_duration_since(exec).as_secs_f64() * 1e3,
                    "files probed (at start)"
                );
            }
            Some(Ok(None)) => {
                done.passed += 1;
                self.pass(id, now);
            }
            Some(Err(why)) => {
                done.failed += 1;
                tracing::debug!(pid, "not probed at start: {why}");
                self.pass(id, now);
            }
            None => {}
        }
        done
    }

    /// Where probes fire per process: clients that hold no connection any more keep their
    /// probes, idle; an idle one that exited, or has been idle for [`LINGER`], leaves its file
    /// (before any new client joins: a pid reused by a new client is free again).
    fn settle_idle(&mut self, kernel: &Mutex<R::Kernel>, clients: &HashSet<Client>, now: Instant) {
        for (key, id) in &self.clients {
            if let (false, Some(id)) = (clients.contains(key), id) {
                self.idle.insert(*key, (*id, now));
            }
        }
        self.idle.retain(|key, _| !clients.contains(key));
        let left: Vec<(Client, FileId)> = self
            .idle
            .iter()
            .filter(|(key, (_, since))| now.saturating_duration_since(*since) >= LINGER || !R::alive(**key))
            .map(|(key, (id, _))| (*key, *id))
            .collect();
        for ((pid, start), id) in left {
            self.idle.remove(&(pid, start));
            if let Some(File::Probed { probed, .. }) = self.files.get_mut(&id) {
                R::leave(kernel, probed, pid);
            }
        }
    }

    /// Remembers that file `id` was passed over at start.
    fn pass(&mut self, id: FileId, now: Instant) {
        if self.passed.len() >= MAX_PASSED {
            let mut ages: Vec<Instant> = self.passed.values().copied().collect();
            ages.sort_unstable();
            let median = ages[ages.len() / 2];
            self.passed.retain(|_, since| *since > median);
        }
        self.passed.insert(id, now);
    }

    fn is_used(&self, id: &FileId) -> bool {
        self.clients.values().any(|f| f.as_ref() == Some(id))
    }

    /// Marks when each probed file lost its last client (None while it has one).
    fn mark_used(&mut self, now: Instant) {
        let used: HashSet<FileId> = self.clients.values().flatten().copied().collect();
        for (id, file) in &mut self.files {
            if let File::Probed { unused_since, .. } = file {
                if used.contains(id) {
                    *unused_since = None;
                } else {
                    unused_since.get_or_insert(now);
                }
            }
        }
    }

    /// The probed files probed for `owner`.
    fn owned_by(&self, owner: &str) -> usize {
        self.files
            .values()
            .filter(|f| matches!(f, File::Probed { owner: Some(o), .. } if o == owner))
            .count()
    }

    /// The probed file with no live client unused the longest: of `owner`'s, or of all.
    fn least_recently_used(&self, owner: Option<&str>) -> Option<FileId> {
        self.files
            .iter()
            .filter_map(|(id, f)| match f {
                File::Probed {
                    unused_since: Some(since),
                    owner: of,
                    ..
                } if owner.is_none() || of.as_deref() == owner => Some((*since, *id)),
                _ => None,
            })
            .min()
            .map(|(_, id)| id)
    }

    /// Records that file `id` was not inspected for a bound; counted once per file and bound.
    fn refuse(&mut self, id: FileId, why: String, rate: bool, done: &mut Inspections) {
        let already = matches!(self.files.get(&id), Some(File::Refused { rate: r, .. }) if *r == rate);
        if !already {
            if rate {
                done.refused_rate += 1;
            } else {
                done.refused_bound += 1;
            }
            // One line per refused file would let an exec loop flood the log: the metric counts them.
            tracing::debug!(file = ?id, "{why}");
        }
        self.files.insert(id, File::Refused { why, rate });
    }

    fn detach(&mut self, kernel: &Mutex<R::Kernel>, id: FileId, why: &str) {
        if let Some(File::Probed { probed, .. }) = self.files.remove(&id) {
            R::unprobe(&mut kernel.lock().unwrap_or_else(PoisonError::into_inner), probed);
            tracing::info!(file = ?id, "this {}'s probes are detached: {why}", R::FILE);
        }
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
            Some(File::Unprobed { why, .. } | File::Refused { why, .. }) => Seen::Unprobed(why),
            None => Seen::Nothing,
        }
    }

    /// The probed files.
    pub fn probed(&self) -> impl Iterator<Item = &R::Probed> {
        self.files.values().filter_map(|f| match f {
            File::Probed { probed, .. } => Some(probed),
            File::Unprobed { .. } | File::Refused { .. } => None,
        })
    }

    /// The probed files, to change.
    pub fn probed_mut(&mut self) -> impl Iterator<Item = &mut R::Probed> {
        self.files.values_mut().filter_map(|f| match f {
            File::Probed { probed, .. } => Some(probed),
            File::Unprobed { .. } | File::Refused { .. } => None,
        })
    }

    /// Probed files, and files refused for a bound (`lifeline_probed_files{state}`).
    pub fn counts(&self) -> (usize, usize) {
        let probed = self.probed().count();
        let refused = self
            .files
            .values()
            .filter(|f| matches!(f, File::Refused { .. }))
            .count();
        (probed, refused)
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
        /// Each test pid's owner (none: no per-owner rate).
        static OWNERS: RefCell<HashMap<u32, String>> = RefCell::new(HashMap::new());
        /// A test pid's process start, where it is not the pid (a pid reused).
        static STARTS: RefCell<HashMap<u32, u64>> = RefCell::new(HashMap::new());
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

        fn owner_of(pid: u32) -> Option<String> {
            OWNERS.with(|o| o.borrow().get(&pid).cloned())
        }

        /// Files named "go-…" are Go programs.
        fn may_probe_at_start(file: &Path) -> bool {
            file.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("go-"))
        }

        /// Of those, "go-client…" link client-go.
        fn probe_at_start(
            kernel: &Mutex<Kernel>,
            file: &Path,
            pid: u32,
        ) -> Option<Result<Option<String>, String>> {
            let client = file.file_name()?.to_string_lossy().starts_with("go-client");
            if !client {
                kernel.lock().unwrap().probes += 1;
                return Some(Ok(None));
            }
            Self::probe(kernel, file, pid).map(|r| r.map(Some))
        }

        fn sites(_: &String) -> usize {
            1
        }

        fn unprobe(kernel: &mut Kernel, name: String) {
            kernel.attached.retain(|n| *n != name);
        }
    }

    #[test]
    fn a_client_go_binary_is_probed_as_it_starts_and_other_programs_when_they_connect() {
        let dir = std::env::temp_dir().join(format!("lifeline-probed-start-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (client, other, shell) = (dir.join("go-client"), dir.join("go-other"), dir.join("sh"));
        for f in [&client, &other, &shell] {
            fs::write(f, "").unwrap();
        }
        FILES.with(|f| {
            f.borrow_mut().extend([
                (11, Some(client.clone())),
                (12, Some(client.clone())),
                (13, Some(other.clone())),
                (14, Some(other.clone())),
                (15, Some(shell.clone())),
            ])
        });
        let kernel = Mutex::new(Kernel::default());
        let mut files = ProbedFiles::<Fake>::default();
        let t0 = Instant::now();
        let inspections = |kernel: &Mutex<Kernel>| kernel.lock().unwrap().probes;

        assert_eq!(
            files.foresee(&kernel, 11, t0, t0).probed,
            1,
            "client-go: probed at start"
        );
        assert_eq!(kernel.lock().unwrap().attached, ["go-client"]);
        assert_eq!(
            files.foresee(&kernel, 12, t0, t0).probed,
            0,
            "the same file: already probed"
        );
        assert_eq!(inspections(&kernel), 1);
        let other = files.foresee(&kernel, 13, t0, t0);
        assert_eq!(
            (other.probed, other.passed),
            (0, 1),
            "a Go program without client-go: looked at, passed over"
        );
        assert_eq!(inspections(&kernel), 2, "looked at once");
        files.foresee(&kernel, 14, t0, t0);
        files.foresee(&kernel, 15, t0, t0);
        assert_eq!(
            inspections(&kernel),
            2,
            "passed over: not looked at again; not Go: never"
        );
        assert_eq!(kernel.lock().unwrap().attached, ["go-client"]);

        // When they connect: the client-go binary is already probed; the other is probed now.
        let clients = |keys: &[u32]| keys.iter().map(|&pid| (pid, 7)).collect::<HashSet<Client>>();
        files.reconcile(&kernel, &clients(&[11, 13]), t0 + Duration::from_secs(1));
        assert!(matches!(files.seen((11, 7)), Seen::Probed(n) if n == "go-client"));
        assert!(matches!(files.seen((13, 7)), Seen::Probed(n) if n == "go-other"));
        assert_eq!(inspections(&kernel), 3);

        // A file probed at start whose process never connects lingers LINGER from its start.
        let late = dir.join("go-client-late");
        fs::write(&late, "").unwrap();
        FILES.with(|f| f.borrow_mut().insert(16, Some(late.clone())));
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(files.foresee(&kernel, 16, t1, t1).probed, 1);
        files.reconcile(&kernel, &clients(&[11, 13]), t1 + LINGER - Duration::from_secs(1));
        assert!(kernel
            .lock()
            .unwrap()
            .attached
            .contains(&"go-client-late".to_owned()));
        files.reconcile(&kernel, &clients(&[11, 13]), t1 + LINGER);
        assert!(!kernel
            .lock()
            .unwrap()
            .attached
            .contains(&"go-client-late".to_owned()));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn at_start_a_container_at_its_bound_recycles_its_own_files_never_a_neighbours() {
        let dir = std::env::temp_dir().join(format!("lifeline-probed-start-bound-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let kernel = Mutex::new(Kernel::default());
        let mut files = ProbedFiles::<Fake>::default().with_owner_bound(2);
        let t0 = Instant::now();
        let start = |files: &mut ProbedFiles<Fake>, pid: u32, name: &str, owner: &str, at: Instant| {
            let path = dir.join(name);
            fs::write(&path, "").unwrap();
            FILES.with(|f| f.borrow_mut().insert(pid, Some(path)));
            OWNERS.with(|o| o.borrow_mut().insert(pid, owner.to_owned()));
            files.foresee(&kernel, pid, at, at)
        };
        start(&mut files, 21, "go-client-n", "neighbour", t0);
        start(&mut files, 22, "go-client-a", "loop", t0);
        start(&mut files, 23, "go-client-b", "loop", t0 + Duration::from_secs(1));
        let third = start(&mut files, 24, "go-client-c", "loop", t0 + Duration::from_secs(9));
        assert_eq!((third.probed, third.evicted), (1, 1), "{third:?}");
        let attached = kernel.lock().unwrap().attached.clone();
        assert_eq!(
            attached,
            ["go-client-n", "go-client-b", "go-client-c"],
            "its oldest went"
        );
        fs::remove_dir_all(&dir).unwrap();
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

        assert_eq!(files.reconcile(&kernel, &clients(&[1, 2, 3, 4]), t0).probed, 1);
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

    #[test]
    fn the_bucket_gives_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(2.0, 3.0);
        assert!((0..3).all(|_| bucket.take(t0)), "the burst at once");
        assert!(!bucket.take(t0), "then nothing");
        assert!(!bucket.take(t0 + Duration::from_millis(400)), "0.8 of a token");
        assert!(
            bucket.take(t0 + Duration::from_millis(500)),
            "one token a half second"
        );
        assert!(!bucket.take(t0 + Duration::from_millis(500)));
        let later = t0 + Duration::from_secs(60);
        assert!(
            (0..3).all(|_| bucket.take(later)),
            "refilled up to the burst only"
        );
        assert!(!bucket.take(later));
    }

    /// Files named by `names` in a fresh directory, each the file of pid = index + 1.
    fn files(test: &str, names: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lifeline-probed-{test}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        FILES.with(|f| {
            let mut f = f.borrow_mut();
            for (i, name) in names.iter().enumerate() {
                let path = dir.join(name);
                fs::write(&path, "").unwrap();
                f.insert(i as u32 + 1, Some(path));
            }
        });
        dir
    }

    fn clients(pids: &[u32]) -> HashSet<Client> {
        pids.iter().map(|&pid| (pid, u64::from(pid))).collect()
    }

    #[test]
    fn at_the_bound_the_least_recently_used_file_without_clients_loses_its_probes_first() {
        let dir = files("lru", &["a", "b", "c", "d"]);
        let kernel = Mutex::new(Kernel::default());
        let mut files =
            ProbedFiles::<Fake>::with_bounds(2, Bucket::new(100.0, 100.0), Bucket::new(100.0, 100.0));
        let t0 = Instant::now();
        let s = Duration::from_secs;
        files.reconcile(&kernel, &clients(&[1, 2]), t0);
        // a's client goes first, then b's: a is the least recently used.
        files.reconcile(&kernel, &clients(&[2]), t0 + s(1));
        files.reconcile(&kernel, &clients(&[]), t0 + s(2));
        let done = files.reconcile(&kernel, &clients(&[3]), t0 + s(3));
        assert_eq!((done.probed, done.evicted), (1, 1));
        assert_eq!(kernel.lock().unwrap().attached, ["b", "c"]);
        // b back in use: with b and c live, d is refused for the bound, once.
        let done = files.reconcile(&kernel, &clients(&[2, 3, 4]), t0 + s(4));
        assert_eq!((done.probed, done.refused_bound, done.refused_rate), (0, 1, 0));
        assert!(
            matches!(files.seen((4, 4)), Seen::Unprobed(why) if why.starts_with("not probed: 2 files (test file) already probed")),
            "the reason is said"
        );
        assert_eq!(files.counts(), (2, 1));
        let done = files.reconcile(&kernel, &clients(&[2, 3, 4]), t0 + s(5));
        assert_eq!(done, Inspections::default(), "a refusal is counted once per file");
        // c's client gone: d takes c's place on its next sighting.
        let done = files.reconcile(&kernel, &clients(&[2, 4]), t0 + s(6));
        assert_eq!((done.probed, done.evicted), (1, 1));
        assert_eq!(kernel.lock().unwrap().attached, ["b", "d"]);
        assert!(matches!(files.seen((4, 4)), Seen::Probed(n) if n == "d"));
        assert_eq!(files.counts(), (2, 0));
        let _ = fs::remove_dir_all(&dir);
    }

    /// A runtime whose probes fire per process (as OpenSSL's on a shared libssl): the kernel
    /// lists "file:pid" for each client's own probes.
    struct PerProcess;

    impl Runtime for PerProcess {
        type Probed = String;
        type Kernel = Kernel;
        const FILE: &'static str = "shared file";

        fn file_of(pid: u32) -> std::io::Result<Option<PathBuf>> {
            Fake::file_of(pid)
        }

        fn probe(kernel: &Mutex<Kernel>, file: &Path, pid: u32) -> Option<Result<String, String>> {
            let name = Fake::probe(kernel, file, pid)?.ok()?;
            let mut kernel = kernel.lock().unwrap();
            kernel.attached.retain(|n| *n != name);
            kernel.attached.push(format!("{name}:{pid}"));
            Some(Ok(name))
        }

        fn join(kernel: &Mutex<Kernel>, name: &mut String, pid: u32) -> bool {
            let own = format!("{name}:{pid}");
            let mut kernel = kernel.lock().unwrap();
            if kernel.attached.contains(&own) {
                return false;
            }
            kernel.attached.push(own);
            true
        }

        fn leave(kernel: &Mutex<Kernel>, name: &mut String, pid: u32) {
            let own = format!("{name}:{pid}");
            kernel.lock().unwrap().attached.retain(|n| *n != own);
        }

        const PER_PROCESS: bool = true;

        /// A test process runs while it has a file; its start is its pid unless `STARTS` says.
        fn alive((pid, start): Client) -> bool {
            let current = STARTS
                .with(|s| s.borrow().get(&pid).copied())
                .unwrap_or(u64::from(pid));
            FILES.with(|f| f.borrow().contains_key(&pid)) && start == current
        }

        fn sites(_: &String) -> usize {
            1
        }

        fn unprobe(kernel: &mut Kernel, name: String) {
            kernel.attached.retain(|n| !n.starts_with(&format!("{name}:")));
        }
    }

    #[test]
    fn where_probes_fire_per_process_each_client_gets_its_own_and_loses_them_when_it_goes() {
        let dir = files("per-process", &["a", "b"]);
        FILES.with(|f| {
            f.borrow_mut()
                .extend([(3, Some(dir.join("b"))), (4, Some(dir.join("a")))])
        });
        let kernel = Mutex::new(Kernel::default());
        // One inspection at first: b's clients wait for the rate until the next second.
        let mut files =
            ProbedFiles::<PerProcess>::with_bounds(10, Bucket::new(1.0, 1.0), Bucket::new(100.0, 100.0));
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let attached = |kernel: &Mutex<Kernel>| {
            let mut a = kernel.lock().unwrap().attached.clone();
            a.sort();
            a
        };
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3]), t0);
        assert_eq!((done.probed, done.refused_rate, done.joined), (1, 1, 0));
        assert_eq!(attached(&kernel), ["a:1"]);
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3]), t0 + s(1));
        assert_eq!(
            (done.probed, done.joined),
            (1, 1),
            "b probed for one of its clients; the other, refused with it, added in the same tick"
        );
        assert_eq!(attached(&kernel), ["a:1", "b:2", "b:3"]);
        assert_eq!(kernel.lock().unwrap().probes, 2, "one inspection per file");

        let done = files.reconcile(&kernel, &clients(&[1, 3, 4]), t0 + s(2));
        assert_eq!(
            (done.probed, done.joined),
            (0, 1),
            "a new client of a: added, not inspected"
        );
        assert_eq!(
            attached(&kernel),
            ["a:1", "a:4", "b:2", "b:3"],
            "client 2, with no connection now, keeps its probes (it may dial again)"
        );
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3, 4]), t0 + s(3));
        assert_eq!(done, Inspections::default(), "client 2 back: nothing to do");
        files.reconcile(&kernel, &clients(&[1, 3, 4]), t0 + s(4));
        FILES.with(|f| f.borrow_mut().remove(&2));
        files.reconcile(&kernel, &clients(&[1, 3, 4]), t0 + s(5));
        assert_eq!(
            attached(&kernel),
            ["a:1", "a:4", "b:3"],
            "client 2 exited: its own probes off, its file's others kept"
        );

        // A pid reused by another process: the old one's probes off, the new one's on.
        STARTS.with(|s| s.borrow_mut().insert(4, 99));
        let reused: HashSet<Client> = [(1, 1), (3, 3), (4, 99)].into();
        let done = files.reconcile(&kernel, &reused, t0 + s(6));
        assert_eq!(done.joined, 1, "the new process of pid 4 added");
        assert_eq!(attached(&kernel), ["a:1", "a:4", "b:3"]);
        assert!(matches!(files.seen((4, 99)), Seen::Probed(n) if n == "a"));

        // A client idle (alive, no connection) for LINGER loses its probes; a file's clients
        // all gone, nothing of it is attached and the file is forgotten LINGER after.
        FILES.with(|f| f.borrow_mut().remove(&4));
        files.reconcile(&kernel, &clients(&[1]), t0 + s(7));
        assert_eq!(
            attached(&kernel),
            ["a:1", "b:3"],
            "4 exited: off at once; 3 idle: kept"
        );
        files.reconcile(&kernel, &clients(&[1]), t0 + s(7) + LINGER);
        assert_eq!(attached(&kernel), ["a:1"], "3 idle for LINGER: off");
        assert_eq!(files.counts(), (1, 0), "b unused for LINGER: forgotten");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_refused_by_the_rate_is_probed_on_a_later_sighting() {
        let dir = files("rate", &["a", "b", "c"]);
        let kernel = Mutex::new(Kernel::default());
        let mut files =
            ProbedFiles::<Fake>::with_bounds(10, Bucket::new(1.0, 2.0), Bucket::new(100.0, 100.0));
        let t0 = Instant::now();
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3]), t0);
        assert_eq!(
            (done.probed, done.refused_rate),
            (2, 1),
            "the burst, then the rate"
        );
        assert_eq!(
            kernel.lock().unwrap().probes,
            2,
            "the refused file is not inspected"
        );
        assert!(matches!(files.seen((3, 3)), Seen::Unprobed(why) if why.starts_with("not probed yet")));
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3]), t0 + Duration::from_millis(500));
        assert_eq!(done, Inspections::default(), "still waiting, counted once");
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3]), t0 + Duration::from_secs(1));
        assert_eq!(done.probed, 1);
        assert!(matches!(files.seen((3, 3)), Seen::Probed(n) if n == "c"));
        assert_eq!(files.counts(), (3, 0));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_loop_of_fresh_files_costs_the_rate_and_holds_the_bound() {
        // 100 fresh copies, one a tick, each with one live client for 3 ticks.
        let names: Vec<String> = (0..100).map(|i| format!("copy-{i}")).collect();
        let dir = files("loop", &names.iter().map(String::as_str).collect::<Vec<_>>());
        let kernel = Mutex::new(Kernel::default());
        let mut files = ProbedFiles::<Fake>::with_bounds(8, Bucket::new(0.5, 4.0), Bucket::new(100.0, 100.0));
        let t0 = Instant::now();
        let mut probed = 0;
        for tick in 0..100u32 {
            let live: Vec<u32> = (tick.saturating_sub(2)..=tick).map(|i| i + 1).collect();
            probed += files
                .reconcile(&kernel, &clients(&live), t0 + Duration::from_secs(tick.into()))
                .probed;
            assert!(files.counts().0 <= 8, "never more than the bound");
        }
        assert!(probed <= 4 + 50, "burst + rate × 100 s: {probed}");
        assert_eq!(
            kernel.lock().unwrap().probes,
            probed,
            "every inspection was paid by the rate"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_owner_spends_its_own_rate_not_its_neighbours() {
        let names: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
        let dir = files("owner", &names.iter().map(String::as_str).collect::<Vec<_>>());
        // pids 1..=8 are one looping pod's, 9 and 10 two other pods'.
        OWNERS.with(|o| {
            let mut o = o.borrow_mut();
            for pid in 1..=8 {
                o.insert(pid, "/kubepods/loop".into());
            }
            o.insert(9, "/kubepods/a".into());
            o.insert(10, "/kubepods/b".into());
        });
        let kernel = Mutex::new(Kernel::default());
        let mut files = ProbedFiles::<Fake>::with_bounds(64, Bucket::new(1.0, 6.0), Bucket::new(0.5, 2.0));
        let t0 = Instant::now();
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3, 4, 5, 6, 7, 8]), t0);
        assert_eq!((done.probed, done.refused_rate), (2, 6), "the owner's burst");
        let done = files.reconcile(&kernel, &clients(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), t0);
        assert_eq!(done.probed, 2, "the node's rate left to the others");
        assert!(matches!(files.seen((9, 9)), Seen::Probed(_)));
        assert!(matches!(files.seen((10, 10)), Seen::Probed(_)));
        assert!(
            matches!(files.seen((3, 3)), Seen::Unprobed(why) if why.contains("for one container")),
            "the reason is said"
        );
        let done = files.reconcile(
            &kernel,
            &clients(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(done.probed, 1, "one every 2 s for the looping owner");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn at_its_own_bound_an_owner_recycles_its_own_files_not_its_neighbours() {
        let dir = files("owned", &["a", "b", "c", "d", "e"]);
        // pids 1, 2, 4, 5 one pod's (a, b, d, e), 3 another's (c).
        OWNERS.with(|o| {
            let mut o = o.borrow_mut();
            for pid in [1, 2, 4, 5] {
                o.insert(pid, "/kubepods/loop".into());
            }
            o.insert(3, "/kubepods/cron".into());
        });
        let kernel = Mutex::new(Kernel::default());
        let mut files =
            ProbedFiles::<Fake>::with_bounds(10, Bucket::new(100.0, 100.0), Bucket::new(100.0, 100.0))
                .with_owner_bound(2);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        files.reconcile(&kernel, &clients(&[3]), t0);
        // The neighbour's c is unused the longest, then a, then b.
        files.reconcile(&kernel, &clients(&[1, 2]), t0 + s(1));
        files.reconcile(&kernel, &clients(&[2]), t0 + s(2));
        files.reconcile(&kernel, &clients(&[]), t0 + s(3));
        let done = files.reconcile(&kernel, &clients(&[4]), t0 + s(4));
        assert_eq!((done.probed, done.evicted), (1, 1));
        assert_eq!(
            kernel.lock().unwrap().attached,
            ["c", "b", "d"],
            "a, the owner's own, went"
        );
        // b and d both live: e is refused for the owner's bound, though the node has room.
        let done = files.reconcile(&kernel, &clients(&[2, 4, 5]), t0 + s(5));
        assert_eq!((done.probed, done.refused_bound), (0, 1));
        assert!(matches!(files.seen((5, 5)), Seen::Unprobed(why) if why.contains("for this container")));
        let _ = fs::remove_dir_all(&dir);
    }
}
