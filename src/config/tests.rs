//! The settings' layering: the file, the environment over it, and errors that name the
//! key and where its value came from, never the value.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::env::{ALIASES, env_keys, schema};
use super::*;
use crate::secrets::ExposeSecret as _;

fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
    pairs
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect()
}

/// Loads `toml` (written to `t.toml`, when given) under the variables `env`.
fn load(toml: Option<&str>, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.toml");
    if let Some(text) = toml {
        std::fs::write(&path, text).expect("write");
    }
    Settings::load_with_env(toml.map(|_| path.as_path()), vars(env))
}

fn error(toml: Option<&str>, env: &[(&str, &str)]) -> String {
    load(toml, env).expect_err("refused").to_string()
}

/// A file (or none), the variables, and what the error must say.
type Case = (
    Option<&'static str>,
    &'static [(&'static str, &'static str)],
    &'static str,
);

fn check_errors(cases: &[Case]) {
    for (file, env, expected) in cases {
        let text = error(*file, env);
        assert!(text.contains(expected), "{file:?} {env:?}: {text}");
    }
}

#[test]
fn a_file_and_the_environment_override_defaults() {
    let file = "listen = \"127.0.0.1:9000\"\n[sessions]\nmax_live = 3\nidle_timeout = \"2m\"\nmax_pending_holds = 7\n";
    let s = load(Some(file), &[]).expect("parse");
    assert_eq!(s.sessions.max_live, 3);
    assert_eq!(s.sessions.idle_timeout, Duration::from_secs(120));
    assert_eq!(s.sessions.max_pending_holds, 7);
    for name in [
        "THREADGATE_MAX_LIVE_SESSIONS",
        "THREADGATE_SESSIONS__MAX_LIVE",
    ] {
        let s = load(Some(file), &[(name, "5")]).expect("env");
        assert_eq!(s.sessions.max_live, 5, "{name}");
        assert_eq!(
            s.sessions.max_pending_holds, 7,
            "the file's other keys stay"
        );
        assert_eq!(s.listen.port(), 9000);
    }
    let s = load(
        Some(file),
        &[
            ("THREADGATE_SESSIONS__IDLE_TIMEOUT", "1h"),
            ("THREADGATE_LISTEN", "127.0.0.1:9001"),
        ],
    )
    .expect("env");
    assert_eq!(s.sessions.idle_timeout, Duration::from_secs(3600));
    assert_eq!(s.listen.port(), 9001);
}

#[test]
fn nothing_set_gives_the_defaults() {
    let loaded = load(None, &[("PATH", "/bin")]).expect("defaults");
    let empty_file = load(Some(""), &[]).expect("defaults");
    let defaults = figment::value::Value::serialize(Settings::default()).expect("written");
    for s in [loaded, empty_file] {
        assert_eq!(
            figment::value::Value::serialize(&s).expect("written"),
            defaults
        );
    }
    let s = Settings::default();
    assert_eq!((s.sessions.max_live, s.server.max_connections), (16, 1024));
    assert_eq!(
        s.model.transcript_retention,
        Duration::from_secs(30 * 24 * 3600)
    );
    assert_eq!(s.github.api_url, "https://api.github.com");
}

/// One key of each table, set from its variable, read back from the settings.
#[test]
fn each_table_s_keys_can_be_set_from_the_environment() {
    type Check = fn(&Settings) -> bool;
    let table: &[(&str, &str, Check)] = &[
        ("THREADGATE_DATA_DIR", "/srv/tg", |s| {
            s.data_dir == Path::new("/srv/tg")
        }),
        ("THREADGATE_INSTANCE_ID", "0123", |s| {
            s.instance_id.as_deref() == Some("0123")
        }),
        ("THREADGATE_DEFAULT_AGENT", "triage", |s| {
            s.default_agent == "triage"
        }),
        ("THREADGATE_PLAIN__MAX_SKEW", "1m", |s| {
            s.plain.max_skew == Duration::from_secs(60)
        }),
        (
            "THREADGATE_PLAIN__THREAD_URL",
            "https://x/{thread_id}",
            |s| s.plain.thread_url.as_deref() == Some("https://x/{thread_id}"),
        ),
        ("THREADGATE_PLAIN__LABELS__AGENT_WORKING", "lt_a", |s| {
            s.plain.labels.agent_working.as_deref() == Some("lt_a")
        }),
        (
            "THREADGATE_STRIPE__WEBHOOK_MAX_SIGNATURE_BYTES",
            "300",
            |s| s.stripe.signature_limits.max_bytes == 300,
        ),
        ("THREADGATE_STRIPE__EMAIL_MAX_AGE", "5m", |s| {
            s.stripe.email_max_age == Duration::from_secs(300)
        }),
        ("THREADGATE_GITHUB__REPOS", "[\"o/a\", \"o/b\"]", |s| {
            s.github.repos == ["o/a", "o/b"]
        }),
        ("THREADGATE_GITHUB__ON_DONE", "close", |s| {
            s.github.on_done == crate::session::publish::OnDone::Close
        }),
        ("THREADGATE_REPO__MAX_COMMIT_BYTES", "4096", |s| {
            s.repo.max_commit_bytes == 4096
        }),
        ("THREADGATE_REPO", "/srv/repo", |s| {
            s.repo.path == Path::new("/srv/repo")
        }),
        ("THREADGATE_SANDBOX__PIDS", "64", |s| s.sandbox.pids == 64),
        ("THREADGATE_SANDBOX__BACKEND", "kubernetes", |s| {
            s.sandbox.backend == crate::sandbox::k8s::Backend::Kubernetes
        }),
        ("THREADGATE_SANDBOX__KUBERNETES__CLAIMS", "never", |s| {
            s.sandbox.kubernetes.claims == crate::sandbox::k8s::ClaimMode::Never
        }),
        (
            "THREADGATE_SANDBOX__KUBERNETES__RUNTIME_CLASS",
            "gvisor",
            |s| s.sandbox.kubernetes.runtime_class.as_deref() == Some("gvisor"),
        ),
        (
            "THREADGATE_SANDBOX__KUBERNETES__READY_TIMEOUT",
            "45s",
            |s| s.sandbox.kubernetes.ready_timeout == std::time::Duration::from_secs(45),
        ),
        ("THREADGATE_IMAGE", "img:1", |s| s.sandbox.image == "img:1"),
        ("THREADGATE_SANDBOX_IMAGE", "img:2", |s| {
            s.sandbox.image == "img:2"
        }),
        ("THREADGATE_SESSIONS__MAX_PENDING_HOLDS", "3", |s| {
            s.sessions.max_pending_holds == 3
        }),
        ("THREADGATE_MODEL__PROVIDER", "anthropic", |s| {
            s.model.provider == crate::model::Provider::Anthropic
        }),
        ("THREADGATE_MODEL__ALLOWED", "[\"m1\"]", |s| {
            s.model.allows("m1")
        }),
        ("THREADGATE_MODEL__ANTHROPIC_VERSION", "2024-01-01", |s| {
            s.model.anthropic_version == "2024-01-01"
        }),
        ("THREADGATE_MCP__WAIT_DEFAULT", "20s", |s| {
            s.mcp.wait_default == Duration::from_secs(20)
        }),
        ("THREADGATE_SERVER__MAX_CONNECTIONS", "10", |s| {
            s.server.max_connections == 10
        }),
        ("THREADGATE_TELEMETRY__READY_TIMEOUT", "500ms", |s| {
            s.telemetry.ready_timeout == Duration::from_millis(500)
        }),
        (
            "THREADGATE_TELEMETRY__OTLP_ENDPOINT",
            "http://127.0.0.1:4318",
            |s| s.telemetry.otlp_endpoint.is_some(),
        ),
        ("THREADGATE_POLICY", "p.yaml", |s| {
            s.policy_file == Path::new("p.yaml")
        }),
    ];
    for (name, value, check) in table {
        let s = load(None, &[(name, value)]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(check(&s), "{name}={value} did not reach its key");
    }
}

/// Every key has a variable that the layer takes, and its default written as text is
/// read back as the default.
#[test]
fn every_key_of_the_file_has_a_variable() {
    let keys = env_keys();
    assert!(keys.len() > 60, "{} keys", keys.len());
    let defaults = figment::value::Value::serialize(Settings::default()).expect("written");
    let optional: Vec<&str> = super::env::optional_tables()
        .expect("templates")
        .into_iter()
        .map(|(table, _)| table)
        .collect();
    // A key of a table that is unset by default sets that table, which needs its other
    // required keys too: `an_unset_table_is_set_whole_from_the_environment` tests those.
    let in_optional = |key: &str| optional.iter().any(|t| key.starts_with(&format!("{t}.")));
    for key in keys.iter().filter(|k| !in_optional(&k.key)) {
        let text = if key.default == "(unset)" || key.default == "(empty)" {
            String::new()
        } else {
            key.default.clone()
        };
        let layer = super::env::layer(vars(&[(&key.variable, &text)])).expect("taken");
        assert_eq!(layer.len(), 1, "{} was not taken", key.variable);
        let s = load(None, &[(&key.variable, &text)])
            .unwrap_or_else(|e| panic!("{}={text}: {e}", key.variable));
        let loaded = figment::value::Value::serialize(&s).expect("written");
        assert_eq!(loaded, defaults, "{}={text}", key.variable);
    }
    for (alias, key) in ALIASES {
        assert!(
            schema().expect("keys").contains_key(*key),
            "{alias} sets {key}"
        );
    }
}

#[test]
fn a_key_set_by_an_old_name_and_the_new_one_is_refused_unless_they_agree() {
    let agreeing = [("THREADGATE_IMAGE", "a"), ("THREADGATE_SANDBOX_IMAGE", "a")];
    assert_eq!(
        load(None, &agreeing).expect("same value").sandbox.image,
        "a"
    );
    let text = error(
        None,
        &[
            ("THREADGATE_IMAGE", "a"),
            ("THREADGATE_SANDBOX__IMAGE", "b"),
        ],
    );
    assert!(
        text.contains("sandbox.image")
            && text.contains("THREADGATE_IMAGE")
            && text.contains("THREADGATE_SANDBOX__IMAGE"),
        "{text}"
    );
}

#[test]
fn a_wrong_value_names_the_key_and_its_source() {
    let cases: &[Case] = &[
        (
            Some("data_dir = \"d\"\n[sessions]\nmax_live = \"many\"\n"),
            &[],
            "t.toml:3: sessions.max_live: expected usize, found a string",
        ),
        (
            Some("[server]\n\nheader_timeout = 5\n"),
            &[],
            "t.toml:3: server.header_timeout:",
        ),
        (
            Some("[plain.labels]\nagent_working = 7\n"),
            &[],
            "t.toml:2: plain.labels.agent_working:",
        ),
        (
            Some("[sessions]\nmax_live = 3\n"),
            &[("THREADGATE_SESSIONS__MAX_LIVE", "many")],
            "environment variable THREADGATE_SESSIONS__MAX_LIVE: sessions.max_live: expected usize",
        ),
        (
            None,
            &[("THREADGATE_MAX_LIVE_SESSIONS", "-1")],
            "environment variable THREADGATE_MAX_LIVE_SESSIONS: sessions.max_live:",
        ),
        (
            None,
            &[("THREADGATE_METRICS_LISTEN", "nine")],
            "environment variable THREADGATE_METRICS_LISTEN: telemetry.metrics_listen:",
        ),
        (
            None,
            &[("THREADGATE_MCP__WAIT_DEFAULT", "0s")],
            "environment variable THREADGATE_MCP__WAIT_DEFAULT: mcp.wait_default: wait_default must be from 1s",
        ),
        (
            Some("[mcp]\nmax_redeemed_per_session = 0\n"),
            &[],
            "t.toml:2: mcp.max_redeemed_per_session: max_redeemed_per_session must be at least 1",
        ),
        (
            Some("[store]\npool_size = 0\n"),
            &[],
            "t.toml:2: store.pool_size: pool_size must be at least 1",
        ),
        (
            Some("[relay.workspace]\nmax_objects = 0\n"),
            &[],
            "t.toml:2: relay.workspace.max_objects: must be at least 1",
        ),
        (
            Some("[relay.workspace]\nmax_bytes = 10\n"),
            &[],
            "t.toml:2: relay.workspace.max_bytes: must be at least 1024",
        ),
        (
            None,
            &[("THREADGATE_RELAY__WORKSPACE__SYNC_EVERY", "200ms")],
            "relay.workspace.sync_every: must be 0s (off) or at least 1s",
        ),
        (
            None,
            &[("THREADGATE_RELAY__WORKSPACE__MAX_TIME", "0s")],
            "relay.workspace.max_time: must be at least 1s",
        ),
        (
            Some("[relay]\nadvertise = \"gateway.internal:8443\"\n"),
            &[],
            "t.toml:2: relay.advertise:",
        ),
        (
            Some("[github]\non_done = \"merge\"\n"),
            &[],
            "t.toml:2: github.on_done: must be one of draft, ready, close",
        ),
        (
            Some("[github]\nwebhook_max_signature_entries = 3\n"),
            &[],
            "t.toml:1: github: webhook_secret, email_max_age and webhook_max_signature_* belong in [stripe]",
        ),
        (
            Some("[stripe]\nrepos = [\"o/r\"]\n"),
            &[],
            "t.toml:1: stripe: on_done and repos belong in [github]",
        ),
        (Some("[sessions]\nmax_live = = 3\n"), &[], "t.toml:2:12: "),
    ];
    check_errors(cases);
}

#[test]
fn an_unknown_key_is_refused_with_its_name() {
    let cases: &[Case] = &[
        (Some("lisen = \"x\"\n"), &[], "t.toml:1: lisen: unknown key"),
        (
            Some("[sessions]\nmax_live = 1\nmax_lve = 2\n"),
            &[],
            "t.toml:3: sessions.max_lve: unknown key",
        ),
        (
            Some("[plain]\nlabels = { waiting = \"lt_w\" }\n"),
            &[],
            "t.toml:2: plain.labels.waiting: unknown key",
        ),
        (
            Some("[stripe]\napi_ur = \"x\"\n"),
            &[],
            "t.toml:2: stripe.api_ur: unknown key",
        ),
        (
            None,
            &[("THREADGATE_SESSIONS__MAX_LVE", "2")],
            "environment variable THREADGATE_SESSIONS__MAX_LVE names no setting",
        ),
        (
            None,
            &[("THREADGATE_GITHUB__WEBHOOK_SECRET", "s")],
            "THREADGATE_GITHUB__WEBHOOK_SECRET names no setting",
        ),
        (
            None,
            &[("THREADGATE_SESSIONS_MAX_PENDING_HOLDS", "3")],
            "THREADGATE_SESSIONS_MAX_PENDING_HOLDS names no setting; did you mean \
             THREADGATE_SESSIONS__MAX_PENDING_HOLDS?",
        ),
    ];
    check_errors(cases);
    let s = load(
        None,
        &[
            ("THREADGATE_LOG_FORMAT", "json"),
            ("THREADGATE_REQUIRE_DOCKER", "1"),
            ("THREADGATE_MODEL", "x"),
        ],
    )
    .expect("other tools' variables are left alone");
    assert_eq!(s.sessions.max_live, 16);
}

#[test]
fn a_secret_in_a_wrong_key_is_never_shown() {
    const SECRET: &str = "9fake_key_SeCrEt42";
    let file_cases = [
        format!("[server]\nmax_connections = \"{SECRET}\"\n"),
        format!("[sessions]\nidle_timeout = \"{SECRET}\"\n"),
        format!("listen = \"{SECRET}\"\n"),
        format!("[github]\non_done = \"{SECRET}\"\n"),
        format!("[model]\nprovider = \"{SECRET}\"\n"),
        format!("[model]\nallowed = \"{SECRET}\"\n"),
    ];
    for file in &file_cases {
        let text = error(Some(file), &[]);
        assert!(text.contains("t.toml:"), "{text}");
        assert!(!text.contains("fake_key"), "{file}: {text}");
    }
    for name in [
        "THREADGATE_SERVER__MAX_CONNECTIONS",
        "THREADGATE_SESSIONS__IDLE_TIMEOUT",
        "THREADGATE_LISTEN",
        "THREADGATE_MODEL__ALLOWED",
        "THREADGATE_MCP__WAIT_DEFAULT",
    ] {
        let text = error(None, &[(name, SECRET)]);
        assert!(text.contains(name), "{text}");
        assert!(!text.contains("fake_key"), "{name}: {text}");
    }
}

#[test]
fn the_plain_state_labels_are_read_from_an_inline_table() {
    let file =
        "[plain]\nlabels = { waiting_for_approval = \"lt_w\", handed_to_person = \"lt_h\" }\n";
    let s = load(Some(file), &[]).expect("parse");
    assert_eq!(
        s.plain.labels.configured(),
        [
            ("waiting_for_approval", "lt_w"),
            ("handed_to_person", "lt_h")
        ]
    );
}

#[test]
fn a_provider_table_with_only_api_url_keeps_the_default_secret_name() {
    let file = "[stripe]\napi_url = \"http://127.0.0.1:8420\"\n[github]\napi_url = \"http://127.0.0.1:1\"\n";
    let s = load(Some(file), &[]).expect("parse");
    assert_eq!(s.stripe.api_url, "http://127.0.0.1:8420");
    assert_eq!(s.stripe.key_secret, "stripe_api_key");
    assert_eq!(s.github.api_url, "http://127.0.0.1:1");
    assert_eq!(s.github.key_secret, "github_token");
    let s = load(Some("[github]\nkey_secret = \"gh\"\n"), &[]).expect("parse");
    assert_eq!(s.github.api_url, "https://api.github.com");
    assert_eq!(s.github.key_secret, "gh");
    assert_eq!(s.stripe.key_secret, "stripe_api_key");
    let s = load(None, &[("THREADGATE_GITHUB__KEY_SECRET", "gh2")]).expect("env");
    assert_eq!(
        (s.github.api_url.as_str(), s.github.key_secret.as_str()),
        ("https://api.github.com", "gh2")
    );
}

#[test]
fn the_stripe_signature_limits_and_the_sign_in_back_off_are_read() {
    let s = Settings::default();
    assert_eq!(s.stripe.signature_limits.max_bytes, 1024);
    assert_eq!(s.stripe.signature_limits.max_entries, 8);
    assert_eq!(s.server.sign_in_backoff_max, Duration::from_secs(15));
    let file = "[stripe]\nwebhook_max_signature_bytes = 300\nwebhook_max_signature_entries = 3\n\
                [server]\nsign_in_backoff_max = \"1m\"\n";
    let s = load(Some(file), &[]).expect("parse");
    assert_eq!(s.stripe.signature_limits.max_bytes, 300);
    assert_eq!(s.stripe.signature_limits.max_entries, 3);
    assert_eq!(s.server.sign_in_backoff_max, Duration::from_secs(60));
}

#[test]
fn on_done_is_a_github_key_with_three_values() {
    use crate::session::publish::OnDone;
    let s = load(Some("[github]\napi_url = \"http://127.0.0.1:1\"\n"), &[]).expect("parse");
    assert_eq!(s.github.on_done, OnDone::Draft);
    for (text, value) in [
        ("draft", OnDone::Draft),
        ("ready", OnDone::Ready),
        ("close", OnDone::Close),
    ] {
        let s = load(Some(&format!("[github]\non_done = \"{text}\"\n")), &[]).expect("parse");
        assert_eq!(s.github.on_done, value);
    }
    let text = error(Some("[stripe]\non_done = \"close\"\n"), &[]);
    assert!(text.contains("on_done"), "{text}");
}

#[test]
fn the_master_key_follows_data_dir_unless_set() {
    let file = "data_dir = \"/srv/tg\"\n";
    let s = load(Some(file), &[]).expect("parse");
    assert_eq!(s.master_key_path(), Path::new("/srv/tg/master.key"));
    let s = load(Some(file), &[("THREADGATE_DATA_DIR", "/var/tg")]).expect("env");
    assert_eq!(s.master_key_path(), Path::new("/var/tg/master.key"));
    let file = "data_dir = \"/srv/tg\"\nmaster_key_file = \"/etc/tg.key\"\n";
    let s = load(Some(file), &[("THREADGATE_DATA_DIR", "/var/tg")]).expect("env");
    assert_eq!(s.master_key_path(), Path::new("/etc/tg.key"));
}

#[test]
fn metrics_are_off_unless_a_listen_address_is_set() {
    let s = load(None, &[]).expect("defaults");
    assert_eq!(s.telemetry.metrics_listen, None);
    let file = "[telemetry]\nmetrics_listen = \"127.0.0.1:9464\"\n";
    for name in [
        "THREADGATE_METRICS_LISTEN",
        "THREADGATE_TELEMETRY__METRICS_LISTEN",
    ] {
        let s = load(None, &[(name, "127.0.0.1:9464")]).expect("env");
        assert_eq!(
            s.telemetry.metrics_listen,
            Some(([127, 0, 0, 1], 9464).into())
        );
        for off in ["off", ""] {
            let s = load(Some(file), &[(name, off)]).expect("env");
            assert_eq!(s.telemetry.metrics_listen, None, "{name}={off:?}");
        }
    }
}

#[test]
fn the_secrets_come_only_from_the_environment_and_never_print() {
    let s = load(
        None,
        &[
            ("THREADGATE_PLAIN_SIGNING_SECRET", "hunter2-xyz"),
            ("THREADGATE_MASTER_KEY", "a2V5LXRleHQtc2VjcmV0"),
        ],
    )
    .expect("env");
    let key = s.master_key.as_ref().expect("set from the environment");
    assert_eq!(key.expose_secret(), "a2V5LXRleHQtc2VjcmV0");
    let signing = s.plain.signing_secret.as_ref().expect("set");
    assert_eq!(signing.expose_secret(), "hunter2-xyz");
    let shown = format!("{s:?}");
    assert!(!shown.contains("hunter2-xyz") && !shown.contains("a2V5LXRleHQtc2VjcmV0"));
    let text = error(Some("master_key = \"k\"\n"), &[]);
    assert!(text.contains("master_key: unknown key"), "{text}");
    let text = error(Some("[plain]\nsigning_secret = \"k\"\n"), &[]);
    assert!(text.contains("plain.signing_secret: unknown key"), "{text}");
}

#[test]
fn the_signing_secret_file_is_read_when_no_variable_is_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let secret = dir.path().join("signing");
    std::fs::write(&secret, "from-file\n").expect("write");
    let file = format!(
        "[plain]\nsigning_secret_file = {:?}\n",
        secret.display().to_string()
    );
    let s = load(Some(&file), &[]).expect("parse");
    let read = s.plain.signing_secret.as_ref().expect("read");
    assert_eq!(read.expose_secret(), "from-file");
    let s = load(Some(&file), &[("THREADGATE_PLAIN_SIGNING_SECRET", "env")]).expect("env");
    assert_eq!(
        s.plain
            .signing_secret
            .as_ref()
            .expect("set")
            .expose_secret(),
        "env"
    );
    let missing = "[plain]\nsigning_secret_file = \"/nonexistent/signing\"\n";
    let text = error(Some(missing), &[]);
    assert!(text.contains("plain.signing_secret_file"), "{text}");
}

#[test]
fn the_readme_lists_every_variable() {
    let readme = include_str!("../../README.md");
    for key in env_keys() {
        let names = [key.key.as_str(), key.variable.as_str()];
        for name in names.into_iter().chain(key.aliases.iter().copied()) {
            assert!(readme.contains(&format!("`{name}`")), "README lacks {name}");
        }
    }
}

/// `[review.oidc]` is unset by default, and every key of it has a variable: set with
/// its required keys it is the table a file would give; one required key alone is an
/// error that names the missing key.
#[test]
fn an_unset_table_is_set_whole_from_the_environment() {
    let vars = [
        (
            "THREADGATE_REVIEW__OIDC__ISSUER_URL",
            "https://id.acme.test",
        ),
        ("THREADGATE_REVIEW__OIDC__CLIENT_ID", "threadgate"),
        (
            "THREADGATE_REVIEW__OIDC__ALLOWED_EMAIL_DOMAINS",
            "[\"acme.test\"]",
        ),
        ("THREADGATE_REVIEW__OIDC__LABEL", "Acme ID"),
    ];
    let s = load(None, &vars).unwrap_or_else(|e| panic!("{e}"));
    let oidc = s.review.oidc.expect("the table is set");
    assert_eq!(oidc.issuer_url, "https://id.acme.test");
    assert_eq!(oidc.client_id, "threadgate");
    assert_eq!(oidc.allowed_email_domains, ["acme.test"]);
    assert_eq!(oidc.label, "Acme ID");
    assert_eq!(oidc.name_claim, "email", "the others keep their defaults");

    let text = error(
        None,
        &[(
            "THREADGATE_REVIEW__OIDC__ISSUER_URL",
            "https://id.acme.test",
        )],
    );
    assert!(text.contains("client_id"), "{text}");
    assert!(load(None, &[]).expect("defaults").review.oidc.is_none());
}

/// The `threadgate.toml` of `deploy/kubernetes/configmap.yaml` loads as it is, and
/// selects the Kubernetes backend.
#[test]
fn the_kubernetes_configmap_holds_a_valid_settings_file() {
    let yaml = include_str!("../../deploy/kubernetes/configmap.yaml");
    let toml = yaml
        .split("\n---\n")
        .filter_map(|doc| serde_norway::from_str::<serde_json::Value>(doc).ok())
        .find_map(|doc| doc["data"]["threadgate.toml"].as_str().map(str::to_string))
        .expect("threadgate.toml in the ConfigMap");
    let settings = load(Some(&toml), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        settings.sandbox.backend,
        crate::sandbox::k8s::Backend::Kubernetes
    );
    assert_eq!(
        settings.sandbox.kubernetes.runtime_class.as_deref(),
        Some("gvisor")
    );
    assert_eq!(
        settings.relay.listen,
        Some("0.0.0.0:8443".parse().expect("addr"))
    );
}

/// `[store] url` selects Postgres, from the file, `THREADGATE_STORE__URL` or
/// `THREADGATE_DATABASE_URL`; unset it is SQLite; the settings' Debug never shows the
/// URL's password.
#[test]
fn the_store_url_is_read_from_the_file_or_the_environment_and_never_printed_whole() {
    let url = "postgres://tg:fake_key_pw@db.test:5432/tg";
    assert_eq!(
        load(None, &[]).expect("defaults").store.postgres_url(),
        None
    );
    let file = format!("[store]\nurl = {url:?}\n");
    let from_file = load(Some(&file), &[]).expect("file");
    assert_eq!(from_file.store.postgres_url(), Some(url));
    for name in ["THREADGATE_DATABASE_URL", "THREADGATE_STORE__URL"] {
        let s = load(None, &[(name, url)]).expect("env");
        assert_eq!(s.store.postgres_url(), Some(url), "{name}");
        let shown = format!("{s:?}");
        assert!(!shown.contains("fake_key_pw"), "{shown}");
        assert!(
            shown.contains("postgres://tg:***@db.test:5432/tg"),
            "{shown}"
        );
    }
}

/// The Deployment's `THREADGATE_RELAY__ADVERTISE=$(POD_IP)`: a bare IPv4 or IPv6
/// address, written out with the listener's port (and brackets).
#[test]
fn a_bare_pod_ip_is_advertised_with_the_listeners_port() {
    for (pod_ip, advertised) in [("fd00::1", "[fd00::1]:8443"), ("10.0.3.7", "10.0.3.7:8443")] {
        let s = load(
            Some("[relay]\nlisten = \"0.0.0.0:8443\"\n"),
            &[("THREADGATE_RELAY__ADVERTISE", pod_ip)],
        )
        .unwrap_or_else(|e| panic!("{pod_ip}: {e}"));
        let bound = s.relay.listen.expect("listen");
        let addr = s.relay.advertised(bound).expect("advertised");
        assert_eq!(addr.to_string(), advertised);
    }
}

#[test]
fn relay_workspace_caps_from_the_environment_keep_the_other_defaults() {
    let vars = [
        ("THREADGATE_RELAY__WORKSPACE__MAX_ENTRIES", "4"),
        ("THREADGATE_RELAY__WORKSPACE__SYNC_EVERY", "0s"),
    ]
    .map(|(k, v)| (k.into(), v.into()));
    let settings = Settings::load_with_env(None, vars).unwrap();
    assert_eq!(settings.relay.workspace.sync_period(), None);
    let limits = settings.relay.workspace.limits();
    assert_eq!(limits.max_entries, 4);
    let defaults = crate::workspace::BundleLimits::default();
    assert_eq!(
        crate::workspace::BundleLimits {
            max_entries: defaults.max_entries,
            ..limits
        },
        defaults,
        "the other caps keep their defaults"
    );
}
