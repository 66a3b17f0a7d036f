//! A connector whose calls are timed, counted by provider (`crate::metrics`) and traced
//! in a `connector_call` span with the provider and the execution id.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument as _;

use super::{CallContext, Connector, ConnectorError};

/// A connector whose calls are timed, counted by provider and traced in a
/// `connector_call` span (with the provider and the execution id).
pub struct Metered(pub Arc<dyn Connector>);

/// Wraps `connector` in [`Metered`].
pub fn metered(connector: Arc<dyn Connector>) -> Arc<dyn Connector> {
    Arc::new(Metered(connector))
}

/// The fixed label of a connector error.
fn error_kind(e: &ConnectorError) -> &'static str {
    match e {
        ConnectorError::Rejected { .. } => "rejected",
        ConnectorError::RateLimited { .. } => "rate_limited",
        ConnectorError::Unknown { .. } => "unknown",
        ConnectorError::Unreachable { .. } => "unreachable",
        ConnectorError::InvalidArgs { .. } => "invalid_args",
    }
}

#[async_trait::async_trait]
impl Connector for Metered {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    async fn call(
        &self,
        tool: &str,
        args: &serde_json::Value,
        ctx: &CallContext<'_>,
    ) -> Result<serde_json::Value, ConnectorError> {
        let provider = self.0.name();
        let span = tracing::info_span!(
            "connector_call",
            provider,
            execution_id = %ctx.execution_id
        );
        let began = Instant::now();
        let outcome = self.0.call(tool, args, ctx).instrument(span.clone()).await;
        let kind = outcome.as_ref().err().map(error_kind);
        span.in_scope(|| {
            tracing::debug!(
                took_ms = crate::clock::ms_u64(began.elapsed()),
                error = kind,
                "provider answered"
            )
        });
        crate::metrics::connector_call(provider, began.elapsed(), kind);
        outcome
    }

    fn supports_idempotency(&self) -> bool {
        self.0.supports_idempotency()
    }
}
