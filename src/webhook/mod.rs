//! TODO: webhook
