//! Harness for lifeline's root-only integration suites.
//!
//! Every test runs the real `lifeline` binary as a child process ([`Agent`]), opens real TCP
//! connections with the `ll-client` / `ll-server` helper programs ([`Client`], [`Server`]),
//! possibly inside throw-away network namespaces ([`NetNs`], [`VethPair`]) and cgroups
//! ([`ContainerCgroup`]), and checks what `/api/v1/clients` reports. Every resource is a guard
//! that cleans up on drop, also when the test panics.
//!
//! Start every test with [`init!`]: it checks for root and records where cargo put the helper
//! programs.
//!
//! The harness, in the order a test uses it (everything is re-exported here, so the suites name
//! it `lifeline_integration::…`):
//!
//! - `setup`: [`init!`], [`require_root`] (which also sets up [`containment`]), [`TempDir`],
//!   [`unique`], [`free_port`], [`run`];
//! - `wait`: [`wait_until`], [`hold`], and [`Pretty`] / [`Shown`] for panic messages;
//! - `netns`: [`NetNs`], [`VethPair`], [`ContainerCgroup`];
//! - `programs`: the helper programs [`Client`] and [`Server`];
//! - `agent`: [`lifeline`] / [`lifeline_via`] (one command to completion), the [`Agent`] and
//!   what its API answers ([`Table`], [`assert_client_schema`]).
//!
//! Besides: [`kube_fixture`] (the fake kube-apiserver and the clients run against it),
//! [`apiserver`] (that fake kube-apiserver's own code: `ll-apiserver` only calls its `main`),
//! [`kube_client`] (what the Rust clients of it share), [`scenario`] (multi-namespace
//! topologies) and [`real_cluster`] (a real Kubernetes cluster).

mod agent;
mod certs;
mod netns;
mod programs;
mod setup;
mod wait;

/// The fake kube-apiserver itself: everything `ll-apiserver` runs.
pub mod apiserver;
/// How often the kernel ran each program of a process, while a test counts.
pub mod bpf_stats;
/// Keeping test traffic on this machine while a suite runs, and removing what that takes when
/// it ends; what a namespace's packet handling looks like, to compare before and after.
pub mod containment;
/// What containment installs, who holds it, and its removal (shared with `xtask`).
pub mod containment_state;
/// What the Kubernetes clients written in Rust share (`ll-kube-watch`, `ll-stuck`, tests).
pub mod kube_client;
/// The fake kube-apiserver (`ll-apiserver`) and the real clients run against it.
pub mod kube_fixture;
/// A network namespace's packet handling as text (shared with `xtask`).
pub mod network_state;
/// A real Kubernetes 1.20 cluster (control plane, node, real clients): the real-cluster tier.
pub mod real_cluster;
pub mod scenario;

pub use agent::*;
pub use kube_fixture::*;
pub use netns::*;
pub use programs::*;
pub use setup::*;
pub use wait::*;

/// Checks that the test runs as root and records the helper programs' paths. Call it first in
/// every test: `lifeline_integration::init!();`
#[macro_export]
macro_rules! init {
    () => {
        $crate::init_with(env!("CARGO_BIN_EXE_ll-client"), env!("CARGO_BIN_EXE_ll-server"))
    };
}
