//! This node's pods, indexed by container id, for attributing a process to its pod.
//!
//! The watch is node-scoped (`fieldSelector=spec.nodeName=<node>`), so the agent never holds
//! more than its own node's pods. Container ids come from `status.containerStatuses`,
//! `status.initContainerStatuses` and `status.ephemeralContainerStatuses`, in the form
//! `<runtime>://<64 hex>` (`containerd://`, `cri-o://`, `docker://`); the index is keyed by the
//! bare 64-hex id, which is what a cgroup path names (see `container.rs`) whatever the runtime.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Client,
};
use serde::Serialize;

use super::{endpoints::Objects, Trouble};
use crate::host::container::{self, ContainerRef};

/// Annotation that makes every container of the pod a monitored client.
pub const MONITOR_ANNOTATION: &str = "lifeline.dev/monitor";
/// Annotation that allows remediation (socket reset, eviction) of the pod.
pub const REMEDIATE_ANNOTATION: &str = "lifeline.dev/remediate";

/// The pod and container a container id belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub uid: String,
    /// `lifeline.dev/monitor: "true"`.
    pub monitor: bool,
    /// `lifeline.dev/remediate: "true"`.
    pub remediate: bool,
    /// The pod's labels (for label selectors in the config).
    pub labels: BTreeMap<String, String>,
}

/// Every container of a pod that has an id: `(bare 64-hex id, its PodRef)`, plus the ids that
/// could not be read (unknown runtime scheme, malformed id) for the caller to log.
pub fn pod_containers(pod: &Pod) -> (Vec<(String, PodRef)>, Vec<container::Error>) {
    let meta = &pod.metadata;
    let annotations = meta.annotations.as_ref();
    let flag = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    };
    let (monitor, remediate) = (flag(MONITOR_ANNOTATION), flag(REMEDIATE_ANNOTATION));
    let mut found = Vec::new();
    let mut bad = Vec::new();
    let Some(status) = &pod.status else {
        return (found, bad);
    };
    let statuses = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten());
    for cs in statuses {
        // A container not started yet has no id (or an empty one).
        let Some(id) = cs.container_id.as_deref().filter(|id| !id.is_empty()) else {
            continue;
        };
        match id.parse::<ContainerRef>() {
            Ok(c) => found.push((
                c.id,
                PodRef {
                    namespace: meta.namespace.clone().unwrap_or_default(),
                    pod: meta.name.clone().unwrap_or_default(),
                    container: cs.name.clone(),
                    uid: meta.uid.clone().unwrap_or_default(),
                    monitor,
                    remediate,
                    labels: meta.labels.clone().unwrap_or_default(),
                },
            )),
            Err(err) => bad.push(err),
        }
    }
    (found, bad)
}

/// container id (bare 64 hex) → pod, built from the pods a watch shows.
pub fn index<'a>(pods: impl Iterator<Item = &'a Vec<(String, PodRef)>>) -> HashMap<String, PodRef> {
    pods.flatten().cloned().collect()
}

/// The bare id of `container_id`, which may carry a `<runtime>://` prefix.
pub fn bare_id(container_id: &str) -> &str {
    container_id.split_once("://").map_or(container_id, |(_, id)| id)
}

// ---------------------------------------------------------------------------------------------
// The task

/// This node's pods → the container index.
pub(super) async fn watch_pods(
    client: Client,
    node: String,
    by_container: Arc<RwLock<HashMap<String, PodRef>>>,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(Api::<Pod>::all(client), config).default_backoff().boxed();
    let mut objects = Objects::default();
    let mut trouble = Trouble::new("watching this node's pods");
    let reduce = |pod: &Pod| {
        let (found, bad) = pod_containers(pod);
        for err in bad {
            tracing::debug!(
                "pod {}/{}: {err}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            );
        }
        found
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                trouble.ok();
                if objects.apply(event, reduce) && objects.listed() {
                    let new = index(objects.values());
                    *by_container.write().expect("pods lock") = new;
                }
            }
            Err(err) => trouble.failed(&err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::endpoints::Objects;
    use kube::runtime::watcher;

    const APP: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const INIT: &str = "1123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const DEBUG: &str = "2123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn status(name: &str, id: Option<&str>) -> serde_json::Value {
        let mut s = serde_json::json!({
            "name": name, "ready": true, "restartCount": 0, "started": true,
            "image": "registry.k8s.io/kube-controller-manager:v1.33.1",
            "imageID": "registry.k8s.io/kube-controller-manager@sha256:00",
            "state": {"running": {"startedAt": "2025-05-01T10:00:05Z"}},
        });
        if let Some(id) = id {
            s["containerID"] = id.into();
        }
        s
    }

    /// A pod as the apiserver returns it on a pod watch (abridged spec).
    fn pod(annotations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {
                "name": "notifier-7d9c5b8f6-x2x4z", "namespace": "ops",
                "uid": "5f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098", "resourceVersion": "8812",
                "labels": {"app": "notifier"}, "annotations": annotations,
            },
            "spec": {"nodeName": "node-1", "containers": [{"name": "notifier", "image": "n:1"}]},
            "status": {
                "phase": "Running", "podIP": "10.244.1.7",
                "initContainerStatuses": [status("setup", Some(&format!("cri-o://{INIT}")))],
                "containerStatuses": [
                    status("notifier", Some(&format!("containerd://{APP}"))),
                    status("sidecar", None),
                    status("waiting", Some("")),
                    status("weird", Some("rkt://abc")),
                ],
                "ephemeralContainerStatuses": [status("debugger", Some(&format!("docker://{DEBUG}")))],
            }
        }))
        .expect("pod")
    }

    #[test]
    fn container_ids_from_every_status_list() {
        let p = pod(serde_json::json!({
            "lifeline.dev/monitor": "true", "lifeline.dev/remediate": "false"
        }));
        let (found, bad) = pod_containers(&p);
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|(id, r)| (id.as_str(), r.container.as_str()))
            .collect();
        assert_eq!(names, [(APP, "notifier"), (INIT, "setup"), (DEBUG, "debugger")]);
        let r = &found[0].1;
        assert_eq!(
            (r.namespace.as_str(), r.pod.as_str(), r.uid.as_str()),
            (
                "ops",
                "notifier-7d9c5b8f6-x2x4z",
                "5f3c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098"
            )
        );
        assert!(r.monitor && !r.remediate);
        assert_eq!(r.labels.get("app").map(String::as_str), Some("notifier"));
        assert_eq!(bad.len(), 1);
        assert!(bad[0].to_string().contains("rkt"), "{}", bad[0]);
    }

    #[test]
    fn annotations_must_say_true() {
        for (value, want) in [
            ("true", true),
            ("True", true),
            (" true ", true),
            ("yes", false),
            ("", false),
        ] {
            let p = pod(serde_json::json!({ "lifeline.dev/remediate": value }));
            assert_eq!(pod_containers(&p).0[0].1.remediate, want, "{value:?}");
            assert!(!pod_containers(&p).0[0].1.monitor);
        }
        let no_status: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).expect("pod");
        assert_eq!(pod_containers(&no_status).0, vec![]);
    }

    #[test]
    fn index_follows_the_watch() {
        let mut objects = Objects::default();
        let reduce = |p: &Pod| pod_containers(p).0;
        objects.apply(watcher::Event::Init, reduce);
        objects.apply(watcher::Event::InitApply(pod(serde_json::json!({}))), reduce);
        objects.apply(watcher::Event::<Pod>::InitDone, reduce);
        let idx = index(objects.values());
        assert_eq!(idx.len(), 3);
        assert_eq!(
            idx.get(bare_id(&format!("containerd://{APP}")))
                .map(|r| r.container.as_str()),
            Some("notifier")
        );
        assert_eq!(
            idx.get(bare_id(INIT)).map(|r| r.container.as_str()),
            Some("setup")
        );
        objects.apply(watcher::Event::Delete(pod(serde_json::json!({}))), reduce);
        assert!(index(objects.values()).is_empty());
    }
}
