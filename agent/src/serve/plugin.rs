//! `kubectl lifeline` (the binary invoked as `kubectl-lifeline`, or `lifeline cluster`): the
//! unhealthy clients of every node in one table, through the Kubernetes API only.
//!
//! For each agent pod (label selector, in the agent's namespace) it reads the agent's
//! `/metrics` through the apiserver's pod proxy
//! (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics`) and lists the `lifeline_client_state`
//! series that are 1 for a state other than `healthy`. Not the client API (`/api/v1/clients`):
//! it answers loopback peers and `--api-token-file` only (it shows command lines), and the
//! apiserver proxies from its own address and strips the caller's `Authorization` header, so
//! no caller could pass. `/metrics` holds no command line and answers anyone who reaches it.
//!
//! RBAC: `list` on `pods` and `get` on `pods/proxy` in the agent's namespace
//! (docs/operations.md, "`kubectl lifeline`").
use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{Api, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};

use crate::{host::redact::escape_controls, serve::exposition};

/// The name kubectl runs a plugin by (`kubectl lifeline` → `kubectl-lifeline` on `$PATH`).
pub const PLUGIN_NAME: &str = "kubectl-lifeline";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("listing the agent pods in namespace {namespace} ({selector}): {source}")]
    List {
        namespace: String,
        selector: String,
        source: kube::Error,
    },
    #[error("no agent pod in namespace {namespace} matches {selector}")]
    NoAgents { namespace: String, selector: String },
    #[error("{failed} of {total} agents could not be read (the table above lacks their nodes)")]
    Partial { failed: usize, total: usize },
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The agents' namespace.
    #[arg(long, short = 'n', default_value = "lifeline")]
    pub namespace: String,
    /// The agent pods' label selector.
    #[arg(long, short = 'l', default_value = "app.kubernetes.io/name=lifeline")]
    pub selector: String,
    /// The name of the agent container's HTTP port.
    #[arg(long, default_value = "http")]
    pub port_name: String,
    /// Kubeconfig (default: $KUBECONFIG, then in-cluster, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// The arguments to parse: `kubectl-lifeline ARGS` is `lifeline cluster ARGS`.
pub fn argv() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name().map(|n| n.to_owned()));
    if invoked_as.is_some_and(|n| n == PLUGIN_NAME) {
        args[0] = "kubectl lifeline".into();
        args.insert(1, "cluster".into());
    }
    args
}

/// One row: an unhealthy client on a node.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub node: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub comm: String,
    pub state: String,
}

/// The table, and the agents that could not be read (printed by the caller on stderr).
pub async fn run(args: &ClusterArgs) -> Result<(String, Vec<String>), Error> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|e| Error::Config(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Config(e.to_string()))?
        }
        None => Config::infer().await.map_err(|e| Error::Config(e.to_string()))?,
    };
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    let pods = Api::<Pod>::namespaced(client.clone(), &args.namespace)
        .list(&ListParams::default().labels(&args.selector))
        .await
        .map_err(|source| Error::List {
            namespace: args.namespace.clone(),
            selector: args.selector.clone(),
            source,
        })?;
    if pods.items.is_empty() {
        return Err(Error::NoAgents {
            namespace: args.namespace.clone(),
            selector: args.selector.clone(),
        });
    }
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    for pod in &pods.items {
        match agent_rows(&client, pod, args).await {
            Ok(r) => rows.extend(r),
            Err(why) => failed.push(why),
        }
    }
    let total = pods.items.len();
    let text = table(&rows);
    if failed.is_empty() {
        Ok((text, failed))
    } else {
        eprint!("{text}");
        for f in &failed {
            eprintln!("kubectl lifeline: {f}");
        }
        Err(Error::Partial {
            failed: failed.len(),
            total,
        })
    }
}

/// The unhealthy clients one agent pod reports, read through the pod proxy.
async fn agent_rows(client: &Client, pod: &Pod, args: &ClusterArgs) -> Result<Vec<Row>, String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.as_ref().ok_or(format!("agent pod {name} has no spec"))?;
    let node = spec.node_name.clone().unwrap_or_else(|| "-".to_owned());
    let port = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(args.port_name.as_str()))
        .map(|p| p.container_port)
        .ok_or(format!(
            "agent pod {name} (node {node}) has no port named {}",
            args.port_name
        ))?;
    let path = format!(
        "/api/v1/namespaces/{}/pods/{name}:{port}/proxy/metrics",
        args.namespace
    );
    let request = http::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| format!("{path}: {e}"))?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("agent pod {name} (node {node}): GET {path}: {e}"))?;
    let samples = exposition::samples(&text, "lifeline_client_state")
        .map_err(|e| format!("agent pod {name} (node {node}): {path}: {e}"))?;
    Ok(unhealthy(&node, &samples))
}

/// The rows of the series that say a client is in a state other than healthy.
pub fn unhealthy(node: &str, samples: &[exposition::Sample]) -> Vec<Row> {
    let label = |s: &exposition::Sample, k: &str| {
        let v = s.labels.get(k).map(String::as_str).unwrap_or("");
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.to_owned()
        }
    };
    samples
        .iter()
        .filter(|s| s.value == 1.0 && s.labels.get("state").is_some_and(|st| st != "healthy"))
        .map(|s| Row {
            node: node.to_owned(),
            namespace: label(s, "namespace"),
            pod: label(s, "pod"),
            container: label(s, "container"),
            comm: label(s, "comm"),
            state: label(s, "state"),
        })
        .collect()
}

/// NODE NAMESPACE POD CONTAINER COMM STATE, sorted, fields with control characters escaped.
pub fn table(rows: &[Row]) -> String {
    let mut cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [&r.node, &r.namespace, &r.pod, &r.container, &r.comm, &r.state]
                .map(|f| escape_controls(f).into_owned())
        })
        .collect();
    cells.sort();
    let header = ["NODE", "NAMESPACE", "POD", "CONTAINER", "COMM", "STATE"].map(str::to_owned);
    let all: Vec<&[String; 6]> = std::iter::once(&header).chain(&cells).collect();
    let widths: BTreeMap<usize, usize> = (0..6)
        .map(|i| (i, all.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)))
        .collect();
    let mut out = String::new();
    for row in all {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[&i]))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    if rows.is_empty() {
        out.push_str("(no unhealthy client on any node)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unhealthy_states_that_hold_become_rows() {
        let text = "lifeline_client_state{comm=\"ll-stuck\",container=\"c\",namespace=\"ns\",pod=\"p\",state=\"disconnected\"} 1\n\
            lifeline_client_state{comm=\"ll-stuck\",container=\"c\",namespace=\"ns\",pod=\"p\",state=\"healthy\"} 0\n\
            lifeline_client_state{comm=\"kubelet\",container=\"\",namespace=\"\",pod=\"\",state=\"healthy\"} 1\n\
            lifeline_client_state{comm=\"kubelet\",container=\"\",namespace=\"\",pod=\"\",state=\"stale\"} 0\n\
            lifeline_client_state{comm=\"op\",container=\"\",namespace=\"\",pod=\"\",state=\"unreachable\"} 1\n";
        let rows = unhealthy(
            "node-a",
            &exposition::samples(text, "lifeline_client_state").unwrap(),
        );
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            (
                rows[0].pod.as_str(),
                rows[0].state.as_str(),
                rows[0].node.as_str()
            ),
            ("p", "disconnected", "node-a")
        );
        assert_eq!((rows[1].pod.as_str(), rows[1].namespace.as_str()), ("-", "-"));
        let t = table(&rows);
        assert!(t.starts_with("NODE"), "{t}");
        assert!(
            t.contains("node-a  ns         p    c          ll-stuck  disconnected"),
            "{t}"
        );
        assert_eq!(
            table(&[]).lines().nth(1),
            Some("(no unhealthy client on any node)")
        );
    }
}
