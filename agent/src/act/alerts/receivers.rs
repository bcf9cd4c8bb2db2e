//! The `receivers:` section of the config file: where alerts go and how to reach each
//! receiver.
use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Receiver {
    pub name: String,
    pub alertmanager: Option<UrlTarget>,
    pub webhook: Option<UrlTarget>,
}

/// Where a receiver is and how to reach it. The TLS and authentication keys are those of
/// Prometheus' and Alertmanager's `http_config`; secrets only from files (re-read per request,
/// so a rotated token is picked up).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UrlTarget {
    pub url: String,
    #[serde(default, deserialize_with = "crate::times::duration")]
    pub timeout: Option<Duration>,
    /// `https://` only: the CA bundle (PEM) that signs the receiver's certificate; the
    /// system's roots when absent.
    pub tls_config: Option<TlsConfig>,
    /// `Authorization: Bearer <contents of credentials_file>`.
    pub authorization: Option<Authorization>,
    /// `Authorization: Basic`, the password from `password_file`.
    pub basic_auth: Option<BasicAuth>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Authorization {
    /// Only `Bearer` (the default).
    #[serde(rename = "type", default = "bearer")]
    pub kind: String,
    pub credentials_file: PathBuf,
}

fn bearer() -> String {
    "Bearer".into()
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password_file: PathBuf,
}
