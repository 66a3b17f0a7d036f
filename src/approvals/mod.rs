//! Approvals: held calls wait here for a person, who decides with a reviewer credential.
pub mod reviewers;
