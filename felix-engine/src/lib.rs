//! One Felix broker node as a Sans-IO state machine (under construction).
