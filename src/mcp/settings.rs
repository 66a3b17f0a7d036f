//! `[mcp]`: how long `threadgate_wait` waits when not told, how often a wait reports
//! progress, and how many redeemed request states one session may have outstanding.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use super::MAX_WAIT_SECONDS;

/// The MCP endpoint's settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpSettings {
    /// How long `threadgate_wait` (and a redeemed request state) waits when the call
    /// gives no `timeout_seconds`: 25 s, under the request timeouts clients keep by
    /// default (the TypeScript SDK's 60 s, the Python SDK's 30 s HTTP read timeout), so
    /// the answer "still pending, call again" arrives before the client gives up.
    /// From 1 s to 300 s.
    #[serde(
        deserialize_with = "wait_default",
        serialize_with = "humantime_serde::serialize"
    )]
    pub wait_default: Duration,
    /// How often a wait sends a progress notification to a client that gave a
    /// `_meta.progressToken` (the first is sent when the wait starts), so a client
    /// that resets its timeout on progress keeps waiting. At least 1 s.
    #[serde(
        deserialize_with = "progress_interval",
        serialize_with = "humantime_serde::serialize"
    )]
    pub progress_interval: Duration,
    /// How many redeemed request states one session keeps until they expire; past it
    /// that session's redemptions are refused (naming this key) until some expire.
    /// Other sessions have their own. At least 1.
    #[serde(deserialize_with = "at_least_one")]
    pub max_redeemed_per_session: usize,
}

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            wait_default: Duration::from_secs(25),
            progress_interval: Duration::from_secs(10),
            max_redeemed_per_session: 1000,
        }
    }
}

fn wait_default<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let wait: Duration = humantime_serde::deserialize(d)?;
    if wait < Duration::from_secs(1) || wait > Duration::from_secs(MAX_WAIT_SECONDS) {
        return Err(serde::de::Error::custom(format!(
            "wait_default must be from 1s to {MAX_WAIT_SECONDS}s"
        )));
    }
    Ok(wait)
}

fn progress_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let every: Duration = humantime_serde::deserialize(d)?;
    if every < Duration::from_secs(1) {
        return Err(serde::de::Error::custom(
            "progress_interval must be at least 1s",
        ));
    }
    Ok(every)
}

fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom(
            "max_redeemed_per_session must be at least 1",
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    fn parse(toml_text: &str) -> Result<Settings, String> {
        toml::from_str::<Settings>(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_mcp_table_parses_and_refuses_out_of_range_values() {
        let s = parse(
            "[mcp]\nwait_default = \"20s\"\nprogress_interval = \"5s\"\nmax_redeemed_per_session = 7\n",
        )
        .expect("parses");
        assert_eq!(s.mcp.wait_default.as_secs(), 20);
        assert_eq!(s.mcp.progress_interval.as_secs(), 5);
        assert_eq!(s.mcp.max_redeemed_per_session, 7);
        let defaults = parse("").expect("parses");
        assert_eq!(defaults.mcp.wait_default.as_secs(), 25);
        for (bad, named) in [
            ("wait_default = \"301s\"", "wait_default"),
            ("wait_default = \"0s\"", "wait_default"),
            ("progress_interval = \"100ms\"", "progress_interval"),
            ("max_redeemed_per_session = 0", "max_redeemed_per_session"),
            ("max_redeemed = 5", "max_redeemed"),
        ] {
            let error = parse(&format!("[mcp]\n{bad}\n")).expect_err(bad);
            assert!(error.contains(named), "{bad}: {error}");
        }
    }
}
