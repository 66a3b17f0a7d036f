//! TODO: store
