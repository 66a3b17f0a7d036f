//! TLS to Postgres, as the URL asks: `sslmode` (`disable`, `prefer`, the default,
//! `require`, `verify-ca`, `verify-full`) and `sslrootcert` (a PEM file of the CA that
//! signed the server's certificate), with libpq's meanings, over rustls.
//!
//! - `disable`: never TLS.
//! - `prefer` / `require`: TLS when the server offers it / or refuse to connect; the
//!   certificate is not checked (libpq's `require` without a root certificate), so these
//!   guard against a passive listener only.
//! - `verify-ca`: the certificate must chain to `sslrootcert` (or, without it, to the
//!   system's roots); the host name is not checked.
//! - `verify-full`: as `verify-ca`, and the certificate must name the URL's host.
//!
//! The two parameters are taken out of the URL before `postgres` parses the rest (it
//! knows neither `verify-*` nor `sslrootcert`). A certificate refused is an error naming
//! the URL's `sslmode` and `sslrootcert`, never the password.

use std::path::PathBuf;
use std::sync::Arc;

use postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{CertificateError, DigitallySignedStruct, RootCertStore};

use super::StoreError;

/// The `sslmode` of a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(text: &str) -> Option<Mode> {
        Some(match text {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }

    /// What the client asks of the server.
    pub(crate) fn ssl_mode(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// The TLS a URL asks for, and the connector that makes it.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) mode: Mode,
    root_cert: Option<PathBuf>,
    connector: MakeRustlsConnect,
}

impl Tls {
    /// The connector for each new connection.
    pub(crate) fn connector(&self) -> MakeRustlsConnect {
        self.connector.clone()
    }

    /// A connection error, said in terms of the URL's TLS parameters when TLS is what
    /// failed: a certificate refused, or a server without TLS under `require` or
    /// stricter. `None`: not a TLS failure.
    pub(crate) fn explain(&self, shown: &str, e: &postgres::Error) -> Option<StoreError> {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        let mut no_tls = false;
        while let Some(s) = source {
            // rustls' error travels inside an io::Error, whose source skips it.
            let inner = s
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>());
            if let Some(rustls::Error::InvalidCertificate(why)) =
                s.downcast_ref::<rustls::Error>().or(inner)
            {
                return Some(StoreError::TlsRefused {
                    url: shown.to_owned(),
                    reason: format!(
                        "the server's certificate was refused under sslmode={} ({}): {why:?}",
                        self.mode.as_str(),
                        self.roots_said()
                    ),
                });
            }
            no_tls |= s.to_string().contains("server does not support TLS");
            source = s.source();
        }
        no_tls.then(|| StoreError::TlsRefused {
            url: shown.to_owned(),
            reason: format!(
                "the server does not offer TLS, which sslmode={} requires",
                self.mode.as_str()
            ),
        })
    }

    fn roots_said(&self) -> String {
        match (&self.root_cert, self.mode) {
            (Some(path), _) => format!("sslrootcert={}", path.display()),
            (None, Mode::VerifyCa | Mode::VerifyFull) => {
                "no sslrootcert: the system's roots".to_owned()
            }
            (None, _) => "no certificate is checked".to_owned(),
        }
    }
}

/// Takes `sslmode` and `sslrootcert` out of `url` (a `postgres://` URL's query, or a
/// `key=value` string) and builds the TLS they ask for; answers the rest of the URL
/// for `postgres` to parse. A bad value is an error naming the parameter.
pub(crate) fn from_url(url: &str, shown: &str) -> Result<(String, Tls), StoreError> {
    let bad = |reason: String| StoreError::BadUrl {
        url: shown.to_owned(),
        reason,
    };
    let (rest, params) = take_params(url, &["sslmode", "sslrootcert"]);
    let mut mode = Mode::Prefer;
    let mut root_cert = None;
    for (key, value) in params {
        match key.as_str() {
            "sslmode" => {
                mode = Mode::parse(&value).ok_or_else(|| {
                    bad(format!(
                        "sslmode={value:?} is not one of disable, prefer, require, verify-ca, verify-full"
                    ))
                })?;
            }
            _ => root_cert = Some(PathBuf::from(value)),
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => Arc::new(Unchecked(provider.clone())),
        Mode::VerifyCa | Mode::VerifyFull => {
            let roots = roots(root_cert.as_deref()).map_err(bad)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| bad(format!("sslrootcert: {e}")))?;
            if mode == Mode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let tls = Tls {
        mode,
        root_cert,
        connector: MakeRustlsConnect::new(config),
    };
    Ok((rest, tls))
}

/// The roots a `verify-*` mode checks against: the PEM file `sslrootcert`, or the
/// system's.
fn roots(path: Option<&std::path::Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match path {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "sslrootcert={} holds no certificate",
                    path.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "sslmode verify-ca/verify-full without sslrootcert, and the system has no root certificate"
                        .to_owned(),
                );
            }
        }
    }
    Ok(roots)
}

/// `url` without the parameters `keys`, and those parameters (percent-decoded).
fn take_params(url: &str, keys: &[&str]) -> (String, Vec<(String, String)>) {
    let mut taken = Vec::new();
    if url.contains("://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), taken);
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if keys.contains(&k) {
                taken.push((k.to_owned(), percent_decode(v)));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, taken);
    }
    let mut kept = Vec::new();
    for word in url.split_whitespace() {
        match word.split_once('=') {
            Some((k, v)) if keys.contains(&k) => taken.push((k.to_owned(), v.to_owned())),
            _ => kept.push(word),
        }
    }
    (kept.join(" "), taken)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `prefer` and `require`: the connection is encrypted, the certificate not checked
/// (libpq's meaning of these modes); the handshake's signatures still are.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must reach a root; the name is not checked (webpki checks the
/// chain first, so a name mismatch means the chain was good).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_leave_the_url_and_the_rest_stays() {
        let (rest, taken) = take_params(
            "postgres://u:p@h:5/db?application_name=x&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem",
            &["sslmode", "sslrootcert"],
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(
            taken,
            [
                ("sslmode".to_owned(), "verify-full".to_owned()),
                ("sslrootcert".to_owned(), "/tmp/ca.pem".to_owned())
            ]
        );
        let (rest, taken) = take_params(
            "host=h user=u sslmode=require dbname=d",
            &["sslmode", "sslrootcert"],
        );
        assert_eq!(rest, "host=h user=u dbname=d");
        assert_eq!(taken, [("sslmode".to_owned(), "require".to_owned())]);
    }

    #[test]
    fn a_bad_sslmode_or_root_file_names_the_parameter_and_not_the_password() {
        let url = "postgres://u:hunter2@h/db?sslmode=verify-everything";
        let shown = super::super::pg::redact(url);
        let Err(e) = from_url(url, &shown) else {
            panic!("accepted")
        };
        let text = e.to_string();
        assert!(
            text.contains("sslmode") && !text.contains("hunter2"),
            "{text}"
        );
        let url = "postgres://u:hunter2@h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem";
        let Err(e) = from_url(url, &super::super::pg::redact(url)) else {
            panic!("accepted")
        };
        let text = e.to_string();
        assert!(
            text.contains("sslrootcert=/nonexistent/ca.pem") && !text.contains("hunter2"),
            "{text}"
        );
        let (rest, tls) = from_url("postgres://u@h/db", "postgres://u@h/db").unwrap();
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("postgres://u@h/db", Mode::Prefer)
        );
    }
}
