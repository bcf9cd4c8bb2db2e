//! What a request is, from its method and path: the Kubernetes API's own grammar
//! (`/api/v1/namespaces/{ns}/{resource}/{name}`, `/apis/{group}/{version}/...`), as the
//! apiserver's request-info resolver reads it. Only metadata is kept: query values survive
//! for an allow-list of keys (SPEC "Streams"); every other value (selectors above all) is
//! replaced before the path is stored anywhere.
use std::{fmt, time::Duration};

use serde::Serialize;

use crate::host::redact::KEPT_QUERY_KEYS;

/// What replaces any other query value.
pub const REDACTED: &str = "REDACTED";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Watch,
    List,
    Get,
    Create,
    Update,
    Patch,
    Delete,
    Other,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Watch => "watch",
            Kind::List => "list",
            Kind::Get => "get",
            Kind::Create => "create",
            Kind::Update => "update",
            Kind::Patch => "patch",
            Kind::Delete => "delete",
            Kind::Other => "other",
        }
    }
}

/// One request, as kept: no value that could be a secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub kind: Kind,
    /// `resource` or `group/resource` (core group bare), with `/subresource` when there is one;
    /// empty for non-resource paths (`/healthz`, `/version`).
    pub resource: String,
    /// The namespace, or None for cluster-wide (all namespaces, or cluster-scoped).
    pub namespace: Option<String>,
    /// The path with query values redacted outside [`KEPT_QUERY_KEYS`].
    pub path: String,
    /// What the request declared about its own lifetime: a watch's `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Its response goes on, quiet or not, for as long as the client wants by design: a
    /// followed log, exec, attach, port-forward, a proxied connection. A pause in it says
    /// nothing about the apiserver.
    pub endless: bool,
    /// The kernel cut the path (longer than it copies): the query may be incomplete.
    pub cut: bool,
}

impl Request {
    /// Reads `method` and `path` as the client sent them.
    pub fn parse(method: &str, path: &str, cut: bool) -> Self {
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        let mut watch = false;
        let mut follow = false;
        let mut timeout = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                // As the apiserver decodes it (Convert_Slice_string_To_bool): anything but
                // "0" and "false" in any case; python-kubernetes sends "True".
                "watch" => watch = value != "0" && !value.eq_ignore_ascii_case("false"),
                "timeoutSeconds" => timeout = value.parse::<u64>().ok().map(Duration::from_secs),
                // `pods/log?follow=true`: as the apiserver's boolean query parameters.
                "follow" => follow = value != "0" && !value.eq_ignore_ascii_case("false"),
                _ => {}
            }
            if KEPT_QUERY_KEYS.contains(&key) {
                kept.push(format!("{key}={value}"));
            } else {
                kept.push(format!("{}={REDACTED}", sanitize(key)));
            }
        }
        let segments: Vec<&str> = route.split('/').filter(|s| !s.is_empty()).collect();
        let info = ResourceInfo::of(&segments);
        let kind = match method {
            "GET" if watch || info.legacy_watch => Kind::Watch,
            "GET" if info.name.is_some() => Kind::Get,
            "GET" if !info.resource.is_empty() => Kind::List,
            "POST" => Kind::Create,
            "PUT" => Kind::Update,
            "PATCH" => Kind::Patch,
            "DELETE" => Kind::Delete,
            _ => Kind::Other,
        };
        let endless = match info.resource.rsplit_once('/').map(|(_, sub)| sub) {
            Some("log") => follow,
            Some("exec" | "attach" | "portforward" | "proxy") => true,
            _ => false,
        };
        let mut kept_path = sanitize(route);
        if !kept.is_empty() {
            kept_path.push('?');
            kept_path.push_str(&kept.join("&"));
        }
        Request {
            method: sanitize(method),
            kind,
            resource: info.resource,
            namespace: info.namespace,
            path: kept_path,
            timeout,
            endless,
            cut,
        }
    }

    /// "watch endpointslices (all namespaces)", "get leases in kube-system".
    pub fn describe(&self) -> String {
        let what = if self.resource.is_empty() {
            self.path.split('?').next().unwrap_or_default().to_string()
        } else {
            self.resource.clone()
        };
        match (&self.namespace, self.resource.is_empty()) {
            (_, true) => format!("{} {what}", self.kind.as_str()),
            (Some(ns), false) => format!("{} {what} in {ns}", self.kind.as_str()),
            // A list or watch across namespaces (or of a cluster-scoped resource).
            (None, false) if matches!(self.kind, Kind::Watch | Kind::List) => {
                format!("{} {what} (all namespaces)", self.kind.as_str())
            }
            (None, false) => format!("{} {what}", self.kind.as_str()),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Printable ASCII only, at most 256 bytes: a path is shown, logged and labelled.
fn sanitize(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_graphic()).take(256).collect()
}

/// The resource part of a path.
#[derive(Debug, Default)]
struct ResourceInfo {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    /// `/api/v1/watch/...` (deprecated, still served by 1.20).
    legacy_watch: bool,
}

impl ResourceInfo {
    fn of(segments: &[&str]) -> Self {
        let (group, rest) = match segments {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => return Self::default(),
        };
        let (legacy_watch, rest) = match rest {
            ["watch", rest @ ..] => (true, rest),
            _ => (false, rest),
        };
        let (namespace, rest) = match rest {
            // `namespaces/{ns}` followed by a resource; `namespaces` or `namespaces/{name}`
            // alone are the namespaces themselves.
            ["namespaces", ns, r, rest @ ..] => (Some(ns.to_string()), {
                let mut v = vec![*r];
                v.extend_from_slice(rest);
                v
            }),
            other => (None, other.to_vec()),
        };
        let Some((resource, rest)) = rest.split_first() else {
            return Self::default();
        };
        let name = rest.first().map(|n| n.to_string());
        let sub = rest.get(1);
        let mut full = if group.is_empty() {
            sanitize(resource)
        } else {
            format!("{}/{}", sanitize(group), sanitize(resource))
        };
        if let Some(sub) = sub {
            full.push('/');
            full.push_str(&sanitize(sub));
        }
        Self {
            resource: full,
            namespace: namespace.map(|n| sanitize(&n)),
            name,
            legacy_watch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_go_watch_keeps_its_deadline_and_loses_its_selector() {
        let r = Request::parse(
            "GET",
            "/apis/discovery.k8s.io/v1beta1/endpointslices?allowWatchBookmarks=true&labelSelector=%21service.kubernetes.io%2Fheadless&resourceVersion=412&timeout=9m6s&timeoutSeconds=546&watch=true",
            false,
        );
        assert_eq!(r.kind, Kind::Watch);
        assert_eq!(r.resource, "discovery.k8s.io/endpointslices");
        assert_eq!(r.namespace, None);
        assert_eq!(r.timeout, Some(Duration::from_secs(546)));
        assert_eq!(
            r.path,
            "/apis/discovery.k8s.io/v1beta1/endpointslices?allowWatchBookmarks=true&labelSelector=REDACTED&resourceVersion=412&timeout=REDACTED&timeoutSeconds=546&watch=true"
        );
        assert_eq!(
            r.describe(),
            "watch discovery.k8s.io/endpointslices (all namespaces)"
        );
    }

    #[test]
    fn watch_is_read_as_the_apiserver_reads_it() {
        let python = Request::parse("GET", "/api/v1/pods?timeoutSeconds=5&watch=True", false);
        assert_eq!(python.kind, Kind::Watch, "python-kubernetes sends True");
        assert_eq!(python.timeout, Some(Duration::from_secs(5)));
        for list in [
            "/api/v1/pods?watch=false",
            "/api/v1/pods?watch=FALSE",
            "/api/v1/pods?watch=0",
            "/api/v1/pods",
        ] {
            assert_eq!(Request::parse("GET", list, false).kind, Kind::List, "{list}");
        }
    }

    #[test]
    fn namespaced_gets_lists_updates_and_subresources() {
        let lease = Request::parse(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler?timeout=10s",
            false,
        );
        assert_eq!(lease.kind, Kind::Update);
        assert_eq!(lease.resource, "coordination.k8s.io/leases");
        assert_eq!(lease.namespace.as_deref(), Some("kube-system"));
        assert_eq!(
            lease.describe(),
            "update coordination.k8s.io/leases in kube-system"
        );
        let get = Request::parse("GET", "/api/v1/namespaces/default/secrets/db-password", false);
        assert_eq!((get.kind, get.resource.as_str()), (Kind::Get, "secrets"));
        let list = Request::parse(
            "GET",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=500",
            false,
        );
        assert_eq!((list.kind, list.resource.as_str()), (Kind::List, "pods"));
        assert_eq!(list.path, "/api/v1/pods?fieldSelector=REDACTED&limit=500");
        let status = Request::parse("PATCH", "/api/v1/nodes/n1/status", false);
        assert_eq!(
            (status.kind, status.resource.as_str()),
            (Kind::Patch, "nodes/status")
        );
        let ns = Request::parse("GET", "/api/v1/namespaces/kube-system", false);
        assert_eq!(
            (ns.kind, ns.resource.as_str(), ns.namespace),
            (Kind::Get, "namespaces", None)
        );
        let legacy = Request::parse("GET", "/api/v1/watch/namespaces/a/configmaps", false);
        assert_eq!(
            (legacy.kind, legacy.resource.as_str()),
            (Kind::Watch, "configmaps")
        );
        let health = Request::parse("GET", "/healthz", false);
        assert_eq!(
            (health.kind, health.describe().as_str()),
            (Kind::Other, "other /healthz")
        );
    }

    #[test]
    fn responses_without_end_by_design_are_known() {
        let endless = |path: &str| Request::parse("GET", path, false).endless;
        assert!(endless(
            "/api/v1/namespaces/a/pods/web-0/log?container=c&follow=true"
        ));
        assert!(!endless("/api/v1/namespaces/a/pods/web-0/log?container=c"));
        assert!(!endless("/api/v1/namespaces/a/pods/web-0/log?follow=false"));
        assert!(endless(
            "/api/v1/namespaces/a/pods/web-0/exec?command=sh&stdin=true"
        ));
        assert!(endless("/api/v1/namespaces/a/pods/web-0/portforward"));
        assert!(endless("/api/v1/namespaces/a/services/web:80/proxy/metrics"));
        assert!(endless("/api/v1/nodes/n1/proxy/stats/summary"));
        for bounded in [
            "/api/v1/configmaps?limit=500",
            "/api/v1/namespaces/a/pods/web-0",
            "/api/v1/nodes/n1/status",
            "/openapi/v2",
        ] {
            assert!(!endless(bounded), "{bounded}");
        }
        let log = Request::parse("GET", "/api/v1/namespaces/a/pods/p/log?follow=true", false);
        assert_eq!(log.path, "/api/v1/namespaces/a/pods/p/log?follow=REDACTED");
    }

    #[test]
    fn nothing_unprintable_or_unbounded_is_kept() {
        let r = Request::parse(
            "GET\n",
            &format!("/api/v1/pods/{}\u{7}?x=1", "a".repeat(1000)),
            true,
        );
        assert!(r.path.len() <= 256 + "?x=REDACTED".len());
        assert!(r.path.chars().all(|c| c.is_ascii_graphic()));
        assert_eq!(r.method, "GET");
        assert!(r.cut);
    }
}
