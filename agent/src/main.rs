//! `lifeline`: the node agent. `main` only parses the command line and wires parts together.
use std::process::ExitCode;

use clap::Parser;

// Steps, bottom up: error, endpoint, times; host; cluster; kernel; table; health; act;
// serve; app. A module imports only from its own step or one below, with no circle between
// top-level modules: the rule, its two exceptions and its test are in layers.rs.
//
// The pipeline, in order: kernel events → connection table → client health → actions.
mod act;
mod health;
mod kernel;
mod table;
// Beside it: what is read from the host and the cluster, what is served, and the program.
mod app;
mod cluster;
#[cfg(test)]
mod docs_tests;
mod endpoint;
mod error;
mod host;
#[cfg(test)]
mod layers;
mod serve;
#[cfg(test)]
mod testkit;
mod times;

/// Tests measure what structures hold (`testkit::heap`).
#[cfg(test)]
#[global_allocator]
static HEAP: testkit::heap::Counting = testkit::heap::Counting;

use app::{check, cli, logging, run};
use serve::status;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_from(serve::plugin::argv());
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
            cli::Command::Cluster(args) => match serve::plugin::run(&args).await {
                Ok((table, _)) => {
                    print!("{table}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("kubectl lifeline: {}", error::chain(&err));
                    ExitCode::FAILURE
                }
            },
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
