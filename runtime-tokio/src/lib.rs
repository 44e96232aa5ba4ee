//! tokio runtime for the Felix engine (under construction).
