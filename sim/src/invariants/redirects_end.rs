//! Redirects end: a subscribe redirected with `not_leader` reaches a node that serves it
//! within [`MAX_REDIRECT_HOPS`] hops, each redirect naming a usable address other than the
//! node that sent it. Checked at every hop; a subscription that is served resets the count.
//! The hop bound holds once the faults are over: while a node is cut off from the control
//! plane's leader its metadata is stale, and it may name a leader the others have moved past
//! (a replicated shard moves under a partition), so chains can be longer until it catches up.
//! A redirect with no usable address, or to its sender, is refused at any time.

use std::net::SocketAddr;

use crate::client::MAX_REDIRECT_HOPS;
use crate::oracle::Violation;

pub(crate) const NAME: &str = "redirects_end";

/// Client `client` was redirected for the `hops`-th time in a row (`None` while faults are
/// still being injected), by `from`, towards `to` (`None`: no usable address) naming `node`.
pub(crate) fn check_hop(
    client: usize,
    hops: Option<u32>,
    from: SocketAddr,
    to: Option<SocketAddr>,
    node: &str,
) -> Result<(), Violation> {
    let why = match to {
        None => Some(format!("names {node} without a usable address")),
        Some(to) if to == from => Some(format!("{from} redirects to itself ({node})")),
        Some(_) if hops.is_some_and(|h| h > MAX_REDIRECT_HOPS) => Some(format!(
            "{} redirects in a row (at most {MAX_REDIRECT_HOPS}); the last from {from} to {node}",
            hops.unwrap_or(0)
        )),
        Some(_) => None,
    };
    match why {
        Some(why) => Err(Violation {
            invariant: NAME,
            detail: format!("c{client}'s subscribe: {why}"),
        }),
        None => Ok(()),
    }
}
