//! TODO: workspace
