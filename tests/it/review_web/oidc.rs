//! Sign-in through the team's OpenID provider, against a real certified one: npm's
//! `oidc-provider` (installed by `scripts/test.sh` into `.oidc-provider`, run by
//! `scripts/oidc-provider.mjs` on a loopback port), through its own login and consent
//! pages in Chromium; and, over HTTP, the sealed sign-in cookie's checks (issue 19:
//! nothing kept on the server, so a flood of starts locks no one out and another
//! instance finishes a sign-in) and the checks at start.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use futures::StreamExt as _;
use serde_json::json;
use threadgate::app::{Application, Overrides};
use threadgate::review::oidc::OidcSettings;

use super::web::{Browser, client, set_cookie};
use crate::support::app::TestApp;
use crate::support::plain::repo_root;
use crate::support::world::World;

const CLIENT_ID: &str = "threadgate-review";
const CLIENT_SECRET: &str = "oidc-client-secret-for-tests-0c5e1a9f";

/// The provider process; it stops when its standard input closes (on drop).
struct Provider {
    issuer: String,
    child: Child,
    _stdin: ChildStdin,
    /// Kept open: a write to a closed pipe would end the provider.
    _stdout: BufReader<ChildStdout>,
}

impl Provider {
    /// Starts the provider for a client whose redirect URL is `redirect_uri`, knowing
    /// alice (verified, at the allowed domain) and mallory (verified, elsewhere).
    fn start(redirect_uri: &str) -> Provider {
        Provider::start_on(redirect_uri, None)
    }

    /// [`Provider::start`] on `port` (a fresh key each start: a restart on the same
    /// port is the same issuer having rotated its keys).
    fn start_on(redirect_uri: &str, port: Option<u16>) -> Provider {
        let dir = std::env::var("OIDC_PROVIDER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| repo_root().join(".oidc-provider"));
        assert!(
            dir.join("node_modules/oidc-provider").is_dir(),
            "oidc-provider is not installed in {} (scripts/test.sh installs it)",
            dir.display()
        );
        let config = json!({
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "redirect_uri": redirect_uri,
            "accounts": {
                "alice": {"email": "alice@acme.test", "email_verified": true, "name": "Alice"},
                "mallory": {"email": "mallory@elsewhere.test", "email_verified": true},
            },
            "port": port,
        });
        let mut child = Command::new("node")
            .arg(repo_root().join("scripts/oidc-provider.mjs"))
            .arg(config.to_string())
            .env("OIDC_PROVIDER_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs scripts/oidc-provider.mjs");
        let stdin = child.stdin.take().expect("stdin");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        stdout
            .read_line(&mut line)
            .expect("the provider says it is ready");
        let issuer = line
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("the provider did not start: {line:?}"))
            .to_owned();
        Provider {
            issuer,
            child,
            _stdin: stdin,
            _stdout: stdout,
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A world whose app listens where the provider sends browsers back, signing in at a
/// fresh provider that allows verified emails at `acme.test`.
async fn world_with_provider(tune: impl FnOnce(&mut OidcSettings)) -> (World, Provider) {
    let mut world = World::new().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let provider = Provider::start(&format!("{base}/login/oidc/callback"));
    world.settings.listen = ([127, 0, 0, 1], port).into();
    world.settings.public_url = base;
    let mut oidc = OidcSettings::new(&provider.issuer, CLIENT_ID);
    oidc.allowed_email_domains = vec!["acme.test".into()];
    oidc.label = "Acme ID".into();
    tune(&mut oidc);
    world.settings.review.oidc = Some(oidc);
    world
        .store_secret("oidc_client_secret", CLIENT_SECRET)
        .await;
    (world, provider)
}

/// Signs in at the provider's own pages as `login` (any password) and consents.
async fn sign_in_at_provider(b: &Browser, login: &str) {
    b.submit("a.button.primary").await;
    sign_in_at_provider_pages(b, login).await;
}

/// The provider's login and consent pages, once the browser is on them.
async fn sign_in_at_provider_pages(b: &Browser, login: &str) {
    b.wait_for("input[name=login]")
        .await
        .send_keys(login)
        .await
        .expect("login");
    b.wait_for("input[name=password]")
        .await
        .send_keys("any password the dev pages take")
        .await
        .expect("password");
    b.submit("button[type=submit]").await;
    // The consent page.
    b.submit("button[type=submit]").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_signs_in_at_the_provider_and_approves_a_held_call_in_a_browser() {
    let (world, _provider) = world_with_provider(|_| {}).await;
    let app = world.start().await;
    let ada = world
        .customer_session(&app, "ada@example.com", &[5000])
        .await;
    let id = ada.session.hold_refund(&ada.charges[0], 700).await;

    let b = Browser::start().await;
    b.open(&format!("{}/approvals/{id}", world.settings.public_url))
        .await;
    assert!(
        b.text("a.button.primary")
            .await
            .contains("Sign in with Acme ID")
    );
    sign_in_at_provider(&b, "alice").await;

    // Back on the approval the link named, signed in as the configured claim.
    b.wait_for("form[action$='/decide']").await;
    let url = b.client.current_url().await.expect("url");
    assert_eq!(url.path(), format!("/approvals/{id}"));
    assert!(b.text("header nav").await.contains("alice@acme.test"));
    b.submit("button[value=approve]").await;
    assert!(b.text("p.banner").await.starts_with("Approved."));

    let done = ada.session.wait(&id, 30).await;
    assert_eq!(done["status"], "ok", "{done}");
    // The audit names the reviewer by the configured claim.
    let by: Vec<(String, Option<String>)> = app
        .audit_rows()
        .await
        .into_iter()
        .filter(|r| r.execution_id.as_deref() == Some(id.as_str()) && r.reviewer.is_some())
        .map(|r| (r.event, r.reviewer))
        .collect();
    assert!(!by.is_empty(), "no audit row names a reviewer");
    assert!(
        by.iter()
            .all(|(_, r)| r.as_deref() == Some("alice@acme.test")),
        "{by:?}"
    );
    b.close().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_rotated_its_keys_is_read_again_in_a_browser() {
    let (world, provider) = world_with_provider(|_| {}).await;
    let app = world.start().await;
    // The same issuer comes back signing with a key the app has never seen.
    let port: u16 = provider
        .issuer
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the issuer's port");
    drop(provider);
    let redirect = format!("{}/login/oidc/callback", world.settings.public_url);
    let _rotated = Provider::start_on(&redirect, Some(port));

    let b = Browser::start().await;
    b.open(&format!("{}/approvals", world.settings.public_url))
        .await;
    sign_in_at_provider(&b, "alice").await;
    assert!(b.text("header nav").await.contains("alice@acme.test"));
    b.close().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_the_provider_knows_but_the_team_did_not_allow_or_who_cancels_is_refused_in_a_browser()
 {
    let (world, _provider) = world_with_provider(|_| {}).await;
    let app = world.start().await;
    let b = Browser::start().await;
    // Cancelled on the provider's login page: the provider's error is shown.
    b.open(&format!("{}/approvals", world.settings.public_url))
        .await;
    b.submit("a.button.primary").await;
    b.submit(".login-help a").await;
    assert_eq!(b.text("h1").await, "Not signed in");
    let told = b.text("main").await;
    assert!(
        told.contains("did not sign you in (access_denied)"),
        "{told}"
    );

    b.open(&format!("{}/approvals", world.settings.public_url))
        .await;
    sign_in_at_provider(&b, "mallory").await;
    assert_eq!(b.text("h1").await, "Not allowed");
    let told = b.text("main").await;
    assert!(
        told.contains("mallory@elsewhere.test") && told.contains("has not allowed"),
        "{told}"
    );
    // Not signed in: the queue still asks for a sign-in, and no reviewer was made.
    b.open(&format!("{}/approvals", world.settings.public_url))
        .await;
    b.wait_for("input[name=password]").await;
    let names: Vec<String> = threadgate::reviewers::list(&app.db)
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert!(names.is_empty(), "{names:?}");
    b.close().await;
    app.stop().await;
}

/// `GET /login/oidc` on `addr`: the status, the provider's authorization URL's
/// `state`, and the browser's sealed cookie (`tg_oidc=...`).
async fn begin_at(addr: std::net::SocketAddr) -> (u16, String, String) {
    let resp = client()
        .get(format!("http://{addr}/login/oidc?next=/approvals"))
        .send()
        .await
        .expect("begin");
    let status = resp.status().as_u16();
    let Some((cookie, header)) = set_cookie(&resp, "tg_oidc") else {
        return (status, String::new(), String::new());
    };
    assert!(
        header.contains("HttpOnly")
            && header.contains("SameSite=Lax")
            && header.contains("Path=/login/oidc/callback;")
            && header.contains("Max-Age=600"),
        "{header}"
    );
    assert!(!header.contains("Secure"), "an http public URL: {header}");
    let location = resp.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    let url = reqwest::Url::parse(&location).expect("an absolute URL");
    let pairs: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
    assert_eq!(pairs["code_challenge_method"], "S256", "{location}");
    assert!(pairs.contains_key("nonce"), "{location}");
    (status, pairs["state"].clone(), cookie)
}

async fn begin(app: &TestApp) -> (u16, String, String) {
    begin_at(app.addr).await
}

/// The provider's answer brought back with `cookie` (`""`: none): the status and the
/// page.
async fn callback(app: &TestApp, state: &str, cookie: &str) -> (u16, String) {
    let mut request = client().get(format!(
        "http://{}/login/oidc/callback?code=made-up&state={state}",
        app.addr
    ));
    if !cookie.is_empty() {
        request = request.header("Cookie", cookie);
    }
    let resp = request.send().await.expect("callback");
    (
        resp.status().as_u16(),
        resp.text().await.unwrap_or_default(),
    )
}

/// Issue 19: a sign-in is sealed into the browser's cookie; every cookie that is not
/// this browser's own, unexpired, for the state the provider answered, is refused with
/// a page saying why, and a replay exchanges nothing.
#[tokio::test]
async fn a_missing_forged_tampered_expired_or_other_browsers_sign_in_is_refused_with_a_page() {
    let (world, _provider) = world_with_provider(|_| {}).await;
    let (app, clock) = world.start_with_clock().await;
    let refused = |(status, page): (u16, String), said: &str| {
        assert_eq!(status, 400, "{page}");
        assert!(page.contains("Not signed in"), "{page}");
        assert!(
            page.contains(said) && page.contains("Sign in again"),
            "{page}"
        );
    };

    let (status, state, cookie) = begin(&app).await;
    assert_eq!(status, 303);
    // No cookie: cookies off, or the answer brought to another browser.
    refused(
        callback(&app, &state, "").await,
        "has no sign-in in progress here",
    );
    // A state the provider never issued for this cookie.
    refused(
        callback(&app, "forged-state", &cookie).await,
        "started in another browser, or the identity provider answered another one",
    );
    // Another browser's cookie with this browser's state.
    let (_, _, other_cookie) = begin(&app).await;
    refused(
        callback(&app, &state, &other_cookie).await,
        "started in another browser",
    );
    // One character of the sealed value changed, and a value never sealed.
    let value = cookie.trim_start_matches("tg_oidc=");
    let mut bytes = value.as_bytes().to_vec();
    let i = bytes.len() / 2;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let tampered = format!("tg_oidc={}", String::from_utf8(bytes).expect("ascii"));
    for bad in [tampered.as_str(), "tg_oidc=not-sealed-at-all"] {
        refused(
            callback(&app, &state, bad).await,
            "not one this site issued",
        );
    }
    // The real cookie and state with a made-up code: the provider refuses the code, and
    // the same again is refused the same way (the cookie alone signs in no one).
    for _ in 0..2 {
        let (status, page) = callback(&app, &state, &cookie).await;
        assert_eq!(status, 401, "{page}");
        assert!(page.contains("did not verify"), "{page}");
    }
    // An answer naming another issuer (a mix-up) is refused.
    let resp = client()
        .get(format!(
            "http://{}/login/oidc/callback?code=c&state={state}&iss=http%3A%2F%2Fevil.test",
            app.addr
        ))
        .header("Cookie", &cookie)
        .send()
        .await
        .expect("callback");
    assert_eq!(resp.status().as_u16(), 400);
    let page = resp.text().await.unwrap_or_default();
    assert!(page.contains("another identity provider"), "{page}");
    // Ten minutes later the same cookie and state are too late.
    clock.advance(std::time::Duration::from_secs(600));
    refused(
        callback(&app, &state, &cookie).await,
        "took longer than ten minutes",
    );
    // Every refusal clears the cookie.
    let resp = client()
        .get(format!(
            "http://{}/login/oidc/callback?code=c&state={state}",
            app.addr
        ))
        .header("Cookie", &cookie)
        .send()
        .await
        .expect("callback");
    let (cleared, header) = set_cookie(&resp, "tg_oidc").expect("a cleared cookie");
    assert_eq!(cleared, "tg_oidc=", "{header}");
    assert!(header.contains("Max-Age=0"), "{header}");
    app.stop().await;
}

/// Issue 19: behind a reverse proxy every browser has one address; a thousand
/// anonymous starts from it (which used to fill its cap of 20 and answer 429 for ten
/// minutes) cost the server nothing, and the next real sign-in goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_anonymous_starts_from_one_address_lock_no_one_out() {
    let (world, _provider) = world_with_provider(|_| {}).await;
    let app = world.start().await;
    let http = client();
    let url = format!("http://{}/login/oidc?next=/approvals", app.addr);
    let starts = futures::stream::iter(0..1_000)
        .map(|_| async {
            let resp = http.get(&url).send().await.expect("begin");
            let sealed = set_cookie(&resp, "tg_oidc").is_some();
            (resp.status().as_u16(), sealed)
        })
        .buffer_unordered(16);
    let answers: Vec<(u16, bool)> = starts.collect().await;
    assert_eq!(answers.len(), 1_000);
    assert!(
        answers.iter().all(|a| *a == (303, true)),
        "every start is sent on with its cookie"
    );

    let b = Browser::start().await;
    b.open(&format!("{}/approvals", world.settings.public_url))
        .await;
    sign_in_at_provider(&b, "alice").await;
    assert!(b.text("header nav").await.contains("alice@acme.test"));
    b.close().await;
    app.stop().await;
}

/// Issue 19: a sign-in started on one instance finishes on another sharing the master
/// key (here the same data directory, so the same key file and database), as behind a
/// load balancer: the browser starts at instance B, and the provider sends it back to
/// the public URL, which is instance A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_started_on_one_instance_finishes_on_another() {
    let (world, _provider) = world_with_provider(|_| {}).await;
    let a = world.start().await;
    // Another instance: its own data directory, the same database and master key.
    let b_dir = tempfile::tempdir().expect("tempdir");
    let mut b_settings = world.settings.clone();
    b_settings.listen = ([127, 0, 0, 1], 0).into();
    b_settings.database_file = world.settings.database_path();
    b_settings.master_key_file = world.settings.master_key_path();
    b_settings.data_dir = b_dir.path().join("data");
    let b = crate::support::app::spawn_app(
        b_settings,
        Overrides {
            sandbox: Some(world.sandbox.clone()),
            clock: None,
        },
    )
    .await;
    assert_ne!(a.addr, b.addr);
    assert_eq!(
        world.settings.public_url,
        format!("http://{}", a.addr),
        "the provider sends browsers back to instance a"
    );

    // Over HTTP: b's cookie opens on a (the made-up code is then refused by the
    // provider, past every check of the cookie).
    let (_, state, cookie) = begin_at(b.addr).await;
    let (status, page) = callback(&a, &state, &cookie).await;
    assert_eq!(status, 401, "{page}");
    assert!(page.contains("did not verify"), "{page}");

    // In a browser: started at b, finished at a.
    let br = Browser::start().await;
    br.open(&format!("http://{}/login/oidc?next=/approvals", b.addr))
        .await;
    sign_in_at_provider_pages(&br, "alice").await;
    assert!(br.text("header nav").await.contains("alice@acme.test"));
    let url = br.client.current_url().await.expect("url");
    assert_eq!(url.port(), Some(a.addr.port()), "finished on instance a");
    br.close().await;
    b.stop().await;
    a.stop().await;
}

#[tokio::test]
async fn a_wrong_oidc_setting_stops_the_start_naming_its_key() {
    let (world, provider) = world_with_provider(|_| {}).await;
    let build = |tune: &dyn Fn(&mut OidcSettings)| {
        let mut settings = world.settings.clone();
        settings.listen = ([127, 0, 0, 1], 0).into();
        if let Some(oidc) = settings.review.oidc.as_mut() {
            tune(oidc);
        }
        let overrides = Overrides {
            sandbox: Some(world.sandbox.clone()),
            clock: None,
        };
        async move {
            match Application::build(settings, overrides).await {
                Ok(_) => String::new(),
                Err(e) => format!("{e:#}"),
            }
        }
    };
    let err = build(&|o| o.allowed_email_domains.clear()).await;
    assert!(
        err.contains("review.oidc") && err.contains("allow-list"),
        "{err}"
    );
    let err = build(&|o| o.client_secret_name = "not_stored".into()).await;
    assert!(err.contains("review.oidc.client_secret_name"), "{err}");
    let err = build(&|o| o.issuer_url = format!("http://127.0.0.1:{}", free_port())).await;
    assert!(err.contains("review.oidc.issuer_url"), "{err}");
    let err = build(&|o| o.issuer_url = format!("{}/elsewhere", provider.issuer)).await;
    assert!(err.contains("review.oidc.issuer_url"), "{err}");
    assert!(!err.contains(CLIENT_SECRET), "{err}");
}
