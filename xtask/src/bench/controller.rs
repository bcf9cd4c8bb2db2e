//! A busy controller (issue 26 item 3): the real kube-controller-manager of the real-cluster
//! tier while ~100 pod updates a second arrive, its CPU and the release agent's with the Go
//! probes, connection-only and with no agent, in interleaved windows of one run, against an
//! unprobed copy of it on the same updates (`tests/realcluster.rs`' ignored
//! `busy_controller_cost`, which prints its figures as `busy controller: ...` lines, each
//! against its goal).
use super::{run_captured, Bins, Report};
use crate::{cargo, Failed, Result};

/// What the measurement prints, its prefix taken off.
fn figures(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("busy controller: "))
        .collect()
}

pub(super) fn controller_section(bins: &Bins, report: &mut Report) -> Result {
    let mut cmd = cargo();
    cmd.env("LIFELINE_BIN", &bins.lifeline)
        .args([
            "test",
            "-p",
            "lifeline-integration",
            "--test",
            "realcluster",
            "--",
        ])
        .args(["--ignored", "--exact", "busy_controller_cost", "--nocapture"]);
    eprintln!("+ {cmd:?}");
    let out = run_captured(cmd)?;
    let lines = figures(&out);
    if lines.is_empty() {
        return Err(Failed(format!(
            "the busy-controller measurement printed no figures:\n{out}"
        )));
    }
    report.line("## A busy controller");
    report.line("");
    report.line(
        "The real kube-controller-manager (1.20, go1.19) of the real-cluster tier while ~100 \
         pod updates a second arrive (label patches of 50 pending pods no scheduler takes, which \
         its informers receive), in interleaved 15 s windows, five rounds: its CPU and the \
         release agent's with the Go probes, connection-only (`--no-go-probes`) and with no \
         agent. The control group: a second kube-controller-manager from a copy of the binary \
         (no probe fires in it), leader election off, through the apiserver's advertised \
         address, which the agent does not watch: it receives the same updates in the same \
         windows. The figure is the controller's CPU over its copy's, against that ratio in the \
         round's no-agent window (median of the rounds), so that the machine's drift between \
         windows cancels. Goals: the agent under 1 % of one core, the controller within 3 % of \
         no agent per update.",
    );
    report.line("");
    for line in lines {
        report.line(format!("- {line}"));
    }
    report.line("");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measurement_s_lines_are_its_figures() {
        let out = "running 1 test\n\
            busy controller: round 1, no agent: 100 updates/s, controller 5.2 % of a core\n\
            test busy_controller_cost has been running for over 60 seconds\n\
            busy controller: median, no agent: controller 0.607 s per 1,000 updates\n\
            test result: ok.\n";
        assert_eq!(
            figures(out),
            [
                "round 1, no agent: 100 updates/s, controller 5.2 % of a core",
                "median, no agent: controller 0.607 s per 1,000 updates"
            ]
        );
    }
}
