//! `[relay]`: the TLS listener a pod's relay dials (off by default).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The relay listener's settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelaySettings {
    /// Where relays connect (`0.0.0.0:7443`); none (the default) serves no relay.
    pub listen: Option<SocketAddr>,
    /// Where the other instances send a relay whose session this instance runs
    /// (`10.0.3.7:8443`; on Kubernetes the pod's IP, through the downward API). Unset:
    /// the bound address, unless it is unspecified (`0.0.0.0`), in which case no relay
    /// is sent here by another instance. The certificate must hold the name relays dial
    /// (`sandbox.kubernetes.gateway_url`'s host), which they keep checking.
    pub advertise: Option<SocketAddr>,
    /// The listener's certificate chain (PEM); required with `listen`.
    pub cert_file: Option<PathBuf>,
    /// The listener's private key (PEM); required with `listen`.
    pub key_file: Option<PathBuf>,
    /// How long a minted or renewed relay credential is valid.
    #[serde(with = "humantime_serde")]
    pub credential_ttl: Duration,
    /// Open connections at most on the listener, from every relay together (each
    /// session also has its socket's cap, `sessions.socket_max_connections`).
    pub max_connections: usize,
    /// Time a new connection has to finish TLS and present its credential.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
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
            handshake_timeout: Duration::from_secs(10),
        }
    }
}
