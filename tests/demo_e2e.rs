//! The newcomer's first run (`scripts/demo.sh`), end to end against real Docker,
//! localstripe and the sandbox image: the demo's own flow (`examples/demo/`, mounted
//! here) runs in a process of its own (this test binary started again on its
//! `demo_process` entry), so Ctrl-C is a real SIGINT and its cleanup is checked from
//! outside.
//!
//! - `--no-wait`: four threads, the goodwill refund held with its whole note, the
//!   injection's $5,000 refund blocked, the duplicate refunded, the bug report's commits (repro script and findings) and
//!   its draft pull request; the process exits and leaves nothing behind.
//! - The default: the review page's credentials are printed; a reviewer signs in over
//!   HTTP (login form, CSRF), approves the held refund, the demo prints that it ran and
//!   the agent's reply; SIGINT stops it and nothing is left: no container with the
//!   demo's instance label, no temporary directory, no localstripe.
//!
//! Timeouts are generous (a loaded two-core machine starts containers slowly); nothing
//! asserts on time.

#![expect(
    clippy::indexing_slicing,
    reason = "test code: an index out of range is a failed test"
)]
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

#[path = "it/support/mod.rs"]
pub mod support;

#[path = "../examples/demo/first_call.rs"]
mod first_call;
#[path = "../examples/demo/flow.rs"]
mod flow;
#[path = "../examples/demo/report.rs"]
mod report;
#[path = "../examples/demo/review.rs"]
mod review;

#[path = "demo_e2e/process.rs"]
mod process;

use std::time::Duration;

use process::{DemoProcess, Transcript};

/// The environment variable that makes [`demo_process`] run the demo with its value's
/// arguments.
const DEMO_ARGS: &str = "THREADGATE_DEMO_E2E_ARGS";

/// The whole demo, with generous room for a busy machine.
const WHOLE_RUN: Duration = Duration::from_secs(20 * 60);

/// One demo at a time: each starts a dozen containers' worth of work.
static ONE_DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The demo's process: run by the tests below (with [`DEMO_ARGS`] set), never alone.
#[test]
#[ignore = "the demo's own process, started by the tests of this file"]
fn demo_process() {
    let Ok(args) = std::env::var(DEMO_ARGS) else {
        return;
    };
    let args = args.split_whitespace().map(str::to_owned).collect();
    std::process::exit(flow::main_with_args(args));
}

#[test]
fn the_options_are_read_and_the_old_keep_flag_is_refused_by_name() {
    let parse = |a: &[&str]| flow::parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(parse(&[]), Ok(flow::Mode::Demo { wait: true }));
    assert_eq!(parse(&["--no-wait"]), Ok(flow::Mode::Demo { wait: false }));
    assert_eq!(parse(&["--first-call", "3"]), Ok(flow::Mode::FirstCall(3)));
    for (args, error) in [
        (&["--keep"][..], "--keep is gone"),
        (&["--first-call"][..], "--first-call needs a number"),
        (
            &["--first-call", "0"][..],
            "--first-call 0: not a positive number",
        ),
        (&["--wait"][..], "unknown argument --wait"),
    ] {
        let got = parse(args).unwrap_err();
        assert!(got.contains(error), "{args:?}: {got}");
    }
    assert!(flow::USAGE.contains("--no-wait") && flow::USAGE.contains("--keep is gone"));
}

#[test]
fn the_demo_without_waiting_shows_every_thread_its_notes_commits_and_pull_request() {
    if support::docker::skip() {
        return;
    }
    let _one = ONE_DEMO.lock().unwrap_or_else(|p| p.into_inner());
    let mut demo = DemoProcess::start(DEMO_ARGS, "--no-wait");
    let status = demo.wait_exit(WHOLE_RUN);
    let out = demo.transcript();
    assert!(
        status.success(),
        "the demo failed ({status}):\n{}",
        out.text()
    );

    let titles = [
        "charged twice",
        "goodwill refund",
        "prompt injection",
        "bug report",
    ];
    for title in titles {
        assert!(
            out.section(title).is_some(),
            "no summary of {title}:\n{}",
            out.text()
        );
    }
    assert!(!out.text().contains("did not settle"), "{}", out.text());

    // The goodwill refund is held, and its note is on the thread whole: the approval
    // link and every line of the diagnosis, not only the first.
    let goodwill = out.section("goodwill refund").unwrap();
    let link = goodwill
        .lines()
        .find_map(|l| l.split("HELD for a person: ").nth(1))
        .unwrap_or_else(|| panic!("no held call:\n{goodwill}"))
        .trim()
        .to_owned();
    assert!(goodwill.contains("stripe.create_refund"), "{goodwill}");
    let note = quoted(&goodwill);
    assert!(note.len() >= 3, "the whole note, not one line:\n{goodwill}");
    let note = note.join("\n");
    assert!(note.contains(&link), "the note links its approval:\n{note}");
    for words in ["goodwill refund", "A person should decide"] {
        assert!(note.contains(words), "{words:?} in the note:\n{note}");
    }

    // The injection's refund of $5,000 is blocked by the demo's rule, which the demo
    // names, and never ran.
    assert!(
        out.text().contains("one rule added for the demo"),
        "{}",
        out.text()
    );
    let injection = out.section("prompt injection").unwrap();
    assert!(
        injection
            .lines()
            .any(|l| l.contains("stripe.create_refund") && l.contains("BLOCKED (")),
        "{injection}"
    );
    assert!(!injection.contains("HELD for a person"), "{injection}");
    let charged_twice = out.section("charged twice").unwrap();
    assert!(
        charged_twice
            .lines()
            .any(|l| l.contains("create_refund") && l.trim_end().ends_with(" ran")),
        "the duplicate is refunded by the policy alone:\n{charged_twice}"
    );

    // The bug report: the agent's repro and findings are commits on its branch, and
    // the draft pull request carries its finding.
    let bug = out.section("bug report").unwrap();
    let thread = out.thread_of("bug report");
    assert!(
        bug.contains(&format!("git log main..threadgate/{thread}")),
        "{bug}"
    );
    for file in [format!("repro/{thread}.sh"), format!("notes/{thread}.md")] {
        assert!(
            bug.lines()
                .any(|l| l.contains("added") && l.trim_end().ends_with(&file)),
            "{file} committed:\n{bug}"
        );
    }
    assert!(bug.contains("draft pull request #"), "{bug}");
    assert!(bug.contains("title: "), "{bug}");
    let body = quoted(&bug).join("\n");
    for words in ["expected 4000, got 3200", "Files changed"] {
        assert!(
            body.contains(words),
            "{words:?} in the pull request:\n{bug}"
        );
    }
    assert!(bug.contains("reply to the customer"), "{bug}");

    out.assert_cleaned_up();
}

#[test]
fn the_waiting_demo_lets_a_reviewer_approve_the_refund_and_cleans_up_on_ctrl_c() {
    if support::docker::skip() {
        return;
    }
    let _one = ONE_DEMO.lock().unwrap_or_else(|p| p.into_inner());
    let mut demo = DemoProcess::start(DEMO_ARGS, "");
    let page = demo.line_after("   review page:", WHOLE_RUN);
    let reviewer = demo.line_after("   reviewer:", WHOLE_RUN);
    let password = demo.line_after("   password:", WHOLE_RUN);
    let password = password.split_whitespace().next().unwrap().to_owned();
    let held = demo.line_after("   held refund:", WHOLE_RUN);
    assert_eq!(reviewer, review::REVIEWER);
    let base = page.trim_end_matches("/approvals").to_owned();
    let id = held.rsplit('/').next().unwrap().to_owned();
    assert!(held.starts_with(&format!("{base}/approvals/")), "{held}");

    process::approve(&base, &reviewer, &password, &id);
    let ran = demo.line_after("the held refund ran:", WHOLE_RUN);
    assert!(
        ran.contains("refund re_") && ran.contains("25.00 USD"),
        "{ran}"
    );
    assert!(ran.contains(review::REVIEWER), "{ran}");
    demo.line_after(
        "reply to the customer (written by the scripted model):",
        WHOLE_RUN,
    );

    demo.interrupt();
    let status = demo.wait_exit(Duration::from_secs(5 * 60));
    let out = demo.transcript();
    assert!(status.success(), "({status}):\n{}", out.text());
    assert!(
        out.text().contains("Ctrl-C: stopping threadgate"),
        "{}",
        out.text()
    );
    out.assert_cleaned_up();
}

/// The lines of a section quoted behind a bar (notes and pull request bodies).
fn quoted(section: &str) -> Vec<&str> {
    section
        .lines()
        .filter_map(|l| {
            l.trim_start()
                .strip_prefix("| ")
                .or((l.trim() == "|").then_some(""))
        })
        .collect()
}

impl Transcript {
    /// Nothing the demo made is left: its containers, its temporary directory, its
    /// sessions' secrets directory, its localstripe.
    fn assert_cleaned_up(&self) {
        let line = self
            .lines()
            .iter()
            .find(|l| l.starts_with("cleaned up: "))
            .unwrap_or_else(|| panic!("no cleanup line:\n{}", self.text()))
            .clone();
        let instance = line
            .split("threadgate.instance=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap();
        assert!(
            support::docker::containers_of(instance).is_empty(),
            "containers of {instance} are left"
        );
        let state = self
            .lines()
            .iter()
            .find_map(|l| l.strip_prefix("state in "))
            .and_then(|r| r.split(';').next())
            .unwrap()
            .to_owned();
        assert!(!std::path::Path::new(&state).exists(), "{state} is left");
        let secrets = format!("/dev/shm/threadgate-{instance}");
        assert!(
            !std::path::Path::new(&secrets).exists(),
            "{secrets} is left"
        );
        let stripe = line.split("localstripe (").nth(1).unwrap();
        let stripe = stripe
            .split(')')
            .next()
            .unwrap()
            .trim_start_matches("http://");
        assert!(
            std::net::TcpStream::connect(stripe).is_err(),
            "localstripe still answers on {stripe}"
        );
    }
}
