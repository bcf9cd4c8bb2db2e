//! A real Prometheus and a real Alertmanager (Debian's `prometheus` and
//! `prometheus-alertmanager`) watching the agents of a real cluster as the shipped monitoring
//! component would: the scrape config generated from `podmonitor.yaml` ([`super::podmonitor`]),
//! the shipped rule file loaded as is, alerts sent to the Alertmanager. Only the intervals are
//! the test's (scrape and evaluation every second; the rules' `for:` are the shipped ones), and
//! the pod discovery (Debian's Prometheus has no Kubernetes discovery): a thread lists the
//! PodMonitor's namespace's pods every second and rewrites the file-discovery targets. Beside
//! the agents, the node's kubelet is scraped as kube-prometheus scrapes it (job `kubelet`, the
//! node's name in `node`, HTTPS without verifying the kubelet's self-signed certificate, a
//! bearer token): the rules' source for which nodes are in the cluster.
use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Value};

use super::{podmonitor, system_bin, KUBECTL};
use crate::{free_port, http_get};

/// Scrape and rule evaluation interval.
pub const INTERVAL: &str = "1s";

/// A kubelet to scrape: where, the node's name, a token the kubelet's webhook authorizes for
/// `nodes/metrics`.
pub struct Kubelet {
    pub endpoint: SocketAddr,
    pub node: String,
    pub token: String,
}

pub struct Monitoring {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    discovery: Option<JoinHandle<()>>,
    prometheus: Child,
    alertmanager: Child,
    pub prometheus_addr: SocketAddr,
    pub alertmanager_addr: SocketAddr,
}

impl Drop for Monitoring {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.discovery.take() {
            let _ = d.join();
        }
        for child in [&mut self.prometheus, &mut self.alertmanager] {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Seconds since the epoch, as Prometheus's API takes times.
pub fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `application/x-www-form-urlencoded` for a query string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn get_json(addr: SocketAddr, path: &str) -> Result<Value, String> {
    match http_get(addr, path) {
        Ok((200, body)) => serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}: {body}")),
        Ok((status, body)) => Err(format!("GET {path}: {status}: {body}")),
        Err(e) => Err(format!("GET {path}: {e}")),
    }
}

/// Every second, the pods of `namespace` as file-discovery targets in `file` (rewritten
/// atomically when they change; kept as they are while the apiserver does not answer, as
/// Kubernetes discovery keeps its last view).
fn discover(kubeconfig: PathBuf, namespace: String, file: PathBuf, stop: Arc<AtomicBool>) {
    let mut last = String::new();
    while !stop.load(Ordering::Relaxed) {
        let out = Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "-n",
                &namespace,
                "get",
                "pods",
                "-o",
                "json",
                "--request-timeout=2s",
            ])
            .output();
        let pods = out
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok());
        if let Some(list) = pods {
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let text = podmonitor::pod_targets(&items).to_string();
            if text != last {
                let tmp = file.with_extension("tmp");
                if fs::write(&tmp, &text).is_ok() && fs::rename(&tmp, &file).is_ok() {
                    last = text;
                }
            }
        }
        thread::sleep(Duration::from_secs(1));
    }
}

impl Monitoring {
    /// Starts both, Prometheus discovering the agent pods through `kubeconfig`, scraping
    /// `kubelet`, and loading `deploy/components/monitoring/prometheus-rules.yaml` of
    /// `workspace`.
    pub fn start(kubeconfig: &Path, workspace: &Path, kubelet: &Kubelet) -> Monitoring {
        let monitoring = workspace.join("deploy/components/monitoring");
        let nanos = unix(SystemTime::now()) as u64;
        let dir = std::env::temp_dir().join(format!("lifeline-prom-{}-{nanos}", std::process::id()));
        fs::create_dir_all(dir.join("am")).expect("the monitoring directory");
        let prometheus_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let alertmanager_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));

        let am_config = dir.join("alertmanager.yml");
        fs::write(
            &am_config,
            "route: {receiver: blackhole, group_wait: 1s, group_interval: 1s}\nreceivers: [{name: blackhole}]\n",
        )
        .expect("alertmanager.yml");
        let log = |name: &str| fs::File::create(dir.join(name)).expect("a log file");
        let alertmanager = Command::new(system_bin(
            "/usr/bin/prometheus-alertmanager",
            "prometheus-alertmanager",
        ))
        .arg(format!("--config.file={}", am_config.display()))
        .arg(format!("--storage.path={}", dir.join("am").display()))
        .arg(format!("--web.listen-address={alertmanager_addr}"))
        .arg("--cluster.listen-address=")
        .stdin(Stdio::null())
        .stdout(log("alertmanager.log"))
        .stderr(log("alertmanager.log.err"))
        .spawn()
        .expect("start prometheus-alertmanager");

        let text = fs::read_to_string(monitoring.join("podmonitor.yaml")).expect("podmonitor.yaml");
        let podmonitor: Value = serde_saphyr::from_str(&text).expect("podmonitor.yaml is YAML");
        let targets = dir.join("targets.json");
        fs::write(&targets, "[]").expect("targets.json");
        let mut scrape = podmonitor::scrape_configs(&podmonitor, &targets.display().to_string(), INTERVAL)
            .unwrap_or_else(|e| panic!("podmonitor.yaml: {e}"));
        let token = dir.join("kubelet.token");
        fs::write(&token, &kubelet.token).expect("kubelet.token");
        scrape.push(json!({
            "job_name": "kubelet",
            "scheme": "https",
            "tls_config": {"insecure_skip_verify": true},
            "authorization": {"credentials_file": token},
            "static_configs": [{
                "targets": [kubelet.endpoint.to_string()],
                "labels": {"node": kubelet.node, "metrics_path": "/metrics"},
            }],
        }));
        let namespace = podmonitor::namespace(&podmonitor).unwrap_or_else(|e| panic!("podmonitor.yaml: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let discovery = {
            let (kubeconfig, stop) = (kubeconfig.to_path_buf(), stop.clone());
            thread::spawn(move || discover(kubeconfig, namespace, targets, stop))
        };
        let config = json!({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [monitoring.join("prometheus-rules.yaml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_addr.to_string()]}]}]},
            "scrape_configs": scrape,
        });
        // JSON is YAML.
        let config_file = dir.join("prometheus.yml");
        fs::write(&config_file, serde_json::to_string_pretty(&config).unwrap()).expect("prometheus.yml");
        let prometheus = Command::new(system_bin("/usr/bin/prometheus", "prometheus"))
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={prometheus_addr}"))
            // A resolved alert reaches the Alertmanager at once, not a minute later.
            .arg("--rules.alert.resend-delay=1s")
            .stdin(Stdio::null())
            .stdout(log("prometheus.log"))
            .stderr(log("prometheus.log.err"))
            .spawn()
            .expect("start prometheus");
        let m = Monitoring {
            dir,
            stop,
            discovery: Some(discovery),
            prometheus,
            alertmanager,
            prometheus_addr,
            alertmanager_addr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        for addr in [m.prometheus_addr, m.alertmanager_addr] {
            while !matches!(http_get(addr, "/-/ready"), Ok((200, _))) {
                assert!(Instant::now() < deadline, "not ready: {addr}\n{}", m.logs());
                thread::sleep(Duration::from_millis(200));
            }
        }
        // The shipped rules loaded (a rule file that does not load leaves no groups).
        let rules = get_json(m.prometheus_addr, "/api/v1/rules").expect("the rules API");
        let groups = rules["data"]["groups"].as_array().map_or(0, Vec::len);
        assert!(
            groups >= 2,
            "Prometheus loaded {groups} rule groups:\n{rules}\n{}",
            m.logs()
        );
        m
    }

    /// Both programs' logs (for failure messages).
    pub fn logs(&self) -> String {
        ["prometheus.log.err", "alertmanager.log.err"]
            .iter()
            .map(|f| {
                let text = fs::read_to_string(self.dir.join(f)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!(
                    "--- {f} (last lines)\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn data(&self, path: &str) -> Result<Value, String> {
        let v = get_json(self.prometheus_addr, path)?;
        if v["status"] != "success" {
            return Err(format!("GET {path}: {v}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query at `time` (now if `None`): the result vector.
    pub fn query(&self, expr: &str, time: Option<f64>) -> Result<Vec<Value>, String> {
        let at = time.map_or(String::new(), |t| format!("&time={t:.3}"));
        let data = self.data(&format!("/api/v1/query?query={}{at}", encode(expr)))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// A range query: the result matrix.
    pub fn query_range(&self, expr: &str, start: f64, end: f64, step: f64) -> Result<Vec<Value>, String> {
        let data = self.data(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            encode(expr)
        ))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// `label_values(MATCH, LABEL)`, as Grafana's template variables ask it.
    pub fn label_values(&self, label: &str, matcher: &str) -> Result<Vec<String>, String> {
        let data = self.data(&format!(
            "/api/v1/label/{label}/values?match[]={}",
            encode(matcher)
        ))?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }

    /// What Prometheus scrapes and how it went, and its logs: for failure messages.
    pub fn diagnosis(&self) -> String {
        let targets = self.data("/api/v1/targets").map_or_else(
            |e| e,
            |d| {
                d["activeTargets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        format!(
                            "{} {} {} {}",
                            t["scrapeUrl"], t["labels"]["pod"], t["health"], t["lastError"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        format!("Prometheus targets:\n{targets}\n{}", self.logs())
    }

    /// Prometheus's active alerts (pending and firing).
    pub fn alerts(&self) -> Result<Vec<Value>, String> {
        Ok(self.data("/api/v1/alerts")?["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The Alertmanager's alerts that are not resolved.
    pub fn alertmanager_alerts(&self) -> Result<Vec<Value>, String> {
        match get_json(self.alertmanager_addr, "/api/v2/alerts")? {
            Value::Array(a) => Ok(a),
            other => Err(format!("/api/v2/alerts is not a list: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_form_encoded() {
        assert_eq!(
            super::encode("up{job=\"x\"} == 0"),
            "up%7Bjob%3D%22x%22%7D%20%3D%3D%200"
        );
    }
}
