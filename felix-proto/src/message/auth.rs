//! The handshake: `auth` and `auth_ok` (plain `ok` is [`super::Message::Ok`]).

use serde::{Deserialize, Serialize};

use crate::features::Features;
use crate::negotiate::{AuthAnswer, BrokerAdvertisement, ClientOffer};

/// `auth`: the first frame on every client stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Auth {
    pub tenant_id: String,
    pub token: String,
    /// Frame flags the client decodes; absent from a client that predates negotiation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_flags: Option<u64>,
    /// Low feature word. The real client sends a value above 2^31, hence `u64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_features: Option<u64>,
    /// Extended feature word; counts only behind `FEATURE_EXTENDED` in the low word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_features_hi: Option<u64>,
}

impl Auth {
    /// The capability offer, as negotiation reads it.
    pub fn offer(&self) -> ClientOffer {
        ClientOffer {
            flags: self.client_flags,
            features: self.client_features,
            features_hi: self.client_features_hi,
        }
    }
}

/// `auth_ok`: the broker's capability advertisement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct AuthOk {
    pub server_flags: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_features: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_features_hi: Option<u64>,
    /// Extra listeners the broker advertises. The client reads it as optional and no
    /// document fixes its shape, so it is carried as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "arbitrary", arbitrary(with = crate::message::fields::arb_opt_json))]
    pub listener_ports: Option<serde_json::Value>,
    /// Per-stream pipelining window, granted only to a client that offered the feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_window: Option<u64>,
}

impl AuthOk {
    /// The advertisement, as negotiation reads it.
    pub fn advertisement(&self) -> BrokerAdvertisement {
        BrokerAdvertisement {
            server_flags: self.server_flags,
            server_features: self.server_features,
            server_features_hi: self.server_features_hi,
            publish_window: self.publish_window,
        }
    }

    /// The advertised features (the `_hi` word only behind the extended marker).
    pub fn features(&self) -> Features {
        Features::from_words(self.server_features, self.server_features_hi)
    }
}

impl From<AuthAnswer> for super::Message {
    fn from(answer: AuthAnswer) -> Self {
        match answer {
            AuthAnswer::Ok => super::Message::Ok,
            AuthAnswer::AuthOk {
                server_flags,
                server_features,
                server_features_hi,
                publish_window,
            } => super::Message::AuthOk(AuthOk {
                server_flags: server_flags.into(),
                server_features: server_features.map(u64::from),
                server_features_hi: server_features_hi.map(u64::from),
                listener_ports: None,
                publish_window: publish_window.map(u64::from),
            }),
        }
    }
}
