//! How the agent reaches the apiserver: in-cluster service account or a kubeconfig.
//!
//! Precedence, most explicit first (client-go's for controllers, with `$KUBECONFIG` honoured):
//!
//! 1. `--kubeconfig FILE`;
//! 2. `$KUBECONFIG` (a list of files, merged as kubectl does);
//! 3. in-cluster: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` set and the service
//!    account token mounted;
//! 4. `~/.kube/config`, if it exists.
use std::{
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{Error, Result};
use crate::endpoint::Source;

/// Where the service account token is mounted in a pod.
pub const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Where the client configuration comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--kubeconfig`.
    Flag(PathBuf),
    /// `$KUBECONFIG` (its raw value).
    Env(String),
    /// The pod's service account.
    InCluster,
    /// `~/.kube/config`.
    Home(PathBuf),
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::Flag(p) => write!(f, "kubeconfig {} (--kubeconfig)", p.display()),
            ConfigSource::Env(v) => write!(f, "kubeconfig {v} ($KUBECONFIG)"),
            ConfigSource::InCluster => f.write_str("in-cluster service account"),
            ConfigSource::Home(p) => write!(f, "kubeconfig {}", p.display()),
        }
    }
}

impl ConfigSource {
    /// The source of the server endpoints this configuration names.
    pub fn endpoint_source(&self) -> Source {
        match self {
            ConfigSource::InCluster => Source::InCluster,
            _ => Source::Kubeconfig,
        }
    }
}

/// What the environment offers, read once (so that [`choose`] is pure).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub kubeconfig_flag: Option<PathBuf>,
    pub kubeconfig_env: Option<String>,
    /// `KUBERNETES_SERVICE_HOST` and `_PORT` are both set and non-empty.
    pub service_env: bool,
    pub token_mounted: bool,
    /// `~/.kube/config`, when `$HOME` is set and the file exists.
    pub home_kubeconfig: Option<PathBuf>,
}

impl Environment {
    pub fn read(kubeconfig_flag: Option<&Path>) -> Self {
        let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        Self {
            kubeconfig_flag: kubeconfig_flag.map(Path::to_path_buf),
            kubeconfig_env: std::env::var("KUBECONFIG").ok().filter(|v| !v.trim().is_empty()),
            service_env: set("KUBERNETES_SERVICE_HOST") && set("KUBERNETES_SERVICE_PORT"),
            token_mounted: Path::new(TOKEN_FILE).exists(),
            home_kubeconfig: std::env::var_os("HOME")
                .map(|home| Path::new(&home).join(".kube/config"))
                .filter(|p| p.exists()),
        }
    }
}

/// The configuration to use, or `None` when there is none.
pub fn choose(env: &Environment) -> Option<ConfigSource> {
    if let Some(path) = &env.kubeconfig_flag {
        return Some(ConfigSource::Flag(path.clone()));
    }
    if let Some(value) = &env.kubeconfig_env {
        return Some(ConfigSource::Env(value.clone()));
    }
    if env.service_env && env.token_mounted {
        return Some(ConfigSource::InCluster);
    }
    env.home_kubeconfig.clone().map(ConfigSource::Home)
}

/// Loads the client configuration from `source`. Requests are not retried by the client
/// (a 429 from an eviction is an answer, not a transient failure); callers retry.
pub async fn load(source: &ConfigSource) -> Result<kube::Config> {
    let kubeconfig_error = |err| Error::Kubeconfig {
        from: source.to_string(),
        err,
    };
    let kubeconfig = match source {
        ConfigSource::InCluster => None,
        ConfigSource::Flag(path) | ConfigSource::Home(path) => {
            Some(Kubeconfig::read_from(path).map_err(kubeconfig_error)?)
        }
        ConfigSource::Env(_) => Some(
            Kubeconfig::from_env()
                .map_err(kubeconfig_error)?
                .ok_or(Error::EmptyKubeconfigEnv)?,
        ),
    };
    let mut config = match kubeconfig {
        None => kube::Config::incluster().map_err(|err| Error::InCluster { err })?,
        Some(kubeconfig) => kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(kubeconfig_error)?,
    };
    config.default_retry = false;
    Ok(config)
}

/// The host of a server URL: an address, or a name to resolve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    Name(String),
}

/// Host and port of a server URL (`https` defaults to 443, `http` to 80).
pub fn server_target(url: &http::Uri) -> Option<(Host, u16)> {
    let host = url.host()?;
    let port = url.port_u16().unwrap_or(match url.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host = match bare.parse::<IpAddr>() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Name(bare.to_owned()),
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_explicit_source_wins() {
        let all = Environment {
            kubeconfig_flag: Some("/flag".into()),
            kubeconfig_env: Some("/env1:/env2".into()),
            service_env: true,
            token_mounted: true,
            home_kubeconfig: Some("/root/.kube/config".into()),
        };
        assert_eq!(choose(&all), Some(ConfigSource::Flag("/flag".into())));
        let env = Environment {
            kubeconfig_flag: None,
            ..all.clone()
        };
        assert_eq!(choose(&env), Some(ConfigSource::Env("/env1:/env2".into())));
        let pod = Environment {
            kubeconfig_env: None,
            ..env.clone()
        };
        assert_eq!(choose(&pod), Some(ConfigSource::InCluster));
        assert_eq!(ConfigSource::InCluster.endpoint_source(), Source::InCluster);
        // Service variables without a token (a host process on a node with them exported).
        let host = Environment {
            token_mounted: false,
            ..pod.clone()
        };
        assert_eq!(
            choose(&host),
            Some(ConfigSource::Home("/root/.kube/config".into()))
        );
        assert_eq!(
            choose(&Environment {
                home_kubeconfig: None,
                ..host
            }),
            None
        );
    }

    #[test]
    fn server_urls() {
        let t = |s: &str| server_target(&s.parse().expect("uri"));
        assert_eq!(
            t("https://10.96.0.1"),
            Some((Host::Ip("10.96.0.1".parse().unwrap()), 443))
        );
        assert_eq!(
            t("https://[fd00::1]:6443/"),
            Some((Host::Ip("fd00::1".parse().unwrap()), 6443))
        );
        assert_eq!(
            t("http://api.example"),
            Some((Host::Name("api.example".into()), 80))
        );
        assert_eq!(
            t("https://api.example:8443/prefix"),
            Some((Host::Name("api.example".into()), 8443))
        );
    }

    #[tokio::test]
    async fn loads_a_kubeconfig_naming_it_on_failure() {
        let dir = std::env::temp_dir().join(format!("lifeline-cluster-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nclusters:\n- name: k\n  cluster: {server: \"https://127.0.0.2:6443\", insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\n",
        )
        .expect("write");
        let config = load(&ConfigSource::Flag(path.clone())).await.expect("load");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.2:6443/");
        assert!(!config.default_retry);
        let missing = dir.join("missing");
        let err = load(&ConfigSource::Flag(missing.clone()))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&missing.display().to_string()), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
