//! What the Kubernetes clients written in Rust share: the helper programs `ll-kube-watch` and
//! `ll-stuck`, and the fixture tests that drive the kube crate themselves.
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Runs `future` to completion on a new current-thread tokio runtime (IO and timers enabled).
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(future)
}

/// The kube crate's client configuration from the kubeconfig file `path` (its current context).
pub async fn kube_config(path: impl AsRef<Path>) -> Result<kube::Config, String> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| format!("read kubeconfig: {e}"))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("load kubeconfig: {e}"))
}

/// The `main` of a client program called `name`: with its parsed `args`, `run` on a
/// current-thread runtime. A bad command line prints the error and `usage` (exit code 2); an
/// error `run` ends with is printed as `NAME: ERROR` (exit code 1).
pub fn client_main<A, T, F>(
    name: &str,
    usage: &str,
    args: Result<A, String>,
    run: impl FnOnce(A) -> F,
) -> ExitCode
where
    F: Future<Output = Result<T, String>>,
{
    let args = match args {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{name}: {e}\n{usage}");
            return ExitCode::from(2);
        }
    };
    match block_on(run(args)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
