//! Which API versions this apiserver serves, decided once at start from the discovery documents.
//!
//! The agent talks to every apiserver from 1.18 on, so three APIs have two generations:
//!
//! | API              | new (served from)               | old (fallback)                              |
//! |------------------|---------------------------------|---------------------------------------------|
//! | apiserver addresses | EndpointSlice `discovery.k8s.io/v1` (1.21) | core `v1` Endpoints (always served; the apiserver maintains `default/kubernetes` itself) |
//! | Eviction         | `policy/v1` (1.22)              | `policy/v1beta1`                            |
//! | Event            | `events.k8s.io/v1` (1.19)       | core `v1` Event                             |
//!
//! `discovery.k8s.io/v1beta1` EndpointSlices (1.17–1.24) are deliberately not used: core
//! Endpoints carry the same addresses for `default/kubernetes` on every version that lacks v1.
//!
//! The inputs are `GET /apis` (an `APIGroupList`) and `GET /api/v1` (an `APIResourceList`):
//! the core list names the group/version of the `pods/eviction` subresource's body, which is the
//! most direct answer for Eviction; the group list is the fallback when it does not.
use std::{fmt, time::Duration};

use k8s_openapi::{
    api::{
        core::v1::{Endpoints, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList},
};
use kube::{runtime::watcher, Api, Client};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::{
    call,
    endpoints::{self, Entry, Feed},
    Result, Trouble,
};

/// Where the apiserver addresses of `default/kubernetes` are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EndpointsApi {
    /// `discovery.k8s.io/v1` EndpointSlices labelled `kubernetes.io/service-name=kubernetes`.
    #[serde(rename = "discovery.k8s.io/v1 EndpointSlice")]
    EndpointSliceV1,
    /// The core `v1` Endpoints object `default/kubernetes`.
    #[serde(rename = "v1 Endpoints")]
    CoreV1,
}

/// The `apiVersion` of the Eviction body POSTed to `pods/eviction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EvictionApi {
    #[serde(rename = "policy/v1")]
    PolicyV1,
    #[serde(rename = "policy/v1beta1")]
    PolicyV1beta1,
}

/// Which Event API events are written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EventsApi {
    /// `events.k8s.io/v1` (`regarding`, `note`, `series`).
    #[serde(rename = "events.k8s.io/v1")]
    EventsV1,
    /// core `v1` (`involvedObject`, `message`, `count`).
    #[serde(rename = "v1")]
    CoreV1,
}

/// The decision, made once at start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ApiVersions {
    /// `gitVersion` of `/version` (e.g. `v1.20.15`); `None` if `/version` did not answer.
    pub server_version: Option<String>,
    pub endpoints: EndpointsApi,
    pub eviction: EvictionApi,
    pub events: EventsApi,
}

impl EndpointsApi {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointsApi::EndpointSliceV1 => "discovery.k8s.io/v1 EndpointSlice",
            EndpointsApi::CoreV1 => "v1 Endpoints",
        }
    }
}

impl EvictionApi {
    /// The `apiVersion` of the Eviction body.
    pub fn api_version(self) -> &'static str {
        match self {
            EvictionApi::PolicyV1 => "policy/v1",
            EvictionApi::PolicyV1beta1 => "policy/v1beta1",
        }
    }
}

impl EventsApi {
    /// The `apiVersion` of an Event object.
    pub fn api_version(self) -> &'static str {
        match self {
            EventsApi::EventsV1 => "events.k8s.io/v1",
            EventsApi::CoreV1 => "v1",
        }
    }

    /// The collection URL of events in `namespace`.
    pub fn collection(self, namespace: &str) -> String {
        match self {
            EventsApi::EventsV1 => format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
            EventsApi::CoreV1 => format!("/api/v1/namespaces/{namespace}/events"),
        }
    }
}

impl fmt::Display for ApiVersions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "apiserver {}: endpoints from {}, Eviction {}, Event {}",
            self.server_version.as_deref().unwrap_or("(version unknown)"),
            self.endpoints.as_str(),
            self.eviction.api_version(),
            self.events.api_version(),
        )
    }
}

impl ApiVersions {
    /// Decides from `GET /apis` and (when it answered) `GET /api/v1`. Total: every input gives an
    /// answer, the old generation where the documents say nothing better.
    pub fn decide(
        groups: &APIGroupList,
        core: Option<&APIResourceList>,
        server_version: Option<String>,
    ) -> Self {
        let served = |group: &str, version: &str| {
            groups
                .groups
                .iter()
                .filter(|g| g.name == group)
                .flat_map(|g| g.versions.iter())
                .any(|v| v.version == version || v.group_version == format!("{group}/{version}"))
        };
        let endpoints = if served("discovery.k8s.io", "v1") {
            EndpointsApi::EndpointSliceV1
        } else {
            EndpointsApi::CoreV1
        };
        let from_subresource = core
            .into_iter()
            .flat_map(|list| list.resources.iter())
            .find(|r| r.name == "pods/eviction")
            .and_then(|r| match (r.group.as_deref(), r.version.as_deref()) {
                (Some("policy"), Some("v1")) => Some(EvictionApi::PolicyV1),
                (Some("policy"), Some("v1beta1")) => Some(EvictionApi::PolicyV1beta1),
                _ => None,
            });
        let eviction = from_subresource.unwrap_or(if served("policy", "v1") {
            EvictionApi::PolicyV1
        } else {
            EvictionApi::PolicyV1beta1
        });
        let events = if served("events.k8s.io", "v1") {
            EventsApi::EventsV1
        } else {
            EventsApi::CoreV1
        };
        ApiVersions {
            server_version,
            endpoints,
            eviction,
            events,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The task

/// Discovery is retried with a backoff from 1 s up to this.
const DISCOVERY_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// `GET /apis`, `GET /api/v1` and `GET /version`, then the decision.
async fn discover(client: &Client, server: &str) -> Result<ApiVersions> {
    let groups = call(server, "API discovery (GET /apis)", client.list_api_groups()).await?;
    let core = call(
        server,
        "API discovery (GET /api/v1)",
        client.list_core_api_resources("v1"),
    )
    .await?;
    let version = match call(server, "GET /version", client.apiserver_version()).await {
        Ok(info) => Some(info.git_version),
        Err(err) => {
            tracing::debug!("{}", crate::error::chain(&err));
            None
        }
    };
    Ok(ApiVersions::decide(&groups, Some(&core), version))
}

/// Discovery until it succeeds, then the Service and EndpointSlice/Endpoints watches.
pub(super) async fn discover_then_watch(
    client: Client,
    server: String,
    versions: watch::Sender<Option<ApiVersions>>,
    feeds: mpsc::Sender<(Feed, Vec<Entry>)>,
) {
    let mut trouble = Trouble::new("Kubernetes API discovery");
    let mut backoff = Duration::from_secs(1);
    let decided = loop {
        match discover(&client, &server).await {
            Ok(v) => break v,
            Err(err) => {
                trouble.failed(&err);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(DISCOVERY_BACKOFF_MAX);
            }
        }
    };
    trouble.ok();
    tracing::info!("{decided}");
    let backends = decided.endpoints;
    versions.send_replace(Some(decided));

    let by_name = watcher::Config::default().fields("metadata.name=kubernetes");
    let service = endpoints::watch_feed(
        Api::<Service>::namespaced(client.clone(), "default"),
        by_name.clone(),
        Feed::Service,
        endpoints::service_entries,
        feeds.clone(),
        "watching Service default/kubernetes",
    );
    match backends {
        EndpointsApi::EndpointSliceV1 => {
            let slices = endpoints::watch_feed(
                Api::<EndpointSlice>::namespaced(client, "default"),
                watcher::Config::default().labels("kubernetes.io/service-name=kubernetes"),
                Feed::Backends,
                endpoints::slice_entries,
                feeds,
                "watching the EndpointSlices of default/kubernetes",
            );
            futures::join!(service, slices);
        }
        EndpointsApi::CoreV1 => {
            let eps = endpoints::watch_feed(
                Api::<Endpoints>::namespaced(client, "default"),
                by_name,
                Feed::Backends,
                endpoints::endpoints_entries,
                feeds,
                "watching Endpoints default/kubernetes",
            );
            futures::join!(service, eps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET /apis` of kube-apiserver 1.18 (abridged to the groups that matter plus a neighbour).
    const APIS_1_18: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[
      {"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}},
      {"name":"events.k8s.io","versions":[{"groupVersion":"events.k8s.io/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"events.k8s.io/v1beta1","version":"v1beta1"}},
      {"name":"policy","versions":[{"groupVersion":"policy/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"policy/v1beta1","version":"v1beta1"}},
      {"name":"discovery.k8s.io","versions":[{"groupVersion":"discovery.k8s.io/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"discovery.k8s.io/v1beta1","version":"v1beta1"}}]}"#;

    /// `GET /apis` of kube-apiserver 1.20.
    const APIS_1_20: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[
      {"name":"events.k8s.io","versions":[{"groupVersion":"events.k8s.io/v1","version":"v1"},{"groupVersion":"events.k8s.io/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"events.k8s.io/v1","version":"v1"}},
      {"name":"policy","versions":[{"groupVersion":"policy/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"policy/v1beta1","version":"v1beta1"}},
      {"name":"discovery.k8s.io","versions":[{"groupVersion":"discovery.k8s.io/v1beta1","version":"v1beta1"}],"preferredVersion":{"groupVersion":"discovery.k8s.io/v1beta1","version":"v1beta1"}}]}"#;

    /// `GET /apis` of kube-apiserver 1.33.
    const APIS_1_33: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[
      {"name":"events.k8s.io","versions":[{"groupVersion":"events.k8s.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"events.k8s.io/v1","version":"v1"}},
      {"name":"policy","versions":[{"groupVersion":"policy/v1","version":"v1"}],"preferredVersion":{"groupVersion":"policy/v1","version":"v1"}},
      {"name":"discovery.k8s.io","versions":[{"groupVersion":"discovery.k8s.io/v1","version":"v1"}],"preferredVersion":{"groupVersion":"discovery.k8s.io/v1","version":"v1"}}]}"#;

    /// `GET /api/v1` (abridged): the eviction subresource names its body's group/version.
    fn core(eviction_version: &str) -> APIResourceList {
        serde_json::from_str(&format!(
            r#"{{"kind":"APIResourceList","groupVersion":"v1","resources":[
              {{"name":"pods","singularName":"","namespaced":true,"kind":"Pod","verbs":["create","delete","deletecollection","get","list","patch","update","watch"],"shortNames":["po"],"categories":["all"]}},
              {{"name":"pods/eviction","singularName":"","namespaced":true,"group":"policy","version":"{eviction_version}","kind":"Eviction","verbs":["create"]}},
              {{"name":"pods/status","singularName":"","namespaced":true,"kind":"Pod","verbs":["get","patch","update"]}}]}}"#
        ))
        .expect("core resource list")
    }

    fn groups(text: &str) -> APIGroupList {
        serde_json::from_str(text).expect("group list")
    }

    #[test]
    fn every_generation() {
        let v = ApiVersions::decide(
            &groups(APIS_1_18),
            Some(&core("v1beta1")),
            Some("v1.18.20".into()),
        );
        assert_eq!(
            (v.endpoints, v.eviction, v.events),
            (
                EndpointsApi::CoreV1,
                EvictionApi::PolicyV1beta1,
                EventsApi::CoreV1
            )
        );
        let v = ApiVersions::decide(&groups(APIS_1_20), Some(&core("v1beta1")), None);
        assert_eq!(
            (v.endpoints, v.eviction, v.events),
            (
                EndpointsApi::CoreV1,
                EvictionApi::PolicyV1beta1,
                EventsApi::EventsV1
            )
        );
        let v = ApiVersions::decide(&groups(APIS_1_33), Some(&core("v1")), Some("v1.33.1".into()));
        assert_eq!(
            (v.endpoints, v.eviction, v.events),
            (
                EndpointsApi::EndpointSliceV1,
                EvictionApi::PolicyV1,
                EventsApi::EventsV1
            )
        );
        assert_eq!(
            v.to_string(),
            "apiserver v1.33.1: endpoints from discovery.k8s.io/v1 EndpointSlice, Eviction policy/v1, Event events.k8s.io/v1"
        );
        assert_eq!(
            serde_json::to_value(&v).expect("serialize"),
            serde_json::json!({
                "server_version": "v1.33.1",
                "endpoints": "discovery.k8s.io/v1 EndpointSlice",
                "eviction": "policy/v1",
                "events": "events.k8s.io/v1",
            })
        );
    }

    #[test]
    fn eviction_follows_the_subresource_then_the_policy_group() {
        // 1.22-1.24 serve both policy versions; the subresource says which body it takes.
        let both = groups(
            r#"{"groups":[{"name":"policy","versions":[{"groupVersion":"policy/v1","version":"v1"},{"groupVersion":"policy/v1beta1","version":"v1beta1"}]}]}"#,
        );
        assert_eq!(
            ApiVersions::decide(&both, Some(&core("v1")), None).eviction,
            EvictionApi::PolicyV1
        );
        assert_eq!(
            ApiVersions::decide(&both, Some(&core("v1beta1")), None).eviction,
            EvictionApi::PolicyV1beta1
        );
        // Without the core list (it did not answer), the policy group decides.
        assert_eq!(
            ApiVersions::decide(&both, None, None).eviction,
            EvictionApi::PolicyV1
        );
        assert_eq!(
            ApiVersions::decide(&groups(APIS_1_20), None, None).eviction,
            EvictionApi::PolicyV1beta1
        );
        // An empty document decides the old generation everywhere.
        let v = ApiVersions::decide(&groups(r#"{"groups":[]}"#), None, None);
        assert_eq!(
            (v.endpoints, v.eviction, v.events),
            (
                EndpointsApi::CoreV1,
                EvictionApi::PolicyV1beta1,
                EventsApi::CoreV1
            )
        );
        assert_eq!(
            v.to_string(),
            "apiserver (version unknown): endpoints from v1 Endpoints, Eviction policy/v1beta1, Event v1"
        );
    }
}
