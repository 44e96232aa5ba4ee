//! Felix client (under construction).
