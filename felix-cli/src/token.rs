//! `felix token`: mint Felix tokens (EdDSA JWTs, as the control plane does) from an Ed25519
//! key file, and generate such keys with the JWKS a broker verifies them with
//! (`FELIX_AUTH_JWKS_FILE`). All cryptography is ed25519-dalek's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Args};
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use ed25519_dalek::SigningKey;

use crate::failure::Failure;

/// The issuer and audience a broker requires.
const ISSUER: &str = felix_auth::EXPECTED_ISSUER;
const BROKER_AUDIENCE: &str = felix_auth::EXPECTED_AUDIENCE;

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("source").required(true).args(["key", "generate_key"])))]
pub(crate) struct TokenArgs {
    /// Signing key: a PKCS#8 PEM Ed25519 private key, or a 32-byte seed in hex.
    #[arg(long, value_name = "PATH")]
    key: Option<PathBuf>,
    /// Write a new private key (PKCS#8 PEM, mode 0600; never overwrites) and print its JWKS.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["perm", "jwks"])]
    generate_key: Option<PathBuf>,
    /// Key id, in the token header and the JWKS.
    #[arg(long)]
    kid: String,
    /// With --key: print the key's JWKS instead of a token.
    #[arg(long)]
    jwks: bool,
    /// Tenant the token is for (claim `tid`).
    #[arg(long, env = "FELIX_TENANT", default_value = "t1")]
    tenant: String,
    /// A permission, ACTION:OBJECT (e.g. stream.publish:stream:t1/default/*); repeat for
    /// more. Default: every permission over the tenant.
    #[arg(long, value_name = "ACTION:OBJECT")]
    perm: Vec<String>,
    /// Lifetime of the token.
    #[arg(long, default_value = "1h", value_parser = crate::duration::parse)]
    ttl: Duration,
    /// Subject (claim `sub`).
    #[arg(long, default_value = "felix-cli")]
    sub: String,
    /// Audience (claim `aud`): felix-broker, or felix-controlplane for the control plane.
    #[arg(long, default_value = BROKER_AUDIENCE)]
    audience: String,
}

pub(crate) fn run(args: TokenArgs) -> Result<(), Failure> {
    let output = if let Some(path) = &args.generate_key {
        let key = SigningKey::generate(&mut rand_core::OsRng);
        write_new_key(path, &key)?;
        jwks(&key, &args.kid)
    } else {
        let path = args
            .key
            .as_ref()
            .ok_or_else(|| Failure::usage("pass --key or --generate-key"))?;
        let key = read_key(path)?;
        if args.jwks {
            jwks(&key, &args.kid)
        } else {
            let perms = if args.perm.is_empty() {
                full_permissions(&args.tenant)
            } else {
                args.perm
                    .iter()
                    .map(|p| check_perm(p))
                    .collect::<Result<_, _>>()?
            };
            let claims = Claims {
                tenant: &args.tenant,
                subject: &args.sub,
                audience: &args.audience,
                perms,
                issued_at: unix_now()?,
                ttl: args.ttl,
            };
            mint(&key, &args.kid, &claims)
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{output}").map_err(|e| Failure::io("writing stdout", e))
}

/// What a minted token says.
pub(crate) struct Claims<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) subject: &'a str,
    pub(crate) audience: &'a str,
    pub(crate) perms: Vec<String>,
    pub(crate) issued_at: u64,
    pub(crate) ttl: Duration,
}

/// A compact JWS: base64url(header).base64url(claims).base64url(Ed25519 signature), minted by
/// `felix_auth`, the one minter the broker's own dev mode and every test use.
pub(crate) fn mint(key: &SigningKey, kid: &str, claims: &Claims<'_>) -> String {
    let claims = felix_auth::Claims {
        iss: ISSUER.to_owned(),
        aud: felix_auth::Audience::One(claims.audience.to_owned()),
        sub: claims.subject.to_owned(),
        tid: claims.tenant.to_owned(),
        exp: claims.issued_at.saturating_add(claims.ttl.as_secs().max(1)),
        iat: Some(claims.issued_at),
        nbf: None,
        perms: claims.perms.clone(),
    };
    felix_auth::mint_token(key, kid, &claims)
}

/// The JWKS document holding the key's public half.
pub(crate) fn jwks(key: &SigningKey, kid: &str) -> String {
    felix_auth::jwks_document(&[(kid, key)])
}

/// Every permission a broker (and the tenant's control-plane scope) knows, over all of the
/// tenant's objects.
pub(crate) fn full_permissions(tenant: &str) -> Vec<String> {
    felix_auth::full_permissions(tenant)
}

/// `ACTION:KIND:PATH`, each part non-empty; anything else would silently grant nothing.
fn check_perm(perm: &str) -> Result<String, Failure> {
    let well_formed = perm
        .split_once(':')
        .and_then(|(action, object)| {
            let (kind, path) = object.split_once(':')?;
            let action_ok = !action.is_empty()
                && action
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_');
            Some(action_ok && !kind.is_empty() && !path.is_empty())
        })
        .unwrap_or(false);
    if well_formed {
        Ok(perm.to_owned())
    } else {
        Err(Failure::usage(format!(
            "--perm {perm:?} is not ACTION:OBJECT, e.g. stream.publish:stream:t1/default/*"
        )))
    }
}

/// Reads a PKCS#8 PEM private key, or a hex seed.
pub(crate) fn read_key(path: &Path) -> Result<SigningKey, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read the key {}: {e}", path.display())))?;
    parse_key(&text).map_err(|e| Failure::usage(format!("key {}: {e}", path.display())))
}

fn parse_key(text: &str) -> Result<SigningKey, String> {
    let text = text.trim();
    if text.starts_with("-----BEGIN") {
        return SigningKey::from_pkcs8_pem(text)
            .map_err(|e| format!("not a PKCS#8 Ed25519 private key: {e}"));
    }
    let seed = hex::decode(text).map_err(|_| "neither PEM nor a hex seed".to_string())?;
    let seed: [u8; 32] = seed
        .try_into()
        .map_err(|s: Vec<u8>| format!("a hex seed must be 32 bytes, this is {}", s.len()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Writes the key as PKCS#8 PEM, readable by the owner only, refusing to replace a file.
fn write_new_key(path: &Path, key: &SigningKey) -> Result<(), Failure> {
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| Failure::usage(format!("cannot encode the key: {e}")))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| Failure::usage(format!("cannot create {}: {e}", path.display())))?;
    file.write_all(pem.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| Failure::io(&format!("writing {}", path.display()), e))
}

fn unix_now() -> Result<u64, Failure> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|_| Failure::usage("the system clock is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use ed25519_dalek::{Signature, Verifier};
    use serde_json::json;

    fn decode_json(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn minted_tokens_verify_and_carry_the_claims() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let claims = Claims {
            tenant: "t9",
            subject: "alice",
            audience: BROKER_AUDIENCE,
            perms: vec!["cache.read:cache:t9/*".into()],
            issued_at: 1_000,
            ttl: Duration::from_secs(60),
        };
        let token = mint(&key, "k1", &claims);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header = decode_json(parts[0]);
        assert_eq!(header["alg"], "EdDSA");
        assert_eq!(header["kid"], "k1");
        let body = decode_json(parts[1]);
        assert_eq!(body["iss"], "felix-auth");
        assert_eq!(body["aud"], "felix-broker");
        assert_eq!(body["tid"], "t9");
        assert_eq!(body["sub"], "alice");
        assert_eq!(body["iat"], 1_000);
        assert_eq!(body["exp"], 1_060);
        assert_eq!(body["perms"], json!(["cache.read:cache:t9/*"]));

        let signature: [u8; 64] = URL_SAFE_NO_PAD
            .decode(parts[2])
            .unwrap()
            .try_into()
            .unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        let public = key.verifying_key();
        public
            .verify(signed.as_bytes(), &Signature::from_bytes(&signature))
            .expect("signature verifies");
        let tampered = signed.replace(parts[1], &URL_SAFE_NO_PAD.encode(b"{}"));
        assert!(public
            .verify(tampered.as_bytes(), &Signature::from_bytes(&signature))
            .is_err());
    }

    #[test]
    fn the_jwks_holds_the_public_key() {
        let key = SigningKey::from_bytes(&[9u8; 32]);
        let doc: serde_json::Value = serde_json::from_str(&jwks(&key, "k2")).unwrap();
        let jwk = &doc["keys"][0];
        assert_eq!(jwk["kty"], "OKP");
        assert_eq!(jwk["crv"], "Ed25519");
        assert_eq!(jwk["kid"], "k2");
        let x = URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap();
        assert_eq!(x, key.verifying_key().as_bytes());
    }

    #[test]
    fn keys_read_from_pem_and_from_hex_seeds() {
        let key = SigningKey::from_bytes(&[3u8; 32]);
        let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(parse_key(&pem).unwrap().to_bytes(), [3u8; 32]);
        let seed_hex = format!("{}\n", hex::encode([3u8; 32]));
        assert_eq!(parse_key(&seed_hex).unwrap().to_bytes(), [3u8; 32]);
        assert!(parse_key("abcd").unwrap_err().contains("32 bytes"));
        assert!(parse_key("not a key").is_err());
        assert!(parse_key("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----").is_err());
    }

    #[test]
    fn generated_keys_are_private_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        let key = SigningKey::from_bytes(&[5u8; 32]);
        write_new_key(&path, &key).unwrap();
        assert_eq!(read_key(&path).unwrap().to_bytes(), [5u8; 32]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        }
        assert_eq!(
            write_new_key(&path, &SigningKey::from_bytes(&[6u8; 32]))
                .unwrap_err()
                .exit_code(),
            2
        );
        assert_eq!(read_key(&path).unwrap().to_bytes(), [5u8; 32]);
    }

    #[test]
    fn permissions_are_checked_for_shape() {
        assert!(check_perm("stream.publish:stream:t1/default/*").is_ok());
        assert!(check_perm("tenant.manage:tenant:t1").is_ok());
        for bad in [
            "stream.publish",
            "stream.publish:stream",
            ":stream:t1/x",
            "a:b:",
        ] {
            assert!(check_perm(bad).is_err(), "{bad}");
        }
        let all = full_permissions("t1");
        assert!(all.contains(&"stream.publish:stream:t1/*".to_string()));
        assert!(all.contains(&"cache.write:cache:t1/*".to_string()));
        assert!(all.iter().all(|p| check_perm(p).is_ok()));
    }
}
