//! TLS to Postgres (`sslmode`, `sslrootcert` in `[store] url`) against a real server:
//! a throwaway cluster with `ssl=on` (`scripts/postgres-tls-up.sh`, on a port of its
//! own, apart from the shared cluster) whose certificate, for `localhost` only, is
//! signed by a CA made here. `verify-full` connects to `localhost` and is refused at
//! 127.0.0.1 (the name), `verify-ca` connects at 127.0.0.1 (the chain only), another CA
//! is refused by both, naming the URL's parameters and never the password; `require`
//! encrypts, `disable` does not; `require` against the shared cluster (no TLS) is
//! refused by name.
//!
//! Needs root and PostgreSQL's binaries (`scripts/postgres-up.sh` installs them); says
//! so and passes without them.

use std::path::{Path, PathBuf};
use std::process::Command;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use threadgate::store::{Db, StoreError};

use crate::support::instances::free_port;

const PASSWORD: &str = "fake_key_tls_pw";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres-tls-up.sh")
}

/// A CA (`NAME-ca.pem`) and, when `server` is set, a certificate for `localhost` it
/// signed (`NAME-cert.pem`, `NAME-key.pem`).
fn ca(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("server params")
        .signed_by(&key, &issuer)
        .expect("server cert");
    let files = (
        dir.join(format!("{name}-ca.pem")),
        dir.join(format!("{name}-cert.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&files.0, ca_cert.pem()).expect("write ca");
    std::fs::write(&files.1, cert.pem()).expect("write cert");
    std::fs::write(&files.2, key.serialize_pem()).expect("write key");
    files
}

/// The throwaway TLS cluster; stopped when dropped.
struct TlsCluster {
    dir: PathBuf,
    port: u16,
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("--stop").arg(&self.dir).status();
    }
}

fn start(root: &Path, cert: &Path, key: &Path) -> Option<TlsCluster> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("pg_tls: not root: skipped");
        return None;
    }
    let dir = root.join("cluster");
    let port = free_port();
    let out = Command::new(script())
        .arg(&dir)
        .arg(port.to_string())
        .arg(cert)
        .arg(key)
        .output()
        .expect("run postgres-tls-up.sh");
    if out.status.code() == Some(2) {
        eprintln!(
            "pg_tls: {}: skipped",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    assert!(
        out.status.success(),
        "postgres-tls-up.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(TlsCluster { dir, port })
}

/// Whether the connection `db` reads on is encrypted.
async fn encrypted(db: &Db) -> bool {
    db.read(|c| {
        c.query_row(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            (),
            |r| r.get::<_, bool>(0),
        )
    })
    .await
    .expect("read pg_stat_ssl")
}

async fn connect(url: String) -> Result<Db, StoreError> {
    tokio::task::spawn_blocking(move || Db::connect(&url))
        .await
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_and_sslrootcert_are_honoured_against_a_tls_server() {
    let root = tempfile::tempdir().expect("tempdir");
    let (ca_file, cert, key) = ca(root.path(), "server");
    let (other_ca, _, _) = ca(root.path(), "other");
    let Some(cluster) = start(root.path(), &cert, &key) else {
        return;
    };
    let port = cluster.port;
    let url = |host: &str, query: String| {
        format!("postgres://threadgate:{PASSWORD}@{host}:{port}/threadgate?{query}")
    };
    let root_cert = |p: &Path| format!("sslrootcert={}", p.display());

    // verify-full by the certificate's name, against the CA made here.
    let db = connect(url(
        "localhost",
        format!("sslmode=verify-full&{}", root_cert(&ca_file)),
    ))
    .await
    .expect("verify-full to localhost");
    assert!(encrypted(&db).await);
    drop(db);
    // verify-ca checks the chain only: 127.0.0.1 is not the certificate's name.
    let db = connect(url(
        "127.0.0.1",
        format!("sslmode=verify-ca&{}", root_cert(&ca_file)),
    ))
    .await
    .expect("verify-ca to 127.0.0.1");
    assert!(encrypted(&db).await);
    drop(db);
    // require encrypts without checking; disable does not encrypt.
    let db = connect(url("127.0.0.1", "sslmode=require".into()))
        .await
        .expect("require");
    assert!(encrypted(&db).await);
    drop(db);
    let db = connect(url("127.0.0.1", "sslmode=disable".into()))
        .await
        .expect("disable");
    assert!(!encrypted(&db).await);
    drop(db);

    // Refused: the name (verify-full at 127.0.0.1), another CA (both modes).
    for (host, mode, ca) in [
        ("127.0.0.1", "verify-full", &ca_file),
        ("localhost", "verify-full", &other_ca),
        ("127.0.0.1", "verify-ca", &other_ca),
    ] {
        let refused = connect(url(host, format!("sslmode={mode}&{}", root_cert(ca))))
            .await
            .err()
            .unwrap_or_else(|| panic!("{mode} at {host} with {} connected", ca.display()));
        let text = refused.to_string();
        assert!(matches!(refused, StoreError::TlsRefused { .. }), "{text}");
        assert!(
            text.contains(&format!("sslmode={mode}"))
                && text.contains(&root_cert(ca))
                && !text.contains(PASSWORD),
            "{text}"
        );
    }
}

/// The shared cluster has no TLS: `require` is refused by name, and `prefer` (the
/// default) connects without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_is_refused_by_name() {
    let Some(admin) = threadgate::store::testing::test_database_url() else {
        eprintln!("pg_tls: THREADGATE_TEST_DATABASE_URL is not set: skipped");
        return;
    };
    let plain = connect(admin.clone()).await.expect("prefer by default");
    if encrypted(&plain).await {
        eprintln!("pg_tls: the shared cluster offers TLS: skipped");
        return;
    }
    let sep = if admin.contains('?') { '&' } else { '?' };
    let refused = connect(format!("{admin}{sep}sslmode=require"))
        .await
        .err()
        .expect("require against a server without TLS");
    let text = refused.to_string();
    assert!(
        text.contains("does not offer TLS") && text.contains("sslmode=require"),
        "{text}"
    );
}
