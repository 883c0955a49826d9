//! Who may do what: bearer tokens with roles, and the ownership rule every route applies.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The principal of every request when no tokens are configured (only allowed on loopback by default).
pub const ANONYMOUS: &str = "anonymous";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Starts and cancels its calls, manages its sessions, reads and answers the Requests of both.
    Agent,
    /// Reads and answers every Request; reads calls, sessions and servers.
    Approver,
    /// Everything.
    Admin,
}

/// Who is asking: a token's name and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
}

impl Principal {
    /// The principal of a gateway without tokens.
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS.to_owned(),
            role: Role::Admin,
        }
    }

    /// Whether it is the one principal of a gateway without tokens (no token may take its name).
    pub fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS
    }

    /// Whether it may see something owned by `owner` (`None`: owned by the gateway, e.g. a shared session's).
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        self.role != Role::Agent || owner == Some(self.name.as_str())
    }

    /// Whether it may change something owned by `owner`: cancel a call, close a session.
    pub fn may_change(&self, owner: Option<&str>) -> bool {
        self.role == Role::Admin || (self.role == Role::Agent && owner == Some(self.name.as_str()))
    }

    /// Whether it may start calls and open sessions.
    pub fn may_start(&self) -> bool {
        self.role != Role::Approver
    }
}

/// A configured token, kept only as its SHA-256 digest.
#[derive(Debug, Clone)]
pub struct Token {
    pub name: String,
    pub role: Role,
    pub digest: [u8; 32],
}

/// Why a request could not be authenticated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("this route needs a bearer token: send Authorization: Bearer <token>")]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
}

/// Checks bearer tokens against the configured digests.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    tokens: Vec<Token>,
}

impl Authenticator {
    /// An authenticator for these tokens; with none, every request is the anonymous admin.
    pub fn new(tokens: Vec<Token>) -> Self {
        Self { tokens }
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The principal an `Authorization` header value names.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        if !self.enabled() {
            return Ok(Principal::anonymous());
        }
        let authorization = authorization.ok_or(AuthError::Missing)?;
        let (scheme, token) = authorization.trim().split_once(' ').ok_or(AuthError::Invalid)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Invalid);
        }
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        // Every configured digest is compared, in constant time, so timing says nothing about which matched.
        let mut found = None;
        for candidate in &self.tokens {
            if constant_time_eq(&candidate.digest, &digest) {
                found = Some(candidate);
            }
        }
        found
            .map(|token| Principal {
                name: token.name.clone(),
                role: token.role,
            })
            .ok_or(AuthError::Invalid)
    }
}

/// The lowercase hex SHA-256 of a token, as `[[auth.tokens]] sha256` expects.
pub fn digest_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Parses a 64-digit hex SHA-256 digest.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (index, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    Some(digest)
}

/// Names used more than once.
pub fn duplicate_names(tokens: &[Token]) -> Option<&str> {
    let mut seen = HashSet::new();
    tokens
        .iter()
        .map(|token| token.name.as_str())
        .find(|name| !seen.insert(*name))
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |differ, (x, y)| differ | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authenticator() -> Authenticator {
        let token = |name: &str, role, secret: &str| Token {
            name: name.into(),
            role,
            digest: parse_digest(&digest_hex(secret)).unwrap(),
        };
        Authenticator::new(vec![
            token("ci", Role::Agent, "agent-secret"),
            token("ops", Role::Admin, "admin-secret"),
        ])
    }

    #[test]
    fn bearer_tokens_resolve_to_their_principal() {
        let auth = authenticator();
        assert_eq!(auth.authenticate(Some("Bearer agent-secret")).unwrap().name, "ci");
        assert_eq!(
            auth.authenticate(Some("bearer admin-secret")).unwrap().role,
            Role::Admin
        );
        assert_eq!(auth.authenticate(None), Err(AuthError::Missing));
        assert_eq!(auth.authenticate(Some("Bearer nope")), Err(AuthError::Invalid));
        assert_eq!(auth.authenticate(Some("Basic agent-secret")), Err(AuthError::Invalid));
        assert_eq!(auth.authenticate(Some("agent-secret")), Err(AuthError::Invalid));
    }

    #[test]
    fn without_tokens_everyone_is_the_anonymous_admin() {
        assert_eq!(Authenticator::default().authenticate(None), Ok(Principal::anonymous()));
    }

    #[test]
    fn ownership_rules() {
        let agent = Principal {
            name: "ci".into(),
            role: Role::Agent,
        };
        let approver = Principal {
            name: "lead".into(),
            role: Role::Approver,
        };
        let admin = Principal {
            name: "ops".into(),
            role: Role::Admin,
        };
        assert!(agent.may_see(Some("ci")) && !agent.may_see(Some("other")) && !agent.may_see(None));
        assert!(approver.may_see(Some("ci")) && approver.may_see(None));
        assert!(agent.may_change(Some("ci")) && !agent.may_change(Some("other")));
        assert!(!approver.may_change(Some("lead")) && admin.may_change(Some("ci")));
        assert!(agent.may_start() && !approver.may_start() && admin.may_start());
    }

    #[test]
    fn digests_round_trip_through_hex() {
        let hex = digest_hex("abc");
        assert_eq!(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(parse_digest(&hex), Some(Sha256::digest(b"abc").into()));
        assert_eq!(parse_digest("zz"), None);
    }
}
