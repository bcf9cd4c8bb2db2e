//! Alerts (SPEC.md "Alerts"): which alerts fire ([`AlertBook`], pure policy fed once per tick
//! with a fake-able `now`) and their delivery to Alertmanager and webhook receivers
//! ([`Dispatcher`], one tokio task and bounded queue per receiver). [`Alerter`] joins the two
//! for the run loop:
//!
//! ```text
//! // start-up, inside the runtime (app/run.rs):
//! let node = alerts::node_name(args.node_name.as_deref());
//! let dispatcher = alerts::Dispatcher::start(&settings.file.receivers, &args.webhook,
//!                                            &args.alertmanager, &metrics.alerts_sent,
//!                                            alerts::Options::default())?;
//! let alerter = alerts::Alerter::new(node.clone(), dispatcher.clone());
//! // each tick, after the judge made its snapshot (app/workers.rs, SampleLoop::act):
//! alerter.tick(&snapshot);
//! // shutdown (app/run.rs):
//! dispatcher.shutdown(GRACE).await;
//! ```
//!
//! Receivers are `http://` or `https://` (a CA bundle, bearer or basic authentication).

mod book;
mod dispatch;
mod input;
mod queue;
pub mod receivers;
mod wire;

#[cfg(test)]
mod real_alertmanager;
#[cfg(test)]
mod sink;

pub use book::{
    alert_name, Alert, AlertBook, ClientInput, ClientLabels, EndpointInput, Labels, Status, DEFAULT_SETTLE,
};
pub use dispatch::{Dispatcher, Error, Options};
pub use input::{node_name, Alerter};
