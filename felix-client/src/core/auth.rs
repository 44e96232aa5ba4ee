//! The `auth` exchange every client stream starts with, and what it negotiates.

use bytes::Bytes;
use felix_proto::message::{self, Message};
use felix_proto::negotiate::{client_view, BrokerAdvertisement, ClientNegotiated, PublishEncoding};
use felix_proto::{Features, Flags, Frame};

use super::codec::{decode_json, frame_bytes, refusal, unexpected};
use crate::error::ClientError;

/// What this client offers on `auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// `client_flags`; `None` sends no flags at all, like a client that predates
    /// negotiation (the broker then answers plain `ok`).
    pub flags: Option<Flags>,
    /// `client_features` (+ `_hi`). Ignored when `flags` is `None`.
    pub features: Features,
}

impl Offer {
    /// Everything this client can read: every frame flag the reference client 0.6.2 offers
    /// (0x1FFF), and the features whose answers this client decodes.
    pub fn full() -> Offer {
        Offer {
            flags: Some(Flags(0x1FFF)),
            features: Features::CACHE_DELETE
                | Features::ERROR_CODES
                | Features::UNSUPPORTED
                | Features::PUBLISH_PIPELINE
                | Features::STREAM_PUBLISH_WINDOW
                | Features::SUBSCRIPTION_LAGGED
                | Features::SHARD_MOVED
                | Features::STREAM_DELETED
                | Features::CACHE_WATCH
                | Features::CACHE_WATCH_RETAINED
                | Features::COUNTERS
                | Features::CACHE_CONDITIONAL
                | Features::CONSUMER_GROUP
                | Features::GROUP_DEAD_LETTERS
                | Features::GROUP_CONSUMER
                | Features::GROUP_SKIPPED
                | Features::GROUP_PUBLISHER
                | Features::GROUP_CLAIM_CONTROL
                | Features::GROUP_ADMIN
                // `timestamp_micros` on group records decodes (core/groups.rs).
                | Features::RECORD_TIMESTAMPS
                // `publish_refused` with `sequence_reused` decodes (core/stream_ops.rs).
                | Features::SEQUENCE_REUSED,
        }
    }

    /// [`Offer::full`] and what the cluster client reads (core/cluster.rs): `topology` to
    /// learn the brokers, `stream_shards` and `shard_owners` to route, and `not_leader`
    /// redirects to follow. The one-broker client does not offer them: it follows nothing.
    pub fn cluster() -> Offer {
        let full = Offer::full();
        Offer {
            flags: full.flags,
            features: full.features
                | Features::TOPOLOGY
                | Features::REDIRECT
                | Features::STREAM_SHARDS
                | Features::SHARD_OWNERS,
        }
    }

    /// Exactly what felix-client 0.6.2 sends (peer-client-wire.md §3).
    pub fn reference_client() -> Offer {
        Offer {
            flags: Some(Flags(0x1FFF)),
            features: Features::from_words(Some(0xFB77_FFFF), Some(0xF)),
        }
    }

    /// No `client_flags` and no features: a legacy client.
    pub fn none() -> Offer {
        Offer {
            flags: None,
            features: Features::NONE,
        }
    }
}

impl Default for Offer {
    fn default() -> Self {
        Offer::full()
    }
}

/// What one authenticated stream may use: the broker's advertisement intersected with our
/// offer. Every stream of a connection normally gets the same answer, but identity and
/// capabilities are per stream on the wire, so each stream keeps its own copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Flags and features as negotiated (see [`client_view`]).
    pub negotiated: ClientNegotiated,
    /// What we offered.
    pub offer: Offer,
    /// True when the broker answered plain `ok` (no advertisement).
    pub legacy_ok: bool,
}

impl Capabilities {
    /// Flags both sides have (the broker may set these on frames to us; we may send them).
    pub fn flags(&self) -> Flags {
        self.negotiated.flags
    }

    /// Features both sides have.
    pub fn features(&self) -> Features {
        self.negotiated
            .broker_features
            .intersection(self.offer.features)
    }

    /// True when the broker advertised `feature` (so we may send its request).
    pub fn broker_has(&self, feature: Features) -> bool {
        self.negotiated.broker_features.contains(feature)
    }

    /// The publish window granted, if pipelining was negotiated.
    pub fn publish_window(&self) -> Option<u32> {
        self.negotiated.publish_window
    }

    /// True when publish answers must come back in request order on each stream.
    pub fn ordered_publish_answers(&self) -> bool {
        self.negotiated.publish_window.is_some()
    }

    /// How to encode a publish with these properties.
    pub fn publish_encoding(&self, acked: bool, keyed: bool) -> PublishEncoding {
        self.negotiated.publish_encoding(acked, keyed)
    }
}

/// Builds the `auth` frame (header included) for this identity and offer.
pub fn auth_frame(tenant: &str, token: &str, offer: &Offer) -> Bytes {
    let (flags, features, features_hi) = match offer.flags {
        None => (None, None, None),
        Some(flags) => {
            let (lo, hi) = offer.features.to_words();
            (
                Some(u64::from(flags.0)),
                (lo != 0).then_some(u64::from(lo)),
                hi.map(u64::from),
            )
        }
    };
    frame_bytes(&Message::Auth(message::Auth {
        tenant_id: tenant.to_owned(),
        token: token.to_owned(),
        client_flags: flags,
        client_features: features,
        client_features_hi: features_hi,
    }))
}

/// Reads the broker's answer to `auth`: `auth_ok` or `ok` yields the stream's
/// capabilities; `error` is the refusal; anything else is a protocol violation.
pub fn read_auth_reply(offer: &Offer, frame: &Frame) -> Result<Capabilities, ClientError> {
    // `Some(advertisement)` for `auth_ok`, `None` for plain `ok`.
    let ad = match decode_json(frame)? {
        Message::AuthOk(ok) => Some(ok.advertisement()),
        Message::Ok => None,
        Message::Error(e) => return Err(refusal(e)),
        other => return Err(unexpected(&other, "auth_ok, ok or error")),
    };
    Ok(capabilities(offer, ad.as_ref()))
}

/// The capabilities for our offer and the broker's advertisement (`None` = plain `ok`).
pub fn capabilities(offer: &Offer, ad: Option<&BrokerAdvertisement>) -> Capabilities {
    let negotiated = match offer.flags {
        Some(flags) => client_view(flags, offer.features, ad),
        // A client that offered nothing knows only the original layouts and no feature,
        // whatever the broker says.
        None => client_view(Flags::ORIGINAL_V1, Features::NONE, None),
    };
    Capabilities {
        negotiated,
        offer: *offer,
        legacy_ok: ad.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ad(
        flags: u64,
        features: Option<u64>,
        hi: Option<u64>,
        window: Option<u64>,
    ) -> BrokerAdvertisement {
        BrokerAdvertisement {
            server_flags: flags,
            server_features: features,
            server_features_hi: hi,
            publish_window: window,
        }
    }

    #[test]
    fn negotiated_is_advertised_intersect_offered() {
        let offer = Offer::full();
        // The broker advertises 0x7FFF, including bits we never offered (0x2000, 0x4000).
        let caps = capabilities(&offer, Some(&ad(0x7FFF, Some(0x0000_2804), None, None)));
        assert_eq!(caps.flags(), Flags(0x1FFF));
        assert!(caps.broker_has(Features::CACHE_DELETE));
        assert!(caps
            .features()
            .contains(Features::ERROR_CODES | Features::UNSUPPORTED));
        assert!(!caps.broker_has(Features::TOPOLOGY));
        assert_eq!(caps.publish_window(), None);
        assert!(!caps.legacy_ok);
    }

    #[test]
    fn absent_advertisement_means_original_v1_and_no_features() {
        let caps = capabilities(&Offer::full(), None);
        assert_eq!(caps.flags(), Flags::ORIGINAL_V1);
        assert_eq!(caps.features(), Features::NONE);
        assert!(caps.legacy_ok);
        // Acked publishes fall back to JSON; unacked stay binary 0x0001.
        assert_eq!(caps.publish_encoding(true, false), PublishEncoding::Json);
        assert_eq!(
            caps.publish_encoding(false, false),
            PublishEncoding::Binary(Flags::BINARY_PUBLISH_BATCH)
        );
    }

    #[test]
    fn window_needs_pipeline_on_both_sides() {
        let offer = Offer::full();
        let granted = capabilities(&offer, Some(&ad(0x1FFF, Some(0x0002_8000), None, Some(64))));
        assert_eq!(granted.publish_window(), Some(64));
        assert!(granted.ordered_publish_answers());
        // A window without the feature bit is no window.
        let stray = capabilities(&offer, Some(&ad(0x1FFF, Some(0x0800), None, Some(64))));
        assert_eq!(stray.publish_window(), None);
        // We did not offer pipelining: no window whatever the broker says.
        let mut no_pipe = offer;
        no_pipe.features = no_pipe.features.without(Features::PUBLISH_PIPELINE);
        let caps = capabilities(&no_pipe, Some(&ad(0x1FFF, Some(0x8000), None, Some(64))));
        assert_eq!(caps.publish_window(), None);
    }

    #[test]
    fn extended_word_counts_only_behind_the_marker() {
        let offer = Offer::full();
        let with_marker = capabilities(&offer, Some(&ad(0x3F, Some(0x8000_0000), Some(0x2), None)));
        assert!(with_marker.broker_has(Features::STREAM_DELETED));
        let without = capabilities(&offer, Some(&ad(0x3F, Some(0), Some(0x2), None)));
        assert!(!without.broker_has(Features::STREAM_DELETED));
    }

    #[test]
    fn reference_offer_matches_the_captured_words() {
        let offer = Offer::reference_client();
        assert_eq!(offer.features.to_words(), (0xFB77_FFFF, Some(0xF)));
    }

    #[test]
    fn legacy_offer_ignores_the_advertisement() {
        let caps = capabilities(
            &Offer::none(),
            Some(&ad(0x7FFF, Some(0x2804), None, Some(8))),
        );
        assert_eq!(caps.flags(), Flags::ORIGINAL_V1);
        assert_eq!(caps.publish_window(), None);
    }
}
