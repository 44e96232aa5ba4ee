//! Capability negotiation as pure functions.
//!
//! The `auth` handshake carries two independent offers: frame flags (how payloads are laid
//! out) and feature bits (which requests exist). Each side advertises what *it* serves; what
//! either side may actually *send* is the intersection with what the other side offered.
//!
//! - [`broker_answer`]: given what a broker serves and what a client offered, the answer to put
//!   on the wire (`auth_ok` or, to a client that offered no flags, plain `ok`) and the
//!   [`Negotiated`] set the broker consults before sending anything optional.
//! - [`client_view`]: given what a client offered and the broker's answer, what the client may
//!   send ([`ClientNegotiated`]), and [`ClientNegotiated::publish_encoding`], the client's rule
//!   for picking a publish encoding from the advertisement, never from its own set.

use crate::features::{Features, FEATURE_EXTENDED_MARKER};
use crate::flags::Flags;

/// What a client offered on `auth`, as raw wire values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientOffer {
    /// `client_flags`; `None` for a client that predates negotiation.
    pub flags: Option<u64>,
    /// `client_features`.
    pub features: Option<u64>,
    /// `client_features_hi`.
    pub features_hi: Option<u64>,
}

impl ClientOffer {
    /// The offered flags, restricted to bits this crate knows (an offer is a set of
    /// capabilities, not a layout, so unknown bits are simply not in common).
    pub fn flags(&self) -> Option<Flags> {
        self.flags
            .map(|f| Flags((f & u64::from(Flags::KNOWN.0)) as u16))
    }
    /// The offered features (the extended word counts only behind the marker).
    pub fn features(&self) -> Features {
        Features::from_words(self.features, self.features_hi)
    }
    /// True when the client set `FEATURE_EXTENDED`, i.e. reads `server_features_hi`.
    pub fn reads_extended_word(&self) -> bool {
        self.features.unwrap_or(0) as u32 & FEATURE_EXTENDED_MARKER != 0
    }
}

/// What a broker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerCapabilities {
    /// Frame flags it can decode and produce.
    pub flags: Flags,
    /// Features it answers (including extended ones).
    pub features: Features,
    /// The per-stream publish window it grants to pipelining clients; `0` grants none and
    /// withdraws the pipeline features from the advertisement.
    pub publish_window: u32,
}

/// The broker's answer to `auth`, as wire values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthAnswer {
    /// Plain `ok`, for a client that offered no flags.
    Ok,
    /// `auth_ok`.
    AuthOk {
        /// `server_flags`.
        server_flags: u16,
        /// `server_features`; omitted when the broker serves none.
        server_features: Option<u32>,
        /// `server_features_hi`; only to a client that set the extended marker.
        server_features_hi: Option<u32>,
        /// `publish_window`; only to a client that offered the pipeline feature.
        publish_window: Option<u32>,
    },
}

/// What the broker may send to one client stream after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Flags the broker may set on frames it sends (served ∩ offered; `ORIGINAL_V1` ∩ served
    /// for a client that offered none).
    pub flags: Flags,
    /// Features both sides have: a client-read feature (error codes, shard_moved, …) is used
    /// only when in here.
    pub features: Features,
    /// The window granted, if any.
    pub publish_window: Option<u32>,
}

impl Negotiated {
    /// True when the client reads typed codes on errors.
    pub fn error_codes(&self) -> bool {
        self.features.contains(Features::ERROR_CODES)
    }
}

fn advertised_features(served: &BrokerCapabilities) -> Features {
    if served.publish_window == 0 {
        served
            .features
            .without(Features::PUBLISH_PIPELINE | Features::STREAM_PUBLISH_WINDOW)
    } else {
        served.features
    }
}

/// The broker's side of the handshake.
pub fn broker_answer(served: &BrokerCapabilities, offer: &ClientOffer) -> (AuthAnswer, Negotiated) {
    let advertised = advertised_features(served);
    let offered_features = offer.features();
    let common_features = advertised.intersection(offered_features);
    let publish_window = (common_features.contains(Features::PUBLISH_PIPELINE)
        && served.publish_window > 0)
        .then_some(served.publish_window);

    let Some(offered_flags) = offer.flags() else {
        let negotiated = Negotiated {
            flags: Flags::ORIGINAL_V1.intersection(served.flags),
            features: common_features,
            // A legacy client gets completion-order answers and no window.
            publish_window: None,
        };
        return (AuthAnswer::Ok, negotiated);
    };

    let (lo, hi) = advertised.to_words();
    let hi = hi.filter(|_| offer.reads_extended_word());
    let lo = if hi.is_some() {
        lo
    } else {
        lo & !FEATURE_EXTENDED_MARKER
    };
    let answer = AuthAnswer::AuthOk {
        server_flags: served.flags.0,
        server_features: (lo != 0).then_some(lo),
        server_features_hi: hi,
        publish_window,
    };
    let negotiated = Negotiated {
        flags: served.flags.intersection(offered_flags).closed(),
        features: common_features,
        publish_window,
    };
    (answer, negotiated)
}

/// What the broker advertised, as the client reads it off `auth_ok` (or `None` for plain `ok`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BrokerAdvertisement {
    /// `server_flags`.
    pub server_flags: u64,
    /// `server_features`.
    pub server_features: Option<u64>,
    /// `server_features_hi`.
    pub server_features_hi: Option<u64>,
    /// `publish_window`.
    pub publish_window: Option<u64>,
}

/// What a client may use after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientNegotiated {
    /// Flags the client may set on frames it sends (advertised ∩ offered).
    pub flags: Flags,
    /// Features the broker advertised: a request is sent only when its bit is here.
    pub broker_features: Features,
    /// The publish window, when pipelining was offered and granted.
    pub publish_window: Option<u32>,
}

/// How a client should encode one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishEncoding {
    /// A binary publish batch with these flags.
    Binary(Flags),
    /// The JSON `publish_batch` fallback.
    Json,
}

/// The client's side of the handshake.
pub fn client_view(
    offered_flags: Flags,
    offered_features: Features,
    answer: Option<&BrokerAdvertisement>,
) -> ClientNegotiated {
    match answer {
        None => ClientNegotiated {
            flags: Flags::ORIGINAL_V1.intersection(offered_flags),
            broker_features: Features::NONE,
            publish_window: None,
        },
        Some(ad) => {
            let server_flags = Flags((ad.server_flags & u64::from(Flags::KNOWN.0)) as u16);
            let broker_features = Features::from_words(ad.server_features, ad.server_features_hi);
            let pipelined = offered_features.contains(Features::PUBLISH_PIPELINE)
                && broker_features.contains(Features::PUBLISH_PIPELINE);
            let publish_window = ad
                .publish_window
                .filter(|w| pipelined && *w > 0)
                .map(|w| u32::try_from(w).unwrap_or(u32::MAX));
            ClientNegotiated {
                flags: server_flags.intersection(offered_flags).closed(),
                broker_features,
                publish_window,
            }
        }
    }
}

impl ClientNegotiated {
    /// The encoding for a publish: binary when the broker advertised every bit it needs
    /// (acked needs `0x0008` and the ack frame `0x0010`; keyed needs `0x0040`), else JSON.
    pub fn publish_encoding(&self, acked: bool, keyed: bool) -> PublishEncoding {
        let mut needed = Flags::BINARY_PUBLISH_BATCH;
        if acked {
            needed |= Flags::BINARY_PUBLISH_ACKED | Flags::BINARY_PUBLISH_ACK;
        }
        if keyed {
            needed |= Flags::BINARY_PUBLISH_KEYED;
        }
        if self.flags.contains(needed) {
            // The ack bit is the answer's layout, not the request's.
            PublishEncoding::Binary(needed.without(Flags::BINARY_PUBLISH_ACK))
        } else {
            PublishEncoding::Json
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker() -> BrokerCapabilities {
        BrokerCapabilities {
            flags: Flags(0x1e7f),
            features: Features::ERROR_CODES
                | Features::PUBLISH_PIPELINE
                | Features::STREAM_PUBLISH_WINDOW
                | Features::CACHE_DELETE,
            publish_window: 256,
        }
    }

    /// The real client's offer (peer-client-wire.md §3).
    fn real_client() -> ClientOffer {
        ClientOffer {
            flags: Some(8191),
            features: Some(4_218_945_535),
            features_hi: Some(15),
        }
    }

    #[test]
    fn real_client_gets_auth_ok_with_window() {
        let (answer, negotiated) = broker_answer(&broker(), &real_client());
        let AuthAnswer::AuthOk {
            server_flags,
            server_features,
            server_features_hi,
            publish_window,
        } = answer
        else {
            panic!("expected auth_ok")
        };
        assert_eq!(server_flags, 0x1e7f);
        assert_eq!(server_features, Some(0x2_8804));
        assert_eq!(
            server_features_hi, None,
            "broker serves no extended feature"
        );
        assert_eq!(publish_window, Some(256));
        // The client did not offer 0x2000 or 0x4000; the broker serves 0x0200 and 0x1000.
        assert_eq!(negotiated.flags, Flags(0x1e7f & 0x1fff));
        assert!(negotiated.error_codes());
    }

    #[test]
    fn client_without_flags_gets_plain_ok() {
        let (answer, negotiated) = broker_answer(&broker(), &ClientOffer::default());
        assert_eq!(answer, AuthAnswer::Ok);
        assert_eq!(negotiated.flags, Flags::ORIGINAL_V1);
        assert_eq!(negotiated.publish_window, None);
        assert!(!negotiated.error_codes());
    }

    #[test]
    fn window_zero_withdraws_pipeline_features() {
        let mut b = broker();
        b.publish_window = 0;
        let (answer, negotiated) = broker_answer(&b, &real_client());
        match answer {
            AuthAnswer::AuthOk {
                server_features,
                publish_window,
                ..
            } => {
                assert_eq!(server_features, Some(0x0804));
                assert_eq!(publish_window, None);
            }
            AuthAnswer::Ok => panic!(),
        }
        assert_eq!(negotiated.publish_window, None);
    }

    #[test]
    fn extended_word_only_to_a_client_with_the_marker() {
        let mut b = broker();
        b.features = b.features | Features::INSPECT;
        let (answer, _) = broker_answer(&b, &real_client());
        let AuthAnswer::AuthOk {
            server_features,
            server_features_hi,
            ..
        } = answer
        else {
            panic!()
        };
        assert_eq!(server_features_hi, Some(1));
        assert_ne!(server_features.unwrap() & FEATURE_EXTENDED_MARKER, 0);

        let plain = ClientOffer {
            flags: Some(25),
            features: Some(1),
            features_hi: None,
        };
        let (answer, negotiated) = broker_answer(&b, &plain);
        let AuthAnswer::AuthOk {
            server_features,
            server_features_hi,
            ..
        } = answer
        else {
            panic!()
        };
        assert_eq!(server_features_hi, None);
        assert_eq!(server_features.unwrap() & FEATURE_EXTENDED_MARKER, 0);
        assert!(!negotiated.features.contains(Features::INSPECT));
    }

    #[test]
    fn features_the_client_did_not_offer_are_not_used() {
        let offer = ClientOffer {
            flags: Some(25),
            features: None,
            features_hi: None,
        };
        let (_, negotiated) = broker_answer(&broker(), &offer);
        assert!(!negotiated.error_codes());
        assert_eq!(negotiated.publish_window, None);
    }

    #[test]
    fn client_decides_from_the_advertisement() {
        let offered = Flags(0x1fff);
        let legacy = client_view(offered, Features::NONE, None);
        assert_eq!(legacy.flags, Flags::ORIGINAL_V1);
        assert_eq!(legacy.publish_encoding(true, false), PublishEncoding::Json);
        assert_eq!(
            legacy.publish_encoding(false, false),
            PublishEncoding::Binary(Flags::BINARY_PUBLISH_BATCH)
        );

        let ad = BrokerAdvertisement {
            server_flags: 0x19,
            ..Default::default()
        };
        let v = client_view(offered, Features::PUBLISH_PIPELINE, Some(&ad));
        assert_eq!(
            v.publish_encoding(true, false),
            PublishEncoding::Binary(Flags(0x0009))
        );
        assert_eq!(
            v.publish_encoding(true, true),
            PublishEncoding::Json,
            "0x0040 not advertised"
        );
        assert_eq!(v.publish_window, None, "pipeline not advertised");

        let ad = BrokerAdvertisement {
            server_flags: 0x7f,
            server_features: Some(0x8000),
            server_features_hi: None,
            publish_window: Some(64),
        };
        let v = client_view(offered, Features::PUBLISH_PIPELINE, Some(&ad));
        assert_eq!(
            v.publish_encoding(true, true),
            PublishEncoding::Binary(Flags(0x0049))
        );
        assert_eq!(v.publish_window, Some(64));
    }
}
