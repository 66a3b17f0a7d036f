//! `[relay]`: the TLS listener a pod's relay dials (off by default), and
//! `[relay.workspace]`: the caps and timing of a session's workspace carried into its pod
//! and back through it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::workspace::BundleLimits;

/// The relay listener's settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySettings {
    /// Where relays connect (`0.0.0.0:7443`); none (the default) serves no relay.
    pub listen: Option<SocketAddr>,
    /// Where the other instances send a relay whose session this instance runs: an
    /// address alone (`10.0.3.7`, `fd00::5`: on Kubernetes the pod's IP as the downward
    /// API gives it, the listener's port added) or with its port (`10.0.3.7:8443`,
    /// `[fd00::5]:8443`). Unset: the bound address, unless it is unspecified
    /// (`0.0.0.0`), in which case no relay is sent here by another instance. Relays
    /// check the certificate against the name they dial (`sandbox.kubernetes.
    /// gateway_url`'s host) even when sent here, so it needs no name for this address.
    pub advertise: Option<Advertise>,
    /// The listener's certificate chain (PEM); required with `listen`. It must name the
    /// host of `sandbox.kubernetes.gateway_url` (checked at start on that backend).
    pub cert_file: Option<PathBuf>,
    /// The listener's private key (PEM); required with `listen`.
    pub key_file: Option<PathBuf>,
    /// How long a minted or renewed relay credential is valid.
    #[serde(with = "humantime_serde")]
    pub credential_ttl: Duration,
    /// Open connections at most on the listener, from every relay together (each
    /// session also has its socket's cap, `sessions.socket_max_connections`).
    pub max_connections: usize,
    /// Open connections at most from one address (each IPv6 address alone: a node's
    /// pods may share a /64), counted
    /// from the moment each is accepted, so one pod (its agent shares its network)
    /// cannot fill the listener with connections that never finish their handshake; 0
    /// turns it off (pods whose traffic reaches the gateway from one translated
    /// address).
    pub max_connections_per_address: usize,
    /// Time a new connection has to finish TLS and present its credential.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// A session's workspace in its pod (`[relay.workspace]`).
    pub workspace: PodWorkspaceSettings,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            listen: None,
            advertise: None,
            cert_file: None,
            key_file: None,
            credential_ttl: Duration::from_secs(15 * 60),
            max_connections: 1024,
            max_connections_per_address: 64,
            handshake_timeout: Duration::from_secs(10),
            workspace: PodWorkspaceSettings::default(),
        }
    }
}

impl RelaySettings {
    /// The address recorded for the other instances, the listener being bound at
    /// `bound`: `advertise` (with `bound`'s port when it names none), else `bound`
    /// unless it is unspecified.
    pub fn advertised(&self, bound: SocketAddr) -> Option<SocketAddr> {
        match self.advertise {
            Some(Advertise { ip, port }) => Some(SocketAddr::new(ip, port.unwrap_or(bound.port()))),
            None => (!bound.ip().is_unspecified()).then_some(bound),
        }
    }
}

/// `[relay] advertise`: an IP address, with or without a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertise {
    /// The address.
    pub ip: IpAddr,
    /// The port; none: the listener's.
    pub port: Option<u16>,
}

impl std::str::FromStr for Advertise {
    type Err = String;

    /// `10.0.3.7`, `fd00::5` (bare, as the downward API gives a pod's IP),
    /// `10.0.3.7:8443`, `[fd00::5]:8443` or `[fd00::5]`. A host name is refused: the
    /// registry holds addresses the other instances dial as they are.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(Advertise {
                ip: addr.ip(),
                port: Some(addr.port()),
            });
        }
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        match bare.parse::<IpAddr>() {
            Ok(ip) => Ok(Advertise { ip, port: None }),
            Err(_) => Err(format!(
                "{text:?} is not an IP address, with or without a port (10.0.3.7, fd00::5, 10.0.3.7:8443, [fd00::5]:8443)"
            )),
        }
    }
}

impl std::fmt::Display for Advertise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => SocketAddr::new(self.ip, port).fmt(f),
            None => self.ip.fmt(f),
        }
    }
}

impl<'de> Deserialize<'de> for Advertise {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Advertise {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `[relay.workspace]`: a session's workspace carried into its pod and back as git
/// bundles. A bundle past any cap is refused whole and changes nothing.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PodWorkspaceSettings {
    /// Bytes of one bundle a pod sends (at least 1 KiB).
    #[serde(deserialize_with = "max_bytes")]
    pub max_bytes: u64,
    /// Objects its pack may declare (at least 1).
    #[serde(deserialize_with = "at_least_one_u32")]
    pub max_objects: u32,
    /// Entries (files, links, directories) of its tree, as written out (at least 1).
    #[serde(deserialize_with = "at_least_one_u64")]
    pub max_entries: u64,
    /// Bytes of file content of its tree, as written out (at least 1).
    #[serde(deserialize_with = "at_least_one_u64")]
    pub max_tree_bytes: u64,
    /// Time to verify and apply one bundle (at least 1 s).
    #[serde(
        deserialize_with = "at_least_a_second",
        serialize_with = "humantime_serde::serialize"
    )]
    pub max_time: Duration,
    /// The longest a pull (a checkpoint's, a sync's, the stop's) waits for the pod's
    /// relay to send its work (at least 1 s).
    #[serde(
        deserialize_with = "at_least_a_second",
        serialize_with = "humantime_serde::serialize"
    )]
    pub pull_timeout: Duration,
    /// While a session runs, its pod's work is pulled into the worktree this often when
    /// it changed since the last pull (so a pod that dies loses at most this much);
    /// `0s` turns it off; else at least 1 s.
    #[serde(
        deserialize_with = "sync_every",
        serialize_with = "humantime_serde::serialize"
    )]
    pub sync_every: Duration,
}

impl Default for PodWorkspaceSettings {
    fn default() -> Self {
        let limits = BundleLimits::default();
        PodWorkspaceSettings {
            max_bytes: u64::try_from(limits.max_bytes).unwrap_or(u64::MAX),
            max_objects: limits.max_objects,
            max_entries: u64::try_from(limits.max_entries).unwrap_or(u64::MAX),
            max_tree_bytes: limits.max_tree_bytes,
            max_time: limits.max_time,
            pull_timeout: crate::relay::pod_workspace::PULL_WAIT,
            sync_every: Duration::from_secs(30),
        }
    }
}

impl PodWorkspaceSettings {
    /// The caps as the bundle checks take them.
    pub fn limits(&self) -> BundleLimits {
        BundleLimits {
            max_bytes: usize::try_from(self.max_bytes).unwrap_or(usize::MAX),
            max_objects: self.max_objects,
            max_entries: usize::try_from(self.max_entries).unwrap_or(usize::MAX),
            max_tree_bytes: self.max_tree_bytes,
            max_time: self.max_time,
        }
    }

    /// The sync's period, `None` when it is off.
    pub fn sync_period(&self) -> Option<Duration> {
        (!self.sync_every.is_zero()).then_some(self.sync_every)
    }
}

fn max_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n < 1024 {
        return Err(serde::de::Error::custom("must be at least 1024 (1 KiB)"));
    }
    Ok(n)
}

fn at_least_one_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(n)
}

fn at_least_one_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = u64::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(n)
}

fn at_least_a_second<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let wait: Duration = humantime_serde::deserialize(d)?;
    if wait < Duration::from_secs(1) {
        return Err(serde::de::Error::custom("must be at least 1s"));
    }
    Ok(wait)
}

fn sync_every<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let every: Duration = humantime_serde::deserialize(d)?;
    if !every.is_zero() && every < Duration::from_secs(1) {
        return Err(serde::de::Error::custom("must be 0s (off) or at least 1s"));
    }
    Ok(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertised_address_takes_the_listeners_port_when_it_names_none() {
        let bound: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        let with = |text: &str| RelaySettings {
            advertise: Some(text.parse().unwrap()),
            ..RelaySettings::default()
        };
        // The downward API's pod IPs, bare: IPv6 gets its brackets when written out.
        for (given, advertised) in [
            ("fd00::1", "[fd00::1]:8443"),
            ("10.0.3.7", "10.0.3.7:8443"),
            ("[fd00::1]", "[fd00::1]:8443"),
            ("[fd00::1]:9443", "[fd00::1]:9443"),
            ("10.0.3.7:9443", "10.0.3.7:9443"),
        ] {
            let addr = with(given).advertised(bound).unwrap();
            assert_eq!(addr.to_string(), advertised, "{given}");
            // What the registry holds parses back as the redirect's address.
            assert_eq!(
                crate::relay::wire::parse_redirect(crate::relay::wire::redirect(addr).trim_end()),
                Some(addr)
            );
        }
        assert_eq!(RelaySettings::default().advertised(bound), None);
        let local: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(RelaySettings::default().advertised(local), Some(local));
        for bad in ["gateway.internal", "gateway.internal:8443", "", "[10.0.3.7"] {
            assert!(bad.parse::<Advertise>().is_err(), "{bad}");
        }
    }
}
