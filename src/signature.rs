//! Standard Webhooks signatures (standardwebhooks.com): a webhook's `whsec_` secret and the `v1` signature of
//! one delivery, which receivers check with the spec's libraries.

use base64::Engine;
use base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// What a secret starts with, before the base64 of its key.
pub const PREFIX: &str = "whsec_";
/// The shortest and longest keys the spec allows, in bytes.
pub const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// How many random bytes a generated key has: within the spec's range, and as long as the HMAC-SHA256 output.
const GENERATED_BYTES: usize = 32;

/// A webhook's signing secret: the key behind `whsec_<base64>`. Its `Debug` shows no part of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

/// Why a configured secret is not a Standard Webhooks secret; never shows the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("it does not start with {PREFIX}")]
    NoPrefix,
    #[error("what follows {PREFIX} is not base64")]
    NotBase64,
    #[error("its key is {0} bytes, not {min} to {max}", min = KEY_BYTES.start(), max = KEY_BYTES.end())]
    Length(usize),
}

impl Secret {
    /// Parses `whsec_` and the base64 (padded or not) of a key of 24 to 64 bytes.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text.strip_prefix(PREFIX).ok_or(SecretError::NoPrefix)?;
        let key = BASE64.decode(encoded).map_err(|_| SecretError::NotBase64)?;
        if !KEY_BYTES.contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Self(key))
    }

    /// A new secret of 32 bytes from the operating system's random source.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut key = vec![0; GENERATED_BYTES];
        getrandom::fill(&mut key)?;
        Ok(Self(key))
    }

    /// The secret as a config file and the receiver's library take it: `whsec_` and the base64 of the key.
    pub fn expose(&self) -> String {
        format!("{PREFIX}{}", BASE64.encode(&self.0))
    }

    /// A MAC keyed with the secret.
    pub fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }

    /// The `webhook-signature` of one delivery: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The signing vector every library of the spec tests against (e.g. libraries/python's test_sign_function).
    #[test]
    fn signatures_match_the_standard_webhooks_libraries() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn the_id_the_timestamp_and_the_body_are_each_signed() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signed = secret.sign("7", 1614265330, b"{}");
        assert_ne!(secret.sign("8", 1614265330, b"{}"), signed);
        assert_ne!(secret.sign("7", 1614265331, b"{}"), signed);
        assert_ne!(secret.sign("7", 1614265330, b"{ }"), signed);
    }

    #[test]
    fn a_secret_is_whsec_and_the_base64_of_24_to_64_bytes() {
        let key_of = |bytes: usize| format!("{PREFIX}{}", BASE64.encode(vec![7; bytes]));
        assert_eq!(Secret::parse("s3cr3t"), Err(SecretError::NoPrefix));
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Err(SecretError::NoPrefix)
        );
        assert_eq!(Secret::parse("whsec_not base64!"), Err(SecretError::NotBase64));
        assert_eq!(Secret::parse(&key_of(23)), Err(SecretError::Length(23)));
        assert_eq!(Secret::parse(&key_of(65)), Err(SecretError::Length(65)));
        assert_eq!(Secret::parse(&key_of(24)).unwrap().0, vec![7; 24]);
        assert_eq!(Secret::parse(&key_of(64)).unwrap().0, vec![7; 64]);
        // 32 bytes end in one `=`, which some tools leave out.
        let padded = key_of(32);
        assert!(padded.ends_with('='));
        assert_eq!(Secret::parse(padded.trim_end_matches('=')), Secret::parse(&padded));
    }

    #[test]
    fn an_error_or_a_debug_shows_no_part_of_the_secret() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(format!("{secret:?}"), "Secret(***)");
        for text in ["s3cr3t", "whsec_s3cr3t!", "whsec_czNjcjN0"] {
            let error = Secret::parse(text).unwrap_err().to_string();
            assert!(!error.contains("s3cr3t") && !error.contains("czNjcjN0"), "{error}");
        }
    }

    #[test]
    fn generated_secrets_are_new_32_byte_keys_that_parse_back() {
        let first = Secret::generate().unwrap();
        let second = Secret::generate().unwrap();
        assert_ne!(first, second);
        assert_eq!(first.0.len(), 32);
        assert!(first.expose().starts_with(PREFIX));
        assert_eq!(Secret::parse(&first.expose()), Ok(first));
    }
}
