//! The e2e's monitoring checks: a real Prometheus scraping the agent as the shipped PodMonitor
//! says, with the shipped rules, sending to a real Alertmanager (`real_cluster::prometheus`);
//! the shipped dashboard's every panel queried; `kubectl lifeline`.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
    time::{Duration, SystemTime},
};

use lifeline_integration::{
    real_cluster::{
        dashboard,
        findings::Findings,
        prometheus::{unix, Monitoring},
        secs, write_kubeconfig, ControlPlane, KUBECTL,
    },
    *,
};
use serde_json::Value;

/// What a panel must show after the incident.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// Series (the incident or the agent's own activity).
    Series,
    /// No series: nothing of the kind happened (the query must still run).
    Nothing,
    /// Series or none: what it shows is chance, not the incident (the query must still run).
    Either,
}

/// Every panel of the shipped dashboard and what it must show after the e2e's incident (a
/// panel missing here is a finding: a new panel gets its expectation written down).
pub const PANELS: [(&str, Expect); 14] = [
    ("Clients by state", Expect::Series),
    // The pod without opt-in is still disconnected when the panels are queried.
    ("Unhealthy clients", Expect::Series),
    ("Apiserver connections by endpoint", Expect::Series),
    ("Seconds since last payload (worst client)", Expect::Series),
    // ll-stuck never dials again and the apiserver came back at once: no failed connect.
    ("Failed connects", Expect::Nothing),
    // The SIGKILLed apiserver's kernel closed the connections at once: a retransmit in the test
    // namespace is chance, not the incident.
    ("Retransmits to apiservers", Expect::Either),
    // The two disconnections were detected.
    ("Detection time (p50, p99)", Expect::Series),
    // One eviction done, one skipped.
    ("Remediations", Expect::Series),
    // The shipped config has no receiver: the agent sends no alert itself.
    ("Alert deliveries", Expect::Nothing),
    ("Kernel events and losses", Expect::Series),
    ("Agents by version", Expect::Series),
    // The apiserver came back at once (before outage_after).
    ("Apiserver endpoints unreachable from a node", Expect::Nothing),
    // The namespace's clients (ll-stuck) are no Go HTTP/2 clients: no stream of theirs.
    ("Open watches by resource", Expect::Nothing),
    ("Stuck streams", Expect::Nothing),
];

/// The stream panels again with the namespace variable on "All" (its `allValue`), where the
/// node's host processes show: a kubectl pods watch started after the apiserver restart and
/// followed from its first request is there, and no stream is stuck (the incident is
/// connections lost; the watch proves the stream gauges are exported, so an empty stuck panel
/// is the agent's judgement, not a missing metric).
pub const STREAM_PANELS_ALL_NAMESPACES: [(&str, Expect); 2] = [
    ("Open watches by resource", Expect::Series),
    ("Stuck streams", Expect::Nothing),
];

fn label<'a>(v: &'a Value, name: &str) -> &'a str {
    v["labels"][name]
        .as_str()
        .or(v["metric"][name].as_str())
        .unwrap_or("")
}

/// Waits until `expr` returns series (`what` for the failure message, with Prometheus's
/// targets and logs).
pub fn wait_series(m: &Monitoring, expr: &str, what: &str, timeout: Duration) {
    wait_until(timeout, what, || match m.query(expr, None) {
        Ok(r) if !r.is_empty() => Ok(()),
        other => Err(Shown(format!("{expr}: {other:?}\n{}", m.diagnosis()))),
    });
}

/// Label values an alert must have; "" for a label it must not have.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

fn has(alert: &Value, labels: Labels) -> bool {
    labels.iter().all(|(name, want)| label(alert, name) == *want)
}

/// Prometheus's alert `name` with `labels` in `state`, once there.
pub fn wait_alert(m: &Monitoring, name: &str, labels: Labels, state: &str, timeout: Duration) -> Value {
    wait_until(
        timeout,
        &format!("{name} {state} with {labels:?} in Prometheus"),
        || {
            let alerts = m.alerts().map_err(Shown)?;
            alerts
                .iter()
                .find(|a| label(a, "alertname") == name && has(a, labels) && a["state"] == state)
                .cloned()
                .ok_or_else(|| Shown(format!("{alerts:#?}\n{}", m.diagnosis())))
        },
    )
}

/// Waits until Prometheus has no alert `name` with `labels` any more.
pub fn wait_alert_gone(m: &Monitoring, name: &str, labels: Labels, timeout: Duration) {
    wait_until(
        timeout,
        &format!("{name} with {labels:?} resolved in Prometheus"),
        || {
            let alerts = m.alerts().map_err(Shown)?;
            let left: Vec<&Value> = alerts
                .iter()
                .filter(|a| label(a, "alertname") == name && has(a, labels))
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(Shown(format!("{left:#?}")))
            }
        },
    );
}

/// The Alertmanager's alert `name` with `labels`: `present` waits for it, else for its absence
/// (resolved alerts are not listed).
pub fn wait_alertmanager(
    m: &Monitoring,
    name: &str,
    labels: Labels,
    present: bool,
    timeout: Duration,
) -> Option<Value> {
    let what = if present { "received" } else { "resolved" };
    wait_until(
        timeout,
        &format!("{name} with {labels:?} {what} in Alertmanager"),
        || {
            let alerts = m.alertmanager_alerts().map_err(Shown)?;
            let found = alerts
                .iter()
                .find(|a| label(a, "alertname") == name && has(a, labels) && a["status"]["state"] == "active")
                .cloned();
            match (present, found) {
                (true, Some(a)) => Ok(Some(a)),
                (false, None) => Ok(None),
                _ => Err(Shown(format!("{alerts:#?}"))),
            }
        },
    )
}

/// Checks the alert's labels: the rule kept the client's and the PodMonitor's.
pub fn check_client_labels(
    alert: &Value,
    namespace: &str,
    pod: &str,
    container: &str,
    node: &str,
    findings: &mut Findings,
) {
    for (name, want) in [
        ("namespace", namespace),
        ("pod", pod),
        ("container", container),
        ("node", node),
        ("job", "lifeline"),
        ("severity", "critical"),
    ] {
        findings.check(label(alert, name) == want, || {
            format!(
                "{} for {pod}: label {name} is {:?}, not {want:?}: {alert:#}",
                label(alert, "alertname"),
                label(alert, name)
            )
        });
    }
}

/// The `ALERTS` series between `start` and now: (alertname, alertstate, pod) seen.
pub fn alert_history(m: &Monitoring, start: SystemTime) -> BTreeSet<(String, String, String)> {
    let series = m
        .query_range("ALERTS", unix(start), unix(SystemTime::now()), 1.0)
        .unwrap_or_else(|e| panic!("ALERTS: {e}"));
    series
        .iter()
        .map(|s| {
            (
                label(s, "alertname").to_owned(),
                label(s, "alertstate").to_owned(),
                label(s, "pod").to_owned(),
            )
        })
        .collect()
}

/// Each panel's queries, the dashboard's variables chosen as an operator looking at the
/// incident would (`node` = this node, `namespace` = the test pods'; both lists taken from
/// Prometheus with the variables' own queries), run over `[start, now]` (table panels: now).
pub fn check_panels(
    m: &Monitoring,
    workspace: &Path,
    node: &str,
    namespace: &str,
    start: SystemTime,
    findings: &mut Findings,
) {
    let path = workspace.join("deploy/components/monitoring/dashboard.json");
    let board: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard.json"))
        .expect("dashboard.json is JSON");
    let choice: BTreeMap<&str, &str> = [("node", node), ("namespace", namespace)].into();
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, query) in dashboard::query_variables(&board) {
        let Some((matcher, label_name)) = dashboard::label_values(&query) else {
            findings.add(format!(
                "dashboard variable {name}: {query:?} is not label_values(...)"
            ));
            continue;
        };
        let matcher = dashboard::substitute(&matcher, &values);
        let offered = m
            .label_values(&label_name, &matcher)
            .unwrap_or_else(|e| panic!("{e}"));
        let Some(want) = choice.get(name.as_str()) else {
            findings.add(format!(
                "dashboard variable {name}: the e2e does not know what to choose"
            ));
            continue;
        };
        findings.check(offered.iter().any(|v| v == want), || {
            format!("dashboard variable {name} ({query}) offers {offered:?}, not {want:?}")
        });
        eprintln!("dashboard variable {name}: {offered:?}, {want} chosen");
        values.insert(name, vec![(*want).to_owned()]);
    }
    let queries = match dashboard::queries(&board, &values) {
        Ok(q) => q,
        Err(e) => return findings.add(format!("dashboard: {e}")),
    };
    let titles: BTreeSet<&str> = queries.iter().map(|q| q.title.as_str()).collect();
    for title in &titles {
        findings.check(PANELS.iter().any(|(t, _)| t == title), || {
            format!(
                "dashboard panel {title:?} has no expectation in the e2e (tests/e2e/monitoring.rs PANELS)"
            )
        });
    }
    for (title, _) in PANELS {
        findings.check(titles.contains(title), || {
            format!("dashboard panel {title:?} is gone")
        });
    }
    let (from, to) = (unix(start), unix(SystemTime::now()));
    let series_of = series_counts(m, &queries, (from, to), findings);
    check_expected(
        &PANELS,
        &series_of,
        &format!("{node}, namespace {namespace}"),
        findings,
    );
    // "All" namespaces: a placeholder the regex escaping keeps, then the variable's allValue.
    values.insert("namespace".into(), vec!["LIFELINE_ALL".into()]);
    let all = match dashboard::queries(&board, &values) {
        Ok(q) => q,
        Err(e) => return findings.add(format!("dashboard: {e}")),
    };
    let streams: Vec<_> = all
        .into_iter()
        .filter(|q| STREAM_PANELS_ALL_NAMESPACES.iter().any(|(t, _)| *t == q.title))
        .map(|mut q| {
            q.expr = q.expr.replace("LIFELINE_ALL", ".*");
            q
        })
        .collect();
    let series_of = series_counts(m, &streams, (from, to), findings);
    let view = format!("{node}, all namespaces");
    check_expected(&STREAM_PANELS_ALL_NAMESPACES, &series_of, &view, findings);
}

/// How many series each panel's queries return over `(from, to)` (instant ones at `to`).
fn series_counts(
    m: &Monitoring,
    queries: &[dashboard::PanelQuery],
    (from, to): (f64, f64),
    findings: &mut Findings,
) -> BTreeMap<String, usize> {
    let mut series_of: BTreeMap<String, usize> = BTreeMap::new();
    for q in queries {
        let result = if q.instant {
            m.query(&q.expr, Some(to))
        } else {
            m.query_range(&q.expr, from, to, 2.0)
        };
        match result {
            Ok(r) => {
                eprintln!("panel {:?}: {} series from {}", q.title, r.len(), q.expr);
                *series_of.entry(q.title.clone()).or_default() += r.len();
            }
            Err(e) => findings.add(format!("dashboard panel {:?}: {} failed: {e}", q.title, q.expr)),
        }
    }
    series_of
}

/// Each panel of `expected` against what its queries returned in `view`.
fn check_expected(
    expected: &[(&str, Expect)],
    series_of: &BTreeMap<String, usize>,
    view: &str,
    findings: &mut Findings,
) {
    for (title, expect) in expected {
        let Some(&n) = series_of.get(*title) else { continue };
        match expect {
            Expect::Series => findings.check(n > 0, || {
                format!("dashboard panel {title:?} shows nothing over the incident ({view})")
            }),
            Expect::Nothing => findings.check(n == 0, || {
                format!("dashboard panel {title:?} shows {n} series where the incident implies none ({view})")
            }),
            Expect::Either => {}
        }
    }
}

/// `kubectl lifeline` as an operator runs it: the agent binary installed as `kubectl-lifeline`
/// on `$PATH`, kubectl finding the plugin, the kubeconfig in `$KUBECONFIG`. Its rows, split.
pub fn kubectl_lifeline(kubeconfig: &Path, dir: &Path) -> Result<Vec<Vec<String>>, String> {
    let plugin = dir.join("kubectl-lifeline");
    if !plugin.exists() {
        std::os::unix::fs::symlink(lifeline_bin(), &plugin).expect("symlink kubectl-lifeline");
    }
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(KUBECTL)
        .arg("lifeline")
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "kubectl lifeline:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!(
            "kubectl lifeline failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    if header != ["NODE", "NAMESPACE", "POD", "CONTAINER", "COMM", "STATE"] {
        return Err(format!("kubectl lifeline: unexpected header {header:?}"));
    }
    Ok(lines
        .filter(|l| !l.starts_with('('))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect())
}

/// The service account `kubectl lifeline` runs as in the e2e.
const VIEWER: &str = "lifeline-viewer";

/// docs/operations.md's RBAC for `kubectl lifeline` (the yaml block after "The RBAC it needs"),
/// bound to the service account [`VIEWER`] of `namespace` instead of the page's example group.
fn readme_rbac(workspace: &Path, namespace: &str) -> String {
    let page = workspace.join("docs/operations.md");
    let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let after = text
        .split_once("The RBAC it needs")
        .expect("docs/operations.md: `kubectl lifeline`'s RBAC")
        .1;
    let block = after
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("docs/operations.md: the RBAC yaml block")
        .0;
    let subjects = block
        .lines()
        .find(|l| l.starts_with("subjects:"))
        .expect("docs/operations.md's RBAC has subjects");
    block.replace(
        subjects,
        &format!("subjects: [{{ kind: ServiceAccount, name: {VIEWER}, namespace: {namespace} }}]"),
    )
}

/// A kubeconfig for the service account [`VIEWER`] in `namespace` (its token secret, which a
/// 1.20 apiserver creates).
fn viewer_kubeconfig(cp: &ControlPlane, namespace: &str, dir: &Path) -> std::path::PathBuf {
    cp.kubectl_ok(&["-n", namespace, "create", "serviceaccount", VIEWER]);
    let token = wait_until(secs(30), "the viewer's token secret", || {
        let secret = cp.kubectl(&[
            "-n",
            namespace,
            "get",
            "sa",
            VIEWER,
            "-o",
            "jsonpath={.secrets[0].name}",
        ]);
        let name = String::from_utf8_lossy(&secret.stdout).trim().to_owned();
        if name.is_empty() {
            return Err(Shown("no secret yet".into()));
        }
        let data = cp.kubectl(&[
            "-n",
            namespace,
            "get",
            "secret",
            &name,
            "-o",
            "jsonpath={.data.token}",
        ]);
        let mut decode = Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("base64");
        use std::io::Write as _;
        decode.stdin.take().unwrap().write_all(&data.stdout).unwrap();
        let out = decode.wait_with_output().expect("base64 -d");
        let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if token.is_empty() {
            Err(Shown(format!("secret {name} has no token")))
        } else {
            Ok(token)
        }
    });
    let path = dir.join("viewer.kubeconfig");
    let user = format!("system:serviceaccount:{namespace}:{VIEWER}");
    write_kubeconfig(&path, &cp.url(), &cp.ca_pem(), &user, &token);
    path
}

/// A kubeconfig with which `kubectl lifeline` runs with exactly docs/operations.md's RBAC: refused
/// before the Role is bound, so the binding is what lets it in.
pub fn plugin_viewer(
    cp: &ControlPlane,
    workspace: &Path,
    namespace: &str,
    dir: &Path,
    findings: &mut Findings,
) -> std::path::PathBuf {
    let kubeconfig = viewer_kubeconfig(cp, namespace, dir);
    match kubectl_lifeline(&kubeconfig, dir) {
        Err(e) => findings.check(e.contains("forbidden") || e.contains("Forbidden"), || {
            format!("`kubectl lifeline` without RBAC failed, but not as forbidden: {e}")
        }),
        Ok(rows) => findings.add(format!("`kubectl lifeline` worked without its RBAC: {rows:?}")),
    }
    cp.apply(&readme_rbac(workspace, namespace));
    kubeconfig
}

/// The label sets promtool's unit test (`prometheus-rules.test.yaml`) expects on alert `name`
/// (`alertname` included), each once: what it assumes a real scrape gives.
pub fn unit_test_labels(workspace: &Path, name: &str) -> BTreeSet<BTreeSet<String>> {
    let path = workspace.join("deploy/components/monitoring/prometheus-rules.test.yaml");
    let text = std::fs::read_to_string(&path).expect("prometheus-rules.test.yaml");
    let tests: Value = serde_saphyr::from_str(&text).expect("prometheus-rules.test.yaml is YAML");
    let expected: BTreeSet<BTreeSet<String>> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["alertname"] == name)
        .flat_map(|a| a["exp_alerts"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["exp_labels"].as_object().cloned())
        .map(|labels| labels.keys().cloned().chain(["alertname".to_owned()]).collect())
        .collect();
    assert!(
        !expected.is_empty(),
        "prometheus-rules.test.yaml has no exp_labels for {name}"
    );
    expected
}

/// Checks that a real alert's label names are a set promtool's unit test expects of it.
pub fn check_unit_tested_labels(alert: &Value, workspace: &Path, findings: &mut Findings) {
    let name = label(alert, "alertname");
    let names: BTreeSet<String> = alert["labels"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let tested = unit_test_labels(workspace, name);
    findings.check(tested.contains(&names), || {
        format!("{name}'s labels are {names:?}; prometheus-rules.test.yaml tests it with {tested:?}")
    });
}
