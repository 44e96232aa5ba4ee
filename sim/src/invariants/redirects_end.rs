//! Redirects end: a subscribe redirected with `not_leader` reaches a node that serves it
//! within [`MAX_REDIRECT_HOPS`] hops, each redirect naming a usable address other than the
//! node that sent it. The client follows redirects with the felix-client core's
//! [`Redirects`](felix_client::core::cluster::Redirects), one per attempt, and this check
//! judges the broker by what the core reports at each hop:
//!
//! - an address that does not parse, and a redirect back to its own sender, are refused at
//!   any time;
//! - the hop bound holds for an attempt that began once the faults were over: while a node is
//!   cut off from the control plane's leader its metadata is stale, and it may name a leader
//!   the others have moved past (a replicated shard moves under a partition), so chains can be
//!   longer until it catches up;
//! - a redirect that names no address yet (the owner's join not applied on that node), one
//!   naming an older generation than the attempt already followed (a stale view), and one
//!   back to a broker asked earlier in the attempt (a node whose metadata is behind names
//!   the one that sent the client there) end the attempt, which the core retries after its
//!   backoff; they are not the broker's fault.

use std::net::SocketAddr;

use felix_client::core::cluster::RedirectRefused;

use crate::client::MAX_REDIRECT_HOPS;
use crate::oracle::Violation;

pub(crate) const NAME: &str = "redirects_end";

/// Client `client`'s subscribe was redirected by `from` naming `node`, and the core's
/// redirect state answered `step`; `bounded`: the attempt began after the faults.
pub(crate) fn check(
    client: usize,
    step: &Result<SocketAddr, RedirectRefused>,
    from: SocketAddr,
    node: &str,
    bounded: bool,
) -> Result<(), Violation> {
    let why = match step {
        Err(RedirectRefused::Unparseable) => Some(format!("names {node} without a usable address")),
        Err(RedirectRefused::Loop(to)) if *to == from => {
            Some(format!("{from} redirects to itself ({node})"))
        }
        Err(RedirectRefused::Bound) if bounded => Some(format!(
            "more than {MAX_REDIRECT_HOPS} redirects in a row; the last from {from} to {node}"
        )),
        Ok(_)
        | Err(
            RedirectRefused::NoAddress
            | RedirectRefused::Stale { .. }
            | RedirectRefused::Loop(_)
            | RedirectRefused::Bound,
        ) => None,
    };
    match why {
        Some(why) => Err(Violation {
            invariant: NAME,
            detail: format!("c{client}'s subscribe: {why}"),
        }),
        None => Ok(()),
    }
}
