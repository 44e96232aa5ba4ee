//! One Felix broker node as a Sans-IO state machine (under construction).

pub(crate) mod auth;
pub(crate) mod broker;
