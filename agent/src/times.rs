//! How the agent writes and reads times: RFC 3339 timestamps (API, alerts) and the config
//! file's durations (`15s`, `2m`).
use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer};

pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn parse_duration<E: serde::de::Error>(text: &str) -> std::result::Result<Duration, E> {
    humantime::parse_duration(text.trim())
        .map_err(|err| E::custom(format!("{text:?} is not a duration like 15s or 2m ({err})")))
}

/// A config file's optional duration (`deserialize_with`).
pub fn duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map(Some)
}

/// A config file's duration (`deserialize_with`).
pub fn required_duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    parse_duration(&String::deserialize(d)?)
}
