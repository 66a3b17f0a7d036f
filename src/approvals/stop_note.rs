//! The notes of sessions that stopped on their own (budget spent, secret in the
//! prompt, workspace full, too many holds) are written by [`crate::gateway::stop_note`]:
//! the gateway stops a session that floods people with holds, and cannot reach up
//! here. Re-exported under this name for the model proxy and the application.

pub use crate::gateway::stop_note::{OutboxStopNotes, StopNote, queue};
