//! Helpers of the review page tests: reviewers with passwords, a signed-in HTTP client
//! (cookies handled by hand, so the tests see every attribute), the note's approval
//! link, and a headless Chromium driven over WebDriver (Debian's `chromium` and
//! `chromedriver`, installed by `scripts/browser-up.sh`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use threadgate::reviewers;
use threadgate::reviewers::hasher::Hasher;
use threadgate::secrets::SecretString;

use crate::support::app::TestApp;
use crate::support::world::{PUBLIC_URL, World};

/// Every test reviewer's password.
pub(crate) const PASSWORD: &str = "correct horse battery staple";

/// Adds reviewer `name` with [`PASSWORD`].
pub(crate) async fn add_reviewer(app: &TestApp, name: &str) {
    reviewers::add(&app.db, name).await.expect("add reviewer");
    // A pool of its own, so the app's counters count only the app's hashes.
    reviewers::set_password(
        &app.db,
        &Hasher::new(1, 1),
        name,
        SecretString::from(PASSWORD),
    )
    .await
    .expect("set password");
}

/// The approval link of the held-call note for `execution_id` on `thread_id`, pointed
/// at the app's address.
pub(crate) async fn note_link(
    world: &World,
    app: &TestApp,
    thread_id: &str,
    execution_id: &str,
) -> String {
    let wanted = format!("{PUBLIC_URL}/approvals/{execution_id}");
    world
        .note_containing(thread_id, &wanted, "the held-call note")
        .await;
    wanted.replace(PUBLIC_URL, &format!("http://{}", app.addr))
}

/// The value of `name="csrf"` in a page.
pub(crate) fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..].split('"').next().unwrap_or_default().to_owned()
}

/// The `name=value` of a Set-Cookie named `name`, and the whole header.
pub(crate) fn set_cookie(resp: &reqwest::Response, name: &str) -> Option<(String, String)> {
    resp.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| {
            (
                v.split(';').next().unwrap_or_default().to_owned(),
                v.to_owned(),
            )
        })
}

/// A reviewer signed in over plain HTTP.
pub(crate) struct Web {
    pub base: String,
    pub http: reqwest::Client,
    pub cookie: String,
    pub csrf: String,
}

/// A client that does not follow redirects (the tests look at each answer).
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Posts the sign-in form as a browser would; returns the response.
pub(crate) async fn post_login(app: &TestApp, name: &str, password: &str) -> reqwest::Response {
    let (base, http) = (format!("http://{}", app.addr), client());
    let form = http
        .get(format!("{base}/login"))
        .send()
        .await
        .expect("login form");
    let (login_cookie, _) = set_cookie(&form, "tg_login").expect("login cookie");
    let csrf = csrf_of(&form.text().await.expect("body"));
    http.post(format!("{base}/login"))
        .header("Cookie", login_cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("name", name),
            ("password", password),
            ("next", "/approvals"),
        ])
        .send()
        .await
        .expect("login")
}

impl Web {
    /// Signs `name` in with [`PASSWORD`].
    pub(crate) async fn sign_in(app: &TestApp, name: &str) -> Web {
        let resp = post_login(app, name, PASSWORD).await;
        assert_eq!(resp.status().as_u16(), 303, "sign-in redirects");
        let (cookie, _) = set_cookie(&resp, "tg_review").expect("session cookie");
        let base = format!("http://{}", app.addr);
        let http = client();
        let page = http
            .get(format!("{base}/approvals"))
            .header("Cookie", &cookie)
            .send()
            .await
            .expect("queue");
        let csrf = csrf_of(&page.text().await.expect("body"));
        Web {
            base,
            http,
            cookie,
            csrf,
        }
    }

    /// `GET path` with the session; (status, body).
    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("Cookie", &self.cookie)
            .send()
            .await
            .expect("get");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }

    /// A form post with the session; (status, body).
    pub(crate) async fn post(&self, path: &str, fields: &[(&str, &str)]) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Cookie", &self.cookie)
            .form(fields)
            .send()
            .await
            .expect("post");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }

    /// Approves `id` with its numeric argument `field` lowered to `value` (the page's
    /// narrowing form); (status, body).
    pub(crate) async fn approve_lower(&self, id: &str, field: &str, value: &str) -> (u16, String) {
        let lowered = format!("lower.{field}");
        self.post(
            &format!("/approvals/{id}/decide"),
            &[
                ("csrf", &self.csrf),
                ("decision", "approve"),
                (&lowered, value),
            ],
        )
        .await
    }
}

// ---------------------------------------------------------------------------------
// The browser

/// A chromedriver process and one browser session on it; both end on [`Browser::close`]
/// (or, without waiting, on drop).
pub(crate) struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Browser {
    /// Starts chromedriver and a fresh headless Chromium profile at desktop width.
    pub(crate) async fn start() -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (scripts/browser-up.sh installs it)");
        let url = format!("http://127.0.0.1:{port}");
        // Ready when its status endpoint answers.
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("{url}/status")).await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::TempDir::new().expect("profile dir");
        let args = vec![
            "--headless".to_owned(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1280,900".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": "/usr/bin/chromium", "args": args}),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a browser session");
        Browser {
            client,
            driver,
            _profile: profile,
        }
    }

    /// Navigates to `url` and waits until the page has a `main` element.
    pub(crate) async fn open(&self, url: &str) {
        self.client.goto(url).await.expect("goto");
    }

    /// Waits for the element at `css`.
    pub(crate) async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    /// The text of the element at `css`.
    pub(crate) async fn text(&self, css: &str) -> String {
        self.wait_for(css).await.text().await.expect("text")
    }

    /// Signs in on the sign-in form the browser is on (or is being sent to).
    pub(crate) async fn sign_in(&self, name: &str, password: &str) {
        self.wait_for("input[name=name]")
            .await
            .send_keys(name)
            .await
            .expect("name");
        self.wait_for("input[name=password]")
            .await
            .send_keys(password)
            .await
            .expect("password");
        self.submit("form[action='/login'] button").await;
    }

    /// Clicks the button at `css` and waits until the browser has left the page (the
    /// old document's root element is gone), so nothing of the old page is read after.
    pub(crate) async fn submit(&self, css: &str) {
        let old = self.wait_for("html").await;
        self.wait_for(css).await.click().await.expect("click");
        let deadline = Instant::now() + Duration::from_secs(20);
        while old.tag_name().await.is_ok() {
            assert!(
                Instant::now() < deadline,
                "clicking {css} did not load a page"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs a script in the page (WebDriver scripts are not subject to the page's CSP).
    pub(crate) async fn script(&self, js: &str) -> Value {
        self.client.execute(js, vec![]).await.expect("script")
    }

    /// Saves a PNG screenshot at `width` x `height` as `name` under the test output.
    pub(crate) async fn screenshot(&self, name: &str, width: u32, height: u32) -> PathBuf {
        self.client
            .set_window_size(width, height)
            .await
            .expect("resize");
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("review-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Ends the browser session and chromedriver.
    pub(crate) async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
