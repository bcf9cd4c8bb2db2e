//! What the probe finds, in the agent's own words, for the log. A condition of an endpoint
//! (it refuses, it does not answer TLS, ...) is logged when it starts, at most every
//! [`REPEAT_EVERY`] while it lasts (with how long), and when it ends; a probe every 5 s must
//! not write a line every 5 s. Pure: fed with each probe's outcome and the time.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use tracing::Level;

use super::ProbeOutcome;
use super::STEP_TIMEOUT;
use crate::endpoint::Endpoint;

/// A condition that lasts is logged again at most this often.
pub const REPEAT_EVERY: Duration = Duration::from_secs(300);

/// What is wrong with an endpoint, by the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Refused,
    NoSynAnswer,
    NoRoute,
    TlsNoAnswer,
    NoTls,
    NoHttpAnswer,
    Http(u16),
}

impl Condition {
    /// `None`: the endpoint answered as an apiserver does.
    fn of(outcome: ProbeOutcome) -> Option<Condition> {
        match outcome {
            ProbeOutcome::Refused => Some(Condition::Refused),
            ProbeOutcome::Timeout => Some(Condition::NoSynAnswer),
            ProbeOutcome::NoRoute => Some(Condition::NoRoute),
            ProbeOutcome::TlsTimeout => Some(Condition::TlsNoAnswer),
            ProbeOutcome::NoTls => Some(Condition::NoTls),
            ProbeOutcome::NoAnswer => Some(Condition::NoHttpAnswer),
            ProbeOutcome::Answered(code) if code >= 500 => Some(Condition::Http(code)),
            ProbeOutcome::Answered(_) => None,
        }
    }

    /// What the endpoint does, the endpoint being the subject.
    fn what(self) -> String {
        let step = STEP_TIMEOUT.as_secs();
        match self {
            Condition::Refused => "refuses connections".into(),
            Condition::NoSynAnswer => format!("does not answer the probe's SYN in {step}s"),
            Condition::NoRoute => "has no route from the agent's network namespace".into(),
            Condition::TlsNoAnswer => {
                format!("accepts TCP but the probe's TLS handshake got no answer in {step}s")
            }
            Condition::NoTls => "does not answer TLS (it answered something else, or closed)".into(),
            Condition::NoHttpAnswer => format!("completes TLS but answers no HTTP request in {step}s"),
            Condition::Http(code) => format!("answers /readyz with HTTP {code}"),
        }
    }
}

/// One line to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub level: Level,
    pub message: String,
}

impl Line {
    pub fn emit(&self) {
        match self.level {
            Level::INFO => tracing::info!("{}", self.message),
            _ => tracing::warn!("{}", self.message),
        }
    }
}

#[derive(Debug)]
struct Ongoing {
    condition: Condition,
    /// When this condition started.
    since: Instant,
    /// When the endpoint last answered as it should (the first condition of a run started).
    run_since: Instant,
    /// When it was last logged.
    logged: Instant,
}

/// Per endpoint, its current condition.
#[derive(Debug, Default)]
pub struct Conditions {
    ongoing: BTreeMap<Endpoint, Ongoing>,
}

impl Conditions {
    /// One probe of `endpoint` ended with `outcome` at `now`: what to log, if anything.
    pub fn observe(&mut self, endpoint: Endpoint, outcome: ProbeOutcome, now: Instant) -> Option<Line> {
        let warn = |message| {
            Some(Line {
                level: Level::WARN,
                message,
            })
        };
        let condition = Condition::of(outcome);
        match (self.ongoing.get_mut(&endpoint), condition) {
            (None, None) => None,
            (None, Some(condition)) => {
                self.ongoing.insert(
                    endpoint,
                    Ongoing {
                        condition,
                        since: now,
                        run_since: now,
                        logged: now,
                    },
                );
                warn(format!("endpoint {endpoint} {}", condition.what()))
            }
            (Some(_), None) => {
                let ended = self.ongoing.remove(&endpoint).expect("present");
                Some(Line {
                    level: Level::INFO,
                    message: format!(
                        "endpoint {endpoint} answers again after {}",
                        human(now.saturating_duration_since(ended.run_since))
                    ),
                })
            }
            (Some(ongoing), Some(condition)) if condition == ongoing.condition => {
                if now.saturating_duration_since(ongoing.logged) < REPEAT_EVERY {
                    return None;
                }
                ongoing.logged = now;
                warn(format!(
                    "endpoint {endpoint} still {}, for {} now",
                    condition.what(),
                    human(now.saturating_duration_since(ongoing.since))
                ))
            }
            (Some(ongoing), Some(condition)) => {
                ongoing.condition = condition;
                ongoing.since = now;
                ongoing.logged = now;
                warn(format!(
                    "endpoint {endpoint} now {} (no normal answer for {})",
                    condition.what(),
                    human(now.saturating_duration_since(ongoing.run_since))
                ))
            }
        }
    }

    /// Forgets the endpoints no longer probed.
    pub fn retain(&mut self, mut keep: impl FnMut(&Endpoint) -> bool) {
        self.ongoing.retain(|e, _| keep(e));
    }
}

/// `2m10s`, to the second.
fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
        .to_string()
        .replace(' ', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Endpoint {
        Endpoint::parse_all("127.0.0.1:6443").unwrap()[0]
    }

    /// Probes every 5 s from `from` to `to` (seconds), all with `outcome`: the lines logged.
    fn run(c: &mut Conditions, t0: Instant, from: u64, to: u64, outcome: ProbeOutcome) -> Vec<(u64, Line)> {
        (from..=to)
            .step_by(5)
            .filter_map(|t| Some((t, c.observe(ep(), outcome, t0 + Duration::from_secs(t))?)))
            .collect()
    }

    fn warn(message: &str) -> Line {
        Line {
            level: Level::WARN,
            message: message.into(),
        }
    }

    #[test]
    fn a_condition_is_logged_when_it_starts_every_5_minutes_while_it_lasts_and_when_it_ends() {
        let t0 = Instant::now();
        let mut c = Conditions::default();
        assert_eq!(run(&mut c, t0, 0, 10, ProbeOutcome::Answered(200)), []);
        assert_eq!(
            run(&mut c, t0, 15, 620, ProbeOutcome::NoTls),
            [
                (15, warn("endpoint 127.0.0.1:6443 does not answer TLS (it answered something else, or closed)")),
                (315, warn("endpoint 127.0.0.1:6443 still does not answer TLS (it answered something else, or closed), for 5m now")),
                (615, warn("endpoint 127.0.0.1:6443 still does not answer TLS (it answered something else, or closed), for 10m now")),
            ]
        );
        assert_eq!(
            run(&mut c, t0, 625, 625, ProbeOutcome::Answered(401)),
            [(
                625,
                Line {
                    level: Level::INFO,
                    message: "endpoint 127.0.0.1:6443 answers again after 10m10s".into()
                }
            )]
        );
        assert_eq!(run(&mut c, t0, 630, 700, ProbeOutcome::Answered(200)), []);
    }

    #[test]
    fn a_change_of_condition_is_logged_at_once_and_the_end_counts_from_the_first() {
        let t0 = Instant::now();
        let mut c = Conditions::default();
        // A stopped apiserver, then killed, then back.
        let lines = [
            run(&mut c, t0, 0, 60, ProbeOutcome::TlsTimeout),
            run(&mut c, t0, 65, 100, ProbeOutcome::Refused),
            run(&mut c, t0, 105, 105, ProbeOutcome::Answered(200)),
        ]
        .concat();
        let messages: Vec<(u64, &str)> = lines.iter().map(|(t, l)| (*t, l.message.as_str())).collect();
        assert_eq!(
            messages,
            [
                (
                    0,
                    "endpoint 127.0.0.1:6443 accepts TCP but the probe's TLS handshake got no answer in 3s"
                ),
                (
                    65,
                    "endpoint 127.0.0.1:6443 now refuses connections (no normal answer for 1m5s)"
                ),
                (105, "endpoint 127.0.0.1:6443 answers again after 1m45s"),
            ]
        );
    }

    #[test]
    fn every_outcome_but_a_good_answer_is_a_condition() {
        let t0 = Instant::now();
        for outcome in [
            ProbeOutcome::Refused,
            ProbeOutcome::Timeout,
            ProbeOutcome::NoRoute,
            ProbeOutcome::TlsTimeout,
            ProbeOutcome::NoTls,
            ProbeOutcome::NoAnswer,
            ProbeOutcome::Answered(503),
        ] {
            let line = Conditions::default().observe(ep(), outcome, t0);
            assert!(line.is_some_and(|l| l.level == Level::WARN), "{outcome:?}");
        }
        for outcome in [ProbeOutcome::Answered(200), ProbeOutcome::Answered(403)] {
            assert_eq!(Conditions::default().observe(ep(), outcome, t0), None);
        }
    }

    #[test]
    fn a_forgotten_endpoint_starts_afresh() {
        let t0 = Instant::now();
        let mut c = Conditions::default();
        assert!(c.observe(ep(), ProbeOutcome::Refused, t0).is_some());
        c.retain(|_| false);
        assert!(c
            .observe(ep(), ProbeOutcome::Refused, t0 + Duration::from_secs(5))
            .is_some());
    }
}
