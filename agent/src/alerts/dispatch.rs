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
    alerts::{Alert, Labels, Status},
    chain, config,
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
    pub fn new(name: &str, kind: Kind, target: &config::UrlTarget) -> Result<Self> {
        let url = target.url.as_str();
        let bad = || Error::Url {
            receiver: name.to_owned(),
            url: crate::redact::redact(url),
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
                url: crate::redact::redact(url),
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
        crate::redact::redact(&self.target.to_string())
    }

    fn plain(name: &str, kind: Kind, url: &str) -> Result<Self> {
        Self::new(
            name,
            kind,
            &config::UrlTarget {
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
    file: &[config::Receiver],
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
        self.pending.lock().expect("alert queue lock")
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
        file: &[config::Receiver],
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
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().expect("task list lock"));
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
mod tests {
    use std::collections::BTreeMap;

    use prometheus::Opts;
    use serde_json::Value;

    use super::*;
    use crate::{
        alerts::{
            sink::{free_addr, Sink},
            Alert, Dispatcher, Error, Labels, Options,
        },
        views::rfc3339,
    };

    const WAIT: Duration = Duration::from_secs(5);

    fn counter() -> IntCounterVec {
        IntCounterVec::new(Opts::new("sent", "sent"), &["receiver", "result"]).unwrap()
    }

    fn count(sent: &IntCounterVec, receiver: &str, result: &str) -> u64 {
        sent.with_label_values(&[receiver, result]).get()
    }

    fn fast() -> Options {
        Options {
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(100),
            timeout: Duration::from_secs(2),
            ..Options::default()
        }
    }

    fn webhook(url: &str, sent: &IntCounterVec, options: Options) -> Dispatcher {
        Dispatcher::start(&[], &[url.to_owned()], &[], sent, options).unwrap()
    }

    fn alertmanager(url: &str, sent: &IntCounterVec, options: Options) -> Dispatcher {
        Dispatcher::start(&[], &[], &[url.to_owned()], sent, options).unwrap()
    }

    fn at_ms(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000 + ms)
    }

    fn firing(pod: &str) -> Alert {
        Alert {
            labels: Labels::from([
                ("alertname".to_owned(), "LifelineClientStale".to_owned()),
                ("severity".to_owned(), "warning".to_owned()),
                ("node".to_owned(), "n1".to_owned()),
                ("pod".to_owned(), pod.to_owned()),
            ]),
            annotations: BTreeMap::from([("summary".to_owned(), format!("{pod} is stale"))]),
            starts_at: at_ms(0),
            ends_at: None,
        }
    }

    fn resolved(pod: &str, at: SystemTime) -> Alert {
        Alert {
            ends_at: Some(at),
            ..firing(pod)
        }
    }

    /// (pod, status) of every alert in webhook bodies, in order.
    fn webhook_alerts(bodies: &[crate::alerts::sink::Received]) -> Vec<(String, String)> {
        bodies
            .iter()
            .flat_map(|r| r.body["alerts"].as_array().unwrap().clone())
            .map(|a| {
                (
                    a["labels"]["pod"].as_str().unwrap().to_owned(),
                    a["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    fn pair(pod: &str, status: &str) -> (String, String) {
        (pod.to_owned(), status.to_owned())
    }

    #[tokio::test]
    async fn webhook_gets_alertmanagers_v4_body_on_each_change() {
        let sink = Sink::start().await;
        let sent = counter();
        let d = webhook(&format!("{}/hook", sink.url), &sent, fast());
        d.submit(vec![firing("p1")]);
        let got = sink.wait_accepted(1, WAIT).await;
        assert_eq!(got[0].path, "/hook");
        let body = &got[0].body;
        assert_eq!(body["version"], "4");
        assert_eq!(body["receiver"], "webhook-1");
        assert_eq!(body["status"], "firing");
        assert_eq!(body["truncatedAlerts"], 0);
        assert_eq!(
            body["groupKey"],
            "{}:{alertname=\"LifelineClientStale\", node=\"n1\"}"
        );
        assert_eq!(body["groupLabels"]["alertname"], "LifelineClientStale");
        assert_eq!(body["commonLabels"]["pod"], "p1");
        assert_eq!(body["commonAnnotations"]["summary"], "p1 is stale");
        assert!(body["externalURL"].is_string());
        let alert = &body["alerts"][0];
        assert_eq!(alert["status"], "firing");
        assert_eq!(alert["startsAt"], rfc3339(at_ms(0)));
        assert_eq!(alert["endsAt"], "0001-01-01T00:00:00Z");
        assert_eq!(alert["fingerprint"].as_str().unwrap().len(), 16);
        assert!(alert["generatorURL"].is_string());

        d.submit(vec![resolved("p1", at_ms(5000))]);
        let got = sink.wait_accepted(2, WAIT).await;
        assert_eq!(got[1].body["status"], "resolved");
        assert_eq!(got[1].body["alerts"][0]["endsAt"], rfc3339(at_ms(5000)));
        assert_eq!(got[1].body["alerts"][0]["fingerprint"], alert["fingerprint"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sink.received().len(), 2, "a webhook is not re-sent");
        assert_eq!(
            (
                count(&sent, "webhook-1", "ok"),
                count(&sent, "webhook-1", "error")
            ),
            (2, 0)
        );
    }

    #[tokio::test]
    async fn alertmanager_gets_v2_alerts_resent_while_firing_and_resolved_with_ends_at() {
        let sink = Sink::start().await;
        let sent = counter();
        let resend = Duration::from_millis(300);
        let d = alertmanager(
            &format!("{}/", sink.url),
            &sent,
            Options {
                resend_interval: resend,
                generator_url: "http://node-1:9477/api/v1/clients".into(),
                ..fast()
            },
        );
        let before = SystemTime::now();
        d.submit(vec![firing("p1")]);
        let got = sink.wait_accepted(1, WAIT).await;
        assert_eq!(got[0].path, "/api/v2/alerts");
        let Value::Array(alerts) = &got[0].body else {
            panic!("not an array: {}", got[0].body)
        };
        assert_eq!(alerts.len(), 1);
        let a = &alerts[0];
        assert_eq!(a["labels"]["pod"], "p1");
        assert_eq!(a["annotations"]["summary"], "p1 is stale");
        assert_eq!(a["startsAt"], rfc3339(at_ms(0)));
        assert_eq!(a["generatorURL"], "http://node-1:9477/api/v1/clients");
        let ends: chrono::DateTime<chrono::Utc> = a["endsAt"].as_str().unwrap().parse().unwrap();
        let ends = SystemTime::from(ends);
        assert!(
            ends >= before + 4 * resend - Duration::from_millis(1) && ends <= SystemTime::now() + 4 * resend,
            "endsAt is 4 resend intervals after sending"
        );
        // Re-sent while firing, each time with a later endsAt.
        let got = sink.wait_accepted(3, WAIT).await;
        for pair in got.windows(2) {
            assert_eq!(pair[1].body[0]["labels"]["pod"], "p1");
            let (a, b) = (
                pair[0].body[0]["endsAt"].as_str(),
                pair[1].body[0]["endsAt"].as_str(),
            );
            assert!(b > a, "{a:?} then {b:?}");
        }
        d.submit(vec![resolved("p1", at_ms(9000))]);
        let deadline = tokio::time::Instant::now() + WAIT;
        let resolved_at = loop {
            let got = sink.accepted();
            if let Some(i) = got
                .iter()
                .position(|r| r.body[0]["endsAt"] == rfc3339(at_ms(9000)))
            {
                break i;
            }
            assert!(tokio::time::Instant::now() < deadline, "no resolve: {got:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        tokio::time::sleep(3 * resend).await;
        assert_eq!(
            sink.accepted().len(),
            resolved_at + 1,
            "nothing re-sent after the resolve"
        );
        assert_eq!(count(&sent, "alertmanager-1", "ok") as usize, resolved_at + 1);
    }

    #[tokio::test]
    async fn a_receiver_that_was_down_gets_the_newest_state_of_every_alert() {
        let addr = free_addr();
        let sent = counter();
        let d = webhook(&format!("http://{addr}/hook"), &sent, fast());
        d.submit(vec![firing("a"), firing("b")]);
        d.submit(vec![resolved("a", at_ms(1000)), firing("c")]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let errors = count(&sent, "webhook-1", "error");
        assert!(errors >= 2, "failed attempts are counted: {errors}");
        assert_eq!(count(&sent, "webhook-1", "ok"), 0);
        let sink = Sink::start_on(addr).await;
        let got = sink.wait_accepted(1, WAIT).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut alerts = webhook_alerts(&sink.accepted());
        alerts.sort();
        assert_eq!(
            alerts,
            [pair("a", "resolved"), pair("b", "firing"), pair("c", "firing")],
            "{got:#?}"
        );
        assert_eq!(count(&sent, "webhook-1", "ok"), 3);
        assert_eq!(count(&sent, "webhook-1", "dropped"), 0);
    }

    #[tokio::test]
    async fn a_receiver_answering_503_is_retried_with_backoff_until_it_accepts() {
        let sink = Sink::start().await;
        sink.respond_with(503);
        let sent = counter();
        let d = alertmanager(&sink.url, &sent, fast());
        d.submit(vec![firing("a")]);
        tokio::time::sleep(Duration::from_millis(150)).await;
        d.submit(vec![resolved("a", at_ms(7000)), firing("b")]);
        tokio::time::sleep(Duration::from_millis(250)).await;
        let refused = sink.received().len();
        assert!(refused >= 3, "retried: {refused}");
        // Backoff: 20, 40, 80, 100, 100 ms... so in 400 ms far fewer than one per ms.
        assert!(refused <= 10, "backs off: {refused}");
        assert_eq!(
            count(&sent, "alertmanager-1", "error") as usize,
            sink.received()
                .iter()
                .map(|r| r.body.as_array().unwrap().len())
                .sum::<usize>()
        );
        sink.respond_with(200);
        let got = sink.wait_accepted(1, WAIT).await;
        let mut alerts: Vec<(String, String)> = got[0]
            .body
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["labels"]["pod"].as_str().unwrap().to_owned(),
                    a["endsAt"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        alerts.sort();
        assert_eq!(alerts.len(), 2, "{alerts:?}");
        assert_eq!(
            alerts[0],
            pair("a", &rfc3339(at_ms(7000))),
            "the resolve replaced the firing"
        );
        assert_eq!(alerts[1].0, "b");
        // The dispatcher counts an attempt once it has read the answer: after the sink did.
        let deadline = tokio::time::Instant::now() + WAIT;
        while count(&sent, "alertmanager-1", "ok") < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(count(&sent, "alertmanager-1", "ok"), 2);
    }

    #[tokio::test]
    async fn queue_overflow_drops_the_oldest_and_counts_it() {
        let addr = free_addr();
        let sent = counter();
        let d = webhook(
            &format!("http://{addr}/"),
            &sent,
            Options {
                queue_capacity: 3,
                ..fast()
            },
        );
        d.submit(["a", "b", "c", "d", "e"].map(firing).to_vec());
        assert_eq!(count(&sent, "webhook-1", "dropped"), 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sink = Sink::start_on(addr).await;
        sink.wait_accepted(1, WAIT).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut alerts = webhook_alerts(&sink.accepted());
        alerts.sort();
        assert_eq!(
            alerts,
            [pair("c", "firing"), pair("d", "firing"), pair("e", "firing")]
        );
        assert_eq!(count(&sent, "webhook-1", "dropped"), 2);
    }

    #[tokio::test]
    async fn submit_returns_at_once_while_the_receiver_hangs_and_shutdown_is_bounded() {
        let sink = Sink::start().await;
        sink.hang();
        let sent = counter();
        let d = alertmanager(
            &sink.url,
            &sent,
            Options {
                timeout: Duration::from_secs(30),
                ..fast()
            },
        );
        d.submit(vec![firing("first")]);
        tokio::time::sleep(Duration::from_millis(100)).await; // the request is now hanging
        let start = std::time::Instant::now();
        for i in 0..2000 {
            d.submit(vec![firing(&format!("p{i}"))]);
        }
        let took = start.elapsed();
        assert!(took < Duration::from_millis(500), "2000 submits took {took:?}");
        assert_eq!(
            count(&sent, "alertmanager-1", "dropped"),
            1000,
            "queue bound 1000"
        );
        let start = std::time::Instant::now();
        d.shutdown(Duration::from_millis(300)).await;
        let took = start.elapsed();
        assert!(took < Duration::from_secs(2), "shutdown took {took:?}");
    }

    #[tokio::test]
    async fn the_request_timeout_counts_as_a_failed_attempt() {
        let sink = Sink::start().await;
        sink.hang();
        let sent = counter();
        let d = webhook(
            &sink.url,
            &sent,
            Options {
                timeout: Duration::from_millis(100),
                ..fast()
            },
        );
        d.submit(vec![firing("a")]);
        tokio::time::sleep(Duration::from_millis(450)).await;
        let errors = count(&sent, "webhook-1", "error");
        assert!(
            (2..=4).contains(&errors),
            "one error per 100 ms attempt plus backoff: {errors}"
        );
    }

    #[tokio::test]
    async fn shutdown_flushes_what_is_queued() {
        let sink = Sink::start().await;
        let sent = counter();
        let d = webhook(&sink.url, &sent, fast());
        d.submit(vec![firing("a"), firing("b")]);
        d.shutdown(Duration::from_secs(2)).await;
        let mut alerts = webhook_alerts(&sink.accepted());
        alerts.sort();
        assert_eq!(alerts, [pair("a", "firing"), pair("b", "firing")]);
    }

    #[tokio::test]
    async fn a_rejected_body_is_not_retried() {
        let sink = Sink::start().await;
        sink.respond_with(400);
        let sent = counter();
        let d = webhook(&sink.url, &sent, fast());
        d.submit(vec![firing("a")]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(sink.received().len(), 1);
        assert_eq!(count(&sent, "webhook-1", "error"), 1);
    }

    #[test]
    fn receivers_come_from_the_file_then_the_flags_with_generated_names() {
        let file: Vec<config::Receiver> = serde_yaml::from_str(
            r#"
- { name: am, alertmanager: { url: "http://alertmanager:9093/" } }
- { name: hook, webhook: { url: "http://sink:8080/hook", timeout: 2s } }
"#,
        )
        .unwrap();
        let specs = receiver_specs(
            &file,
            &["http://a/1".into(), "http://a/2".into()],
            &["http://am2:9093".into()],
        )
        .unwrap();
        let got: Vec<(&str, Kind, String, Option<Duration>)> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.kind, s.target.to_string(), s.timeout))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "am",
                    Kind::Alertmanager,
                    "http://alertmanager:9093/api/v2/alerts".into(),
                    None
                ),
                (
                    "hook",
                    Kind::Webhook,
                    "http://sink:8080/hook".into(),
                    Some(Duration::from_secs(2))
                ),
                ("webhook-1", Kind::Webhook, "http://a/1".into(), None),
                ("webhook-2", Kind::Webhook, "http://a/2".into(), None),
                (
                    "alertmanager-1",
                    Kind::Alertmanager,
                    "http://am2:9093/api/v2/alerts".into(),
                    None
                ),
            ]
        );
    }

    #[test]
    fn bad_urls_credentials_in_urls_and_duplicate_names_are_refused_naming_them() {
        let err = |file: &[config::Receiver], hooks: &[&str]| {
            let hooks: Vec<String> = hooks.iter().map(|s| (*s).to_owned()).collect();
            receiver_specs(file, &hooks, &[]).unwrap_err()
        };
        let e = err(&[], &["https://admin:s3cret@secure/hook"]);
        assert!(matches!(e, Error::UserInfo { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("https://admin:<redacted>@secure/hook"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        let text = err(&[], &["ftp://x"]).to_string();
        assert!(text.contains("webhook-1") && text.contains("ftp://x"), "{text}");
        assert!(matches!(err(&[], &["http://"]), Error::Url { .. }));
        let file: Vec<config::Receiver> =
            serde_yaml::from_str(r#"[{ name: webhook-1, webhook: { url: "http://x" } }]"#).unwrap();
        let text = err(&file, &["http://y"]).to_string();
        assert!(text.contains("\"webhook-1\" is used twice"), "{text}");
        let both: Vec<config::Receiver> = serde_yaml::from_str(r#"[{ name: x }]"#).unwrap();
        assert!(matches!(err(&both, &[]), Error::Target { .. }));
    }

    /// A receiver from YAML (a `UrlTarget`), for the TLS and authentication tests.
    fn receiver_yaml(yaml: &str) -> Vec<config::Receiver> {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[tokio::test]
    async fn https_receivers_verify_against_the_ca_bundle_and_send_bearer_and_basic_auth() {
        let dir = std::env::temp_dir().join(format!("lifeline-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sink = Sink::start_tls(&dir).await;
        let ca = sink.ca_file.clone().unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "t0ken-1\n").unwrap();
        let password = dir.join("password");
        std::fs::write(&password, "pa55").unwrap();
        let file = receiver_yaml(&format!(
            r#"
- name: bearer
  webhook:
    url: "{url}/bearer"
    tls_config: {{ ca_file: "{ca}" }}
    authorization: {{ credentials_file: "{token}" }}
- name: basic
  alertmanager:
    url: "{url}"
    tls_config: {{ ca_file: "{ca}" }}
    basic_auth: {{ username: lifeline, password_file: "{password}" }}
"#,
            url = sink.url,
            ca = ca.display(),
            token = token.display(),
            password = password.display(),
        ));
        let sent = counter();
        let d = Dispatcher::start(&file, &[], &[], &sent, fast()).unwrap();
        d.submit(vec![firing("p1")]);
        let got = sink.wait_accepted(2, WAIT).await;
        let auth = |path: &str| {
            got.iter()
                .find(|r| r.path == path)
                .unwrap_or_else(|| panic!("no POST to {path}: {got:?}"))
                .authorization
                .clone()
        };
        assert_eq!(auth("/bearer").as_deref(), Some("Bearer t0ken-1"));
        // base64("lifeline:pa55")
        assert_eq!(
            auth("/api/v2/alerts").as_deref(),
            Some("Basic bGlmZWxpbmU6cGE1NQ==")
        );

        // A rotated token is read for the next request.
        std::fs::write(&token, "t0ken-2").unwrap();
        d.submit(vec![resolved("p1", at_ms(1))]);
        let got = sink.wait_accepted(4, WAIT).await;
        assert!(
            got.iter()
                .any(|r| r.authorization.as_deref() == Some("Bearer t0ken-2")),
            "{got:?}"
        );
        d.shutdown(WAIT).await;

        // Without the CA bundle, the system's roots do not know the sink: delivery fails.
        let untrusted = Dispatcher::start(&[], &[format!("{}/x", sink.url)], &[], &sent, fast()).unwrap();
        untrusted.submit(vec![firing("p2")]);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(count(&sent, "webhook-1", "error") >= 1);
        assert!(!sink.received().iter().any(|r| r.path == "/x"));
        untrusted.shutdown(Duration::from_millis(10)).await;
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unreadable_ca_bundles_and_credentials_are_refused_at_start_naming_them() {
        let dir = std::env::temp_dir().join(format!("lifeline-tls-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let start_err = |yaml: &str| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _guard = runtime.enter();
            Dispatcher::start(&receiver_yaml(yaml), &[], &[], &counter(), fast())
                .err()
                .expect(yaml)
                .to_string()
        };
        let text = start_err(&format!(
            r#"[{{ name: a, webhook: {{ url: "https://x", tls_config: {{ ca_file: "{}" }} }} }}]"#,
            not_pem.display()
        ));
        assert!(
            text.contains("receiver a: CA bundle") && text.contains("no PEM certificate"),
            "{text}"
        );
        let text = start_err(
            r#"[{ name: a, webhook: { url: "https://x", tls_config: { ca_file: /nonexistent/ca.pem } } }]"#,
        );
        assert!(text.contains("/nonexistent/ca.pem"), "{text}");
        let text = start_err(
            r#"[{ name: a, webhook: { url: "https://x", authorization: { credentials_file: /nonexistent/t } } }]"#,
        );
        assert!(
            text.contains("receiver a: credentials file /nonexistent/t"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_server_side_failures_are_retried() {
        let status = |code: u16| Error::Status {
            url: "u".into(),
            status: StatusCode::from_u16(code).unwrap(),
            body: String::new(),
        };
        assert!(status(503).is_retryable());
        assert!(status(429).is_retryable());
        assert!(status(408).is_retryable());
        assert!(!status(400).is_retryable());
        assert!(!status(404).is_retryable());
        let timeout = Error::Timeout {
            url: "u".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(timeout.is_retryable());
    }
}
