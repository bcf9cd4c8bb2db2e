//! The Prometheus scrape config prometheus-operator generates from a PodMonitor, so that a
//! plain Prometheus scrapes exactly as the shipped `deploy/components/monitoring/podmonitor.yaml`
//! says (one truth: that file). What the operator does (its `generatePodMonitorConfig`):
//! Kubernetes pod discovery in the PodMonitor's namespace (unless `namespaceSelector` says
//! otherwise), pods that are done dropped, `keep` on the selector's labels and on the port's
//! name, the target labels `namespace`, `container`, `pod`, `job` (from `jobLabel` when the pod
//! has it, else `NAMESPACE/NAME`) and `endpoint` (the port's name), then the endpoint's own
//! `relabelings`.
//! A field this module does not know is an error, never ignored: the shipped file must not say
//! more than the test scrapes.
//!
//! Debian's `prometheus` is built without Kubernetes service discovery (`kubernetes_sd_configs`
//! is not a field it knows), so the discovery is the test's: [`pod_targets`] turns the pod list
//! into file-discovery targets carrying the `__meta_kubernetes_*` labels Kubernetes discovery
//! (role `pod`) gives, and the relabeling above runs on them unchanged.
use serde_json::{json, Map, Value};

/// The endpoint fields understood; `interval` is replaced by the test's (the rules' `for:` are
/// what they are, the scrape only has to be faster).
const ENDPOINT_FIELDS: [&str; 5] = ["port", "path", "interval", "honorLabels", "relabelings"];
const SPEC_FIELDS: [&str; 3] = ["jobLabel", "selector", "podMetricsEndpoints"];
const RELABEL_FIELDS: [&str; 7] = [
    "sourceLabels",
    "separator",
    "targetLabel",
    "regex",
    "modulus",
    "replacement",
    "action",
];

/// Prometheus's label name for a Kubernetes label (`app.kubernetes.io/name` →
/// `app_kubernetes_io_name`).
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn only(object: &Value, known: &[&str], what: &str) -> Result<(), String> {
    let map = object
        .as_object()
        .ok_or(format!("{what} is not a mapping: {object}"))?;
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "{what}.{k}: not understood by the test's scrape config generator"
        )),
        None => Ok(()),
    }
}

/// The namespace whose pods the PodMonitor selects from (its own: no `namespaceSelector`).
pub fn namespace(podmonitor: &Value) -> Result<String, String> {
    podmonitor["metadata"]["namespace"]
        .as_str()
        .map(str::to_owned)
        .ok_or("no metadata.namespace".into())
}

/// The `scrape_configs` entries for `podmonitor` (one per endpoint), its pods' targets read
/// from `targets_file` ([`pod_targets`] of [`namespace`]'s pods), scraping every `interval`.
pub fn scrape_configs(podmonitor: &Value, targets_file: &str, interval: &str) -> Result<Vec<Value>, String> {
    if podmonitor["kind"] != "PodMonitor" {
        return Err(format!("not a PodMonitor: {}", podmonitor["kind"]));
    }
    let name = podmonitor["metadata"]["name"]
        .as_str()
        .ok_or("no metadata.name")?;
    let namespace = podmonitor["metadata"]["namespace"]
        .as_str()
        .ok_or("no metadata.namespace")?;
    let spec = &podmonitor["spec"];
    only(spec, &SPEC_FIELDS, "spec")?;
    only(&spec["selector"], &["matchLabels"], "spec.selector")?;
    let match_labels = spec["selector"]["matchLabels"]
        .as_object()
        .ok_or("spec.selector.matchLabels is not a mapping")?;
    let endpoints = spec["podMetricsEndpoints"]
        .as_array()
        .ok_or("no spec.podMetricsEndpoints")?;
    let mut out = Vec::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        only(
            endpoint,
            &ENDPOINT_FIELDS,
            &format!("spec.podMetricsEndpoints[{i}]"),
        )?;
        let port = endpoint["port"]
            .as_str()
            .ok_or(format!("podMetricsEndpoints[{i}].port (a port name) is missing"))?;
        let mut relabel: Vec<Value> = vec![
            json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}),
            // Pods that are done are not scraped (the operator's `filterRunning`, on by default).
            json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}),
        ];
        for (label, value) in match_labels {
            let value = value
                .as_str()
                .ok_or(format!("matchLabels.{label} is not a string"))?;
            let l = sanitize(label);
            relabel.push(json!({
                "action": "keep",
                "source_labels": [format!("__meta_kubernetes_pod_label_{l}"), format!("__meta_kubernetes_pod_labelpresent_{l}")],
                "regex": format!("({value});true"),
            }));
        }
        relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}));
        relabel.push(json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}));
        relabel.push(
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
        );
        relabel.push(json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}));
        relabel.push(json!({"target_label": "job", "replacement": format!("{namespace}/{name}")}));
        if let Some(job_label) = spec["jobLabel"].as_str() {
            relabel.push(json!({
                "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize(job_label))],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }));
        }
        relabel.push(json!({"target_label": "endpoint", "replacement": port}));
        for (j, r) in endpoint["relabelings"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            only(
                r,
                &RELABEL_FIELDS,
                &format!("podMetricsEndpoints[{i}].relabelings[{j}]"),
            )?;
            let mut m = Map::new();
            for (k, v) in r.as_object().into_iter().flatten() {
                let key = match k.as_str() {
                    "sourceLabels" => "source_labels",
                    "targetLabel" => "target_label",
                    other => other,
                };
                // The operator lower-cases actions (`labeldrop`, `replace`, ...).
                let v = if k == "action" {
                    json!(v.as_str().unwrap_or_default().to_lowercase())
                } else {
                    v.clone()
                };
                m.insert(key.to_owned(), v);
            }
            relabel.push(Value::Object(m));
        }
        out.push(json!({
            "job_name": format!("podMonitor/{namespace}/{name}/{i}"),
            "honor_labels": endpoint["honorLabels"].as_bool().unwrap_or(false),
            "honor_timestamps": true,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
            "scheme": "http",
            "file_sd_configs": [{"files": [targets_file], "refresh_interval": "1s"}],
            "relabel_configs": relabel,
        }));
    }
    Ok(out)
}

/// File-discovery targets for `pods` (a pod list's items) as Kubernetes discovery's role `pod`
/// makes them: one per declared container port of a pod that has an IP.
pub fn pod_targets(pods: &[Value]) -> Value {
    let mut out = Vec::new();
    for pod in pods {
        let (meta, spec, status) = (&pod["metadata"], &pod["spec"], &pod["status"]);
        let Some(ip) = status["podIP"].as_str().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        let ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let put = |m: &mut Map<String, Value>, k: String, v: &Value| {
            m.insert(k, json!(v.as_str().unwrap_or_default()));
        };
        let mut common = Map::new();
        put(
            &mut common,
            "__meta_kubernetes_namespace".into(),
            &meta["namespace"],
        );
        put(&mut common, "__meta_kubernetes_pod_name".into(), &meta["name"]);
        put(&mut common, "__meta_kubernetes_pod_uid".into(), &meta["uid"]);
        put(&mut common, "__meta_kubernetes_pod_ip".into(), &status["podIP"]);
        put(
            &mut common,
            "__meta_kubernetes_pod_host_ip".into(),
            &status["hostIP"],
        );
        put(
            &mut common,
            "__meta_kubernetes_pod_node_name".into(),
            &spec["nodeName"],
        );
        put(
            &mut common,
            "__meta_kubernetes_pod_phase".into(),
            &status["phase"],
        );
        common.insert("__meta_kubernetes_pod_ready".into(), json!(ready.to_string()));
        for (kind, field) in [("label", "labels"), ("annotation", "annotations")] {
            for (k, v) in meta[field].as_object().into_iter().flatten() {
                let k = sanitize(k);
                put(&mut common, format!("__meta_kubernetes_pod_{kind}_{k}"), v);
                common.insert(format!("__meta_kubernetes_pod_{kind}present_{k}"), json!("true"));
            }
        }
        for container in spec["containers"].as_array().into_iter().flatten() {
            for port in container["ports"].as_array().into_iter().flatten() {
                let number = port["containerPort"].as_u64().unwrap_or(0);
                let mut labels = common.clone();
                put(
                    &mut labels,
                    "__meta_kubernetes_pod_container_name".into(),
                    &container["name"],
                );
                put(
                    &mut labels,
                    "__meta_kubernetes_pod_container_image".into(),
                    &container["image"],
                );
                put(
                    &mut labels,
                    "__meta_kubernetes_pod_container_port_name".into(),
                    &port["name"],
                );
                labels.insert(
                    "__meta_kubernetes_pod_container_port_number".into(),
                    json!(number.to_string()),
                );
                let protocol = port["protocol"].as_str().unwrap_or("TCP");
                labels.insert(
                    "__meta_kubernetes_pod_container_port_protocol".into(),
                    json!(protocol),
                );
                labels.insert("__meta_kubernetes_pod_container_init".into(), json!("false"));
                out.push(json!({"targets": [format!("{ip}:{number}")], "labels": labels}));
            }
        }
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/components/monitoring/podmonitor.yaml"
        );
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn the_shipped_podmonitor_becomes_the_operators_scrape_config() {
        let configs = scrape_configs(&shipped(), "/k", "1s").unwrap();
        assert_eq!(configs.len(), 1);
        let c = &configs[0];
        assert_eq!(c["job_name"], "podMonitor/lifeline/lifeline/0");
        assert_eq!(c["honor_labels"], true);
        assert_eq!(c["metrics_path"], "/metrics");
        assert_eq!(namespace(&shipped()).unwrap(), "lifeline");
        let relabel = c["relabel_configs"].as_array().unwrap();
        let has = |want: Value| relabel.contains(&want);
        assert!(has(
            json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"})
        ));
        assert!(has(
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http"})
        ));
        assert!(has(
            json!({"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
        ));
        assert!(has(
            json!({"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node", "action": "replace"})
        ));
        // The user's labeldrop comes after the operator's `endpoint` label, so it drops it.
        let drop = relabel.iter().position(|r| r["action"] == "labeldrop").unwrap();
        let endpoint = relabel
            .iter()
            .position(|r| r["target_label"] == "endpoint")
            .unwrap();
        assert!(endpoint < drop, "{relabel:#?}");
    }

    #[test]
    fn promtool_accepts_the_generated_config() {
        let dir = crate::TempDir::new();
        let targets = dir.path().join("targets.json");
        std::fs::write(&targets, "[]").unwrap();
        let scrape = scrape_configs(&shipped(), &targets.display().to_string(), "1s").unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, json!({"scrape_configs": scrape}).to_string()).unwrap();
        let promtool = super::super::system_bin("/usr/bin/promtool", "prometheus");
        let out = std::process::Command::new(promtool)
            .args(["check", "config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn pods_become_targets_with_kubernetes_discovery_labels() {
        let pod = json!({
            "metadata": {"name": "lifeline-x", "namespace": "lifeline", "uid": "u",
                         "labels": {"app.kubernetes.io/name": "lifeline"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "lifeline", "image": "i",
                     "ports": [{"name": "http", "containerPort": 9477, "protocol": "TCP"}]}]},
            "status": {"podIP": "10.0.0.5", "hostIP": "10.0.0.5", "phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]},
        });
        let pending = json!({"metadata": {"name": "p"}, "spec": {"containers": []}, "status": {}});
        let t = pod_targets(&[pod, pending]);
        assert_eq!(t.as_array().unwrap().len(), 1, "{t:#}");
        assert_eq!(t[0]["targets"], json!(["10.0.0.5:9477"]));
        let l = &t[0]["labels"];
        assert_eq!(l["__meta_kubernetes_pod_node_name"], "n1");
        assert_eq!(
            l["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "lifeline"
        );
        assert_eq!(
            l["__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"],
            "true"
        );
        assert_eq!(l["__meta_kubernetes_pod_container_port_name"], "http");
        assert_eq!(l["__meta_kubernetes_pod_ready"], "true");
    }

    #[test]
    fn fields_it_does_not_know_are_errors() {
        let mut pm = shipped();
        pm["spec"]["podMetricsEndpoints"][0]["scheme"] = json!("https");
        let err = scrape_configs(&pm, "/k", "1s").unwrap_err();
        assert!(err.contains("scheme"), "{err}");
        let mut pm = shipped();
        pm["spec"]["namespaceSelector"] = json!({"any": true});
        assert!(scrape_configs(&pm, "/k", "1s")
            .unwrap_err()
            .contains("namespaceSelector"));
    }
}
