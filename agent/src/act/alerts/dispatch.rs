//! Alert delivery: one tokio task per receiver, fed through a bounded queue, so delivery never
//! blocks detection.
//!
//! - [`Dispatcher::submit`] only locks each receiver's queue for a moment and wakes its task.
//! - Each queue holds the newest state of each alert identity (see [`Queue`]); beyond
//!   [`Options::queue_capacity`] the oldest is dropped and counted (`result="dropped"`).
//! - A task sends one batch at a time. A failed attempt is counted (`result="error"`) and
//!   retried with exponential backoff; its alerts go back to the front of the queue unless a
//!   newer state of the same alert arrived meanwhile. Answers 4xx other than 408 and 429 mean
//!   the receiver rejects the body, which a retry would not change: those alerts are logged
//!   and given up (counted as `error`). Counters count alerts, not requests.
//! - Alertmanager receivers re-send every firing alert each [`Options::resend_interval`], with
//!   `endsAt` four intervals ahead, so Alertmanager keeps it alive while we run and lets it
//!   expire if we stop. Webhook receivers get each change once.
//! - `http://` and `https://` URLs; https verifies the receiver against the `tls_config.ca_file`
//!   bundle, or the system's roots. `authorization` (bearer) and `basic_auth` read their secret
//!   from a file on every request, so a rotated token is picked up; an unreadable file at
//!   start-up is a configuration error, later a failed (retried) attempt.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::{
    body::Bytes,
    header::{AUTHORIZATION, CONTENT_TYPE, USER_AGENT},
    Request, StatusCode, Uri,
};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use prometheus::{IntCounter, IntCounterVec};
use rustls::pki_types::{pem::PemObject, CertificateDer};
use tokio::{
    sync::{watch, Notify},
    task::JoinHandle,
    time::Instant,
};

use super::{queue::Queue, wire};
use crate::{
    act::alerts::{receivers, Alert, Labels, Status},
    error::chain,
};

/// Alerts per request at most.
const MAX_BATCH: usize = 500;
/// How much of an error answer is kept for the log.
const MAX_ERROR_BODY: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("alert receiver {receiver}: {url:?} is not an http:// or https:// URL with a host")]
    Url { receiver: String, url: String },
    #[error(
        "alert receiver {receiver}: {url:?} holds credentials; give them in basic_auth or \
         authorization, not in the URL"
    )]
    UserInfo { receiver: String, url: String },
    #[error("alert receiver {receiver}: tls_config is for https:// URLs only")]
    TlsOnHttp { receiver: String },
    #[error("alert receiver {receiver}: CA bundle {path}: {reason}")]
    CaBundle {
        receiver: String,
        path: PathBuf,
        reason: String,
    },
    #[error("alert receiver {receiver}: no CA certificates in the system store ({reason}); give tls_config.ca_file")]
    SystemRoots { receiver: String, reason: String },
    #[error("alert receiver {receiver}: TLS setup: {source}")]
    Tls { receiver: String, source: rustls::Error },
    #[error("alert receiver {receiver}: credentials file {path}: {source}")]
    Credentials {
        receiver: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("alert receiver {receiver}: needs exactly one of alertmanager or webhook")]
    Target { receiver: String },
    #[error(
        "alert receiver name {name:?} is used twice (the config file and a --webhook/--alertmanager flag?)"
    )]
    DuplicateName { name: String },
    #[error("POST {url}: building the request: {source}")]
    Build { url: String, source: hyper::http::Error },
    #[error("POST {url}: encoding the alerts: {source}")]
    Encode { url: String, source: serde_json::Error },
    #[error("POST {url}: {source}")]
    Request {
        url: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("POST {url}: reading the answer: {source}")]
    Body { url: String, source: hyper::Error },
    #[error("POST {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("POST {url}: answered {status}: {body}")]
    Status {
        url: String,
        status: StatusCode,
        body: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether sending the same body again may succeed.
    fn is_retryable(&self) -> bool {
        match self {
            Error::Status { status, .. } => {
                !status.is_client_error()
                    || *status == StatusCode::REQUEST_TIMEOUT
                    || *status == StatusCode::TOO_MANY_REQUESTS
            }
            Error::Request { .. }
            | Error::Body { .. }
            | Error::Timeout { .. }
            | Error::Credentials { .. } => true,
            _ => false,
        }
    }
}

/// Settings shared by all receivers.
#[derive(Clone, Debug)]
pub struct Options {
    /// Alert identities each receiver holds while it cannot deliver; the oldest are dropped
    /// beyond this.
    pub queue_capacity: usize,
    /// How often an Alertmanager receiver re-sends firing alerts (`endsAt` is four of these
    /// ahead).
    pub resend_interval: Duration,
    /// First retry delay after a failed attempt; doubles per failure up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Per-request timeout of receivers that configure none.
    pub timeout: Duration,
    /// `generatorURL` and `externalURL` of the alerts (where a human finds this agent);
    /// empty for none.
    pub generator_url: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            queue_capacity: 1000,
            resend_interval: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            generator_url: String::new(),
        }
    }
}

/// What a receiver speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Alertmanager,
    Webhook,
}

/// How a receiver authenticates; secrets stay in their files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Bearer <file contents, trimmed>`.
    Bearer { credentials_file: PathBuf },
    /// `Authorization: Basic base64(username:<file contents, trimmed>)`.
    Basic {
        username: String,
        password_file: PathBuf,
    },
}

/// One receiver, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiverSpec {
    /// The `receiver` label and the webhook body's `receiver`.
    pub name: String,
    pub kind: Kind,
    /// The URL as configured.
    pub url: String,
    /// Where alerts are posted (`{url}/api/v2/alerts` for Alertmanager).
    pub target: Uri,
    pub timeout: Option<Duration>,
    /// https only: the CA bundle; the system's roots when `None`.
    pub ca_file: Option<PathBuf>,
    pub auth: Option<Auth>,
}

impl ReceiverSpec {
    pub fn new(name: &str, kind: Kind, target: &receivers::UrlTarget) -> Result<Self> {
        let url = target.url.as_str();
        let bad = || Error::Url {
            receiver: name.to_owned(),
            url: crate::host::redact::redact(url),
        };
        let post_to = match kind {
            Kind::Alertmanager => format!("{}/api/v2/alerts", url.trim_end_matches('/')),
            Kind::Webhook => url.to_owned(),
        };
        let post_to: Uri = post_to.parse().map_err(|_| bad())?;
        let https = match post_to.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad()),
        };
        let authority = post_to.authority().ok_or_else(bad)?;
        if authority.host().is_empty() {
            return Err(bad());
        }
        if authority.as_str().contains('@') {
            return Err(Error::UserInfo {
                receiver: name.to_owned(),
                url: crate::host::redact::redact(url),
            });
        }
        let ca_file = target.tls_config.as_ref().and_then(|t| t.ca_file.clone());
        if target.tls_config.is_some() && !https {
            return Err(Error::TlsOnHttp {
                receiver: name.to_owned(),
            });
        }
        let auth = match (&target.authorization, &target.basic_auth) {
            (Some(a), _) => Some(Auth::Bearer {
                credentials_file: a.credentials_file.clone(),
            }),
            (None, Some(b)) => Some(Auth::Basic {
                username: b.username.clone(),
                password_file: b.password_file.clone(),
            }),
            (None, None) => None,
        };
        Ok(Self {
            name: name.to_owned(),
            kind,
            url: url.to_owned(),
            target: post_to,
            timeout: target.timeout,
            ca_file,
            auth,
        })
    }

    /// The target URL as logs and errors show it: secret query parameters redacted.
    fn shown_url(&self) -> String {
        crate::host::redact::redact(&self.target.to_string())
    }

    fn plain(name: &str, kind: Kind, url: &str) -> Result<Self> {
        Self::new(
            name,
            kind,
            &receivers::UrlTarget {
                url: url.to_owned(),
                ..Default::default()
            },
        )
    }

    /// The `Authorization` header value, its secret read now.
    fn authorization(&self) -> Result<Option<String>> {
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map(|text| text.trim().to_owned())
                .map_err(|source| Error::Credentials {
                    receiver: self.name.clone(),
                    path: path.to_owned(),
                    source,
                })
        };
        Ok(match &self.auth {
            None => None,
            Some(Auth::Bearer { credentials_file }) => Some(format!("Bearer {}", read(credentials_file)?)),
            Some(Auth::Basic {
                username,
                password_file,
            }) => {
                let pair = format!("{username}:{}", read(password_file)?);
                Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                ))
            }
        })
    }

    /// The TLS client settings: the CA bundle, or the system's roots (https only; an http
    /// receiver gets an empty root store it never uses).
    fn tls(&self) -> Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        let https = self.target.scheme_str() == Some("https");
        match (&self.ca_file, https) {
            (_, false) => {}
            (Some(path), true) => {
                let bad = |reason: String| Error::CaBundle {
                    receiver: self.name.clone(),
                    path: path.clone(),
                    reason,
                };
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .map_err(|e| bad(e.to_string()))?
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|e| bad(e.to_string()))?;
                if certs.is_empty() {
                    return Err(bad("holds no PEM certificate".into()));
                }
                for cert in certs {
                    roots.add(cert).map_err(|e| bad(e.to_string()))?;
                }
            }
            (None, true) => {
                let native = rustls_native_certs::load_native_certs();
                for cert in native.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(Error::SystemRoots {
                        receiver: self.name.clone(),
                        reason: native
                            .errors
                            .first()
                            .map_or_else(|| "none found".to_owned(), ToString::to_string),
                    });
                }
            }
        }
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|source| Error::Tls {
                    receiver: self.name.clone(),
                    source,
                })?
                .with_root_certificates(roots)
                .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// Everything that can be checked before the first alert: the CA bundle parses, the
    /// credentials files can be read.
    fn check(&self) -> Result<Arc<rustls::ClientConfig>> {
        self.authorization()?;
        self.tls()
    }
}

/// The receivers in force: the config file's, then `--webhook` flags named `webhook-1`, …,
/// then `--alertmanager` flags named `alertmanager-1`, ….
pub fn receiver_specs(
    file: &[receivers::Receiver],
    webhooks: &[String],
    alertmanagers: &[String],
) -> Result<Vec<ReceiverSpec>> {
    let mut specs = Vec::new();
    for r in file {
        let spec = match (&r.alertmanager, &r.webhook) {
            (Some(t), None) => ReceiverSpec::new(&r.name, Kind::Alertmanager, t)?,
            (None, Some(t)) => ReceiverSpec::new(&r.name, Kind::Webhook, t)?,
            _ => {
                return Err(Error::Target {
                    receiver: r.name.clone(),
                })
            }
        };
        specs.push(spec);
    }
    for (i, url) in webhooks.iter().enumerate() {
        specs.push(ReceiverSpec::plain(
            &format!("webhook-{}", i + 1),
            Kind::Webhook,
            url,
        )?);
    }
    for (i, url) in alertmanagers.iter().enumerate() {
        specs.push(ReceiverSpec::plain(
            &format!("alertmanager-{}", i + 1),
            Kind::Alertmanager,
            url,
        )?);
    }
    let mut names = std::collections::HashSet::new();
    for s in &specs {
        if !names.insert(s.name.as_str()) {
            return Err(Error::DuplicateName { name: s.name.clone() });
        }
    }
    Ok(specs)
}

/// `lifeline_alerts_sent_total` of one receiver.
struct Counts {
    ok: IntCounter,
    error: IntCounter,
    dropped: IntCounter,
}

/// What waits for a receiver's task.
struct Pending {
    queue: Queue,
    /// Alertmanager only: firing alerts, re-sent every resend interval.
    firing: HashMap<Labels, Alert>,
}

/// One receiver's state, shared by the dispatcher (producer) and its task.
struct Receiver {
    spec: ReceiverSpec,
    pending: Mutex<Pending>,
    /// Woken on submit.
    wake: Notify,
    counts: Counts,
}

impl Receiver {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn count_dropped(&self, dropped: &[Alert]) {
        if dropped.is_empty() {
            return;
        }
        self.counts.dropped.inc_by(dropped.len() as u64);
        tracing::warn!(
            receiver = %self.spec.name,
            dropped = dropped.len(),
            "alert queue full: dropped the oldest alerts"
        );
    }

    /// Queues every firing alert not queued already (Alertmanager re-send).
    fn requeue_firing(&self) {
        let dropped = {
            let mut pending = self.pending();
            let Pending { queue, firing } = &mut *pending;
            let mut dropped = Vec::new();
            for alert in firing.values() {
                if !queue.contains(&alert.labels) {
                    dropped.extend(queue.push(alert.clone()));
                }
            }
            dropped
        };
        self.count_dropped(&dropped);
    }
}

/// Hands alerts to every receiver's task. Cheap to clone; the tasks stop when
/// [`Dispatcher::shutdown`] ends or the last clone is dropped.
#[derive(Clone)]
pub struct Dispatcher {
    inner: Arc<Inner>,
}

struct Inner {
    receivers: Vec<Arc<Receiver>>,
    /// Set to true on shutdown.
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().expect("task list lock").drain(..) {
            task.abort();
        }
    }
}

impl Dispatcher {
    /// Validates the receivers (see [`receiver_specs`]) and starts one task per receiver,
    /// counting into `sent` (`lifeline_alerts_sent_total{receiver,result}`). Must be called
    /// inside the tokio runtime.
    pub fn start(
        file: &[receivers::Receiver],
        webhooks: &[String],
        alertmanagers: &[String],
        sent: &IntCounterVec,
        options: Options,
    ) -> Result<Self> {
        let specs = receiver_specs(file, webhooks, alertmanagers)?;
        let (stop, _) = watch::channel(false);
        let mut receivers = Vec::new();
        let mut tasks = Vec::new();
        for spec in specs {
            let tls = spec.check()?;
            tracing::info!(receiver = %spec.name, kind = ?spec.kind, url = %spec.shown_url(), "alert receiver");
            let count = |result: &str| sent.with_label_values(&[spec.name.as_str(), result]);
            let receiver = Arc::new(Receiver {
                counts: Counts {
                    ok: count("ok"),
                    error: count("error"),
                    dropped: count("dropped"),
                },
                pending: Mutex::new(Pending {
                    queue: Queue::new(options.queue_capacity),
                    firing: HashMap::new(),
                }),
                wake: Notify::new(),
                spec,
            });
            tasks.push(tokio::spawn(run_receiver(
                receiver.clone(),
                tls,
                options.clone(),
                stop.subscribe(),
            )));
            receivers.push(receiver);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                receivers,
                stop,
                tasks: Mutex::new(tasks),
            }),
        })
    }

    /// Queues alert changes for every receiver and returns at once.
    pub fn submit(&self, alerts: Vec<Alert>) {
        if alerts.is_empty() {
            return;
        }
        for r in &self.inner.receivers {
            let dropped = {
                let mut pending = r.pending();
                let mut dropped = Vec::new();
                for alert in &alerts {
                    if r.spec.kind == Kind::Alertmanager {
                        match alert.status() {
                            Status::Firing => {
                                pending.firing.insert(alert.labels.clone(), alert.clone());
                            }
                            Status::Resolved => {
                                pending.firing.remove(&alert.labels);
                            }
                        }
                    }
                    dropped.extend(pending.queue.push(alert.clone()));
                }
                dropped
            };
            r.count_dropped(&dropped);
            r.wake.notify_one();
        }
    }

    /// Stops the receivers' tasks, letting them deliver what is queued for at most `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.stop.send_replace(true);
        let tasks = std::mem::take(
            &mut *self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let deadline = Instant::now() + grace;
        for mut task in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
            }
        }
        for r in &self.inner.receivers {
            let left = r.pending().queue.len();
            if left > 0 {
                tracing::warn!(receiver = %r.spec.name, alerts = left, "alerts not delivered before shutdown");
            }
        }
    }
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A receiver's task: deliver the queue, back off while failing, re-send firing alerts
/// (Alertmanager); once stopping, deliver what is left and end.
async fn run_receiver(
    r: Arc<Receiver>,
    tls: Arc<rustls::ClientConfig>,
    options: Options,
    mut stop: watch::Receiver<bool>,
) {
    let timeout = r.spec.timeout.unwrap_or(options.timeout);
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let resends = r.spec.kind == Kind::Alertmanager;
    let mut next_resend = Instant::now() + options.resend_interval;
    let mut backoff = options.backoff_initial;
    let mut failures = 0u32;
    let mut stopping = *stop.borrow();
    loop {
        if resends && !stopping && Instant::now() >= next_resend {
            r.requeue_firing();
            next_resend = Instant::now() + options.resend_interval;
        }
        let batch = r.pending().queue.take(MAX_BATCH);
        if batch.is_empty() {
            if stopping {
                return;
            }
            tokio::select! {
                () = r.wake.notified() => {}
                () = tokio::time::sleep_until(next_resend), if resends => {}
                _ = stop.changed() => stopping = true,
            }
            continue;
        }
        let size = batch.len();
        match send(&r, &client, &options, timeout, batch).await {
            Ok(()) => {
                r.counts.ok.inc_by(size as u64);
                if failures > 0 {
                    tracing::info!(receiver = %r.spec.name, failures, "alert delivery works again");
                }
                failures = 0;
                backoff = options.backoff_initial;
            }
            Err((unsent, err)) if !err.is_retryable() => {
                r.counts.ok.inc_by((size - unsent.len()) as u64);
                r.counts.error.inc_by(unsent.len() as u64);
                tracing::error!(
                    receiver = %r.spec.name,
                    alerts = unsent.len(),
                    "alerts rejected, not retried: {}",
                    chain(&err)
                );
            }
            Err((unsent, err)) => {
                r.counts.ok.inc_by((size - unsent.len()) as u64);
                r.counts.error.inc_by(unsent.len() as u64);
                failures += 1;
                tracing::warn!(
                    receiver = %r.spec.name,
                    alerts = unsent.len(),
                    attempt = failures,
                    retry_in_ms = backoff.as_millis() as u64,
                    "alert delivery failed: {}",
                    chain(&err)
                );
                let dropped = r.pending().queue.restore(unsent);
                r.count_dropped(&dropped);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = stop.changed(), if !stopping => stopping = true,
                }
                backoff = (backoff * 2).min(options.backoff_max);
            }
        }
    }
}

/// Sends one batch. On failure returns the alerts not delivered (webhook batches go out as
/// one request per alert name, so part of a batch may have been delivered).
async fn send(
    r: &Receiver,
    client: &HttpClient,
    options: &Options,
    timeout: Duration,
    batch: Vec<Alert>,
) -> std::result::Result<(), (Vec<Alert>, Error)> {
    let url = r.spec.shown_url();
    match r.spec.kind {
        Kind::Alertmanager => {
            let body = wire::alertmanager_body(
                &batch,
                SystemTime::now(),
                options.resend_interval,
                &options.generator_url,
            );
            let result = match serde_json::to_vec(&body) {
                Ok(body) => post(client, &r.spec, body, timeout).await,
                Err(source) => Err(Error::Encode { url, source }),
            };
            drop(body);
            result.map_err(|err| (batch, err))
        }
        Kind::Webhook => {
            let mut groups = wire::webhook_groups(batch).into_iter();
            while let Some(group) = groups.next() {
                let message = wire::webhook_message(&r.spec.name, &group, &options.generator_url);
                let result = match serde_json::to_vec(&message) {
                    Ok(body) => post(client, &r.spec, body, timeout).await,
                    Err(source) => Err(Error::Encode {
                        url: url.clone(),
                        source,
                    }),
                };
                drop(message);
                if let Err(err) = result {
                    let unsent = group.into_iter().chain(groups.flatten()).collect();
                    return Err((unsent, err));
                }
            }
            Ok(())
        }
    }
}

/// One POST of a JSON body; success is a 2xx answer within `timeout`.
async fn post(client: &HttpClient, spec: &ReceiverSpec, body: Vec<u8>, timeout: Duration) -> Result<()> {
    let url = spec.shown_url();
    let mut request = Request::post(spec.target.clone())
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, concat!("lifeline/", env!("CARGO_PKG_VERSION")));
    if let Some(value) = spec.authorization()? {
        request = request.header(AUTHORIZATION, value);
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|source| Error::Build {
            url: url.clone(),
            source,
        })?;
    let exchange = async {
        let response = client.request(request).await.map_err(|source| Error::Request {
            url: url.clone(),
            source,
        })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|source| Error::Body {
                url: url.clone(),
                source,
            })?
            .to_bytes();
        if status.is_success() {
            return Ok(());
        }
        let body = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)])
            .trim()
            .to_owned();
        Err(Error::Status {
            url: url.clone(),
            status,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Timeout {
            url: url.clone(),
            timeout,
        })?
}

#[cfg(test)]
mod tests;
