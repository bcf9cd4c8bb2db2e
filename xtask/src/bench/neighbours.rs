//! Noisy neighbours (issue 25): the `neighbours` suite run as CI runs it, one neighbour at a
//! time, and its figures gathered: how long after its LIST the stuck client beside each
//! neighbour turned `stale`, the agent's CPU and RSS meanwhile, each against the bound the test
//! holds it to, and what each neighbour cost itself. The suite's assertions are the goals: a
//! figure past its bound fails the run, as it fails CI.
use super::{run_captured, Report};
use crate::{cargo, Failed, Result};

/// One neighbour's figures, from the suite's lines `<neighbour>: <figure>`.
#[derive(Default)]
struct Row {
    neighbour: String,
    /// "6.3 s (stale_after 6 s, bound 9 s)".
    stale: Option<String>,
    /// "1.0 % of one core, RSS 50.6 MiB (budget 50 %, bound 96 MiB)".
    cost: Option<String>,
    /// Anything else it said of itself.
    more: Vec<String>,
}

/// The rows of the suite's output, in the order the neighbours ran: a neighbour is what
/// names a stale or a cost figure; its other lines, before or after, are its `more`.
fn rows(output: &str) -> Vec<Row> {
    let lines: Vec<(&str, &str)> = output.lines().filter_map(|l| l.split_once(": ")).collect();
    let mut rows: Vec<Row> = Vec::new();
    for (neighbour, figure) in &lines {
        let figure_line =
            figure.starts_with("the stuck LIST stale after ") || figure.starts_with("agent CPU ");
        if figure_line && !rows.iter().any(|r| r.neighbour == *neighbour) {
            rows.push(Row {
                neighbour: (*neighbour).to_owned(),
                ..Row::default()
            });
        }
    }
    for (neighbour, figure) in lines {
        let Some(row) = rows.iter_mut().find(|r| r.neighbour == neighbour) else {
            continue;
        };
        if let Some(s) = figure.strip_prefix("the stuck LIST stale after ") {
            row.stale = Some(s.to_owned());
        } else if let Some(c) = figure.strip_prefix("agent CPU ") {
            row.cost = Some(c.to_owned());
        } else {
            row.more.push(figure.to_owned());
        }
    }
    rows
}

pub(super) fn neighbours_section(report: &mut Report) -> Result {
    let mut cmd = cargo();
    cmd.args(["test", "-p", "lifeline-integration", "--test", "neighbours", "--"])
        .args(["--test-threads=1", "--nocapture"]);
    eprintln!("+ {cmd:?}");
    let out = run_captured(cmd)?;
    let rows = rows(&out);
    if rows.is_empty() {
        return Err(Failed(format!("the neighbours suite printed no figures:\n{out}")));
    }
    report.line("## Noisy neighbours");
    report.line("");
    report.line(
        "The `neighbours` suite (`tests/neighbours.rs`), one neighbour at a time beside a stuck \
         client (kubectl 1.20 whose LIST is held mid-answer) and a healthy watch, with \
         `stale_after` 6 s. Each figure is held to its bound by the suite's assertions.",
    );
    report.line("");
    report.line("| neighbour | stuck LIST `stale` after | agent CPU, RSS |");
    report.line("| --- | --- | --- |");
    for r in &rows {
        report.line(format!(
            "| {} | {} | {} |",
            r.neighbour,
            r.stale.as_deref().unwrap_or("—"),
            r.cost.as_deref().unwrap_or("—")
        ));
    }
    report.line("");
    for r in rows.iter().filter(|r| !r.more.is_empty()) {
        report.line(format!("- {}: {}", r.neighbour, r.more.join("; ")));
    }
    report.line("");
    bounds_memory(report)
}

/// The agent's memory with every node-level bound of its table and metrics filled at once:
/// the lines of the unit test that measures it (`agent/src/app/bounds.rs`), whose
/// assertions hold each figure to its ceiling.
fn bounds_memory(report: &mut Report) -> Result {
    let mut cmd = cargo();
    cmd.args(["test", "-p", "lifeline", "--bin", "lifeline", "--", "--exact"])
        .arg("app::bounds::memory_at_the_nodes_bounds_of_streams_requests_and_labels")
        .arg("--nocapture");
    eprintln!("+ {cmd:?}");
    let out = run_captured(cmd)?;
    let figures = memory_figures(&out);
    if figures.is_empty() {
        return Err(Failed(format!(
            "the bounds' memory test printed no figures:\n{out}"
        )));
    }
    report.line("**Memory at the node's bounds** (heap of the table, the judge's snapshot and the metrics, every node-level bound filled at once through the pipeline; `agent/src/app/bounds.rs`):");
    report.line("");
    for f in figures {
        report.line(format!("- {f}"));
    }
    report.line("");
    Ok(())
}

/// The figures of the bounds' memory test's output.
fn memory_figures(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("memory at the node's bounds: "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_gathered_by_neighbour_in_order() {
        let out = "running 2 tests\n\
            a header flood: requests per second [3000, 2900]\n\
            a header flood: the stuck LIST stale after 6.4 s (stale_after 6 s, bound 9 s)\n\
            a header flood: agent CPU 8.0 % of one core, RSS 47.1 MiB (budget 50 %, bound 96 MiB)\n\
            test a_header_flood ... ok\n\
            10,000 open streams: 2048 listed over 50 connections\n\
            10,000 open streams: the stuck LIST stale after 6.3 s (stale_after 6 s, bound 9 s)\n\
            10,000 open streams: agent CPU 1.0 % of one core, RSS 50.6 MiB (budget 50 %, bound 96 MiB)\n\
            test result: ok. 2 passed; 0 failed\n";
        let rows = rows(out);
        let names: Vec<&str> = rows.iter().map(|r| r.neighbour.as_str()).collect();
        assert_eq!(names, ["a header flood", "10,000 open streams"]);
        // What a neighbour says before its first figure is its own too.
        assert_eq!(rows[0].more, ["requests per second [3000, 2900]"]);
        assert_eq!(
            rows[0].stale.as_deref(),
            Some("6.4 s (stale_after 6 s, bound 9 s)")
        );
        assert_eq!(
            rows[1].cost.as_deref(),
            Some("1.0 % of one core, RSS 50.6 MiB (budget 50 %, bound 96 MiB)")
        );
        assert_eq!(rows[1].more, ["2048 listed over 50 connections"]);
    }

    #[test]
    fn the_bounds_memory_figures_are_its_own_lines() {
        let out = "running 1 test\n\
            memory at the node's bounds: 4096 requests waiting 3.0 MiB (758 B each)\n\
            test app::bounds::memory_at ... ok\n\
            memory at the node's bounds: held 15.2 MiB\n";
        assert_eq!(
            memory_figures(out),
            ["4096 requests waiting 3.0 MiB (758 B each)", "held 15.2 MiB"]
        );
    }
}
