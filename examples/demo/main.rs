//! The newcomer's first run (`scripts/demo.sh`): the whole flow on one machine with no
//! outside account. Embedded state (SQLite in a temp dir), sessions in local Docker
//! containers from the sandbox image, the **scripted model (not a real model)** behind
//! the model proxy, localstripe for Stripe, the Plain fake for Plain and the GitHub fake
//! for pull requests.
//!
//! Four signed webhooks open four threads ("charged twice", "a bad month", a prompt
//! injection, a bug report whose agent reproduces the bug in its workspace); the
//! summary shows per thread what ran, what is held (with each held call's whole note as
//! it was posted to the thread), what was blocked, the replies, the branch's commits and
//! the draft pull request GitHub received. Then the app stays up with its review page:
//! a reviewer made for the demo signs in, approves the held refund and the demo prints
//! what ran. Ctrl-C stops everything and cleans up; `--no-wait` prints and exits.
//!
//! `--first-call N` instead measures webhook → the agent's first tool call over N
//! threads and prints the median with the load average.
//!
//! The flow lives in modules of this directory, shared with `tests/demo_e2e.rs`, which
//! runs it end to end.

#![expect(
    clippy::indexing_slicing,
    reason = "example code: an index out of range stops the example with its message"
)]
#![expect(
    clippy::expect_used,
    reason = "test code: an unwrap or expect that fails is a failed test, with its message"
)]

#[path = "../../tests/it/support/mod.rs"]
pub mod support;

mod first_call;
mod flow;
mod report;
mod review;

fn main() {
    std::process::exit(flow::main_with_args(std::env::args().skip(1).collect()));
}
