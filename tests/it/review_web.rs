//! The review page, end to end: a real threadgate (the gateway harness: localstripe,
//! the Plain fake, a fake sandbox) with reviewers signing in over HTTP and in a real
//! headless Chromium driven over WebDriver.
//!
//! Needs `.venv-peers` (`scripts/localstripe.sh setup`) and Chromium with chromedriver
//! (`scripts/browser-up.sh`); the single sign-on tests need npm's `oidc-provider` in
//! `.oidc-provider` (`scripts/test.sh` installs it). Screenshots land in `target/tmp/review-screenshots/`.

#[path = "review_web/web.rs"]
pub(crate) mod web;

#[path = "review_web/browser.rs"]
mod browser;
#[path = "review_web/http.rs"]
mod http;
#[path = "review_web/lockout.rs"]
mod lockout;
#[path = "review_web/narrow.rs"]
mod narrow;
#[path = "review_web/oidc.rs"]
mod oidc;
#[path = "review_web/pages.rs"]
mod pages;
#[path = "review_web/paths.rs"]
mod paths;
