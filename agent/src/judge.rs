//! Applies the health engine to the connection table once per tick: turns each process
//! record into an [`Observation`], keeps the latest verdicts for the API, and returns the
//! transitions for the actions (logs, metrics, alerts).
use std::{collections::HashMap, time::Instant};

use lifeline_common::tcp_state;

use crate::{
    config::Select,
    health::{
        assess_outage, ConnectionFacts, HealthEngine, Observation, Outage, Thresholds, Transition, Verdict,
    },
    process::ProcessInfo,
    table::{ConnectionTable, ProcessRecord},
    views::{ClientKey, PodOf},
};

/// A transition of one client, with who it is.
#[derive(Clone, Debug)]
pub struct ClientTransition {
    pub process: ProcessInfo,
    pub transition: Transition,
    /// The endpoint the evidence is about (the first one it was connected or connecting to).
    pub endpoint: Option<String>,
}

pub struct Judge {
    engine: HealthEngine<ClientKey>,
    select: Select,
    verdicts: HashMap<ClientKey, Verdict>,
    outage: Option<Outage>,
}

/// What one tick found.
#[derive(Debug, Default)]
pub struct Findings {
    pub transitions: Vec<ClientTransition>,
    /// `Some(Some(_))`: a node-level apiserver outage began; `Some(None)`: it ended.
    pub outage_change: Option<Option<Outage>>,
}

impl Judge {
    pub fn new(thresholds: Thresholds, select: Select) -> Self {
        Self {
            engine: HealthEngine::new(thresholds),
            select,
            verdicts: HashMap::new(),
            outage: None,
        }
    }

    pub fn thresholds(&self) -> &Thresholds {
        self.engine.thresholds()
    }

    pub fn select(&self) -> &Select {
        &self.select
    }

    pub fn reconfigure(&mut self, thresholds: Thresholds, select: Select) {
        self.engine.set_thresholds(thresholds);
        self.select = select;
    }

    pub fn verdicts(&self) -> &HashMap<ClientKey, Verdict> {
        &self.verdicts
    }

    /// Judges every process in the table; forgets those the table forgot.
    /// `pod_of` tells a process's pod, whose `lifeline.dev/monitor` annotation selects it.
    pub fn tick(&mut self, table: &ConnectionTable, now: Instant, pod_of: PodOf<'_>) -> Findings {
        let mut transitions = Vec::new();
        let mut seen = HashMap::new();
        for record in table.processes() {
            let key = (record.info.pid, record.info.start_time_ticks);
            let selected = self.select.matches(&record.info.comm, &record.info.cmdline)
                || pod_of(&record.info).is_some_and(|p| p.monitor);
            let obs = observe(table, record, selected);
            let (verdict, transition) = self.engine.evaluate(&key, &obs, now);
            if let Some(transition) = transition {
                let endpoint = obs
                    .established
                    .first()
                    .map(|c| c.endpoint.clone())
                    .or_else(|| obs.failures.last().map(|(_, e)| e.clone()))
                    .or_else(|| {
                        table
                            .connections_of(record.info.pid)
                            .next()
                            .map(|c| c.endpoint.to_string())
                    })
                    .or_else(|| record.last_endpoint.map(|e| e.to_string()));
                transitions.push(ClientTransition {
                    process: record.info.clone(),
                    transition,
                    endpoint,
                });
            }
            seen.insert(key, verdict);
        }
        self.engine.retain(|k| seen.contains_key(k));
        self.verdicts = seen;
        let outage = assess_outage(self.verdicts.values());
        let outage_change = (outage.is_some() != self.outage.is_some()).then(|| outage.clone());
        self.outage = outage;
        Findings {
            transitions,
            outage_change,
        }
    }
}

/// What the engine needs to know about one process.
pub fn observe(table: &ConnectionTable, record: &ProcessRecord, selected: bool) -> Observation {
    let established = table
        .connections_of(record.info.pid)
        .filter(|c| c.tcp_state == tcp_state::ESTABLISHED)
        .map(|c| ConnectionFacts {
            endpoint: c.endpoint.to_string(),
            last_payload: c.last_payload.unwrap_or(c.first_seen),
            stalled_since: c.stalled_since,
        })
        .collect();
    Observation {
        selected,
        connected_since: record.connected_since,
        connection_lost_at: record.connection_lost_at,
        established,
        failures: record
            .connect_failures
            .iter()
            .map(|f| (f.at, f.endpoint.to_string()))
            .collect(),
    }
}
