//! Kubernetes Events: deduplicated, rate-limited, written in the background.
//!
//! [`Book`] decides, synchronously and without I/O, what an emitted event becomes:
//!
//! - the first occurrence of (target, reason, message, type) within [`Limits::window`] is
//!   *created*, if a token is left in the target's bucket and in the global bucket; otherwise it
//!   is dropped (rate-limited);
//! - a repeat within the window only increments the count; the count is written (a *series*
//!   update on `events.k8s.io/v1`, `count`/`lastTimestamp` on core v1) at most once per
//!   [`Limits::update_every`], by the repeat itself or by a later [`Book::flush`], each write
//!   taking tokens like a creation.
//!
//! The writer task ([`EventWriter`], below) turns each [`Write`] into a request; an update whose event is
//! gone (404: events expire after an hour, or the create was lost) becomes a create carrying the
//! count, and a create that finds its name taken (409) becomes an update.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::{
    call,
    discovery::{ApiVersions, EventsApi},
    Error, Trouble,
};

/// `source.component` of core v1 events.
pub const COMPONENT: &str = "lifeline";
/// `reportingController` (`reportingComponent` on core v1).
pub const CONTROLLER: &str = "lifeline.dev/agent";
/// The longest `note`/`message` the apiserver accepts on `events.k8s.io/v1` (bytes).
pub const MESSAGE_LIMIT: usize = 1024;

/// What an event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventTarget {
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    Node {
        name: String,
    },
}

impl EventTarget {
    /// The namespace the Event object lives in: the pod's, or `default` for a node (as the
    /// kubelet does).
    pub fn event_namespace(&self) -> &str {
        match self {
            EventTarget::Pod { namespace, .. } => namespace,
            EventTarget::Node { .. } => "default",
        }
    }

    fn name(&self) -> &str {
        match self {
            EventTarget::Pod { name, .. } | EventTarget::Node { name } => name,
        }
    }

    /// The object reference (`regarding` / `involvedObject`); a node's UID is looked up by the
    /// writer, the node name standing in for it (the kubelet's convention) when unknown.
    fn reference(&self, node_uid: Option<&str>) -> Value {
        match self {
            EventTarget::Pod { namespace, name, uid } => json!({
                "apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid,
            }),
            EventTarget::Node { name } => json!({
                "apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid.unwrap_or(name),
            }),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Dedup and rate-limit settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// A repeat within this long of the previous occurrence counts into the same event.
    pub window: Duration,
    /// The least time between two writes of the same event.
    pub update_every: Duration,
    /// Per target: writes allowed at once, and one more per `per_target_every`.
    pub per_target_burst: u32,
    pub per_target_every: Duration,
    /// All targets together.
    pub global_burst: u32,
    pub global_every: Duration,
    /// Events remembered for dedup at most (the least recently seen are forgotten first).
    pub max_tracked: usize,
    /// Writes waiting for the writer task at most (more are dropped).
    pub queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10 * 60),
            update_every: Duration::from_secs(30),
            per_target_burst: 10,
            per_target_every: Duration::from_secs(60),
            global_burst: 50,
            global_every: Duration::from_secs(1),
            max_tracked: 4096,
            queue: 256,
        }
    }
}

/// One event as it is to be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `metadata.name`: `<object>.<hex nanoseconds>`, unique per agent.
    pub name: String,
    pub target: EventTarget,
    pub reason: String,
    pub message: String,
    pub type_: EventType,
    pub count: u32,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
}

/// A request for the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Create(Record),
    Update(Record),
}

/// What [`Book::admit`] made of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// To be written now.
    Write(Write),
    /// A repeat: counted; the count is written later.
    Counted,
    /// Dropped: the target's or the global rate limit is exhausted.
    RateLimited,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    target: EventTarget,
    reason: String,
    message: String,
    type_: EventType,
}

#[derive(Debug)]
struct Tracked {
    record: Record,
    last_seen: Instant,
    last_write: Instant,
    written_count: u32,
}

/// A token bucket: `burst` tokens, one more every `every`.
#[derive(Clone, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant, burst: u32, every: Duration) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        let rate = 1.0 / every.as_secs_f64().max(f64::MIN_POSITIVE);
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(burst));
        self.at = now;
    }
}

/// The dedup and rate-limit state. Pure: the caller passes the clocks.
#[derive(Debug)]
pub struct Book {
    limits: Limits,
    tracked: HashMap<Key, Tracked>,
    targets: HashMap<EventTarget, Bucket>,
    global: Bucket,
    last_nanos: i64,
}

impl Book {
    pub fn new(limits: Limits, now: Instant) -> Self {
        let global = Bucket::full(limits.global_burst, now);
        Self {
            limits,
            tracked: HashMap::new(),
            targets: HashMap::new(),
            global,
            last_nanos: 0,
        }
    }

    /// Decides what one emitted event becomes; `now` is monotonic, `wall` is for the timestamps.
    pub fn admit(
        &mut self,
        now: Instant,
        wall: DateTime<Utc>,
        target: EventTarget,
        reason: &str,
        message: &str,
        type_: EventType,
    ) -> Admission {
        self.prune(now);
        let message = truncate(message, MESSAGE_LIMIT);
        let key = Key {
            target,
            reason: reason.to_owned(),
            message: message.to_owned(),
            type_,
        };
        if let Some(t) = self.tracked.get_mut(&key) {
            t.record.count = t.record.count.saturating_add(1);
            t.record.last = wall;
            t.last_seen = now;
            let due = now.saturating_duration_since(t.last_write) >= self.limits.update_every;
            if due {
                if let Some(write) = self.update(&key, now) {
                    return Admission::Write(write);
                }
            }
            return Admission::Counted;
        }
        if !take(
            &mut self.targets,
            &mut self.global,
            &self.limits,
            &key.target,
            now,
        ) {
            return Admission::RateLimited;
        }
        if self.tracked.len() >= self.limits.max_tracked {
            if let Some(oldest) = self
                .tracked
                .iter()
                .min_by_key(|(_, t)| t.last_seen)
                .map(|(k, _)| k.clone())
            {
                self.tracked.remove(&oldest);
            }
        }
        let record = Record {
            name: self.event_name(key.target.name(), wall),
            target: key.target.clone(),
            reason: key.reason.clone(),
            message: key.message.clone(),
            type_,
            count: 1,
            first: wall,
            last: wall,
        };
        self.tracked.insert(
            key,
            Tracked {
                record: record.clone(),
                last_seen: now,
                last_write: now,
                written_count: 1,
            },
        );
        Admission::Write(Write::Create(record))
    }

    /// Updates due: events whose count grew since their last write, `update_every` ago or more,
    /// as far as the rate limits allow.
    pub fn flush(&mut self, now: Instant) -> Vec<Write> {
        self.prune(now);
        let mut due: Vec<&Key> = self
            .tracked
            .iter()
            .filter(|(_, t)| {
                t.record.count > t.written_count
                    && now.saturating_duration_since(t.last_write) >= self.limits.update_every
            })
            .map(|(k, _)| k)
            .collect();
        due.sort_by_key(|k| self.tracked[*k].last_write);
        let due: Vec<Key> = due.into_iter().cloned().collect();
        let mut out = Vec::new();
        for key in due {
            out.extend(self.update(&key, now));
        }
        out
    }

    /// The count update of tracked event `key`, marked written, if the rate limits give it a
    /// token; `None` if not.
    fn update(&mut self, key: &Key, now: Instant) -> Option<Write> {
        if !take(
            &mut self.targets,
            &mut self.global,
            &self.limits,
            &key.target,
            now,
        ) {
            return None;
        }
        let t = self.tracked.get_mut(key).expect("a tracked event");
        t.last_write = now;
        t.written_count = t.record.count;
        Some(Write::Update(t.record.clone()))
    }

    /// Forgets events not seen for a window, and buckets that refilled completely.
    fn prune(&mut self, now: Instant) {
        let window = self.limits.window;
        self.tracked
            .retain(|_, t| now.saturating_duration_since(t.last_seen) < window);
        let (burst, every) = (self.limits.per_target_burst, self.limits.per_target_every);
        self.targets.retain(|_, b| {
            b.refill(now, burst, every);
            b.tokens < f64::from(burst)
        });
    }

    /// `<object>.<hex nanoseconds>` (client-go's scheme), strictly increasing, at most 253 bytes.
    fn event_name(&mut self, object: &str, wall: DateTime<Utc>) -> String {
        let nanos = wall.timestamp_nanos_opt().unwrap_or(0).max(self.last_nanos + 1);
        self.last_nanos = nanos;
        let suffix = format!(".{nanos:x}");
        format!("{}{suffix}", truncate(object, 253 - suffix.len()))
    }
}

/// Takes a token from the target's bucket and the global one, only if both have one.
fn take(
    targets: &mut HashMap<EventTarget, Bucket>,
    global: &mut Bucket,
    limits: &Limits,
    target: &EventTarget,
    now: Instant,
) -> bool {
    global.refill(now, limits.global_burst, limits.global_every);
    let bucket = targets
        .entry(target.clone())
        .or_insert_with(|| Bucket::full(limits.per_target_burst, now));
    bucket.refill(now, limits.per_target_burst, limits.per_target_every);
    if bucket.tokens < 1.0 || global.tokens < 1.0 {
        return false;
    }
    bucket.tokens -= 1.0;
    global.tokens -= 1.0;
    true
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `events.k8s.io/v1` requires an `action`: what the agent did or found. Derived from the
/// reason: `…Reset…` → `ResetConnections`, `…Restart…`/`…Evict…` → `Evict`, else `Detect`.
pub fn action_of(reason: &str) -> &'static str {
    if reason.contains("Reset") {
        "ResetConnections"
    } else if reason.contains("Restart") || reason.contains("Evict") {
        "Evict"
    } else {
        "Detect"
    }
}

fn micro_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The body that creates `rec` (with its count so far).
pub fn create_body(api: EventsApi, rec: &Record, node: &str, node_uid: Option<&str>) -> Value {
    let namespace = rec.target.event_namespace();
    match api {
        EventsApi::EventsV1 => {
            let mut body = json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": rec.name, "namespace": namespace},
                "eventTime": micro_time(rec.first),
                "reportingController": CONTROLLER,
                "reportingInstance": truncate(node, 128),
                "action": action_of(&rec.reason),
                "reason": rec.reason,
                "regarding": rec.target.reference(node_uid),
                "note": rec.message,
                "type": rec.type_.as_str(),
            });
            if rec.count >= 2 {
                body["series"] = series(rec);
            }
            body
        }
        EventsApi::CoreV1 => json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": rec.name, "namespace": namespace},
            "involvedObject": rec.target.reference(node_uid),
            "reason": rec.reason,
            "message": rec.message,
            "type": rec.type_.as_str(),
            "source": {"component": COMPONENT, "host": node},
            "firstTimestamp": time(rec.first),
            "lastTimestamp": time(rec.last),
            "count": rec.count,
            "reportingComponent": CONTROLLER,
            "reportingInstance": node,
        }),
    }
}

fn series(rec: &Record) -> Value {
    json!({"count": rec.count, "lastObservedTime": micro_time(rec.last)})
}

/// The JSON merge patch that writes `rec`'s count.
pub fn update_patch(api: EventsApi, rec: &Record) -> Value {
    match api {
        EventsApi::EventsV1 => json!({ "series": series(rec) }),
        EventsApi::CoreV1 => json!({ "count": rec.count, "lastTimestamp": time(rec.last) }),
    }
}

// ---------------------------------------------------------------------------------------------
// The writer task

/// How often due event counts are written.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// Resolves once `stop` holds true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Writes the events the [`Book`] admitted.
pub(super) struct EventWriter {
    client: Client,
    server: String,
    node: String,
    /// The node's UID for node events: `None` until looked up, `Some(None)` if that failed.
    node_uid: Option<Option<String>>,
    book: Arc<Mutex<Book>>,
    trouble: Trouble,
}

impl EventWriter {
    pub(super) fn new(client: Client, server: String, node: String, book: Arc<Mutex<Book>>) -> Self {
        Self {
            client,
            server,
            node,
            node_uid: None,
            book,
            trouble: Trouble::new("writing events"),
        }
    }

    pub(super) async fn run(
        mut self,
        mut writes: mpsc::Receiver<Write>,
        mut versions: watch::Receiver<Option<ApiVersions>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let discovered = async {
            versions
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|v| v.as_ref().map(|v| v.events))
        };
        let api = tokio::select! {
            api = discovered => match api {
                Some(api) => api,
                None => return,
            },
            () = stopped(&mut stop) => return,
        };
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                write = writes.recv() => match write {
                    Some(write) => self.write(api, write).await,
                    None => return,
                },
                _ = flush.tick() => {
                    let due = self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner).flush(Instant::now());
                    for write in due {
                        self.write(api, write).await;
                    }
                }
                () = stopped(&mut stop) => {
                    while let Ok(write) = writes.try_recv() {
                        self.write(api, write).await;
                    }
                    return;
                }
            }
        }
    }

    async fn write(&mut self, api: EventsApi, write: Write) {
        let (record, create) = match write {
            Write::Create(r) => (r, true),
            Write::Update(r) => (r, false),
        };
        let node_uid = match &record.target {
            EventTarget::Node { .. } => self.node_uid().await,
            EventTarget::Pod { .. } => None,
        };
        let collection = api.collection(record.target.event_namespace());
        let post = || {
            let body = create_body(api, &record, &self.node, node_uid.as_deref());
            http::Request::post(&collection)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.to_string().into_bytes())
                .expect("a valid request")
        };
        let patch = || {
            http::Request::patch(format!("{collection}/{}", record.name))
                .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
                .body(update_patch(api, &record).to_string().into_bytes())
                .expect("a valid request")
        };
        let first = if create { post() } else { patch() };
        let what = |create: bool| {
            format!(
                "{} event {}/{} ({} {})",
                if create { "creating" } else { "updating" },
                record.target.event_namespace(),
                record.name,
                record.reason,
                api.api_version()
            )
        };
        let result = match call(&self.server, &what(create), self.client.request_text(first)).await {
            // The create's name is taken (a retry that had succeeded): write the count instead.
            Err(Error::Request {
                err: kube::Error::Api(status),
                ..
            }) if create && status.code == 409 => {
                call(&self.server, &what(false), self.client.request_text(patch())).await
            }
            // The event to update is gone (expired, or its create was lost): create it anew.
            Err(Error::Request {
                err: kube::Error::Api(status),
                ..
            }) if !create && status.code == 404 => {
                call(&self.server, &what(true), self.client.request_text(post())).await
            }
            other => other,
        };
        match result {
            Ok(_) => self.trouble.ok(),
            Err(err) => self.trouble.failed(&err),
        }
    }

    async fn node_uid(&mut self) -> Option<String> {
        if let Some(known) = &self.node_uid {
            return known.clone();
        }
        let api = Api::<Node>::all(self.client.clone());
        let what = format!("GET node {}", self.node);
        let uid = match call(&self.server, &what, api.get(&self.node)).await {
            Ok(node) => node.metadata.uid,
            Err(err) => {
                tracing::debug!(
                    "{}; node events use the node name as its UID",
                    crate::error::chain(&err)
                );
                None
            }
        };
        self.node_uid = Some(uid.clone());
        uid
    }
}

#[cfg(test)]
mod tests;
