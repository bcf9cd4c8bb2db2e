//! `lifeline run`: wires the parts together, in the order of the data flow:
//!
//! kernel events (`kernel`) → connection table (`table`, fed by `app::pump` and
//! `sampler`) → client health (`judge`) → actions (logs, metrics, `alerts`, Kubernetes Events
//! and `remediate`), with `cluster` (when there is one) naming pods and discovering endpoints.
//!
//! Start-up order closes the blind spot of a restart: the kernel filter is active *before*
//! the scan of existing connections, so a connection is either seen by the scan or by an
//! event (or both: the table merges them by network namespace + 4-tuple).
//!
//! Before anything is loaded, the privileges are assessed (`privileges`): the agent refuses to
//! start without what it cannot work without, and runs blind (and not ready) without what
//! only limits its sight. A config reload (SIGHUP, or the file changing) is all or nothing:
//! everything is parsed, validated and installed in the kernel first, and only then do the
//! thresholds and remediation settings change.
use std::{
    path::PathBuf,
    sync::{atomic::AtomicBool, mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use lifeline_common::MAX_ENDPOINTS;

use tokio::signal::unix::{signal, SignalKind};

use crate::{
    act::alerts::{self, Alerter},
    act::metrics::{self, Metrics},
    act::remediate::{self, Remediation},
    app::cli::RunArgs,
    app::config::{self, ConfigFile, ThresholdsFile},
    app::pump::{Pump, PumpContext},
    app::unsupported::Unsupported,
    app::workers::{ClusterEvictor, Command, Refresher, SampleLoop},
    cluster::{self, Cluster},
    endpoint::{Endpoint, EndpointSet},
    health::judge::Judge,
    health::snapshot::{Latest, Snapshot},
    health::Thresholds,
    host::privileges::{self, Assessment, Blindness, Capabilities},
    host::prober,
    host::process::Procfs,
    kernel::{
        golang::GoTracer,
        object, offsets,
        openssl::SslTracer,
        programs::{KernelStats, Probes},
    },
    serve::api::{self, Access, ApiState},
    table::sampler::{Sampler, SharedTable},
    table::ConnectionTable,
};

/// How long start-up waits for the cluster's first discovery before going on without it.
pub const CLUSTER_SETTLE: Duration = Duration::from_secs(10);
/// How long shutdown may take before the agent exits anyway.
pub const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error(
        "no apiserver endpoint to watch: pass --endpoint or a --config with endpoints, or run where a \
         kubeconfig or the in-cluster service account is ({0})"
    )]
    NoEndpoints(String),
    #[error(transparent)]
    Offsets(#[from] offsets::Error),
    #[error(
        "too many apiserver endpoints: {0} from --endpoint, the config file's `endpoints` and \
         discovery; the kernel map holds at most {MAX_ENDPOINTS}"
    )]
    TooManyEndpoints(usize),
    #[error(transparent)]
    Privileges(#[from] privileges::Error),
    #[error(transparent)]
    Probes(#[from] object::Error),
    #[error(transparent)]
    Metrics(#[from] metrics::Error),
    #[error(transparent)]
    Alerts(#[from] alerts::Error),
    #[error(transparent)]
    Api(#[from] api::Error),
    #[error("starting the event pump thread: {0}")]
    Pump(std::io::Error),
    #[error("installing the {0} signal handler: {1}")]
    Signal(&'static str, std::io::Error),
}

impl Error {
    /// Usage errors (bad config, no endpoints, bad receivers) exit 2 like bad flags; the rest 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_)
            | Error::NoEndpoints(_)
            | Error::TooManyEndpoints(_)
            | Error::Alerts(_)
            | Error::Privileges(privileges::Error::Remediation { .. }) => 2,
            Error::Api(api::Error::TokenFile { .. } | api::Error::EmptyToken { .. }) => 2,
            _ => 1,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The settings in force: flags merged over the config file.
struct Settings {
    config_path: Option<PathBuf>,
    flag_endpoints: Vec<Endpoint>,
    flag_thresholds: ThresholdsFile,
    file: ConfigFile,
}

impl Settings {
    fn load(args: &RunArgs) -> Result<Self> {
        let file = match &args.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        Ok(Self {
            config_path: args.config.clone(),
            flag_endpoints: args.endpoints.iter().flat_map(|e| e.0.iter().copied()).collect(),
            flag_thresholds: args.thresholds.as_file(),
            file,
        })
    }

    /// The endpoints asked for by flags and the config file (discovery adds to them).
    fn endpoints(&self) -> Result<EndpointSet> {
        let path = self.config_path.clone().unwrap_or_default();
        Ok(config::endpoint_set(
            &self.flag_endpoints,
            &self.file.endpoint_list(&path)?,
        ))
    }

    fn thresholds(&self) -> Thresholds {
        self.file.thresholds(&self.flag_thresholds)
    }

    /// Re-reads the config file (SIGHUP); flags stay as they were.
    fn reload(&self) -> Result<Self> {
        let file = match &self.config_path {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        Ok(Self {
            config_path: self.config_path.clone(),
            flag_endpoints: self.flag_endpoints.clone(),
            flag_thresholds: self.flag_thresholds.clone(),
            file,
        })
    }
}

/// The Kubernetes side, when there is local configuration for it (in-cluster or kubeconfig).
/// It never waits for the apiserver beyond CLUSTER_SETTLE: an agent started during an outage
/// still watches connections, and discovery goes on in the background.
async fn start_cluster(args: &RunArgs, node: &str) -> Option<Cluster> {
    let c = match Cluster::start(cluster::Options::new(args.kubeconfig.clone(), node)).await {
        Ok(c) => c,
        Err(err) => {
            tracing::info!("without Kubernetes: {}", crate::error::chain(&err));
            return None;
        }
    };
    if !c.settled(CLUSTER_SETTLE).await {
        tracing::warn!("the apiserver did not answer within {CLUSTER_SETTLE:?}; discovery goes on");
    }
    match c.api_versions() {
        Some(v) => tracing::info!("Kubernetes API in use: {v}"),
        None => tracing::info!("Kubernetes API versions not discovered yet"),
    }
    Some(c)
}

pub async fn run(args: RunArgs) -> Result<()> {
    let fd_limit = match crate::host::resources::raise_nofile() {
        Ok(l) => {
            if l.before < l.soft {
                tracing::info!("open-file limit raised from {} to {}", l.before, l.soft);
            }
            l.soft
        }
        Err(err) => {
            tracing::warn!("cannot raise the open-file limit, keeping it: {err}");
            1024
        }
    };
    let privileges = Assessment::of(Capabilities::current()?);
    privileges.check_can_run()?;
    let mut watch = args.config.as_deref().map(config::Watch::new);
    let mut settings = Settings::load(&args)?;
    privileges.check_remediation(
        settings.file.remediation.mode.remedy(),
        args.dry_run || settings.file.remediation.dry_run,
    )?;
    let access = match &args.api_token_file {
        Some(path) => Access::with_token_file(path)?,
        None => Access::loopback_only(),
    };
    let base_endpoints = settings.endpoints()?;
    let listen = args
        .listen
        .or(settings.file.listen)
        .unwrap_or_else(|| config::DEFAULT_LISTEN.parse().expect("valid default"));
    let node = alerts::node_name(args.node_name.as_deref());
    let cluster = start_cluster(&args, &node).await;
    // What discovery had found by now is in force from the start: `follow_discovery` installs
    // (and rescans for) only what differs from it.
    let discovered = cluster
        .as_ref()
        .map(|c| c.endpoints().borrow().clone())
        .unwrap_or_default();
    let mut endpoints = base_endpoints.clone();
    cluster::endpoints::merge_into(&mut endpoints, &discovered);
    if endpoints.is_empty() {
        return Err(Error::NoEndpoints("none from flags, config or discovery".into()));
    }
    let count = endpoints.iter().count();
    if count > MAX_ENDPOINTS as usize {
        return Err(Error::TooManyEndpoints(count));
    }
    let blindness = Arc::new(Blindness::new()?);
    for (what, reason) in &privileges.blind {
        blindness.set(*what, reason.clone());
    }
    if privileges.no_signal_others {
        tracing::warn!("without CAP_KILL, remediation cannot restart host processes of other users");
    }
    let metrics = Arc::new(Metrics::new(
        env!("CARGO_PKG_VERSION"),
        env!("LIFELINE_REVISION"),
    )?);

    // A kernel without what the agent needs does not make it exit: a DaemonSet would
    // crash-loop. It stays up, not ready, saying why (`unsupported`).
    let loaded = offsets::discover()
        .map_err(Error::from)
        .and_then(|offsets| Ok(Probes::load(&offsets, args.stream_record_budget)?));
    let (probes, feed) = match loaded {
        Ok(loaded) => loaded,
        Err(why) => {
            return Unsupported {
                listen,
                access,
                fd_limit,
                metrics,
                blindness,
                cluster,
            }
            .serve(&why)
            .await
        }
    };
    let probes = Arc::new(Mutex::new(probes));
    probes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .set_endpoints(&endpoints)?;
    // Parsing the kernel's BTF (offsets) and loading the objects left ~20 MiB of freed heap
    // that glibc would otherwise keep for the agent's lifetime.
    // SAFETY: malloc_trim only returns free memory to the kernel.
    unsafe { libc::malloc_trim(0) };
    for (e, sources) in endpoints.iter() {
        tracing::info!(endpoint = %e, sources = ?sources, "watching");
    }

    let table: SharedTable = Arc::new(Mutex::new(
        ConnectionTable::new(endpoints).ignoring(std::process::id()),
    ));
    let judge = Arc::new(Mutex::new(Judge::new(
        settings.thresholds(),
        settings.file.select.clone(),
    )));
    let ready = Arc::new(AtomicBool::new(false));
    let procfs = Procfs::default();

    let (commands, command_rx) = mpsc::channel();
    let refresher = Refresher::new(commands.clone());
    let stats = Arc::new(KernelStats::default());
    let go = Arc::new(Mutex::new(GoTracer::default()));
    // Client-go binaries are probed as their processes start, before their first request.
    let go_at_start = {
        let mut kernel = probes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Without Go probes (refused: said at load) there is nothing to probe at start.
        if args.no_go_probes || kernel.go_unavailable().is_some() {
            None
        } else {
            match kernel.attach_exec(!args.no_hold_at_start) {
                Ok(()) => Some(go.clone()),
                Err(err) => {
                    tracing::warn!(
                        "a client-go binary is probed when it first connects, not when it starts (its first requests \
                         are unseen): {}",
                        crate::error::chain(&err)
                    );
                    None
                }
            }
        }
    };
    let pump = Pump::spawn(
        feed,
        PumpContext {
            table: table.clone(),
            metrics: metrics.clone(),
            procfs: procfs.clone(),
            cluster: cluster.clone(),
            probes: probes.clone(),
            stats: stats.clone(),
            refresher: refresher.clone(),
            go_at_start,
        },
    )
    .map_err(Error::Pump)?;

    let dispatcher = alerts::Dispatcher::start(
        &settings.file.receivers,
        &args.webhook,
        &args.alertmanager,
        &metrics.alerts_sent,
        alerts::Options::default(),
    )?;
    let remediation = Remediation::start(
        settings.file.remediation.settings(args.dry_run),
        remediate::Actuator::new(ClusterEvictor(cluster.clone())),
        &metrics,
    );

    let (probe_targets, targets_rx) = tokio::sync::watch::channel(prober::Targets::new());
    let endpoint_probes = prober::start(targets_rx);
    let latest = Latest::new(Snapshot::empty());

    let endpoint_feed = Arc::new(Mutex::new(EndpointFeed {
        base: base_endpoints,
        discovered,
        probes: probes.clone(),
        table: table.clone(),
        commands: commands.clone(),
    }));
    if let Some(c) = cluster.clone() {
        tokio::spawn(follow_discovery(c, endpoint_feed.clone()));
    }
    let sample_loop = SampleLoop {
        commands: command_rx,
        sampler: Sampler::new(procfs).with_kernel_stats(stats),
        table: table.clone(),
        judge: judge.clone(),
        alerter: Alerter::new(node.clone(), dispatcher.clone()),
        remediation: remediation.clone(),
        cluster: cluster.clone(),
        node,
        metrics: metrics.clone(),
        endpoint_probes,
        probe_targets,
        latest: latest.clone(),
        refresher,
        ready: ready.clone(),
        kernel: probes.clone(),
        go,
        ssl: SslTracer::default(),
        go_probes: !args.no_go_probes,
    };
    let sampler_thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || sample_loop.run())
        .expect("spawning the sampler thread");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let state = ApiState {
        latest,
        ready,
        blindness,
        unsupported: None,
        metrics,
        cluster: cluster.clone(),
    };
    let server = tokio::spawn(
        api::serve(
            listen,
            api::router(state, access),
            api::Limits::for_fd_limit(fd_limit),
            async move {
                let _ = stop_rx.await;
            },
        )
        .await?,
    );

    let mut term = signal(SignalKind::terminate()).map_err(|e| Error::Signal("SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::Signal("SIGINT", e))?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| Error::Signal("SIGHUP", e))?;
    let mut watch_tick = tokio::time::interval(config::WATCH_INTERVAL);
    watch_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let why = tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break }
            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break }
            _ = hup.recv() => "SIGHUP",
            _ = watch_tick.tick(), if watch.is_some() => {
                if !watch.as_mut().is_some_and(config::Watch::poll) {
                    continue;
                }
                "the config file changed"
            }
        };
        let reloaded = Reload {
            feed: &endpoint_feed,
            judge: &judge,
            remediation: &remediation,
            privileges: &privileges,
            dry_run: args.dry_run,
        }
        .apply(&settings);
        match reloaded {
            Ok(new) => {
                tracing::info!("config reloaded ({why})");
                settings = new;
            }
            Err(err) => tracing::error!(
                "config not reloaded ({why}), keeping the previous one entirely: {}",
                crate::error::chain(&err)
            ),
        }
    }

    // Shutdown, bounded by GRACE per part: stop serving and sampling, flush alerts, actions and
    // Events, detach the programs.
    let _ = stop_tx.send(());
    let _ = commands.send(Command::Stop);
    let _ = tokio::task::spawn_blocking(move || drop(pump)).await;
    let _ = tokio::time::timeout(GRACE, server).await;
    let _ = tokio::task::spawn_blocking(move || sampler_thread.join()).await;
    dispatcher.shutdown(GRACE).await;
    remediation.shutdown(GRACE).await;
    if let Some(c) = &cluster {
        c.shutdown(GRACE).await;
    }
    drop(endpoint_feed);
    drop(probes);
    tracing::info!("programs detached; bye");
    Ok(())
}

/// What a config reload changes.
struct Reload<'a> {
    feed: &'a Mutex<EndpointFeed>,
    judge: &'a Mutex<Judge>,
    remediation: &'a Remediation,
    privileges: &'a Assessment,
    dry_run: bool,
}

impl Reload<'_> {
    /// Re-reads the config file and applies it all or nothing: the file is parsed and
    /// validated, the remediation mode checked against the privileges, the endpoints installed
    /// in the kernel (rolled back there if that fails) — and only then are the thresholds,
    /// selectors and remediation settings swapped. On any error nothing has changed.
    fn apply(&self, settings: &Settings) -> Result<Settings> {
        let new = settings.reload()?;
        let base = new.endpoints()?;
        let dry_run = self.dry_run || new.file.remediation.dry_run;
        self.privileges
            .check_remediation(new.file.remediation.mode.remedy(), dry_run)?;
        self.feed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_base(base)?;
        self.judge
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .reconfigure(new.thresholds(), new.file.select.clone());
        self.remediation
            .reconfigure(new.file.remediation.settings(self.dry_run));
        if new.file.listen != settings.file.listen {
            tracing::warn!("`listen` changed in the config file: it takes effect at the next restart");
        }
        if new.file.receivers != settings.file.receivers {
            tracing::warn!("`receivers` changed in the config file: they take effect at the next restart");
        }
        Ok(new)
    }
}

/// Where the endpoint set in force comes from: flags and the config file (`base`) and the
/// cluster's live discovery (`discovered`). Whenever either changes, their union goes to the
/// kernel map and the table, and existing connections are rescanned (a connection to a newly
/// added endpoint may be older than the change).
struct EndpointFeed {
    base: EndpointSet,
    discovered: EndpointSet,
    probes: Arc<Mutex<Probes>>,
    table: SharedTable,
    commands: mpsc::Sender<Command>,
}

impl EndpointFeed {
    /// New endpoints from flags and the config file; on error the previous ones stay in force.
    fn set_base(&mut self, base: EndpointSet) -> Result<()> {
        self.install(&base, &self.discovered)?;
        self.base = base;
        Ok(())
    }

    /// New endpoints from discovery; on error the previous ones stay in force.
    fn set_discovered(&mut self, discovered: EndpointSet) -> Result<()> {
        self.install(&self.base, &discovered)?;
        self.discovered = discovered;
        Ok(())
    }

    /// Puts `base` ∪ `discovered` in force: the kernel map first (all or nothing), then the
    /// table, then a rescan for connections older than the change.
    fn install(&self, base: &EndpointSet, discovered: &EndpointSet) -> Result<()> {
        let mut set = base.clone();
        cluster::endpoints::merge_into(&mut set, discovered);
        let count = set.iter().count();
        if count > MAX_ENDPOINTS as usize {
            return Err(Error::TooManyEndpoints(count));
        }
        if set.is_empty() {
            tracing::warn!("no apiserver endpoint left to watch");
        }
        let summary: Vec<String> = set.iter().map(|(e, _)| e.to_string()).collect();
        self.probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_endpoints(&set)?;
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set_endpoints(set, Instant::now());
        let _ = self.commands.send(Command::Rescan);
        tracing::info!(endpoints = ?summary, "endpoints in force");
        Ok(())
    }
}

/// Follows the cluster's endpoint discovery (Service, EndpointSlices or Endpoints, kubeconfig).
async fn follow_discovery(cluster: Cluster, feed: Arc<Mutex<EndpointFeed>>) {
    let mut rx = cluster.endpoints();
    loop {
        let discovered = rx.borrow_and_update().clone();
        {
            let mut feed = feed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if feed.discovered != discovered {
                if let Err(err) = feed.set_discovered(discovered) {
                    tracing::error!(
                        "discovered endpoints not applied, keeping the previous ones: {}",
                        crate::error::chain(&err)
                    );
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
