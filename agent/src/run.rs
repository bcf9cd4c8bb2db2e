//! `lifeline run`: wires the parts together, in the order of the data flow:
//!
//! kernel events (`kernel`) → connection table (`table`, fed by `pump` and `sampler`) →
//! client health (`judge`) → actions (logs, metrics; alerts and remediation come later).
//!
//! Start-up order closes the blind spot of a restart: the kernel filter is active *before*
//! the scan of existing connections, so a connection is either seen by the scan or by an
//! event (or both: the table merges them by network namespace + 4-tuple).
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    alerts::{self, Alerter},
    api::{self, ApiState},
    cli::RunArgs,
    config::{self, ConfigFile, ThresholdsFile},
    endpoint::{Endpoint, EndpointSet, Source},
    health::{State, Thresholds},
    judge::Judge,
    kernel::{
        events::{self, MonotonicClock},
        offsets,
        programs::{self, Probes},
    },
    kubeconfig,
    metrics::{self, Metrics},
    process::{ProcessInfo, Procfs},
    sampler::{Sampler, SharedTable},
    table::{Applied, ConnectionTable},
    views,
};

/// How often tracked sockets are sampled and clients judged.
pub const TICK: Duration = Duration::from_secs(1);
/// How long shutdown may take before the agent exits anyway.
pub const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error(transparent)]
    Kubeconfig(#[from] kubeconfig::Error),
    #[error(
        "no apiserver endpoint to watch: pass --endpoint, a --config with endpoints, or a kubeconfig ({0})"
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
    #[error("watching the event ring buffer: {0}")]
    Ring(std::io::Error),
}

impl Error {
    /// Usage errors (bad config, no endpoints) exit 2 like bad flags; the rest exit 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::Kubeconfig(_) | Error::NoEndpoints(_) | Error::Alerts(_) => 2,
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
    kubeconfig: Option<PathBuf>,
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
            kubeconfig: args.kubeconfig.clone(),
        })
    }

    fn endpoints(&self) -> Result<EndpointSet> {
        let path = self.config_path.clone().unwrap_or_default();
        let mut set = config::endpoint_set(&self.flag_endpoints, &self.file.endpoint_list(&path)?);
        if set.is_empty() {
            let Some(kc) = self.kubeconfig.clone().or_else(kubeconfig::default_path) else {
                return Err(Error::NoEndpoints("no kubeconfig path either".into()));
            };
            if self.kubeconfig.is_none() && !kc.exists() {
                return Err(Error::NoEndpoints(format!("{} does not exist", kc.display())));
            }
            for e in kubeconfig::endpoints(&kc)? {
                set.insert(e, Source::Kubeconfig);
            }
        }
        Ok(set)
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
            file,
            ..self.clone_without_file()
        })
    }

    fn clone_without_file(&self) -> Self {
        Self {
            config_path: self.config_path.clone(),
            flag_endpoints: self.flag_endpoints.clone(),
            flag_thresholds: self.flag_thresholds.clone(),
            file: ConfigFile::default(),
            kubeconfig: self.kubeconfig.clone(),
        }
    }
}

enum Command {
    Rescan,
    Stop,
}

pub async fn run(args: RunArgs) -> Result<()> {
    let mut settings = Settings::load(&args)?;
    let endpoints = settings.endpoints()?;
    let listen = args
        .listen
        .or(settings.file.listen)
        .unwrap_or_else(|| config::DEFAULT_LISTEN.parse().expect("valid default"));
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

    let table: SharedTable = Arc::new(Mutex::new(ConnectionTable::new(endpoints)));
    let judge = Arc::new(Mutex::new(Judge::new(
        settings.thresholds(),
        settings.file.select.clone(),
    )));
    let ready = Arc::new(AtomicBool::new(false));
    let procfs = Procfs::default();

    let pump = tokio::spawn(pump_events(ring, table.clone(), metrics.clone(), procfs.clone()));

    let dispatcher = alerts::Dispatcher::start(
        &settings.file.receivers,
        &args.webhook,
        &args.alertmanager,
        &metrics.alerts_sent,
        alerts::Options::default(),
    )?;
    let alerter = Alerter::new(alerts::node_name(args.node_name.as_deref()), dispatcher.clone());

    let (commands, command_rx) = mpsc::channel();
    let sample_loop = SampleLoop {
        commands: command_rx,
        sampler: Sampler::new(procfs),
        table: table.clone(),
        judge: judge.clone(),
        alerter,
        metrics: metrics.clone(),
        probes: probes.clone(),
        ready: ready.clone(),
    };
    let sampler_thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || sample_loop.run())
        .expect("spawning the sampler thread");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let state = ApiState {
        table: table.clone(),
        judge: judge.clone(),
        ready,
        metrics,
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
            _ = hup.recv() => {
                match reload(&settings, &probes, &table, &judge) {
                    Ok(new) => { settings = new; let _ = commands.send(Command::Rescan); }
                    Err(err) => tracing::error!("config not reloaded, keeping the previous one: {err}"),
                }
            }
        }
    }

    // Shutdown, bounded by GRACE: stop serving, stop sampling, detach the programs.
    let _ = stop_tx.send(());
    let _ = commands.send(Command::Stop);
    pump.abort();
    let _ = tokio::time::timeout(GRACE, server).await;
    let _ = tokio::task::spawn_blocking(move || sampler_thread.join()).await;
    dispatcher.shutdown(GRACE).await;
    drop(probes);
    tracing::info!("programs detached; bye");
    Ok(())
}

fn reload(
    settings: &Settings,
    probes: &Mutex<Probes>,
    table: &Mutex<ConnectionTable>,
    judge: &Mutex<Judge>,
) -> Result<Settings> {
    let new = settings.reload()?;
    let endpoints = new.endpoints()?;
    probes.lock().expect("probes lock").set_endpoints(&endpoints)?;
    let summary: Vec<String> = endpoints.iter().map(|(e, _)| e.to_string()).collect();
    judge
        .lock()
        .expect("judge lock")
        .reconfigure(new.thresholds(), new.file.select.clone());
    table
        .lock()
        .expect("table lock")
        .set_endpoints(endpoints, Instant::now());
    tracing::info!(endpoints = ?summary, "config reloaded");
    Ok(new)
}

/// Kernel events → connection table.
async fn pump_events(
    ring: RingBuf<MapData>,
    table: SharedTable,
    metrics: Arc<Metrics>,
    procfs: Procfs,
) -> Result<()> {
    let clock = MonotonicClock::new();
    let mut fd = crate::kernel::readable_fd(ring).map_err(Error::Ring)?;
    loop {
        let mut guard = fd.readable_mut().await.map_err(Error::Ring)?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            let decoded = events::decode(&item, &clock);
            drop(item);
            let ev = match decoded {
                Ok(ev) => ev,
                Err(err) => {
                    tracing::warn!("dropping a kernel event: {err}");
                    continue;
                }
            };
            metrics.ebpf_events.with_label_values(&[ev.kind_label()]).inc();
            let owner = ev.owner_tgid.and_then(|tgid| procfs.process(tgid).ok());
            let mut table = table.lock().expect("table lock");
            match table.apply_event(&ev, owner) {
                Some(Applied::Retransmit {
                    pid: Some(pid),
                    endpoint,
                }) => {
                    if let Some(p) = table.process(pid) {
                        metrics.count_retransmit(&client_labels(&p.info), &endpoint.to_string());
                    }
                }
                Some(Applied::ConnectFailed {
                    pid,
                    endpoint,
                    reason,
                }) => {
                    if let Some(p) = table.process(pid) {
                        let reason = serde_json::to_value(reason).ok();
                        let reason = reason.as_ref().and_then(|v| v.as_str()).unwrap_or("unknown");
                        metrics.count_connect_failure(&client_labels(&p.info), &endpoint.to_string(), reason);
                    }
                }
                Some(Applied::Retransmit { pid: None, .. }) | None => {}
            }
        }
        guard.clear_ready();
    }
}

/// Metric labels of a process: namespace, pod, container (empty outside Kubernetes), comm.
fn client_labels(info: &ProcessInfo) -> [String; 4] {
    [String::new(), String::new(), String::new(), info.comm.clone()]
}

/// What the sampler thread works on.
struct SampleLoop {
    commands: mpsc::Receiver<Command>,
    sampler: Sampler,
    table: SharedTable,
    judge: Arc<Mutex<Judge>>,
    alerter: Alerter,
    metrics: Arc<Metrics>,
    probes: Arc<Mutex<Probes>>,
    ready: Arc<AtomicBool>,
}

impl SampleLoop {
    /// First scan (then ready), then once per TICK: sample, judge, act (log, alert, export).
    fn run(mut self) {
        let found = self.sampler.scan(&self.table);
        tracing::info!(found, "start-up scan done");
        self.ready.store(true, Ordering::Release);
        let mut lost_seen = 0;
        loop {
            match self.commands.recv_timeout(TICK) {
                Ok(Command::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(Command::Rescan) => {
                    let found = self.sampler.scan(&self.table);
                    tracing::info!(found, "rescan after config change done");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            self.sampler.sample(&self.table);
            let clients = self.judge_and_alert(Instant::now());
            self.metrics.update_clients(&clients);
            if let Ok(counters) = self.probes.lock().expect("probes lock").counters() {
                self.metrics
                    .ebpf_events_lost
                    .inc_by(counters.lost.saturating_sub(lost_seen));
                lost_seen = counters.lost;
            }
        }
    }

    fn judge_and_alert(&mut self, now: Instant) -> Vec<views::ClientView> {
        let mut judge = self.judge.lock().expect("judge lock");
        let table = self.table.lock().expect("table lock");
        let findings = judge.tick(&table, now);
        match &findings.outage_change {
            Some(Some(o)) => tracing::error!(
                affected = o.affected,
                clients = o.clients,
                "apiserver outage: most clients on this node lost the apiserver at once"
            ),
            Some(None) => tracing::warn!("apiserver outage over"),
            None => {}
        }
        for t in &findings.transitions {
            let tr = &t.transition;
            tracing::warn!(
                pid = t.process.pid, comm = %t.process.comm, endpoint = ?t.endpoint,
                from = %tr.from, to = %tr.to, detection_ms = tr.detection.as_millis() as u64,
                "{}", tr.reason
            );
            if tr.to != State::Healthy {
                self.metrics.detection.observe(tr.detection.as_secs_f64());
            }
        }
        self.alerter.tick(&table, judge.verdicts(), now);
        views::clients(&table, judge.verdicts(), judge.thresholds().connect_window, now)
    }
}
