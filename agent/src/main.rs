//! `lifeline`: the node agent. `main` only parses the command line and wires parts together.
use std::process::ExitCode;

use clap::Parser;

mod alerts;
mod api;
mod check;
mod cli;
// Not wired into `run.rs` yet: remove these two attributes when it is.
mod cluster;
mod config;
mod container;
mod endpoint;
mod error;
mod health;
mod judge;
mod kernel;
mod logging;
mod metrics;
mod netns;
mod privileges;
mod prober;
mod process;
mod reachability;
mod redact;
mod remediate;
mod resources;
mod run;
mod sampler;
mod snapshot;
mod sock_diag;
mod status;
mod table;
#[cfg(test)]
mod testkit;
mod views;
mod workers;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    runtime.block_on(async {
        match cli.command {
            cli::Command::Run(args) => match run::run(*args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!("{}", error::chain(&err));
                    ExitCode::from(err.exit_code())
                }
            },
            cli::Command::Status(args) => {
                match status::run(&args.server, args.token_file.as_deref(), args.output).await {
                    Ok(text) => {
                        print!("{text}");
                        ExitCode::SUCCESS
                    }
                    Err(err) => {
                        eprintln!("lifeline status: {}", error::chain(&err));
                        ExitCode::FAILURE
                    }
                }
            }
            cli::Command::Check => {
                let report = check::run();
                print!("{}", report.render());
                if report.can_run() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
        }
    })
}
