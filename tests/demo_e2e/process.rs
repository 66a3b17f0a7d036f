//! The demo as a process of its own: this test binary started again on its
//! `demo_process` entry, its stdout read line by line on a thread (every line kept for
//! the assertions), SIGINT sent as a terminal's Ctrl-C would; and the reviewer's
//! approval over HTTP as a browser makes it (the sign-in form with its CSRF field and
//! cookie, then the approval's form).

use std::io::BufRead as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running demo process. Dropped while it runs, it gets SIGINT (so it cleans up) and
/// is killed if it has not stopped within a minute.
pub(crate) struct DemoProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

/// Everything a demo printed.
pub(crate) struct Transcript(Vec<String>);

impl DemoProcess {
    /// Starts the demo with `args` (split at whitespace) in `env_name`.
    pub(crate) fn start(env_name: &str, args: &str) -> DemoProcess {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "demo_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(env_name, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the demo process starts");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        DemoProcess {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The rest of the first line (from now on) that starts with `prefix`, trimmed;
    /// panics with everything printed when none comes within `timeout`.
    pub(crate) fn line_after(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    // What the demo prints when a thread goes wrong: fail now, not at
                    // the deadline.
                    assert!(
                        !line.contains("did not settle") && !line.starts_with("(no held refund"),
                        "the demo printed {line:?}:\n{}",
                        self.seen.join("\n")
                    );
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(e) => panic!(
                    "no line {prefix:?} ({e:?}); the demo printed:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Sends SIGINT, as Ctrl-C in a terminal does.
    pub(crate) fn interrupt(&self) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -INT {}", self.child.id());
    }

    /// Waits for the process to exit, reading what it prints; panics after `timeout`.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // The reader thread ends at the pipe's end: take its last lines.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not exit within {timeout:?}; it printed:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What it printed so far.
    pub(crate) fn transcript(&self) -> Transcript {
        Transcript(self.seen.clone())
    }
}

impl Drop for DemoProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        self.interrupt();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Transcript {
    /// Every line.
    pub(crate) fn lines(&self) -> &[String] {
        &self.0
    }

    /// Every line, joined.
    pub(crate) fn text(&self) -> String {
        self.0.join("\n")
    }

    /// The summary of the thread titled `title`: from its `== TITLE: thread ID` line to
    /// the next blank line.
    pub(crate) fn section(&self, title: &str) -> Option<String> {
        let head = format!("== {title}: thread ");
        let start = self.0.iter().position(|l| l.starts_with(&head))?;
        let lines: Vec<&str> = self.0[start..]
            .iter()
            .take_while(|l| !l.is_empty())
            .map(String::as_str)
            .collect();
        Some(lines.join("\n"))
    }

    /// The thread id of the thread titled `title`.
    pub(crate) fn thread_of(&self, title: &str) -> String {
        let head = format!("== {title}: thread ");
        self.0
            .iter()
            .find_map(|l| l.strip_prefix(&head))
            .unwrap_or_else(|| panic!("no thread {title}"))
            .trim()
            .to_owned()
    }
}

/// The value of `name="csrf"` in a page.
fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..].split('"').next().unwrap_or_default().to_owned()
}

/// The `name=value` of the Set-Cookie named `name`.
fn cookie(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .and_then(|v| v.split(';').next())
        .unwrap_or_else(|| panic!("no cookie {name}"))
        .to_owned()
}

/// Signs in at `base` as `name` with `password` and approves held call `id` through
/// the review page's forms, as a browser does.
pub(crate) fn approve(base: &str, name: &str, password: &str, id: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let form = http
            .get(format!("{base}/login"))
            .send()
            .await
            .expect("login form");
        let login_cookie = cookie(&form, "tg_login");
        let csrf = csrf_of(&form.text().await.expect("body"));
        let signed_in = http
            .post(format!("{base}/login"))
            .header("Cookie", login_cookie)
            .form(&[
                ("csrf", csrf.as_str()),
                ("name", name),
                ("password", password),
                ("next", "/approvals"),
            ])
            .send()
            .await
            .expect("sign in");
        assert_eq!(signed_in.status().as_u16(), 303, "the sign-in is accepted");
        let session = cookie(&signed_in, "tg_review");
        let page = http
            .get(format!("{base}/approvals/{id}"))
            .header("Cookie", &session)
            .send()
            .await
            .expect("the approval page");
        assert_eq!(page.status().as_u16(), 200);
        let page = page.text().await.expect("body");
        assert!(page.contains(&format!("/approvals/{id}/decide")), "{page}");
        let decided = http
            .post(format!("{base}/approvals/{id}/decide"))
            .header("Cookie", &session)
            .form(&[("csrf", csrf_of(&page).as_str()), ("decision", "approve")])
            .send()
            .await
            .expect("approve");
        let status = decided.status().as_u16();
        let body = decided.text().await.unwrap_or_default();
        assert!(
            matches!(status, 200 | 303),
            "approve answered {status}: {body}"
        );
    });
}
