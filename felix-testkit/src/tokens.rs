//! Tokens signed by a test's own keys, for engines configured with a JWKS.

use felix_auth::SigningKey;

/// The JWKS document listing `keys` by key id.
pub fn jwks(keys: &[(&str, &SigningKey)]) -> Vec<u8> {
    felix_auth::jwks_document(keys).into_bytes()
}

/// A token for tenant `t1` that may publish to its streams, signed by `key` under `kid`,
/// valid for an hour from [`crate::Net`]'s default start (2026-01-01T00:00:00Z).
pub fn token(kid: &str, key: &SigningKey) -> String {
    let now = 1_767_225_600u64;
    let perms = vec!["stream.publish:stream:t1/*".to_owned()];
    felix_auth::mint_token(
        key,
        kid,
        &felix_auth::Claims::for_tenant("t1", perms, now, 3600),
    )
}
