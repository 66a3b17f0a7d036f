//! TODO: secrets
