//! Felix token verification and permission checks. Pure: the caller passes the time and the
//! JWKS bytes; nothing here reads a clock or a file.
//!
//! A Felix token is a compact JWS signed with Ed25519 (`alg` EdDSA), its header naming the
//! JWKS key by `kid`. Claims: `iss` = "felix-auth", `aud` = "felix-broker" (string or array),
//! `tid` (must equal the tenant the client authenticates for), `exp`, `iat`, optional `nbf`,
//! `sub`, and `perms`, strings like `"stream.publish:stream:t1/default/*"`.

mod jwt;
mod perms;

use std::collections::HashMap;
use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;

pub use ed25519_dalek::{SigningKey, VerifyingKey};
pub use jwt::{jwks_document, mint_token, sign_compact, Audience, Claims};
pub use perms::{
    cache_object, glob_match, name_charset_ok, object_tenant, stream_object, Action, Permission,
    NAME_MAX_BYTES,
};

pub const EXPECTED_ISSUER: &str = "felix-auth";
pub const EXPECTED_AUDIENCE: &str = "felix-broker";
/// Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.
pub const CLOCK_SKEW_LEEWAY_SECS: u64 = 60;
/// Longest token looked at; anything longer is refused before decoding.
pub const MAX_TOKEN_BYTES: usize = 32 * 1024;
/// The tenant dev mode mints its token for.
pub const DEV_TENANT: &str = "t1";
/// The `kid` of the dev-mode key.
pub const DEV_KID: &str = "dev";
/// Lifetime of the dev-mode token.
pub const DEV_TOKEN_TTL_SECS: u64 = 30 * 24 * 3600;

/// A credential was refused. Always answered `unauthenticated`; `reason` is for logs and the
/// error message (it says what was wrong, never anything secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    pub reason: String,
}

impl AuthError {
    fn new(reason: impl Into<String>) -> AuthError {
        AuthError {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "token refused: {}", self.reason)
    }
}

/// The JWKS document could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfigError {
    pub reason: String,
}

impl fmt::Display for AuthConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unusable JWKS: {}", self.reason)
    }
}

impl std::error::Error for AuthConfigError {}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
}

/// Verifies Felix tokens against a fixed set of Ed25519 keys, by `kid`.
#[derive(Clone)]
pub struct Verifier {
    keys: HashMap<String, VerifyingKey>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kids: Vec<_> = self.keys.keys().collect();
        kids.sort();
        f.debug_struct("Verifier").field("kids", &kids).finish()
    }
}

impl Verifier {
    /// Reads a JWKS document: `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":..,"x":..}]}`.
    /// Keys of other types (or for encryption) are skipped; a document with no usable key,
    /// a key without `kid`, a duplicate `kid` or a bad `x` is refused.
    pub fn from_jwks(json: &[u8]) -> Result<Verifier, AuthConfigError> {
        let err = |reason: String| AuthConfigError { reason };
        let jwks: Jwks =
            serde_json::from_slice(json).map_err(|e| err(format!("not a JWKS document: {e}")))?;
        let mut keys = HashMap::new();
        for jwk in jwks.keys {
            let is_ed25519 = jwk.kty == "OKP" && jwk.crv.as_deref() == Some("Ed25519");
            let signs = jwk.use_.as_deref().is_none_or(|u| u == "sig");
            let eddsa = jwk.alg.as_deref().is_none_or(|a| a == jwt::ALG_EDDSA);
            if !(is_ed25519 && signs && eddsa) {
                continue;
            }
            let kid = jwk
                .kid
                .ok_or_else(|| err("an Ed25519 key has no kid".into()))?;
            let x = jwk.x.ok_or_else(|| err(format!("key {kid:?} has no x")))?;
            let raw = URL_SAFE_NO_PAD
                .decode(x.trim_end_matches('='))
                .map_err(|_| err(format!("key {kid:?}: x is not base64url")))?;
            let raw: [u8; 32] = raw
                .try_into()
                .map_err(|_| err(format!("key {kid:?}: x is not 32 bytes")))?;
            let key = VerifyingKey::from_bytes(&raw)
                .map_err(|_| err(format!("key {kid:?}: x is not an Ed25519 public key")))?;
            if keys.insert(kid.clone(), key).is_some() {
                return Err(err(format!("kid {kid:?} appears twice")));
            }
        }
        if keys.is_empty() {
            return Err(err("no Ed25519 signing key".into()));
        }
        Ok(Verifier { keys })
    }

    /// Dev mode: a key derived from `seed` (kid [`DEV_KID`]) and a token for tenant
    /// [`DEV_TENANT`] granting every action on every object of that tenant.
    pub fn dev(seed: [u8; 32], unix_now_secs: u64) -> (Verifier, String) {
        let signing = SigningKey::from_bytes(&seed);
        let verifier = Verifier::with_key(DEV_KID, signing.verifying_key());
        let claims = Claims {
            iss: EXPECTED_ISSUER.into(),
            aud: Audience::One(EXPECTED_AUDIENCE.into()),
            sub: "dev".into(),
            tid: DEV_TENANT.into(),
            exp: unix_now_secs.saturating_add(DEV_TOKEN_TTL_SECS),
            iat: Some(unix_now_secs),
            nbf: None,
            perms: full_permissions(DEV_TENANT),
        };
        (verifier, mint_token(&signing, DEV_KID, &claims))
    }

    /// A verifier trusting one key.
    pub fn with_key(kid: &str, key: VerifyingKey) -> Verifier {
        Verifier {
            keys: HashMap::from([(kid.to_owned(), key)]),
        }
    }

    /// Checks a token for a client authenticating as `tenant`, at `unix_now_secs`.
    pub fn verify(
        &self,
        token: &str,
        tenant: &str,
        unix_now_secs: u64,
    ) -> Result<Identity, AuthError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::new(format!(
                "longer than {MAX_TOKEN_BYTES} bytes"
            )));
        }
        let parsed = jwt::parse(token).map_err(AuthError::new)?;
        if parsed.header.alg != jwt::ALG_EDDSA {
            return Err(AuthError::new(format!(
                "alg {:?} is not EdDSA",
                parsed.header.alg
            )));
        }
        let kid = parsed
            .header
            .kid
            .as_deref()
            .ok_or_else(|| AuthError::new("no kid"))?;
        let key = self
            .keys
            .get(kid)
            .ok_or_else(|| AuthError::new(format!("unknown kid {kid:?}")))?;
        if !jwt::signature_ok(key, &parsed) {
            return Err(AuthError::new("bad signature"));
        }
        // Only now, with the signature good, is anything in the claims believed.
        let claims: Claims = serde_json::from_slice(&parsed.claims_json)
            .map_err(|e| AuthError::new(format!("claims do not parse: {e}")))?;
        if claims.iss != EXPECTED_ISSUER {
            return Err(AuthError::new(format!(
                "issuer {:?} is not {EXPECTED_ISSUER}",
                claims.iss
            )));
        }
        if !claims.aud.contains(EXPECTED_AUDIENCE) {
            return Err(AuthError::new(format!(
                "audience is not {EXPECTED_AUDIENCE}"
            )));
        }
        let leeway = CLOCK_SKEW_LEEWAY_SECS;
        if unix_now_secs >= claims.exp.saturating_add(leeway) {
            return Err(AuthError::new("expired"));
        }
        if claims
            .nbf
            .is_some_and(|nbf| nbf > unix_now_secs.saturating_add(leeway))
        {
            return Err(AuthError::new("not valid yet (nbf)"));
        }
        if claims
            .iat
            .is_some_and(|iat| iat > unix_now_secs.saturating_add(leeway))
        {
            return Err(AuthError::new("issued in the future (iat)"));
        }
        if claims.tid != tenant {
            return Err(AuthError::new(format!(
                "token is for tenant {:?}, not {tenant:?}",
                claims.tid
            )));
        }
        Ok(Identity {
            perms: claims
                .perms
                .iter()
                .filter_map(|p| Permission::parse(p))
                .collect(),
            tenant: claims.tid,
            subject: claims.sub,
        })
    }
}

/// The tenant a token names, read WITHOUT verifying it: only to choose the tenant to verify
/// it for (`GET /v1/streams` names none), never to grant anything.
pub fn claimed_tenant(token: &str) -> Option<String> {
    if token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let parsed = jwt::parse(token).ok()?;
    let claims: Claims = serde_json::from_slice(&parsed.claims_json).ok()?;
    Some(claims.tid)
}

/// Every broker-relevant permission over every object of `tenant`.
pub fn full_permissions(tenant: &str) -> Vec<String> {
    Action::ALL
        .into_iter()
        .map(|action| {
            let object = match action {
                Action::StreamPublish
                | Action::StreamSubscribe
                | Action::StreamManage
                | Action::StreamView
                | Action::GroupConsume
                | Action::GroupManage => format!("stream:{tenant}/*"),
                Action::CacheRead
                | Action::CacheWrite
                | Action::CacheManage
                | Action::CacheView => {
                    format!("cache:{tenant}/*")
                }
                Action::NsManage => format!("namespace:{tenant}/*"),
                Action::TenantManage => format!("tenant:{tenant}"),
                // Not a tenant's object: a full (dev) token may run cluster operations.
                Action::NodeManage => "cluster:*".to_owned(),
            };
            format!("{action}:{object}")
        })
        .collect()
}

/// Who a verified token speaks for, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tenant: String,
    pub subject: String,
    pub perms: Vec<Permission>,
}

impl Identity {
    /// True when a permission grants `action` over `object` (e.g. "stream:t1/default/orders").
    ///
    /// An object outside this identity's tenant is never allowed, whatever the patterns say.
    /// `stream.subscribe` also grants `group.consume`, and `stream.manage` `group.manage`,
    /// over a stream and its groups (`group:T/ns/stream/group`); once a token grants one of
    /// the group actions on any `group:` object, stream grants stop covering groups for that
    /// action (it is scoped to the groups it names).
    /// Whether the token grants `action` on a cluster-wide object (`cluster:…`), which
    /// belongs to no tenant: `node.manage:cluster:*` grants every cluster operation.
    pub fn allows_cluster(&self, action: Action, object: &str) -> bool {
        object.starts_with("cluster:")
            && self
                .perms
                .iter()
                .any(|p| p.action == action && glob_match(&p.object, object))
    }

    pub fn allows(&self, action: Action, object: &str) -> bool {
        if object_tenant(object) != Some(self.tenant.as_str()) {
            return false;
        }
        let grants = |a: Action, obj: &str| {
            self.perms
                .iter()
                .any(|p| p.action == a && glob_match(&p.object, obj))
        };
        let implied_by = match action {
            Action::GroupConsume => Some(Action::StreamSubscribe),
            Action::GroupManage => Some(Action::StreamManage),
            _ => None,
        };
        if grants(action, object) {
            return true;
        }
        let Some(implied_by) = implied_by else {
            return false;
        };
        let stream = match object.strip_prefix("group:") {
            Some(path) => {
                let group_scoped = self
                    .perms
                    .iter()
                    .any(|p| p.action == action && p.object.starts_with("group:"));
                if group_scoped {
                    return false;
                }
                // group:T/ns/stream/group → stream:T/ns/stream
                match path.rsplit_once('/') {
                    Some((stream_path, _group)) => format!("stream:{stream_path}"),
                    None => return false,
                }
            }
            None => object.to_owned(),
        };
        grants(action, &stream) || grants(implied_by, &stream)
    }
}

#[cfg(test)]
mod tests;
