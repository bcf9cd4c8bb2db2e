//! `cargo xtask test`'s checks of deploy/: the Prometheus rules (promtool), the PrometheusRule
//! in step with the plain rule file, the dashboard's queries, and what kustomize renders for the
//! base, the local-image overlay and every component (kubectl's built-in kustomize).
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::{
    image::{LOCAL_NAME, REGISTRY_NAME},
    run, show, workspace, Failed, Result,
};

/// The capabilities of `remediation.mode: none` (docs/operations.md "Privileges"); the components
/// add NET_ADMIN (reset) and NET_ADMIN + KILL (restart).
const BASE_CAPABILITIES: [&str; 5] = ["BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"];

pub fn check() -> Result {
    let deploy = workspace().join("deploy");
    let monitoring = deploy.join("components/monitoring");
    run(Command::new("promtool")
        .current_dir(&monitoring)
        .args(["check", "rules", "prometheus-rules.yaml"]))?;
    run(Command::new("promtool").current_dir(&monitoring).args([
        "test",
        "rules",
        "prometheus-rules.test.yaml",
    ]))?;
    rules_in_step(&monitoring)?;
    dashboard_queries_parse(&monitoring)?;
    manifests(&deploy)?;
    eprintln!("deploy: rules, dashboard and manifests checked");
    Ok(())
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| Failed(format!("{}: {e}", path.display())))
}

/// A YAML file as a JSON value (manifests and rules have string keys only).
fn yaml(path: &Path) -> Result<Value> {
    serde_saphyr::from_str(&read(path)?).map_err(|e| Failed(format!("{}: {e}", path.display())))
}

/// prometheusrule.yaml's `spec` is exactly the plain rule file.
fn rules_in_step(dir: &Path) -> Result {
    let plain = yaml(&dir.join("prometheus-rules.yaml"))?;
    let resource = yaml(&dir.join("prometheusrule.yaml"))?;
    if resource["spec"] != plain {
        return Err(Failed(format!(
            "{}'s spec differs from {}: the PrometheusRule and the plain rule file must carry the same rules",
            dir.join("prometheusrule.yaml").display(),
            dir.join("prometheus-rules.yaml").display()
        )));
    }
    Ok(())
}

/// Every query of the dashboard (panels and variables), with its variables replaced, is valid
/// PromQL: promtool checks them as recording rules.
fn dashboard_queries_parse(dir: &Path) -> Result {
    let path = dir.join("dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&path)?).map_err(|e| Failed(format!("{}: {e}", path.display())))?;
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push(expr.to_owned());
            }
        }
    }
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = variable["query"]["query"].as_str() {
            // label_values(SELECTOR, LABEL): the selector is the PromQL part.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(selector, _)| selector.to_owned())
                .ok_or_else(|| {
                    Failed(format!(
                        "{}: variable query {q:?} is not label_values(SELECTOR, LABEL)",
                        path.display()
                    ))
                })?;
            queries.push(inner);
        }
    }
    if queries.is_empty() {
        return Err(Failed(format!("{}: no queries found", path.display())));
    }
    let rules: Vec<serde_json::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let expr = q.replace("$node", ".*").replace("$namespace", ".*");
            serde_json::json!({ "record": format!("dashboard:query_{i}"), "expr": expr })
        })
        .collect();
    let file = scratch_dir()?.join("dashboard-queries.rules.json");
    let doc = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    fs::write(&file, doc.to_string()).map_err(|e| Failed(format!("{}: {e}", file.display())))?;
    run(Command::new("promtool").arg("check").arg("rules").arg(&file))
}

/// A directory under target/ for generated files (kustomize overlays must sit near the base:
/// it refuses absolute paths).
fn scratch_dir() -> Result<PathBuf> {
    let dir = workspace().join("target/deploy-check");
    fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// `kubectl kustomize DIR` → its objects, in order.
fn kustomize(dir: &Path) -> Result<Vec<Value>> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("kustomize").arg(dir);
    let out = cmd.output().map_err(|e| {
        Failed(format!(
            "{}: {e} (kubectl is needed for its kustomize)",
            show(&cmd)
        ))
    })?;
    if !out.status.success() {
        return Err(Failed(format!(
            "{} failed: {}",
            show(&cmd),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_saphyr::from_multiple(&text).map_err(|e| Failed(format!("{}: {e}", show(&cmd))))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .ok_or_else(|| Failed(format!("no {kind} {name} in the rendered manifests")))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result {
    if ok {
        Ok(())
    } else {
        Err(Failed(format!("deploy/: {}", what())))
    }
}

fn manifests(deploy: &Path) -> Result {
    let version = env!("CARGO_PKG_VERSION");
    let base = kustomize(deploy)?;
    ensure(base[0]["kind"] == "Namespace", || {
        format!(
            "the Namespace must come first (kubectl apply -k creates in order), got {:?}",
            base[0]["kind"]
        )
    })?;
    let namespace = &base[0];
    ensure(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged",
        || "the namespace needs pod-security.kubernetes.io/enforce=privileged".into(),
    )?;
    let ds = find(&base, "DaemonSet", "lifeline")?;
    let pod = &ds["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    ensure(
        container["image"] == format!("{REGISTRY_NAME}:{version}").as_str(),
        || {
            format!(
                "the DaemonSet's image must be {REGISTRY_NAME}:{version} (the workspace version), is {:?}",
                container["image"]
            )
        },
    )?;
    ensure(pod["hostPID"] == true && pod["hostNetwork"] == true, || {
        "hostPID and hostNetwork are required".into()
    })?;
    ensure(pod["nodeSelector"]["kubernetes.io/os"] == "linux", || {
        "nodeSelector kubernetes.io/os=linux".into()
    })?;
    let priority = pod["priorityClassName"].as_str().unwrap_or_default();
    find(&base, "PriorityClass", priority)?;
    let security = &container["securityContext"];
    ensure(strings(&security["capabilities"]["drop"]) == ["ALL"], || {
        "capabilities must drop ALL".into()
    })?;
    ensure(
        strings(&security["capabilities"]["add"]) == BASE_CAPABILITIES,
        || {
            format!(
                "the base adds exactly {BASE_CAPABILITIES:?}, not {:?}",
                strings(&security["capabilities"]["add"])
            )
        },
    )?;
    ensure(
        security["readOnlyRootFilesystem"] == true && security["allowPrivilegeEscalation"] == false,
        || "readOnlyRootFilesystem: true and allowPrivilegeEscalation: false".into(),
    )?;
    let host_paths: Vec<&Value> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("hostPath").is_some())
        .collect();
    ensure(
        host_paths.len() == 1 && host_paths[0]["hostPath"]["path"] == "/sys/kernel/tracing",
        || format!("the only hostPath is tracefs, got {host_paths:?}"),
    )?;
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        ensure(
            mount["readOnly"] == true && mount.get("subPath").is_none(),
            || {
                format!("every mount read-only, none by subPath (a subPath never sees ConfigMap updates): {mount:?}")
            },
        )?;
    }
    let config = find(&base, "ConfigMap", "lifeline")?;
    ensure(
        config["data"]["config.yaml"] == read(&deploy.join("base/config.yaml"))?.as_str(),
        || "the ConfigMap lifeline carries deploy/config.yaml".into(),
    )?;

    // The local-image overlay: the same DaemonSet, the image named as `cargo xtask image` names it.
    let local = kustomize(&deploy.join("local"))?;
    let image = &find(&local, "DaemonSet", "lifeline")?["spec"]["template"]["spec"]["containers"][0]["image"];
    ensure(image == format!("{LOCAL_NAME}:{version}").as_str(), || {
        format!("deploy/local must run {LOCAL_NAME}:{version}, runs {image:?}")
    })?;

    // Every component, through an overlay as a user would write it.
    for (component, extra) in [
        ("monitoring", &[][..]),
        ("reset", &["NET_ADMIN"][..]),
        ("restart", &["NET_ADMIN", "KILL"][..]),
    ] {
        let dir = scratch_dir()?.join(format!("overlay-{component}"));
        fs::create_dir_all(&dir).map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        let kustomization =
            format!("resources: [../../../deploy]\ncomponents: [../../../deploy/components/{component}]\n");
        fs::write(dir.join("kustomization.yaml"), kustomization)
            .map_err(|e| Failed(format!("{}: {e}", dir.display())))?;
        let objects = kustomize(&dir)?;
        let caps = strings(
            &find(&objects, "DaemonSet", "lifeline")?["spec"]["template"]["spec"]["containers"][0]
                ["securityContext"]["capabilities"]["add"],
        );
        let expected: Vec<&str> = BASE_CAPABILITIES.iter().chain(extra).copied().collect();
        ensure(caps == expected, || {
            format!("components/{component}: capabilities {caps:?}, expected {expected:?}")
        })?;
        if component == "monitoring" {
            monitoring(&objects, ds, &deploy.join("components/monitoring"))?;
        }
    }
    Ok(())
}

/// The PodMonitor's job is the one the rules alert on; the dashboard ConfigMap is the file.
fn monitoring(objects: &[Value], ds: &Value, dir: &Path) -> Result {
    let monitor = find(objects, "PodMonitor", "lifeline")?;
    let spec = &monitor["spec"];
    // prometheus-operator sets job to "<namespace>/<name>", or to the value of the pod label
    // named by jobLabel when the pod has it.
    let job = match spec["jobLabel"].as_str() {
        Some(label) => ds["spec"]["template"]["metadata"]["labels"][label]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| {
                Failed(format!(
                    "the PodMonitor's jobLabel {label} is not a label of the agent's pods"
                ))
            })?,
        None => format!(
            "{}/{}",
            monitor["metadata"]["namespace"].as_str().unwrap_or_default(),
            monitor["metadata"]["name"].as_str().unwrap_or_default()
        ),
    };
    let rules = read(&dir.join("prometheus-rules.yaml"))?;
    let selector = format!("up{{job=\"{job}\"}}");
    ensure(rules.contains(&selector), || {
        format!("the PodMonitor produces job={job:?}; LifelineAgentDown must select {selector}")
    })?;
    let tests = read(&dir.join("prometheus-rules.test.yaml"))?;
    ensure(tests.contains(&format!("up{{job=\"{job}\"")), || {
        format!("prometheus-rules.test.yaml must test `up` series with job={job:?}")
    })?;
    let endpoint = &spec["podMetricsEndpoints"][0];
    ensure(endpoint["honorLabels"] == true, || {
        "the PodMonitor needs honorLabels: true".into()
    })?;
    let relabels = endpoint["relabelings"].as_array().cloned().unwrap_or_default();
    ensure(
        relabels.iter().any(|r| {
            r["targetLabel"] == "node" && strings(&r["sourceLabels"]) == ["__meta_kubernetes_pod_node_name"]
        }),
        || "the PodMonitor must set `node` from __meta_kubernetes_pod_node_name".into(),
    )?;
    let dashboard = find(objects, "ConfigMap", "lifeline-dashboard")?;
    ensure(
        dashboard["metadata"]["labels"]["grafana_dashboard"] == "1",
        || "the dashboard ConfigMap needs the label grafana_dashboard=1".into(),
    )?;
    ensure(
        dashboard["data"]["lifeline.json"] == read(&dir.join("dashboard.json"))?.as_str(),
        || "the dashboard ConfigMap carries dashboard.json".into(),
    )?;
    let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    ensure(kinds.contains("PrometheusRule"), || {
        "no PrometheusRule rendered".into()
    })
}
