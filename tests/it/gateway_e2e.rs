//! The gateway end to end: a real threadgate (webhook intake, supervisor with a fake
//! sandbox, session sockets, policy gate, approvals, note outbox, audit) against
//! localstripe, the Plain fake and the GitHub stub, driven over the session's unix
//! socket as an agent drives it and over the people's listener as reviewers do.
//!
//! Needs `.venv-peers`: run `scripts/localstripe.sh setup` once.

#[path = "gateway_e2e/approvals.rs"]
mod approvals;
#[path = "gateway_e2e/checkpoint.rs"]
mod checkpoint;
#[path = "gateway_e2e/floods.rs"]
mod floods;
#[path = "gateway_e2e/hang_up.rs"]
mod hang_up;
#[path = "gateway_e2e/holds.rs"]
mod holds;
#[path = "gateway_e2e/labels.rs"]
mod labels;
#[path = "gateway_e2e/leaks.rs"]
mod leaks;
#[path = "gateway_e2e/lease_lapse.rs"]
mod lease_lapse;
#[path = "gateway_e2e/limits.rs"]
mod limits;
#[path = "gateway_e2e/ops.rs"]
mod ops;
#[path = "gateway_e2e/pace.rs"]
mod pace;
#[path = "gateway_e2e/publish.rs"]
mod publish;
#[path = "gateway_e2e/queue.rs"]
mod queue;
#[path = "gateway_e2e/read_commit.rs"]
mod read_commit;
#[path = "gateway_e2e/read_holds.rs"]
mod read_holds;
#[path = "gateway_e2e/read_scope.rs"]
mod read_scope;
#[path = "gateway_e2e/refund_evidence.rs"]
mod refund_evidence;
#[path = "gateway_e2e/restart.rs"]
mod restart;
#[path = "gateway_e2e/scope.rs"]
mod scope;
#[path = "gateway_e2e/shutdown.rs"]
mod shutdown;
#[path = "gateway_e2e/stripe_events.rs"]
mod stripe_events;
#[path = "gateway_e2e/telemetry.rs"]
mod telemetry;
#[path = "gateway_e2e/trail.rs"]
mod trail;
#[path = "gateway_e2e/twins.rs"]
mod twins;
