//! Compact JWS with EdDSA (Ed25519), the only form a Felix token takes:
//! `base64url(header) . base64url(claims) . base64url(signature)`, unpadded.
//!
//! Parsing and claim checks are ours; the signature math is ed25519-dalek's.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

/// The only `alg` accepted or produced.
pub const ALG_EDDSA: &str = "EdDSA";

#[derive(Debug, Serialize, Deserialize)]
pub struct Header {
    pub alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
}

/// `aud` is a string or an array of strings (RFC 7519 §4.1.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    pub fn contains(&self, aud: &str) -> bool {
        match self {
            Audience::One(a) => a == aud,
            Audience::Many(list) => list.iter().any(|a| a == aud),
        }
    }
}

/// The claims of a Felix token. Unknown claims are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub aud: Audience,
    #[serde(default)]
    pub sub: String,
    pub tid: String,
    pub exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    #[serde(default)]
    pub perms: Vec<String>,
}

impl Claims {
    /// Claims a broker accepts for `tenant`: the expected issuer and audience, issued at
    /// `issued_at` (Unix seconds) and valid for `ttl_secs`.
    pub fn for_tenant(tenant: &str, perms: Vec<String>, issued_at: u64, ttl_secs: u64) -> Claims {
        Claims {
            iss: crate::EXPECTED_ISSUER.to_owned(),
            aud: Audience::One(crate::EXPECTED_AUDIENCE.to_owned()),
            sub: String::new(),
            tid: tenant.to_owned(),
            exp: issued_at.saturating_add(ttl_secs),
            iat: Some(issued_at),
            nbf: None,
            perms,
        }
    }
}

/// Signs `claims` as a compact JWS with `kid` in the header: the one minter, used by dev
/// mode, `felix token` and every test that needs a token.
pub fn mint_token(key: &SigningKey, kid: &str, claims: &Claims) -> String {
    let claims = serde_json::to_vec(claims).expect("claims serialize");
    sign_compact(key, kid, &claims)
}

/// Signs any claims document as a compact JWS with `kid` in the header. Tests use it to make
/// tokens whose claims are wrong in ways [`Claims`] cannot say.
pub fn sign_compact(key: &SigningKey, kid: &str, claims_json: &[u8]) -> String {
    let header = Header {
        alg: ALG_EDDSA.to_owned(),
        typ: Some("JWT".to_owned()),
        kid: Some(kid.to_owned()),
    };
    let header = serde_json::to_vec(&header).expect("header serializes");
    let mut token = URL_SAFE_NO_PAD.encode(header);
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(claims_json));
    let signature = key.sign(token.as_bytes());
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(signature.to_bytes()));
    token
}

/// The JWKS document that publishes each key's public half under its `kid`, as a broker
/// reads it.
pub fn jwks_document(keys: &[(&str, &SigningKey)]) -> String {
    let keys: Vec<serde_json::Value> = keys
        .iter()
        .map(|(kid, key)| {
            let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
            serde_json::json!({
                "kty": "OKP", "crv": "Ed25519", "kid": kid, "x": x, "alg": "EdDSA", "use": "sig",
            })
        })
        .collect();
    serde_json::json!({ "keys": keys }).to_string()
}

/// A token split and decoded, its signature not yet checked.
pub struct Unverified<'a> {
    pub header: Header,
    /// The bytes the signature covers: `header.claims` as sent.
    pub signing_input: &'a [u8],
    pub claims_json: Vec<u8>,
    pub signature: Signature,
}

/// Splits and decodes a compact JWS. The error is a short reason for logs.
pub fn parse(token: &str) -> Result<Unverified<'_>, &'static str> {
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a compact JWS (three dot-separated parts)");
    };
    let header_json = URL_SAFE_NO_PAD
        .decode(h)
        .map_err(|_| "header is not base64url")?;
    let header: Header =
        serde_json::from_slice(&header_json).map_err(|_| "header is not a JWS header")?;
    let claims_json = URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| "claims are not base64url")?;
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| "signature is not base64url")?;
    let sig: [u8; 64] = sig.try_into().map_err(|_| "signature is not 64 bytes")?;
    Ok(Unverified {
        header,
        signing_input: &token.as_bytes()[..h.len() + 1 + c.len()],
        claims_json,
        signature: Signature::from_bytes(&sig),
    })
}

/// Checks an Ed25519 signature strictly (rejecting small-order keys and non-canonical
/// signatures, which plain `verify` lets through).
pub fn signature_ok(key: &VerifyingKey, token: &Unverified<'_>) -> bool {
    key.verify_strict(token.signing_input, &token.signature)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            iss: "felix-auth".into(),
            aud: Audience::One("felix-broker".into()),
            sub: "p1".into(),
            tid: "t1".into(),
            exp: 2000,
            iat: Some(1000),
            nbf: None,
            perms: vec!["stream.publish:stream:t1/*".into()],
        }
    }

    #[test]
    fn minted_tokens_parse_and_verify() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let token = mint_token(&key, "k1", &claims());
        assert_eq!(token.matches('.').count(), 2);
        assert!(!token.contains('='), "unpadded");
        let parsed = parse(&token).unwrap();
        assert_eq!(parsed.header.alg, "EdDSA");
        assert_eq!(parsed.header.kid.as_deref(), Some("k1"));
        assert!(signature_ok(&key.verifying_key(), &parsed));
        let back: Claims = serde_json::from_slice(&parsed.claims_json).unwrap();
        assert_eq!(back, claims());
        let other = SigningKey::from_bytes(&[8u8; 32]);
        assert!(!signature_ok(&other.verifying_key(), &parsed));
    }

    #[test]
    fn a_changed_claim_breaks_the_signature() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let token = mint_token(&key, "k1", &claims());
        let mut forged = claims();
        forged.tid = "t2".into();
        let forged_body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        let parts: Vec<_> = token.split('.').collect();
        let tampered = format!("{}.{}.{}", parts[0], forged_body, parts[2]);
        assert!(!signature_ok(
            &key.verifying_key(),
            &parse(&tampered).unwrap()
        ));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in ["", "a.b", "a.b.c.d", "!!.e30.AAAA", "e30.e30.AAAA"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn audience_is_a_string_or_an_array() {
        let one: Audience = serde_json::from_str(r#""felix-broker""#).unwrap();
        assert!(one.contains("felix-broker"));
        let many: Audience = serde_json::from_str(r#"["x","felix-broker"]"#).unwrap();
        assert!(many.contains("felix-broker"));
        assert!(!many.contains("felix-controlplane"));
    }
}
