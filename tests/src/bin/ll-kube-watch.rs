//! `ll-kube-watch`: the healthy re-dialing client. A `kube::runtime::watcher` on Pods, with the
//! watcher's default backoff: when a connection breaks it dials again by itself (and relists when
//! the apiserver answers 410 Expired).
//!
//! ```text
//! ll-kube-watch --kubeconfig PATH [--namespace NS(default)] [--timeout-seconds N]
//! ```
//!
//! stdout, one line per watcher event: `INIT`, `INIT_APPLY <name> <rv>`, `INIT_DONE`,
//! `APPLY <name> <rv>`, `DELETE <name> <rv>`. stderr: `ERROR <error>` for every failed attempt
//! (the watcher then backs off and dials again). Runs until killed.
use std::process::ExitCode;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use lifeline_integration::kube_client::{client_main, kube_config};

const USAGE: &str = "usage: ll-kube-watch --kubeconfig PATH [--namespace NS] [--timeout-seconds N]";

struct Args {
    kubeconfig: String,
    namespace: String,
    timeout: Option<u32>,
}

fn parse_args() -> Result<Args, String> {
    let mut kubeconfig = None;
    let mut namespace = "default".to_string();
    let mut timeout = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--kubeconfig" => kubeconfig = Some(value()?),
            "--namespace" => namespace = value()?,
            "--timeout-seconds" => {
                let v = value()?;
                timeout = Some(v.parse().map_err(|_| format!("bad --timeout-seconds {v:?}"))?);
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(Args {
        kubeconfig: kubeconfig.ok_or("--kubeconfig is required")?,
        namespace,
        timeout,
    })
}

fn describe(pod: &Pod) -> String {
    format!(
        "{} {}",
        pod.name_any(),
        pod.resource_version().unwrap_or_default()
    )
}

async fn run(args: Args) -> Result<(), String> {
    let config = kube_config(&args.kubeconfig).await?;
    let client = Client::try_from(config).map_err(|e| format!("client: {e}"))?;
    let pods: Api<Pod> = Api::namespaced(client, &args.namespace);
    let mut config = watcher::Config::default();
    if let Some(t) = args.timeout {
        config = config.timeout(t);
    }
    let mut events = watcher::watcher(pods, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => println!("INIT"),
            Ok(Event::InitApply(pod)) => println!("INIT_APPLY {}", describe(&pod)),
            Ok(Event::InitDone) => println!("INIT_DONE"),
            Ok(Event::Apply(pod)) => println!("APPLY {}", describe(&pod)),
            Ok(Event::Delete(pod)) => println!("DELETE {}", describe(&pod)),
            Err(e) => eprintln!("ERROR {e}"),
        }
    }
    Err("the watch stream ended".into())
}

fn main() -> ExitCode {
    client_main("ll-kube-watch", USAGE, parse_args(), run)
}
