//! Why the gate refused a call before deciding it. Typed, with no HTTP in it: the
//! sandbox API maps each kind to a status and the one error body
//! ([`crate::api_error::ApiError`]).

/// A call refused before any decision (nothing was sent, no execution recorded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The agent has no definition or is not granted the tool.
    #[error("{0}")]
    NotGranted(String),
    /// No tool of that name in the catalog.
    #[error("{0}")]
    UnknownTool(String),
    /// The arguments do not fit the tool; `problems` lists each.
    #[error("{message}")]
    InvalidArguments {
        message: String,
        problems: Vec<String>,
    },
    /// The arguments or diagnosis hold a stored secret's value.
    #[error("{0}")]
    SecretInArguments(String),
    /// The call reaches beyond the session's thread, customer or repositories.
    #[error("{0}")]
    OutOfScope(String),
    /// A lookup the check needed failed; `definite` when the provider refused it (the
    /// call is wrong), else the provider could not be reached.
    #[error("{message}")]
    LookupFailed { message: String, definite: bool },
    /// The call would be held while `limit` calls of the session already wait for a
    /// person; the session is stopped.
    #[error(
        "the session already has {limit} calls waiting for a person, the most \
         [sessions] max_pending_holds ({limit}) allows: this call is refused and the \
         session stops; a person takes over the thread"
    )]
    TooManyHolds { limit: usize },
    /// The session's thread was taken over by another instance (this instance's lease
    /// is stale): the database refused the call's record, so nothing of it was written
    /// and nothing was sent.
    #[error(
        "this session's thread was taken over by another threadgate instance; the call \
         was not recorded or sent, and this session stops here"
    )]
    SessionMoved,
    /// An identical write of the session is still being sent and did not end within
    /// the wait ([`super::run::TWIN_WAIT`]): this one was neither recorded nor sent.
    #[error(
        "an identical call ({0}) is still being sent; this one was not sent again: \
         its outcome will be at GET /v1/executions/{0}"
    )]
    InFlight(crate::ids::ExecutionId),
    /// The session already has as many calls under way as one session may (a call
    /// whose client hung up counts until it ends): this one was neither recorded nor
    /// sent.
    #[error(
        "this session already has {limit} calls under way, the most one session may \
         have at once (a call whose client hung up counts until it ends): this call was \
         not recorded or sent; send it again once one has ended"
    )]
    TooManyCalls { limit: usize },
    /// This instance already runs as many calls, all sessions together, as it may:
    /// this one was neither recorded nor sent.
    #[error(
        "this threadgate instance already has {limit} calls under way, the most it runs \
         at once: this call was not recorded or sent; send it again in a moment"
    )]
    InstanceBusy { limit: usize },
    /// The session sends calls faster than `[sessions] calls_per_second` allows (in
    /// bursts of at most `calls_burst`): this one was neither recorded nor sent.
    #[error(
        "this session sends tool calls faster than [sessions] calls_per_second \
         ({per_second}) allows, in bursts of at most calls_burst ({burst}): this call was \
         not recorded or sent; send it again in {retry_after_ms} ms"
    )]
    RateLimited {
        per_second: u32,
        burst: u32,
        retry_after_ms: u64,
    },
    /// The call could not be recorded.
    #[error("internal error")]
    Internal,
}

impl Refusal {
    /// The stable machine code of the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotGranted(_) => "not_granted",
            Refusal::UnknownTool(_) => "unknown_tool",
            Refusal::InvalidArguments { .. } => "invalid_arguments",
            Refusal::SecretInArguments(_) => "secret_in_arguments",
            Refusal::OutOfScope(_) => "out_of_scope",
            Refusal::LookupFailed { .. } => "lookup_failed",
            Refusal::TooManyHolds { .. } => "too_many_holds",
            Refusal::SessionMoved => "session_moved",
            Refusal::InFlight(_) => "in_flight",
            Refusal::TooManyCalls { .. } => "too_many_calls",
            Refusal::InstanceBusy { .. } => "instance_busy",
            Refusal::RateLimited { .. } => "rate_limited",
            Refusal::Internal => "internal",
        }
    }

    /// Arguments that do not fit, with no list of problems.
    pub fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::InvalidArguments {
            message: message.into(),
            problems: Vec::new(),
        }
    }
}
