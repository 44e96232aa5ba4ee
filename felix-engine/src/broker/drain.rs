//! Draining: a broker that is stopping takes no new work. Every request that would start
//! some (publish, subscribe, cache reads and writes) is refused `draining` [retry], so the
//! client goes elsewhere while the answers already owed are delivered.

use felix_proto::ErrorCode;

use super::{Broker, BrokerError};

impl Broker {
    /// From now on, new work is refused (see [`Broker::refuse_if_draining`]).
    pub(crate) fn begin_drain(&mut self) {
        self.draining = true;
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining
    }

    /// `Err(draining)` once [`Broker::begin_drain`] was called.
    pub(crate) fn refuse_if_draining(&self) -> Result<(), BrokerError> {
        if self.draining {
            return Err(BrokerError::new(
                ErrorCode::Draining,
                "the broker is shutting down and takes no new work",
            ));
        }
        Ok(())
    }
}
