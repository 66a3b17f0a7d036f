//! TODO: approvals
