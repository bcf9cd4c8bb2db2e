//! The agent as a program: the command line and settings, `lifeline check`, logging, and
//! `run`, which wires kernel → table → health → act: the event pump (`pump`: kernel events →
//! table, on a thread of its own) and the tick (`workers`).
#[cfg(test)]
mod bounds;
pub mod check;
pub mod cli;
pub mod config;
pub mod logging;
pub mod pump;
pub mod run;
pub mod unsupported;
pub mod workers;
