//! The invariants, one per file (after openraft's `tests-turmoil/src/invariants/`). Each is a
//! function over the [`Oracle`](crate::oracle::Oracle) and what was just observed; safety
//! ones run as events happen, the liveness ones once the run has healed and gone quiet.

pub(crate) mod cache_reads;
pub(crate) mod committed_prefix;
pub(crate) mod forwarded_acks;
pub(crate) mod group_claims;
pub(crate) mod idempotent_once;
pub(crate) mod leases_disjoint;
pub(crate) mod meta_agreement;
pub(crate) mod no_acked_loss;
pub(crate) mod object_specs;
pub(crate) mod offsets;
pub(crate) mod one_writer;
pub(crate) mod redirects_end;
pub(crate) mod requests_answered;
pub(crate) mod shard_leaders;
pub(crate) mod subscriber_order;
pub(crate) mod watch_gapless;
