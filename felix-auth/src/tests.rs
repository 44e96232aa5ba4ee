use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::SigningKey;

use super::*;

const NOW: u64 = 1_750_000_000;

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn jwks(entries: &[(&str, &SigningKey)]) -> Vec<u8> {
    jwks_document(entries).into_bytes()
}

fn claims() -> Claims {
    Claims {
        iss: EXPECTED_ISSUER.into(),
        aud: Audience::One(EXPECTED_AUDIENCE.into()),
        sub: "p:alice".into(),
        tid: "t1".into(),
        exp: NOW + 900,
        iat: Some(NOW),
        nbf: None,
        perms: vec![
            "stream.publish:stream:t1/default/*".into(),
            "stream.subscribe:stream:t1/*".into(),
            "cache.read:cache:t1/default/c1".into(),
            "rbac.view:tenant:t1".into(),
        ],
    }
}

fn verifier() -> Verifier {
    Verifier::from_jwks(&jwks(&[("k1", &key(1)), ("k2", &key(2))])).unwrap()
}

fn verify_with(c: &Claims) -> Result<Identity, AuthError> {
    verifier().verify(&mint_token(&key(1), "k1", c), "t1", NOW)
}

#[test]
fn a_valid_token_yields_its_identity() {
    let id = verify_with(&claims()).unwrap();
    assert_eq!(id.tenant, "t1");
    assert_eq!(id.subject, "p:alice");
    // rbac.view is not a broker action: parsed away, not refused.
    assert_eq!(id.perms.len(), 3);
    // Either key of the set verifies its own tokens.
    let t2 = mint_token(&key(2), "k2", &claims());
    assert!(verifier().verify(&t2, "t1", NOW).is_ok());
}

#[test]
fn expiry_honours_the_leeway_and_no_more() {
    let mut c = claims();
    c.exp = NOW - CLOCK_SKEW_LEEWAY_SECS + 1;
    assert!(verify_with(&c).is_ok(), "within the leeway");
    c.exp = NOW - CLOCK_SKEW_LEEWAY_SECS;
    let err = verify_with(&c).unwrap_err();
    assert_eq!(err.reason, "expired");
}

#[test]
fn not_yet_valid_tokens_are_refused() {
    let mut c = claims();
    c.nbf = Some(NOW + CLOCK_SKEW_LEEWAY_SECS);
    assert!(verify_with(&c).is_ok());
    c.nbf = Some(NOW + CLOCK_SKEW_LEEWAY_SECS + 1);
    assert!(verify_with(&c).unwrap_err().reason.contains("nbf"));
    let mut c = claims();
    c.iat = Some(NOW + 3600);
    assert!(verify_with(&c).unwrap_err().reason.contains("iat"));
}

#[test]
fn a_wrong_signature_is_refused() {
    // Signed by a key the JWKS does not hold, under a kid it does.
    let token = mint_token(&key(9), "k1", &claims());
    assert_eq!(
        verifier().verify(&token, "t1", NOW).unwrap_err().reason,
        "bad signature"
    );
    // Signed by k2's key but labelled k1.
    let token = mint_token(&key(2), "k1", &claims());
    assert_eq!(
        verifier().verify(&token, "t1", NOW).unwrap_err().reason,
        "bad signature"
    );
    // A flipped signature byte.
    let mut token = mint_token(&key(1), "k1", &claims());
    let last = token.pop().unwrap();
    token.push(if last == 'A' { 'B' } else { 'A' });
    assert!(verifier().verify(&token, "t1", NOW).is_err());
}

#[test]
fn an_unknown_or_missing_kid_is_refused() {
    let token = mint_token(&key(1), "k3", &claims());
    assert!(verifier()
        .verify(&token, "t1", NOW)
        .unwrap_err()
        .reason
        .contains("unknown kid"));
    // A header without kid, signed correctly.
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"EdDSA","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims()).unwrap());
    let input = format!("{header}.{body}");
    use ed25519_dalek::Signer;
    let sig = URL_SAFE_NO_PAD.encode(key(1).sign(input.as_bytes()).to_bytes());
    let token = format!("{input}.{sig}");
    assert_eq!(
        verifier().verify(&token, "t1", NOW).unwrap_err().reason,
        "no kid"
    );
}

#[test]
fn other_algorithms_are_refused() {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","kid":"k1"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims()).unwrap());
    let token = format!("{header}.{body}.{}", URL_SAFE_NO_PAD.encode([0u8; 64]));
    assert!(verifier()
        .verify(&token, "t1", NOW)
        .unwrap_err()
        .reason
        .contains("alg"));
}

#[test]
fn wrong_audience_is_refused_and_arrays_are_accepted() {
    let mut c = claims();
    c.aud = Audience::One("felix-controlplane".into());
    assert!(verify_with(&c).unwrap_err().reason.contains("audience"));
    c.aud = Audience::Many(vec!["felix-controlplane".into()]);
    assert!(verify_with(&c).is_err());
    c.aud = Audience::Many(vec!["other".into(), EXPECTED_AUDIENCE.into()]);
    assert!(verify_with(&c).is_ok());
}

#[test]
fn wrong_issuer_is_refused() {
    let mut c = claims();
    c.iss = "https://login.example.com".into();
    assert!(verify_with(&c).unwrap_err().reason.contains("issuer"));
}

#[test]
fn the_token_tenant_must_be_the_authenticating_tenant() {
    let token = mint_token(&key(1), "k1", &claims());
    let err = verifier().verify(&token, "t2", NOW).unwrap_err();
    assert!(err.reason.contains("tenant"), "{}", err.reason);
}

#[test]
fn oversized_and_garbage_tokens_are_refused() {
    let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
    assert!(verifier().verify(&huge, "t1", NOW).is_err());
    for bad in ["", "probe-token", "a.b.c", "...."] {
        assert!(verifier().verify(bad, "t1", NOW).is_err(), "{bad:?}");
    }
}

#[test]
fn jwks_documents_are_checked() {
    assert!(Verifier::from_jwks(b"not json").is_err());
    assert!(Verifier::from_jwks(br#"{"keys":[]}"#).is_err());
    // An RSA key alone is no usable key; beside an Ed25519 key it is skipped.
    let rsa = r#"{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"}"#;
    assert!(Verifier::from_jwks(format!(r#"{{"keys":[{rsa}]}}"#).as_bytes()).is_err());
    let x = URL_SAFE_NO_PAD.encode(key(1).verifying_key().to_bytes());
    let ed = format!(r#"{{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"{x}"}}"#);
    let v = Verifier::from_jwks(format!(r#"{{"keys":[{rsa},{ed}]}}"#).as_bytes()).unwrap();
    assert!(v
        .verify(&mint_token(&key(1), "k1", &claims()), "t1", NOW)
        .is_ok());
    // Duplicate kid, missing kid, short x.
    assert!(Verifier::from_jwks(format!(r#"{{"keys":[{ed},{ed}]}}"#).as_bytes()).is_err());
    let no_kid = format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}"}}]}}"#);
    assert!(Verifier::from_jwks(no_kid.as_bytes()).is_err());
    let short = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k","x":"AAAA"}]}"#;
    assert!(Verifier::from_jwks(short.as_bytes()).is_err());
}

#[test]
fn dev_mode_token_verifies_and_grants_all_of_t1_only() {
    let (v, token) = Verifier::dev([42u8; 32], NOW);
    let id = v.verify(&token, DEV_TENANT, NOW).unwrap();
    for (action, object) in [
        (Action::StreamPublish, "stream:t1/default/orders"),
        (Action::StreamSubscribe, "stream:t1/any/thing"),
        (Action::StreamManage, "stream:t1/a/b"),
        (Action::CacheRead, "cache:t1/default/c1"),
        (Action::CacheWrite, "cache:t1/x/y"),
        (Action::GroupConsume, "group:t1/default/orders/g1"),
        (Action::GroupManage, "stream:t1/default/orders"),
    ] {
        assert!(id.allows(action, object), "{action} {object}");
        let other = object.replacen("t1", "t2", 1);
        assert!(!id.allows(action, &other), "{action} {other}");
    }
    // Deterministic: the same seed gives the same key and token.
    assert_eq!(Verifier::dev([42u8; 32], NOW).1, token);
    // It expires like any other token.
    assert!(v
        .verify(
            &token,
            DEV_TENANT,
            NOW + DEV_TOKEN_TTL_SECS + CLOCK_SKEW_LEEWAY_SECS
        )
        .is_err());
    assert!(v.verify(&token, "t2", NOW).is_err());
}

fn identity(perms: &[&str]) -> Identity {
    Identity {
        tenant: "t1".into(),
        subject: "s".into(),
        perms: perms.iter().filter_map(|p| Permission::parse(p)).collect(),
    }
}

#[test]
fn permission_matrix_with_wildcards() {
    let id = identity(&[
        "stream.publish:stream:t1/default/*",
        "stream.subscribe:stream:t1/*/orders",
        "cache.read:cache:t1/default/c1",
        "cache.write:cache:t1/*",
    ]);
    let cases = [
        (Action::StreamPublish, "stream:t1/default/orders", true),
        (Action::StreamPublish, "stream:t1/default/x", true),
        (Action::StreamPublish, "stream:t1/other/orders", false),
        (Action::StreamSubscribe, "stream:t1/default/orders", true),
        (Action::StreamSubscribe, "stream:t1/billing/orders", true),
        (Action::StreamSubscribe, "stream:t1/default/payments", false),
        (Action::StreamManage, "stream:t1/default/orders", false),
        (Action::CacheRead, "cache:t1/default/c1", true),
        (Action::CacheRead, "cache:t1/default/c2", false),
        (Action::CacheWrite, "cache:t1/default/c1", true),
        (Action::CacheWrite, "stream:t1/default/c1", false),
        // stream.subscribe implies group.consume on the stream and its groups.
        (Action::GroupConsume, "stream:t1/default/orders", true),
        (Action::GroupConsume, "group:t1/default/orders/g1", true),
        (Action::GroupConsume, "group:t1/default/payments/g1", false),
        (Action::GroupManage, "group:t1/default/orders/g1", false),
    ];
    for (action, object, expected) in cases {
        assert_eq!(id.allows(action, object), expected, "{action} {object}");
    }
}

#[test]
fn no_pattern_reaches_another_tenant() {
    let id = identity(&[
        "stream.publish:stream:*",
        "stream.subscribe:stream:t*",
        "cache.read:cache:*/*/*",
        "tenant.manage:tenant:*",
    ]);
    assert!(id.allows(Action::StreamPublish, "stream:t1/default/orders"));
    assert!(!id.allows(Action::StreamPublish, "stream:t2/default/orders"));
    assert!(!id.allows(Action::StreamSubscribe, "stream:t10/default/orders"));
    assert!(!id.allows(Action::CacheRead, "cache:t2/default/c1"));
    assert!(id.allows(Action::CacheRead, "cache:t1/default/c1"));
    assert!(!id.allows(Action::TenantManage, "tenant:t2"));
    assert!(id.allows(Action::TenantManage, "tenant:t1"));
    // Objects outside every tenant are never granted to a tenant identity.
    assert!(!id.allows(Action::StreamPublish, "cluster:*"));
    assert!(!id.allows(Action::StreamPublish, "stream:"));
    // A tenant prefix is not a tenant: "t1" does not own "t1x".
    assert!(!id.allows(Action::StreamPublish, "stream:t1x/default/orders"));
}

#[test]
fn a_group_scoped_grant_narrows_stream_grants_for_that_action() {
    let id = identity(&[
        "stream.subscribe:stream:t1/default/orders",
        "group.consume:group:t1/default/orders/g1",
    ]);
    assert!(id.allows(Action::GroupConsume, "group:t1/default/orders/g1"));
    assert!(!id.allows(Action::GroupConsume, "group:t1/default/orders/g2"));
    assert!(id.allows(Action::StreamSubscribe, "stream:t1/default/orders"));
}
