//! The command line (SPEC.md). Bad values are rejected by clap with a message naming them and
//! exit code 2.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    app::config::ThresholdsFile, app::logging::LogFormat, endpoint::Endpoint, serve::status::Output,
};

pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (rev ",
    env!("LIFELINE_REVISION"),
    ")"
);

#[derive(Debug, Parser)]
#[command(name = "lifeline", version = VERSION, about = "Watches every controller's connection to the Kubernetes apiserver from the kernel")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines on stderr as text or as one JSON object per line.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent in the foreground until SIGTERM/SIGINT (SIGHUP re-reads --config).
    Run(Box<RunArgs>),
    /// Show what a running agent sees: one row per client connection.
    Status(StatusArgs),
    /// Kernel and privilege preflight; exit 1 if the agent cannot run here.
    Check,
    /// Every node's unhealthy clients, through the Kubernetes API (also `kubectl lifeline`:
    /// the binary installed as `kubectl-lifeline`).
    Cluster(crate::serve::plugin::ClusterArgs),
}

/// One `--endpoint` value: a name may resolve to several addresses.
#[derive(Clone, Debug)]
pub struct EndpointArg(pub Vec<Endpoint>);

fn parse_endpoint(s: &str) -> Result<EndpointArg, String> {
    Endpoint::parse_all(s).map(EndpointArg).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// YAML config file (SPEC.md); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// An apiserver endpoint to watch: HOST:PORT, CIDR:PORT, [IPv6]:PORT or [IPv6/LEN]:PORT.
    #[arg(long = "endpoint", value_name = "HOST:PORT|CIDR:PORT", value_parser = parse_endpoint)]
    pub endpoints: Vec<EndpointArg>,
    /// Kubeconfig whose current context's server is watched when no endpoint is given
    /// (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the HTTP server [default: 0.0.0.0:9477]: /metrics, /healthz and /readyz
    /// answer anyone; the client API (/api/v1/*) only loopback peers and --api-token-file.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// A file holding a bearer token: requests bearing it may read the client API from any
    /// address (without it, only loopback peers may).
    #[arg(long, value_name = "FILE")]
    pub api_token_file: Option<PathBuf>,
    /// Log remediation actions instead of taking them.
    #[arg(long)]
    pub dry_run: bool,
    /// Attach no client uprobes (Go or OpenSSL): every client is judged at connection level
    /// (what they cost is measured against this in `cargo xtask bench`).
    #[arg(long)]
    pub no_go_probes: bool,
    /// Never hold a starting client-go process still while its probes go in (a ptrace-stop
    /// of ~20 ms at its binary's first start); without the hold, a client whose first
    /// requests beat the probes has its first watches unnamed until it watches again.
    #[arg(long)]
    pub no_hold_at_start: bool,
    /// Stream records (request headers and frames the client uprobes read) each process may
    /// send per second; beyond it the kernel drops its records and its evidence is
    /// `incomplete` (rate_limited) until it slows, so one process's flood costs its own
    /// visibility, never another client's.
    #[arg(long, value_name = "N", default_value_t = lifeline_common::STREAM_BUDGET,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub stream_record_budget: u32,
    /// This node's name (default: $NODE_NAME, then the hostname).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Post alerts as Alertmanager webhook JSON to this URL (repeatable).
    #[arg(long, value_name = "URL")]
    pub webhook: Vec<String>,
    /// Send alerts to this Alertmanager (repeatable).
    #[arg(long, value_name = "URL")]
    pub alertmanager: Vec<String>,
    #[command(flatten)]
    pub thresholds: ThresholdArgs,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 15s or 2m: {e}"))
}

/// Thresholds (SPEC.md); each overrides the config file's value.
#[derive(Debug, Args, Default)]
pub struct ThresholdArgs {
    /// No connection for this long after losing one: disconnected [default: 15s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub disconnect_grace: Option<Duration>,
    /// A request unanswered for this long: stale [default: 90s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub stale_after: Option<Duration>,
    /// Silence never counts as stale before this, whatever the client's rhythm [default: 11m].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub silence_floor: Option<Duration>,
    /// Silence this long is stale while the client's rhythm is not known [default: 65m].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub silence_max: Option<Duration>,
    /// Retransmitting without ACK progress for this long: blackholed [default: 20s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub blackhole_after: Option<Duration>,
    /// This many failed connects within --connect-window: unreachable [default: 3].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub connect_failures: Option<u32>,
    /// [default: 60s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub connect_window: Option<Duration>,
    /// A process is judged once it held a connection this long [default: 10s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub min_client_age: Option<Duration>,
    /// An endpoint unreachable this long: LifelineApiserverOutage [default: 30s].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub outage_after: Option<Duration>,
    /// A watch open this long past its own deadline, with nothing since, is stuck (streams
    /// only) [default: 2m].
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub watch_grace: Option<Duration>,
}

impl ThresholdArgs {
    pub fn as_file(&self) -> ThresholdsFile {
        ThresholdsFile {
            disconnect_grace: self.disconnect_grace,
            stale_after: self.stale_after,
            silence_floor: self.silence_floor,
            silence_max: self.silence_max,
            blackhole_after: self.blackhole_after,
            connect_failures: self.connect_failures,
            connect_window: self.connect_window,
            min_client_age: self.min_client_age,
            outage_after: self.outage_after,
            watch_grace: self.watch_grace,
        }
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The agent's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:9477")]
    pub server: String,
    /// A file holding the bearer token of the agent's --api-token-file (needed unless the
    /// agent is reached over loopback).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_endpoints_fail_naming_the_value_with_usage_exit_code() {
        let err = Cli::try_parse_from(["lifeline", "run", "--endpoint", "nonsense:port"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("nonsense:port"), "{err}");
    }

    #[test]
    fn threshold_flags_parse_durations_and_reject_nonsense() {
        let cli = Cli::try_parse_from([
            "lifeline",
            "run",
            "--stale-after",
            "2m",
            "--connect-failures",
            "5",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("run")
        };
        assert_eq!(args.thresholds.stale_after, Some(Duration::from_secs(120)));
        assert_eq!(args.thresholds.as_file().connect_failures, Some(5));
        let err = Cli::try_parse_from(["lifeline", "run", "--stale-after", "soon"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("soon"), "{err}");
        assert!(Cli::try_parse_from(["lifeline", "run", "--connect-failures", "0"]).is_err());
    }

    #[test]
    fn endpoints_repeat_and_names_resolve() {
        let cli = Cli::try_parse_from([
            "lifeline",
            "run",
            "--endpoint",
            "10.0.0.1:443",
            "--endpoint",
            "localhost:6443",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("run")
        };
        assert_eq!(args.endpoints.len(), 2);
        assert!(!args.endpoints[1].0.is_empty());
    }

    #[test]
    fn the_plugin_name_selects_the_cluster_command() {
        let cli = Cli::try_parse_from(["kubectl lifeline", "cluster", "-n", "x"]).unwrap();
        assert!(matches!(cli.command, Command::Cluster(ref a) if a.namespace == "x"));
    }
}
