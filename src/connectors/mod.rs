//! TODO: connectors
