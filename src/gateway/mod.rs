//! TODO: gateway
