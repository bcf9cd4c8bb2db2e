//! `lifeline run`: wires the parts together, in the order of the data flow:
//!
//! kernel events (`kernel`) → connection table (`table`, fed by `workers::pump_events` and
//! `sampler`) → client health (`judge`) → actions (logs, metrics, `alerts`, Kubernetes Events
//! and `remediate`), with `cluster` (when there is one) naming pods and discovering endpoints.
//!
//! Start-up order closes the blind spot of a restart: the kernel filter is active *before*
//! the scan of existing connections, so a connection is either seen by the scan or by an
//! event (or both: the table merges them by network namespace + 4-tuple).
use std::{
    path::PathBuf,
    sync::{atomic::AtomicBool, mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::signal::unix::{signal, SignalKind};

use crate::{
    alerts::{self, Alerter},
    api::{self, ApiState},
    cli::RunArgs,
    cluster::{self, Cluster},
    config::{self, ConfigFile, ThresholdsFile},
    endpoint::{Endpoint, EndpointSet},
    health::Thresholds,
    judge::Judge,
    kernel::{
        offsets,
        programs::{self, Probes},
    },
    metrics::{self, Metrics},
    prober,
    process::Procfs,
    remediate::{self, Remediation},
    sampler::{Sampler, SharedTable},
    snapshot::{Latest, Snapshot},
    table::ConnectionTable,
    workers::{pump_events, ClusterEvictor, Command, Refresher, SampleLoop},
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
    #[error(transparent)]
    Probes(#[from] programs::Error),
    #[error(transparent)]
    Metrics(#[from] metrics::Error),
    #[error(transparent)]
    Alerts(#[from] alerts::Error),
    #[error(transparent)]
    Api(#[from] api::Error),
    #[error("installing the {0} signal handler: {1}")]
    Signal(&'static str, std::io::Error),
}

impl Error {
    /// Usage errors (bad config, no endpoints, bad receivers) exit 2 like bad flags; the rest 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::NoEndpoints(_) | Error::Alerts(_) => 2,
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
            tracing::info!("without Kubernetes: {}", crate::chain(&err));
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
    let mut settings = Settings::load(&args)?;
    let base_endpoints = settings.endpoints()?;
    let listen = args
        .listen
        .or(settings.file.listen)
        .unwrap_or_else(|| config::DEFAULT_LISTEN.parse().expect("valid default"));
    let node = alerts::node_name(args.node_name.as_deref());
    let cluster = start_cluster(&args, &node).await;
    let mut endpoints = base_endpoints.clone();
    if let Some(c) = &cluster {
        cluster::endpoints::merge_into(&mut endpoints, &c.endpoints().borrow());
    }
    if endpoints.is_empty() {
        return Err(Error::NoEndpoints("none from flags, config or discovery".into()));
    }
    let metrics = Arc::new(Metrics::new(
        env!("CARGO_PKG_VERSION"),
        env!("LIFELINE_REVISION"),
    )?);

    let offsets = offsets::discover()?;
    let (probes, ring) = Probes::load(&offsets)?;
    let probes = Arc::new(Mutex::new(probes));
    probes.lock().expect("probes lock").set_endpoints(&endpoints)?;
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
    let pump = tokio::spawn(pump_events(
        ring,
        table.clone(),
        metrics.clone(),
        procfs.clone(),
        cluster.clone(),
        refresher.clone(),
    ));

    let dispatcher = alerts::Dispatcher::start(
        &settings.file.receivers,
        &args.webhook,
        &args.alertmanager,
        &metrics.alerts_sent,
        alerts::Options::default(),
    )?;
    let remediation = Remediation::start(
        remediate::Settings::new(&settings.file.remediation, args.dry_run),
        remediate::Actuator::new(ClusterEvictor(cluster.clone())),
        &metrics,
    );

    let (probe_targets, targets_rx) = tokio::sync::watch::channel(prober::Targets::new());
    let endpoint_probes = prober::start(targets_rx);
    let latest = Latest::new(Snapshot::empty());

    let feed = Arc::new(Mutex::new(EndpointFeed {
        base: base_endpoints,
        discovered: EndpointSet::default(),
        probes: probes.clone(),
        table: table.clone(),
        commands: commands.clone(),
    }));
    if let Some(c) = cluster.clone() {
        tokio::spawn(follow_discovery(c, feed.clone()));
    }
    let sample_loop = SampleLoop {
        commands: command_rx,
        sampler: Sampler::new(procfs),
        table: table.clone(),
        judge: judge.clone(),
        alerter: Alerter::new(node.clone(), dispatcher.clone()),
        remediation: remediation.clone(),
        cluster: cluster.clone(),
        node,
        metrics: metrics.clone(),
        probes: probes.clone(),
        endpoint_probes,
        probe_targets,
        latest: latest.clone(),
        refresher,
        ready: ready.clone(),
    };
    let sampler_thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || sample_loop.run())
        .expect("spawning the sampler thread");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let state = ApiState {
        latest,
        ready,
        metrics,
        cluster: cluster.clone(),
    };
    let server = tokio::spawn(
        api::serve(listen, state, async move {
            let _ = stop_rx.await;
        })
        .await?,
    );

    let mut term = signal(SignalKind::terminate()).map_err(|e| Error::Signal("SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::Signal("SIGINT", e))?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| Error::Signal("SIGHUP", e))?;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break }
            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break }
            _ = hup.recv() => match reload(&settings, &feed, &judge) {
                Ok(new) => {
                    settings = new;
                    remediation.reconfigure(remediate::Settings::new(&settings.file.remediation, args.dry_run));
                }
                Err(err) => tracing::error!("config not reloaded, keeping the previous one: {}", crate::chain(&err)),
            },
        }
    }

    // Shutdown, bounded by GRACE per part: stop serving and sampling, flush alerts, actions and
    // Events, detach the programs.
    let _ = stop_tx.send(());
    let _ = commands.send(Command::Stop);
    pump.abort();
    let _ = tokio::time::timeout(GRACE, server).await;
    let _ = tokio::task::spawn_blocking(move || sampler_thread.join()).await;
    dispatcher.shutdown(GRACE).await;
    remediation.shutdown(GRACE).await;
    if let Some(c) = &cluster {
        c.shutdown(GRACE).await;
    }
    drop(feed);
    drop(probes);
    tracing::info!("programs detached; bye");
    Ok(())
}

fn reload(settings: &Settings, feed: &Mutex<EndpointFeed>, judge: &Mutex<Judge>) -> Result<Settings> {
    let new = settings.reload()?;
    let base = new.endpoints()?;
    judge
        .lock()
        .expect("judge lock")
        .reconfigure(new.thresholds(), new.file.select.clone());
    let mut feed = feed.lock().expect("feed lock");
    feed.base = base;
    feed.apply()?;
    tracing::info!("config reloaded");
    Ok(new)
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
    fn apply(&self) -> Result<()> {
        let mut set = self.base.clone();
        cluster::endpoints::merge_into(&mut set, &self.discovered);
        if set.is_empty() {
            tracing::warn!("no apiserver endpoint left to watch");
        }
        let summary: Vec<String> = set.iter().map(|(e, _)| e.to_string()).collect();
        self.probes.lock().expect("probes lock").set_endpoints(&set)?;
        self.table
            .lock()
            .expect("table lock")
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
            let mut feed = feed.lock().expect("feed lock");
            if feed.discovered != discovered {
                feed.discovered = discovered;
                if let Err(err) = feed.apply() {
                    tracing::error!("applying discovered endpoints: {}", crate::chain(&err));
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
