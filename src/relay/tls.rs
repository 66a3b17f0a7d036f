//! TLS of the relay: the gateway's listener config from its certificate and key files,
//! and the relay's client config trusting only the CA file it is given. Both use
//! rustls with the aws-lc-rs provider, the one reqwest already links; TLS 1.3 only.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
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

/// Every certificate of a PEM file; at least one.
fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| anyhow::anyhow!("not a PEM certificate file"))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in the file");
    Ok(certs)
}
