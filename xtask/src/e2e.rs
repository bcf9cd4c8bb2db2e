//! `cargo xtask e2e`: the shipping end-to-end test. Builds the image as `cargo xtask image`
//! does, then runs `tests/e2e.rs` with it: a real single node (etcd, containerd, runc, the CNI
//! plugins from Debian; the Kubernetes 1.20 components built from Debian's `kubernetes` source
//! package by `cargo xtask setup`, cached under /var/tmp/lifeline-k8s), the image imported,
//! `kubectl apply -k deploy/local/`, and the agent's checks (docs/testing.md "End to end").
use std::{path::PathBuf, process::Command};

use crate::{hoststate, image, run, Failed, Result};

/// The kubectl the suite drives the cluster with (its kustomize reads `deploy/`: 1.21 or newer).
const KUBECTL: &str = "/usr/bin/kubectl";

/// The Prometheus and Alertmanager that watch the agents as the shipped monitoring component
/// says (tests/e2e/monitoring.rs).
const MONITORING_PACKAGES: [&str; 2] = ["prometheus", "prometheus-alertmanager"];

/// What the suite needs on the machine, installed if missing: the node's Debian packages and
/// the Kubernetes binaries (cached after the first build), Prometheus and Alertmanager, tracefs,
/// a kubectl.
fn prerequisites() -> Result {
    crate::kubernetes::setup()?;
    crate::setup::apt(&MONITORING_PACKAGES)?;
    crate::setup::tracefs()?;
    let kubectl = Command::new(KUBECTL).args(["version", "--client"]).output();
    if !kubectl.is_ok_and(|o| o.status.success()) {
        return Err(Failed(format!(
            "{KUBECTL} is needed (kubectl 1.21 or newer: its kustomize reads deploy/)"
        )));
    }
    Ok(())
}

/// Builds the image, then runs the suite against it.
pub fn e2e() -> Result {
    let env = prepare()?;
    let mut suite = crate::clusters::Suite::build("e2e", &ARGS)?;
    suite.command.envs(env);
    hoststate::checked("the end-to-end suite", || run(&mut suite.command))
}

/// The suite's test binary's arguments: its output shown (it prints each step and a timeline).
pub const ARGS: [&str; 2] = ["--test-threads=1", "--nocapture"];

/// What the suite needs (as root): the machine's prerequisites and the image; then the suite's
/// environment: the archive (`LIFELINE_IMAGE`) and the image's binary as `kubectl-lifeline`
/// (`LIFELINE_BIN`). Run it between [`hoststate::checked`]'s snapshots: it leaves the host's
/// iptables rules and routes as it found them (kube-proxy's and the CNI plugin's included).
pub fn prepare() -> Result<[(&'static str, PathBuf); 2]> {
    crate::require_root("the end-to-end test")?;
    prerequisites()?;
    let archive = image::image(image::Options::default())?;
    let binary = image::static_binary(&image::host_target()?);
    Ok([("LIFELINE_IMAGE", archive), ("LIFELINE_BIN", binary)])
}
