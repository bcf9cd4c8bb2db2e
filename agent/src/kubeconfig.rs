//! Endpoints from a kubeconfig: the server URL of the current context's cluster, so that
//! `lifeline run` with no `--endpoint` watches the cluster this host talks to.
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::endpoint::{self, Endpoint};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read kubeconfig {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("kubeconfig {path}: {source}")]
    Parse {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("kubeconfig {path}: {reason}")]
    Content { path: PathBuf, reason: String },
    #[error("kubeconfig {path}: server {server:?}: {source}")]
    Server {
        path: PathBuf,
        server: String,
        source: endpoint::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    current_context: Option<String>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    clusters: Vec<NamedCluster>,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: ContextBody,
}

#[derive(Deserialize)]
struct ContextBody {
    cluster: String,
}

#[derive(Deserialize)]
struct NamedCluster {
    name: String,
    cluster: ClusterBody,
}

#[derive(Deserialize)]
struct ClusterBody {
    server: String,
}

/// `--kubeconfig`, else `$KUBECONFIG` (first path), else `~/.kube/config`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(first) = std::env::var_os("KUBECONFIG").and_then(|v| std::env::split_paths(&v).next()) {
        return Some(first);
    }
    std::env::var_os("HOME").map(|home| Path::new(&home).join(".kube/config"))
}

/// The endpoints of the current context's server (names resolved).
pub fn endpoints(path: &Path) -> Result<Vec<Endpoint>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.into(),
        source,
    })?;
    let config: Kubeconfig = serde_yaml::from_str(&text).map_err(|source| Error::Parse {
        path: path.into(),
        source,
    })?;
    let content = |reason: String| Error::Content {
        path: path.into(),
        reason,
    };
    let current = config
        .current_context
        .ok_or_else(|| content("no current-context".into()))?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == current)
        .ok_or_else(|| content(format!("current-context {current:?} is not among its contexts")))?;
    let cluster_name = &context.context.cluster;
    let cluster = config
        .clusters
        .iter()
        .find(|c| &c.name == cluster_name)
        .ok_or_else(|| {
            content(format!(
                "cluster {cluster_name:?} of context {current:?} is not defined"
            ))
        })?;
    let server = &cluster.cluster.server;
    let host_port = server_host_port(server)
        .ok_or_else(|| content(format!("server {server:?} is not an http(s):// URL")))?;
    Endpoint::parse_all(&host_port).map_err(|source| Error::Server {
        path: path.into(),
        server: server.clone(),
        source,
    })
}

/// `https://host[:port][/path]` → `host:port` (443 by default for https, 80 for http).
fn server_host_port(server: &str) -> Option<String> {
    let (rest, default_port) = match server.split_once("://")? {
        ("https", rest) => (rest, 443),
        ("http", rest) => (rest, 80),
        _ => return None,
    };
    let authority = rest.split('/').next().filter(|a| !a.is_empty())?;
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close..].contains(':'),
        None => authority.contains(':'),
    };
    Some(if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:{default_port}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_become_host_port() {
        assert_eq!(
            server_host_port("https://10.0.0.1:6443").as_deref(),
            Some("10.0.0.1:6443")
        );
        assert_eq!(
            server_host_port("https://api.example").as_deref(),
            Some("api.example:443")
        );
        assert_eq!(
            server_host_port("http://[fd00::1]/x").as_deref(),
            Some("[fd00::1]:80")
        );
        assert_eq!(
            server_host_port("https://[fd00::1]:6443").as_deref(),
            Some("[fd00::1]:6443")
        );
        assert_eq!(server_host_port("unix:///x"), None);
    }

    #[test]
    fn reads_the_current_contexts_server() {
        let dir = std::env::temp_dir().join(format!("lifeline-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: b\ncontexts:\n- name: a\n  context: {cluster: one}\n- name: b\n  context: {cluster: two, user: u}\nclusters:\n- name: one\n  cluster: {server: \"https://127.0.0.1:1\"}\n- name: two\n  cluster: {server: \"https://127.0.0.2:6443\", certificate-authority-data: abc}\nusers: []\n",
        )
        .unwrap();
        let got: Vec<String> = endpoints(&path)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, vec!["127.0.0.2:6443"]);
        std::fs::write(&path, "current-context: zz\ncontexts: []\nclusters: []\n").unwrap();
        let err = endpoints(&path).unwrap_err().to_string();
        assert!(err.contains("\"zz\" is not among its contexts"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
