//! Requests: routing, the generic verbs (list, watch, get, create, patch, delete) for every
//! kind at every served group-version, the pod eviction subresource, and the fixture's own
//! control endpoints under `/fixture/`.
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::kinds::{self, ingest, list_item, render, Generation, Gv, Kind, Resource, CORE};
use super::patch::{json_patch, merge_patch};
use super::select::{label_selector_matches, FieldSelector, LabelSelector};
use super::store::{Change, Store};
use super::util::{
    event_line, full, json_response, ok, parse_bool, parse_query, rfc3339, stream_lines, streaming, unix_now,
    ApiError, ApiResult, Body, Query,
};
use super::Server;

/// The largest request body accepted (the real apiserver's limit).
const MAX_BODY: usize = 3 << 20;

/// How the client asked for objects to be shown.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Format {
    Object,
    /// A Table with rows holding the object as none, PartialObjectMetadata, or the object.
    Table(Include),
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Include {
    None,
    Metadata,
    Object,
}

fn format_of(accept: &str, query: &Query) -> Format {
    if !accept.contains("as=Table") {
        return Format::Object;
    }
    Format::Table(match query.get("includeObject").map(String::as_str) {
        Some("None") => Include::None,
        Some("Object") => Include::Object,
        _ => Include::Metadata,
    })
}

/// One request, its body read.
struct Ctx {
    srv: Arc<Server>,
    peer: SocketAddr,
    method: Method,
    query: Query,
    format: Format,
    content_type: String,
    body: Bytes,
}

impl Ctx {
    fn generation(&self) -> Generation {
        self.srv.cfg.generation
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.srv.store.lock().unwrap()
    }

    fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|d| d == "All")
    }

    /// The body as a JSON object.
    fn json_body(&self) -> ApiResult<Value> {
        let value: Value = serde_json::from_slice(&self.body).map_err(|e| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized: couldn't parse the request body as JSON: {e}"
            ))
        })?;
        if !value.is_object() && !value.is_array() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        Ok(value)
    }
}

fn header_str(req: &Request<Incoming>, name: header::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

pub async fn handle(
    srv: Arc<Server>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let ua = match header_str(&req, header::USER_AGENT) {
        ua if ua.is_empty() => "-".to_string(),
        ua => ua,
    };
    let accept = header_str(&req, header::ACCEPT);
    let content_type = header_str(&req, header::CONTENT_TYPE);
    let target = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    srv.log(format_args!(
        "{peer} {} {target} {:?} ua={ua:?}",
        req.method(),
        req.version()
    ));
    let query = parse_query(req.uri().query());
    let format = format_of(&accept, &query);
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body could not be read: {e}"),
            Value::Null,
        )),
    };
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    let result = body.and_then(|body| {
        let cx = Ctx {
            srv: srv.clone(),
            peer,
            method: method.clone(),
            query,
            format,
            content_type,
            body,
        };
        route(&cx, &segs)
    });
    let mut resp = result.unwrap_or_else(|e| e.response());
    if method != Method::GET {
        srv.log(format_args!(
            "{peer} {method} {path} -> {}",
            resp.status().as_u16()
        ));
    }
    let audit_id = format!("{:032x}", unix_now().as_nanos() ^ u128::from(peer.port()));
    if let Ok(v) = audit_id.parse() {
        resp.headers_mut().insert("audit-id", v);
    }
    Ok(resp)
}

fn route(cx: &Ctx, segs: &[&str]) -> ApiResult<Response<Body>> {
    let generation = cx.generation();
    let get_only = || {
        if cx.method == Method::GET {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(cx.method.as_str()))
        }
    };
    match segs {
        ["fixture", rest @ ..] => fixture(cx, rest),
        [] => get_only().map(|()| ok(&generation.root_paths())),
        ["version"] => get_only().map(|()| {
            ok(&generation.version_info(cx.srv.cfg.server_version.as_deref()))
        }),
        ["healthz" | "readyz" | "livez"] => {
            get_only().map(|()| full(StatusCode::OK, "text/plain; charset=utf-8", "ok"))
        }
        ["api"] => get_only().map(|()| {
            ok(&json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": cx.srv.local.to_string()}],
            }))
        }),
        ["apis"] => get_only().map(|()| ok(&generation.group_list())),
        ["apis", group] => {
            get_only()?;
            generation
                .group(group)
                .map(|g| ok(&g))
                .ok_or_else(ApiError::no_route)
        }
        ["api", "v1", rest @ ..] => api(cx, CORE, rest),
        ["apis", group, version, rest @ ..] => {
            let gv = generation.gv(group, version).ok_or_else(ApiError::no_route)?;
            api(cx, gv, rest)
        }
        _ => Err(ApiError::no_route()),
    }
}

/// A path under a served group-version.
fn api(cx: &Ctx, gv: Gv, rest: &[&str]) -> ApiResult<Response<Body>> {
    let generation = cx.generation();
    if rest.is_empty() {
        if cx.method != Method::GET {
            return Err(ApiError::method_not_allowed(cx.method.as_str()));
        }
        return generation
            .resource_list(gv)
            .map(|l| ok(&l))
            .ok_or_else(ApiError::no_route);
    }
    let (ns, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(*ns), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(*n), None),
        [p, n, s] => (*p, Some(*n), Some(*s)),
        _ => return Err(ApiError::no_route()),
    };
    let res = generation.resolve(gv, plural).ok_or_else(ApiError::no_route)?;
    let namespaced = res.kind.namespaced();
    if (ns.is_some() && !namespaced) || (ns.is_none() && name.is_some() && namespaced) {
        return Err(ApiError::no_route());
    }
    let verb = |v: &str| {
        if res.allows(v) {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(cx.method.as_str()))
        }
    };
    let m = &cx.method;
    match (name, sub) {
        (None, None) if m == Method::GET => {
            if parse_bool(cx.query.get("watch")) {
                verb("watch")?;
                watch(cx, res, ns)
            } else {
                verb("list")?;
                list(cx, res, ns)
            }
        }
        (None, None) if m == Method::POST && (ns.is_some() || !namespaced) => {
            verb("create")?;
            create(cx, res, ns.unwrap_or(""))
        }
        (Some(name), None) if m == Method::GET => {
            verb("get")?;
            get(cx, res, ns.unwrap_or(""), name)
        }
        (Some(name), None) if m == Method::DELETE => {
            verb("delete")?;
            delete(cx, res, ns.unwrap_or(""), name)
        }
        (Some(name), None) if m == Method::PATCH => {
            verb("patch")?;
            patch(cx, res, ns.unwrap_or(""), name)
        }
        (Some(name), Some("eviction")) if res.kind == Kind::Pod && gv == CORE => {
            if m != Method::POST {
                return Err(ApiError::method_not_allowed(m.as_str()));
            }
            Ok(evict(cx, ns.unwrap_or(""), name))
        }
        (_, Some(_)) => Err(ApiError::no_route()),
        _ => Err(ApiError::method_not_allowed(m.as_str())),
    }
}

// ---------------------------------------------------------------------------------------------
// Reading: list, get, watch

/// Which objects a list or watch wants.
#[derive(Clone)]
struct Selection {
    kind: Kind,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selection {
    fn new(res: Resource, ns: Option<&str>, query: &Query) -> ApiResult<Selection> {
        let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(
            query.get("fieldSelector").map_or("", String::as_str),
            res.kind.field_labels(),
        )
        .map_err(ApiError::bad_request)?;
        Ok(Selection {
            kind: res.kind,
            ns: ns.map(str::to_string),
            labels,
            fields,
        })
    }

    fn selects(&self, o: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|ns| o["metadata"]["namespace"] == ns)
            && self.labels.matches(&o["metadata"]["labels"])
            && self.fields.matches(o, |o, f| self.kind.field_value(o, f))
    }

    /// The watch event `change` makes for this selection, as the real watch cache does: an
    /// object that starts (stops) matching is ADDED (DELETED, as it was before the change).
    fn event(&self, change: &Change) -> Option<(&'static str, Arc<Value>)> {
        if change.kind != self.kind {
            return None;
        }
        let is = self.selects(&change.object);
        let was = change.prev.as_deref().is_some_and(|p| self.selects(p));
        match (change.verb, was, is) {
            ("ADDED", _, true) => Some(("ADDED", change.object.clone())),
            ("DELETED", _, true) => Some(("DELETED", change.object.clone())),
            ("MODIFIED", true, true) => Some(("MODIFIED", change.object.clone())),
            ("MODIFIED", false, true) => Some(("ADDED", change.object.clone())),
            ("MODIFIED", true, false) => {
                let mut old = change.prev.as_deref().cloned().unwrap_or(Value::Null);
                old["metadata"]["resourceVersion"] = json!(change.rv.to_string());
                Some(("DELETED", Arc::new(old)))
            }
            _ => None,
        }
    }
}

fn table(res: Resource, objects: &[&Value], include: Include, rv: u64, headers: bool) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match include {
                Include::None => Value::Null,
                Include::Metadata => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                }),
                Include::Object => render(res.kind, res.gv, o),
            };
            json!({"cells": kinds::table_cells(res.kind, o), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": if headers { kinds::table_columns(res.kind) } else { Value::Null },
        "rows": rows,
    })
}

fn list(cx: &Ctx, res: Resource, ns: Option<&str>) -> ApiResult<Response<Body>> {
    let selection = Selection::new(res, ns, &cx.query)?;
    let store = cx.store();
    let matching: Vec<&Value> = store
        .list(res.kind)
        .iter()
        .filter(|o| selection.selects(o))
        .collect();
    let offset = match cx.query.get("continue").filter(|c| !c.is_empty()) {
        None => 0,
        Some(token) => match token
            .strip_prefix("ll-offset-")
            .and_then(|o| o.parse::<usize>().ok())
        {
            Some(o) => o.min(matching.len()),
            None => return Err(ApiError::bad_request(format!("invalid continue token {token:?}"))),
        },
    };
    let limit = cx
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0)
        .unwrap_or(usize::MAX);
    let end = offset.saturating_add(limit).min(matching.len());
    let page = &matching[offset..end];
    let mut metadata = json!({"resourceVersion": store.rv.to_string()});
    if end < matching.len() {
        metadata["continue"] = json!(format!("ll-offset-{end}"));
        metadata["remainingItemCount"] = json!(matching.len() - end);
    }
    let mut body = match cx.format {
        Format::Object => json!({
            "kind": format!("{}List", res.kind.name()),
            "apiVersion": res.gv.api_version(),
            "metadata": {},
            "items": page.iter().map(|o| list_item(&render(res.kind, res.gv, o))).collect::<Vec<_>>(),
        }),
        Format::Table(include) => table(res, page, include, store.rv, true),
    };
    body["metadata"] = metadata;
    let scoped = format!("{}/{}", ns.unwrap_or("*"), res.kind.plural());
    let named = |list: &[String]| list.iter().any(|r| r == res.kind.plural() || *r == scoped);
    if named(&cx.srv.cfg.hang_lists) {
        return Ok(hung_midway(cx, body.to_string().into_bytes()));
    }
    if named(&cx.srv.cfg.chunk_lists) {
        return Ok(streamed_whole(body.to_string().into_bytes()));
    }
    Ok(ok(&body))
}

/// A response that sends `body` whole in two chunks and ends (`--chunk-lists`).
fn streamed_whole(mut body: Vec<u8>) -> Response<Body> {
    let rest = body.split_off(body.len() / 2);
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        for part in [body, rest] {
            if tx.send(Bytes::from(part)).await.is_err() {
                return;
            }
        }
    });
    streaming(rx)
}

/// A response that sends the first half of `body` and never the rest (`--hang-lists`).
fn hung_midway(cx: &Ctx, mut body: Vec<u8>) -> Response<Body> {
    let (srv, peer) = (cx.srv.clone(), cx.peer);
    srv.log(format_args!("{peer} list hangs mid-answer (--hang-lists)"));
    body.truncate(body.len() / 2);
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        if tx.send(Bytes::from(body)).await.is_ok() {
            tx.closed().await;
        }
        srv.log(format_args!("{peer} hung list end: client gone"));
    });
    streaming(rx)
}

/// A Node nobody stored: the server answers for any node name.
fn synthetic_node(cx: &Ctx, store: &mut Store, name: &str) -> Value {
    let mut node = kinds::node(name, cx.generation(), store.start_secs);
    node["metadata"]["uid"] = json!(store.new_uid());
    node["metadata"]["resourceVersion"] = json!(store.rv.to_string());
    node
}

fn get(cx: &Ctx, res: Resource, ns: &str, name: &str) -> ApiResult<Response<Body>> {
    let mut store = cx.store();
    let object = match store.get(res.kind, ns, name) {
        Some(o) => o.clone(),
        None if res.kind == Kind::Node => synthetic_node(cx, &mut store, name),
        None => return Err(ApiError::not_found(res.gv.group, res.kind.plural(), name)),
    };
    Ok(match cx.format {
        Format::Object => ok(&render(res.kind, res.gv, &object)),
        Format::Table(include) => ok(&table(res, &[&object], include, store.rv, true)),
    })
}

fn watch(cx: &Ctx, res: Resource, ns: Option<&str>) -> ApiResult<Response<Body>> {
    let srv = &cx.srv;
    let peer = cx.peer;
    let selection = Selection::new(res, ns, &cx.query)?;
    let cap = srv.cfg.watch_timeout;
    let timeout = match cx.query.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()) {
        Some(t) if t > 0 => Duration::from_secs(t).min(cap),
        _ => cap,
    };
    let bookmarks = parse_bool(cx.query.get("allowWatchBookmarks")).then_some(srv.cfg.bookmark_interval);
    let from = match cx.query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersion: Invalid value: \"{rv}\": strconv.ParseUint: parsing \"{rv}\": invalid syntax"
                )))
            }
        },
    };
    let format = cx.format;
    let render_event = move |kind: &str, object: &Value, rv: u64| -> Bytes {
        match format {
            Format::Object => event_line(kind, &render(res.kind, res.gv, object)),
            Format::Table(include) => event_line(kind, &table(res, &[object], include, rv, false)),
        }
    };
    let (changes, initial, progress) = {
        let store = cx.store();
        let changes = store.subscribe();
        let initial: Vec<Bytes> = match from {
            None => store
                .list(res.kind)
                .iter()
                .filter(|o| selection.selects(o))
                .map(|o| render_event("ADDED", o, store.rv))
                .collect(),
            Some(rv) => match store.since(rv, res.kind) {
                None => {
                    let status = ApiError::new(
                        410,
                        "Expired",
                        format!("too old resource version: {rv} ({})", store.oldest),
                        Value::Null,
                    )
                    .status_object();
                    srv.log(format_args!(
                        "{peer} watch from rv {rv}: expired (oldest {})",
                        store.oldest
                    ));
                    return Ok(streaming(stream_lines(vec![event_line("ERROR", &status)])));
                }
                Some(history) => history
                    .iter()
                    .filter_map(|c| selection.event(c).map(|(k, o)| render_event(k, &o, c.rv)))
                    .collect(),
            },
        };
        (changes, initial, store.rv)
    };
    srv.log(format_args!(
        "{peer} watch start {}/{} ns={} from={from:?} timeout={timeout:?} bookmarks={bookmarks:?} initial={}",
        res.gv.api_version(),
        res.kind.plural(),
        ns.unwrap_or("*"),
        initial.len()
    ));
    let (tx, rx) = mpsc::channel(64);
    let scoped = format!("{}/{}", ns.unwrap_or("*"), res.kind.plural());
    let hangs = srv
        .cfg
        .hang_watches
        .iter()
        .any(|r| r == res.kind.plural() || *r == scoped)
        && srv
            .cfg
            .hang_first
            .is_none_or(|first| srv.hung.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < first);
    if hangs {
        srv.log(format_args!(
            "{peer} watch of {} hangs (--hang-watches)",
            res.kind.plural()
        ));
        let srv = srv.clone();
        tokio::spawn(async move {
            for line in initial {
                if tx.send(line).await.is_err() {
                    return;
                }
            }
            tx.closed().await;
            srv.log(format_args!("{peer} hung watch end: client gone"));
        });
        return Ok(streaming(rx));
    }
    let task = WatchTask {
        srv: srv.clone(),
        peer,
        res,
        tx,
        changes,
        selection,
        progress,
        bookmarks,
        deadline: Instant::now() + timeout,
    };
    tokio::spawn(task.run(initial, render_event));
    Ok(streaming(rx))
}

struct WatchTask {
    srv: Arc<Server>,
    peer: SocketAddr,
    res: Resource,
    tx: mpsc::Sender<Bytes>,
    changes: broadcast::Receiver<Change>,
    selection: Selection,
    /// The newest resourceVersion this watch has seen (sent or filtered out).
    progress: u64,
    bookmarks: Option<Duration>,
    deadline: Instant,
}

impl WatchTask {
    async fn run(mut self, initial: Vec<Bytes>, render: impl Fn(&str, &Value, u64) -> Bytes) {
        let mut sent = 0usize;
        for line in initial {
            if self.tx.send(line).await.is_err() {
                self.srv.log(format_args!("{} watch end: client gone", self.peer));
                return;
            }
            sent += 1;
        }
        let mut bookmark = self
            .bookmarks
            .map(|every| tokio::time::interval_at(Instant::now() + every, every));
        let why = loop {
            let next_bookmark = async {
                match bookmark.as_mut() {
                    Some(ticker) => ticker.tick().await,
                    None => std::future::pending().await,
                }
            };
            let line = tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => break "timeout",
                _ = self.tx.closed() => break "client gone",
                _ = next_bookmark => event_line(
                    "BOOKMARK",
                    &json!({
                        "kind": self.res.kind.name(),
                        "apiVersion": self.res.gv.api_version(),
                        "metadata": {"resourceVersion": self.progress.to_string()},
                    }),
                ),
                change = self.changes.recv() => match change {
                    Ok(change) => {
                        if change.rv <= self.progress {
                            continue;
                        }
                        self.progress = change.rv;
                        match self.selection.event(&change) {
                            Some((kind, object)) => render(kind, &object, change.rv),
                            None => continue,
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => break "lagged",
                    Err(broadcast::error::RecvError::Closed) => break "closed",
                },
            };
            if self.tx.send(line).await.is_err() {
                break "client gone";
            }
            sent += 1;
        };
        self.srv
            .log(format_args!("{} watch end: {why}, {sent} events sent", self.peer));
    }
}

// ---------------------------------------------------------------------------------------------
// Writing: create, patch, delete

/// Checks a body's apiVersion and kind against what the endpoint serves.
fn check_type_meta(body: &Value, res: Resource) -> ApiResult<()> {
    let expected = res.gv.api_version();
    let kind = body["kind"].as_str().unwrap_or("");
    let api_version = body["apiVersion"].as_str().unwrap_or("");
    if !kind.is_empty() && kind != res.kind.name() {
        let version = api_version.rsplit('/').next().unwrap_or("");
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {}: the kind in the data ({kind}) does not match {}",
            res.kind.name(),
            res.kind.name()
        )));
    }
    if !api_version.is_empty() && api_version != expected {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({expected})"
        )));
    }
    Ok(())
}

fn check_namespace(body: &mut Value, ns: &str, namespaced: bool) -> ApiResult<()> {
    let given = body["metadata"]["namespace"].as_str().unwrap_or("").to_string();
    if namespaced {
        if !given.is_empty() && given != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        body["metadata"]["namespace"] = json!(ns);
    } else if let Some(m) = body["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(())
}

/// Five characters for `generateName`, from the real alphabet.
fn random_suffix(seed: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = seed ^ (unix_now().as_nanos() as u64) ^ 0x9e37_79b9_7f4a_7c15;
    (0..5)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

fn qualified_plural(res: Resource) -> String {
    if res.gv.group.is_empty() {
        res.kind.plural().to_string()
    } else {
        format!("{}.{}", res.kind.plural(), res.gv.group)
    }
}

/// Records an Event request in the journal.
fn journal_event(cx: &Ctx, res: Resource, verb: &str, ns: &str, name: &str, code: u16, object: &Value) {
    if res.kind != Kind::Event {
        return;
    }
    cx.srv.journal.lock().unwrap().events.push(json!({
        "verb": verb,
        "apiVersion": res.gv.api_version(),
        "namespace": ns,
        "name": name,
        "code": code,
        "object": object,
        "at": rfc3339(unix_now().as_secs()),
    }));
}

fn create(cx: &Ctx, res: Resource, ns: &str) -> ApiResult<Response<Body>> {
    let result = create_inner(cx, res, ns);
    if res.kind == Kind::Event {
        let (code, object) = match &result {
            Ok(o) => (201, o.clone()),
            Err(e) => (e.code, serde_json::from_slice(&cx.body).unwrap_or(Value::Null)),
        };
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_string();
        journal_event(cx, res, "create", ns, &name, code, &object);
    }
    result.map(|o| json_response(StatusCode::CREATED, &o))
}

fn create_inner(cx: &Ctx, res: Resource, ns: &str) -> ApiResult<Value> {
    let mut body = cx.json_body()?;
    check_type_meta(&body, res)?;
    check_namespace(&mut body, ns, res.kind.namespaced())?;
    if body["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let mut store = cx.store();
    let mut name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    let generate = body["metadata"]["generateName"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if name.is_empty() && !generate.is_empty() {
        for attempt in 0.. {
            let candidate = format!("{generate}{}", random_suffix(attempt));
            if store.get(res.kind, ns, &candidate).is_none() {
                name = candidate;
                break;
            }
        }
        body["metadata"]["name"] = json!(name);
    }
    let mut internal = ingest(res.kind, res.gv, body);
    let mut errors = Vec::new();
    if res.kind == Kind::Event {
        errors = kinds::validate_event(res.gv, &internal);
    } else if name.is_empty() {
        errors.push((
            "metadata.name".to_string(),
            "FieldValueRequired",
            "Required value: name or generateName is required".to_string(),
        ));
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid(res.kind.name(), res.gv.group, &name, &errors));
    }
    if res.kind == Kind::PodDisruptionBudget {
        internal = kinds::loaded_pdb(internal).map_err(ApiError::bad_request)?;
    }
    if store.get(res.kind, ns, &name).is_some() {
        let mut details = json!({"name": name, "kind": res.kind.plural()});
        if !res.gv.group.is_empty() {
            details["group"] = json!(res.gv.group);
        }
        return Err(ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified_plural(res)),
            details,
        ));
    }
    let stored = if cx.dry_run() {
        internal
    } else {
        store.insert(res.kind, internal)
    };
    Ok(render(res.kind, res.gv, &stored))
}

/// The fields an events.k8s.io/v1 Event may not change once created (internal names).
const EVENT_IMMUTABLE: [&str; 13] = [
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "type",
    "eventTime",
    "action",
    "related",
    "reportingComponent",
    "reportingInstance",
];

fn patch(cx: &Ctx, res: Resource, ns: &str, name: &str) -> ApiResult<Response<Body>> {
    let result = patch_inner(cx, res, ns, name);
    if res.kind == Kind::Event {
        let (code, object) = match &result {
            Ok(o) => (200, o.clone()),
            Err(e) => (e.code, serde_json::from_slice(&cx.body).unwrap_or(Value::Null)),
        };
        journal_event(cx, res, "patch", ns, name, code, &object);
    }
    result.map(|o| ok(&o))
}

fn patch_inner(cx: &Ctx, res: Resource, ns: &str, name: &str) -> ApiResult<Value> {
    let media = cx.content_type.split(';').next().unwrap_or("").trim();
    let json_patch_type = match media {
        "application/json-patch+json" => true,
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+yaml" => false,
        _ => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: \
                     application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml \
                     (got {media:?})"
                ),
                Value::Null,
            ))
        }
    };
    let patch = cx.json_body()?;
    let mut store = cx.store();
    let current = match store.get(res.kind, ns, name) {
        Some(o) => o.clone(),
        None if res.kind == Kind::Node => {
            let node = synthetic_node(cx, &mut store, name);
            store.insert(Kind::Node, node)
        }
        None => return Err(ApiError::not_found(res.gv.group, res.kind.plural(), name)),
    };
    let mut external = render(res.kind, res.gv, &current);
    if json_patch_type {
        json_patch(&mut external, &patch).map_err(|e| {
            ApiError::new(
                422,
                "Invalid",
                format!("the server rejected our request due to an error in our request: {e}"),
                Value::Null,
            )
        })?;
    } else {
        if !patch.is_object() {
            return Err(ApiError::bad_request("a merge patch must be a JSON object"));
        }
        merge_patch(&mut external, &patch);
    }
    let meta = &external["metadata"];
    if meta["name"] != name || (res.kind.namespaced() && meta["namespace"] != ns) {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta["name"].as_str().unwrap_or("")
        )));
    }
    let current_rv = current["metadata"]["resourceVersion"].clone();
    if meta["resourceVersion"] != current_rv {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply \
                 your changes to the latest version and try again",
                qualified_plural(res)
            ),
            json!({"name": name, "kind": res.kind.plural()}),
        ));
    }
    let updated = ingest(res.kind, res.gv, external);
    if res.kind == Kind::Event && res.gv.group == "events.k8s.io" && res.gv.version == "v1" {
        let mut errors = Vec::new();
        for field in EVENT_IMMUTABLE {
            if updated.get(field) != current.get(field) {
                errors.push((
                    field.to_string(),
                    "FieldValueInvalid",
                    format!(
                        "Invalid value: {}: field is immutable",
                        updated.get(field).unwrap_or(&Value::Null)
                    ),
                ));
            }
        }
        if updated.get("series") != current.get("series") {
            if let Some(series) = updated.get("series").filter(|s| !s.is_null()) {
                if series["count"].as_i64().unwrap_or(0) < 2 {
                    errors.push((
                        "series.count".into(),
                        "FieldValueInvalid",
                        "Invalid value: \"\": should be at least 2".into(),
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::invalid(res.kind.name(), res.gv.group, name, &errors));
        }
    }
    // Unchanged: a no-op, no new resourceVersion and no watch event, as the real one.
    if updated == current || cx.dry_run() {
        return Ok(render(res.kind, res.gv, &updated));
    }
    let stored = store.replace(res.kind, updated).expect("the object exists");
    Ok(render(res.kind, res.gv, &stored))
}

fn delete(cx: &Ctx, res: Resource, ns: &str, name: &str) -> ApiResult<Response<Body>> {
    let removed = {
        let mut store = cx.store();
        if cx.dry_run() {
            store.get(res.kind, ns, name).cloned()
        } else {
            store.remove(res.kind, ns, name)
        }
    };
    if res.kind == Kind::Pod {
        let code = if removed.is_some() { 200 } else { 404 };
        cx.srv.journal.lock().unwrap().deletions.push(json!({
            "namespace": ns,
            "name": name,
            "outcome": if removed.is_some() { "deleted" } else { "not-found" },
            "code": code,
            "dryRun": cx.dry_run(),
            "at": rfc3339(unix_now().as_secs()),
        }));
    }
    let removed = removed.ok_or_else(|| ApiError::not_found(res.gv.group, res.kind.plural(), name))?;
    if res.kind == Kind::Pod {
        // Pods answer with the object; other kinds with a Status.
        return Ok(ok(&render(res.kind, res.gv, &removed)));
    }
    let mut details = json!({"name": name, "kind": res.kind.plural(), "uid": removed["metadata"]["uid"]});
    if !res.gv.group.is_empty() {
        details["group"] = json!(res.gv.group);
    }
    Ok(ok(&json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })))
}

// ---------------------------------------------------------------------------------------------
// The eviction subresource

/// What an eviction request came to.
struct Evicted {
    outcome: &'static str,
    pdb: Option<String>,
}

fn evict(cx: &Ctx, ns: &str, name: &str) -> Response<Body> {
    let body: Value = serde_json::from_slice(&cx.body).unwrap_or(Value::Null);
    let api_version = body["apiVersion"].as_str().unwrap_or("").to_string();
    let dry_run = cx.dry_run()
        || body["deleteOptions"]["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x == "All"));
    let result = evict_inner(cx, &body, ns, name, dry_run);
    let (code, outcome, pdb, message) = match &result {
        Ok(e) => (201, e.outcome, e.pdb.clone(), String::new()),
        Err((e, pdb)) => {
            let outcome = match e.code {
                429 => "blocked",
                404 => "not-found",
                400 => "rejected",
                _ => "error",
            };
            (e.code, outcome, pdb.clone(), e.message.clone())
        }
    };
    cx.srv.journal.lock().unwrap().evictions.push(json!({
        "namespace": ns,
        "name": name,
        "apiVersion": api_version,
        "outcome": outcome,
        "code": code,
        "pdb": pdb,
        "message": message,
        "dryRun": dry_run,
        "at": rfc3339(unix_now().as_secs()),
    }));
    match result {
        Ok(_) => json_response(
            StatusCode::CREATED,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        ),
        Err((e, _)) => {
            let mut resp = e.response();
            if let Some(after) = e.details["retryAfterSeconds"].as_u64() {
                if let Ok(v) = after.to_string().parse() {
                    resp.headers_mut().insert(header::RETRY_AFTER, v);
                }
            }
            resp
        }
    }
}

type EvictError = (ApiError, Option<String>);

/// The eviction itself, as the real EvictionREST.Create (simplified: pods go at once).
fn evict_inner(cx: &Ctx, body: &Value, ns: &str, name: &str, dry_run: bool) -> Result<Evicted, EvictError> {
    let generation = cx.generation();
    let plain = |e: ApiError| (e, None);
    if !body.is_object() {
        return Err(plain(ApiError::bad_request(
            "the object provided is unrecognized: the request body must be a JSON Eviction",
        )));
    }
    let served = generation.eviction_gv().api_version();
    let api_version = body["apiVersion"].as_str().unwrap_or(&served).to_string();
    let kind = body["kind"].as_str().unwrap_or("Eviction");
    if !generation.eviction_known().contains(&api_version.as_str()) || kind != "Eviction" {
        // The scheme cannot decode it (a 1.18 apiserver has never heard of policy/v1).
        let version = api_version.rsplit('/').next().unwrap_or("");
        return Err(plain(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a Eviction: no kind \"{kind}\" is registered \
             for version \"{api_version}\" in scheme \"k8s.io/kubernetes/pkg/api/legacyscheme/scheme.go:30\""
        ))));
    }
    if cx.srv.cfg.strict_eviction && api_version != served {
        return Err(plain(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({served})"
        ))));
    }
    let body_ns = body["metadata"]["namespace"].as_str().unwrap_or("");
    if !body_ns.is_empty() && body_ns != ns {
        return Err(plain(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )));
    }
    if body["metadata"]["name"].as_str().unwrap_or("") != name {
        return Err(plain(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        )));
    }
    let mut store = cx.store();
    let pod = store
        .get(Kind::Pod, ns, name)
        .cloned()
        .ok_or_else(|| plain(ApiError::not_found("", "pods", name)))?;
    let delete = |store: &mut Store| {
        if !dry_run {
            store.remove(Kind::Pod, ns, name);
        }
    };
    if matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
        delete(&mut store);
        return Ok(Evicted {
            outcome: "evicted",
            pdb: None,
        });
    }
    let labels = &pod["metadata"]["labels"];
    let pdbs: Vec<Value> = store
        .list(Kind::PodDisruptionBudget)
        .iter()
        .filter(|p| p["metadata"]["namespace"] == ns)
        .filter(|p| label_selector_matches(&p["spec"]["selector"], labels, generation == Generation::New))
        .cloned()
        .collect();
    let pdb = match pdbs.as_slice() {
        [] => {
            delete(&mut store);
            return Ok(Evicted {
                outcome: "evicted",
                pdb: None,
            });
        }
        [one] => one.clone(),
        _ => {
            let msg = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
            return Err(plain(ApiError::new(
                500,
                "InternalError",
                format!("Internal error occurred: {msg}"),
                json!({"causes": [{"message": msg}]}),
            )));
        }
    };
    let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or("").to_string();
    let blocked = |retry: u64, cause: String| {
        let mut details = json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]});
        if retry > 0 {
            details["retryAfterSeconds"] = json!(retry);
        }
        (
            ApiError::new(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                details,
            ),
            Some(pdb_name.clone()),
        )
    };
    let status = &pdb["status"];
    if let (Some(observed), Some(generation)) = (
        status["observedGeneration"].as_i64(),
        pdb["metadata"]["generation"].as_i64(),
    ) {
        if observed < generation {
            return Err(blocked(
                10,
                format!("The disruption budget {pdb_name} is still being processed by the server."),
            ));
        }
    }
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
    if allowed < 0 {
        return Err((
            ApiError::new(
                403,
                "Forbidden",
                format!("poddisruptionbudgets.policy \"{pdb_name}\" is forbidden: pdb disruptions allowed is negative"),
                json!({"name": pdb_name, "group": "policy", "kind": "poddisruptionbudgets"}),
            ),
            Some(pdb_name),
        ));
    }
    if allowed == 0 {
        return Err(blocked(
            0,
            format!(
                "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                status["desiredHealthy"].as_i64().unwrap_or(0),
                status["currentHealthy"].as_i64().unwrap_or(0)
            ),
        ));
    }
    if !dry_run {
        let mut updated = pdb.clone();
        updated["status"]["disruptionsAllowed"] = json!(allowed - 1);
        updated["status"]["disruptedPods"][name] = json!(rfc3339(unix_now().as_secs()));
        store.replace(Kind::PodDisruptionBudget, updated);
    }
    delete(&mut store);
    Ok(Evicted {
        outcome: "evicted",
        pdb: Some(pdb_name),
    })
}

// ---------------------------------------------------------------------------------------------
// The fixture's own endpoints (not part of the Kubernetes API)

fn fixture(cx: &Ctx, rest: &[&str]) -> ApiResult<Response<Body>> {
    match (&cx.method, rest) {
        (&Method::GET, ["log"]) => {
            let journal = cx.srv.journal.lock().unwrap();
            Ok(ok(&json!({
                "evictions": journal.evictions,
                "deletions": journal.deletions,
                "events": journal.events,
            })))
        }
        (&Method::POST, ["endpoint-ips"]) => {
            let body = cx.json_body()?;
            let (ips, port) = match &body {
                Value::Array(ips) => (ips.clone(), None),
                other => (
                    other["ips"].as_array().cloned().unwrap_or_default(),
                    other["port"].as_u64(),
                ),
            };
            let ips: Vec<IpAddr> = ips
                .iter()
                .map(|ip| {
                    ip.as_str()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| ApiError::bad_request(format!("not an IP address: {ip}")))
                })
                .collect::<ApiResult<_>>()?;
            let port = match port {
                Some(p) => u16::try_from(p).map_err(|_| ApiError::bad_request("bad port"))?,
                None => *cx.srv.endpoint_port.lock().unwrap(),
            };
            let (slice, endpoints) = cx.srv.set_endpoints(&ips, port).map_err(ApiError::bad_request)?;
            let generation = cx.generation();
            let slice_gv = Gv {
                group: "discovery.k8s.io",
                version: generation.eviction_gv().version,
            };
            Ok(ok(&json!({
                "endpointslice": render(Kind::EndpointSlice, slice_gv, &slice),
                "endpoints": render(Kind::Endpoints, CORE, &endpoints),
            })))
        }
        _ => Err(ApiError::no_route()),
    }
}
