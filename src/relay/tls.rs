//! TLS of the relay: the gateway's listener config from its certificate and key files,
//! and the relay's client config trusting only the CA file it is given. Both use
//! rustls with the aws-lc-rs provider, the one reqwest already links; TLS 1.3 only.
//!
//! A relay checks the listener's certificate against the host of the URL it was given
//! (`sandbox.kubernetes.gateway_url`, the `threadgate-relay` Service) on every
//! connection, also when a replica sent it to another one's pod IP (`GO <address>`):
//! every replica's certificate must name that host, and none needs its pod IP.
//! [`check_names`] verifies it at start, as a relay would.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_rustls::rustls::client::danger::ServerCertVerifier as _;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

/// The listener's config: the certificate chain in `cert_file` and the private key in
/// `key_file` (PEM). An error names the file (and `what` calls it, e.g. the settings key).
pub fn server_config(
    (cert_key, cert_file): (&str, &Path),
    (key_key, key_file): (&str, &Path),
) -> anyhow::Result<Arc<ServerConfig>> {
    let chain =
        read_certs(cert_file).with_context(|| format!("{cert_key}: {}", cert_file.display()))?;
    let pem = std::fs::read(key_file)
        .map(zeroize::Zeroizing::new)
        .with_context(|| format!("{key_key}: cannot read {}", key_file.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|_| anyhow::anyhow!("{key_key}: no PEM private key in {}", key_file.display()))?;
    let config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with the aws-lc-rs provider")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| {
            format!(
                "{cert_key}/{key_key}: the certificate and key do not make a usable pair ({} and {})",
                cert_file.display(),
                key_file.display()
            )
        })?;
    Ok(Arc::new(config))
}

/// The relay's config: the gateway's certificate must chain to a certificate of
/// `ca_file` (PEM) and name the host the relay dials.
pub fn client_config(ca_file: &Path) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca_file).with_context(|| format!("--ca-file {}", ca_file.display()))? {
        roots.add(cert).with_context(|| {
            format!(
                "--ca-file {}: a certificate is not usable",
                ca_file.display()
            )
        })?;
    }
    let config = ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with the aws-lc-rs provider")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Checks, as a relay dialling `host` and trusting `ca_file` would, that the chain in
/// `cert_file` verifies: it chains to the CA, is valid now and names `host` (a DNS
/// name, or an IP address the certificate lists as one). The error names the keys.
pub fn check_names(cert_file: &Path, ca_file: &Path, host: &str) -> anyhow::Result<()> {
    let chain = read_certs(cert_file)
        .with_context(|| format!("relay.cert_file: {}", cert_file.display()))?;
    let Some((leaf, intermediates)) = chain.split_first() else {
        anyhow::bail!(
            "relay.cert_file: {} holds no certificate",
            cert_file.display()
        );
    };
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca_file)
        .with_context(|| format!("sandbox.kubernetes.ca_file: {}", ca_file.display()))?
    {
        roots.add(cert).with_context(|| {
            format!(
                "sandbox.kubernetes.ca_file: {}: a certificate is not usable",
                ca_file.display()
            )
        })?;
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(aws_lc_rs::default_provider()),
    )
    .build()
    .context("sandbox.kubernetes.ca_file: no usable CA")?;
    let name = ServerName::try_from(host.to_owned()).map_err(|_| {
        anyhow::anyhow!("sandbox.kubernetes.gateway_url: {host:?} is not a host name or address")
    })?;
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .map_err(|e| {
            anyhow::anyhow!(
                "relay.cert_file: {} does not verify for {host:?} (the host of sandbox.kubernetes.gateway_url, which every relay checks, also when sent to another replica) against sandbox.kubernetes.ca_file: {e}",
                cert_file.display()
            )
        })?;
    Ok(())
}

/// Every certificate of a PEM file; at least one.
fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| anyhow::anyhow!("not a PEM certificate file"))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the file");
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and a leaf for `names` it signed, as PEM files in `dir`: (cert, CA).
    fn issue(dir: &Path, names: &[&str]) -> (std::path::PathBuf, std::path::PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
        let (cert_file, ca_file) = (dir.join("tls.crt"), dir.join("ca.crt"));
        std::fs::write(&cert_file, leaf.pem()).unwrap();
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        (cert_file, ca_file)
    }

    #[test]
    fn the_certificate_must_name_the_host_relays_dial() {
        let dir = tempfile::tempdir().unwrap();
        let service = "threadgate-relay.threadgate.svc";
        let (cert, ca) = issue(dir.path(), &[service, "fd00::1"]);
        check_names(&cert, &ca, service).unwrap();
        check_names(&cert, &ca, "fd00::1").unwrap();
        for other in ["threadgate-relay", "10.0.3.7", "fd00::2"] {
            let e = check_names(&cert, &ca, other).unwrap_err().to_string();
            assert!(
                e.starts_with("relay.cert_file:") && e.contains("sandbox.kubernetes.gateway_url"),
                "{e}"
            );
        }
        // Another CA's certificate does not chain.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let (_, other_ca) = issue(&elsewhere, &[service]);
        let e = check_names(&cert, &other_ca, service)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not verify"), "{e}");
    }
}
