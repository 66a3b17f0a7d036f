//! The one test harness of threadgate's integration tests. Every test binary that needs
//! a helper declares `pub mod support;` (benches and examples mount this file with
//! `#[path]`); the modules and their items are `pub`, so no binary needs
//! `allow(dead_code)` for the helpers it does not use.
//!
//! - [`app`]: [`app::spawn_app`], the one way a test runs the real `Application` (on its
//!   own runtime, so a test can also crash it), and [`app::TestApp`], what it answers.
//! - [`world`]: the gateway's world (localstripe, the Plain fake, the GitHub stub, a fake
//!   sandbox) and a session driven over its unix socket.
//! - [`sessions`]: the Docker sessions' world (a real repository, the sandbox image).
//! - [`agent`]: the agent's world (real Docker sessions and a scripted model).
//! - [`instances`]: real `threadgate serve` processes on one shared database (SQLite file
//!   or Postgres) and one Docker engine.
//! - [`intake`]: the webhook intake router alone, with a fixed clock.
//! - [`plain`]: Plain's example deliveries, ids and the shared directory; deliveries are
//!   signed by the library's own `threadgate::webhook::sign`.
//! - [`docker`]: whether Docker is there (a test without it is skipped, and says so,
//!   unless `THREADGATE_REQUIRE_DOCKER=1`), and the `docker` CLI.
//! - [`wait`]: waiting on an observable condition, never a bare sleep.

pub mod agent;
pub mod app;
pub mod clock;
pub mod docker;
pub mod figures;
pub mod github_stub;
pub mod instances;
pub mod intake;
pub mod localstripe;
pub mod logs;
pub mod pg_hold;
pub mod plain;
pub mod plain_fake;
pub mod plain_fake_model;
pub mod plain_fake_trail;
pub mod relay;
pub mod rows;
pub mod sandbox;
pub mod sessions;
pub mod slow_stripe;
pub mod token_review;
pub mod unix_http;
pub mod wait;
pub mod world;
