//! Felix conformance (under construction).
