//! Who may do what: bearer tokens with roles, or an OpenID provider's JWTs, and the ownership rule every route
//! applies.

pub mod oidc;

use std::collections::HashSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::records::Answerer;
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

/// Who is asking: a stable identity, which owns what it starts and which every rule compares, a name to show,
/// a role, and how it signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// A token's name, or an OpenID subject's issuer and `sub` ([`oidc::identity`]).
    pub id: String,
    /// What `answeredBy` shows: the token's name, or the configured claim of an OpenID token.
    pub name: String,
    pub role: Role,
    pub signed_in: SignIn,
}

/// How a principal signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignIn {
    /// With a configured token (or as everyone, without tokens).
    Token,
    /// With an OpenID provider's JWT: the provider, its `sub`, its `email` when the provider verified it, and
    /// its groups.
    Oidc {
        issuer: String,
        subject: String,
        email: Option<String>,
        groups: Vec<String>,
    },
    /// With a signed answer link ([`crate::links`]): one a principal asked for itself (`asked`: how it signed
    /// in), or one a notification channel sent (`to`: the address it was sent to, when the channel knows one).
    Link {
        asked: Option<Box<SignIn>>,
        to: Option<String>,
    },
}

impl SignIn {
    /// What proved who the principal is: through a link a principal asked for, how that principal signed in.
    fn proof(&self) -> &SignIn {
        match self {
            SignIn::Link { asked: Some(asked), .. } => asked.proof(),
            other => other,
        }
    }
}

/// How an approval policy's `approvers` entry names a group of the OpenID provider.
pub const GROUP: &str = "group:";
/// How an approval policy's `approvers` entry names an OpenID user, by `sub` or by its verified `email`.
pub const USER: &str = "user:";

/// What an approval policy's `approvers` entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approver<'a> {
    /// `group:<group>`: any OpenID principal in that group.
    Group(&'a str),
    /// `user:<user>`: the OpenID principal whose `sub`, or verified `email`, it is.
    User(&'a str),
    /// A bare name: the configured token of that name.
    Token(&'a str),
}

impl<'a> Approver<'a> {
    /// What `entry` names.
    pub fn parse(entry: &'a str) -> Self {
        if let Some(group) = entry.strip_prefix(GROUP) {
            Self::Group(group)
        } else if let Some(user) = entry.strip_prefix(USER) {
            Self::User(user)
        } else {
            Self::Token(entry)
        }
    }
}

impl Principal {
    /// The principal of a configured token.
    pub fn token(name: &str, role: Role) -> Self {
        Self {
            id: name.to_owned(),
            name: name.to_owned(),
            role,
            signed_in: SignIn::Token,
        }
    }

    /// Who it is, as an answer records it.
    pub fn answerer(&self) -> Answerer {
        let via = match &self.signed_in {
            SignIn::Token => "token",
            SignIn::Oidc { .. } => "oidc",
            SignIn::Link { .. } => "link",
        };
        let (issuer, subject) = match self.signed_in.proof() {
            SignIn::Oidc { issuer, subject, .. } => (Some(issuer.clone()), Some(subject.clone())),
            _ => (None, None),
        };
        Answerer {
            name: self.name.clone(),
            via: via.to_owned(),
            issuer,
            subject,
        }
    }

    /// Whether an approval policy's `approvers` entry names it: `group:<group>` an OpenID principal in that
    /// group, `user:<user>` an OpenID principal by its `sub` or its verified `email` (never by a name its user
    /// may choose), or the address a notification channel sent its link to, and a bare name a configured token.
    /// A link a principal asked for is listed as that principal is.
    pub fn is_listed(&self, entry: &str) -> bool {
        match (Approver::parse(entry), self.signed_in.proof()) {
            (Approver::Group(group), SignIn::Oidc { groups, .. }) => groups.iter().any(|mine| mine == group),
            (Approver::User(user), SignIn::Oidc { subject, email, .. }) => {
                user == subject || email.as_deref() == Some(user)
            }
            (Approver::User(user), SignIn::Link { to, .. }) => to.as_deref() == Some(user),
            (Approver::Token(name), SignIn::Token) => name == self.id,
            _ => false,
        }
    }

    /// The principal of a gateway without tokens.
    pub fn anonymous() -> Self {
        Self::token(ANONYMOUS, Role::Admin)
    }

    /// Whether it is the one principal of a gateway without tokens (no token may take its name).
    pub fn is_anonymous(&self) -> bool {
        self.id == ANONYMOUS
    }

    /// Whether it may see something owned by `owner` (`None`: owned by the gateway, e.g. a shared session's).
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        self.role != Role::Agent || owner == Some(self.id.as_str())
    }

    /// Whether it may change something owned by `owner`: cancel a call, close a session.
    pub fn may_change(&self, owner: Option<&str>) -> bool {
        self.role == Role::Admin || (self.role == Role::Agent && owner == Some(self.id.as_str()))
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
    /// An OpenID token that failed a check, which the message names.
    #[error("the bearer token is not valid: {0}")]
    Rejected(String),
    /// A valid OpenID token that gives no role.
    #[error("{0}")]
    Forbidden(String),
}

/// Checks bearer tokens against the configured digests, and JWTs against the OpenID provider.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    tokens: Vec<Token>,
    oidc: Option<Arc<oidc::Oidc>>,
}

impl Authenticator {
    /// An authenticator for these tokens and this provider; with neither, every request is the anonymous admin.
    pub fn new(tokens: Vec<Token>, oidc: Option<oidc::Oidc>) -> Self {
        Self {
            tokens,
            oidc: oidc.map(Arc::new),
        }
    }

    /// Whether any token or a provider is configured.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty() || self.oidc.is_some()
    }

    /// The OpenID provider, when one is configured.
    pub fn oidc(&self) -> Option<&oidc::Oidc> {
        self.oidc.as_deref()
    }

    /// The principal an `Authorization` header value names: a configured token's, else, when it is a JWT and
    /// a provider is configured, the provider's subject.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        if !self.enabled() {
            return Ok(Principal::anonymous());
        }
        let authorization = authorization.ok_or(AuthError::Missing)?;
        let (scheme, token) = authorization.trim().split_once(' ').ok_or(AuthError::Invalid)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Invalid);
        }
        let token = token.trim();
        match self.configured(token) {
            Some(principal) => Ok(principal),
            None => match &self.oidc {
                Some(oidc) if token.split('.').count() == 3 => oidc.authenticate(token).await,
                _ => Err(AuthError::Invalid),
            },
        }
    }

    /// The principal of a configured token.
    fn configured(&self, token: &str) -> Option<Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Every configured digest is compared, in constant time, so timing says nothing about which matched.
        let mut found = None;
        for candidate in &self.tokens {
            if constant_time_eq(&candidate.digest, &digest) {
                found = Some(candidate);
            }
        }
        found.map(|token| Principal::token(&token.name, token.role))
    }
}

/// The lowercase hex SHA-256 of `text`: of a token, as `[[auth.tokens]] sha256` expects, and of the canonical
/// forms that approvals' and the audit trail's digests cover.
pub fn digest_hex(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()).into())
}

/// A SHA-256 digest in lowercase hex.
pub fn hex(digest: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    hex
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
        Authenticator::new(
            vec![
                token("ci", Role::Agent, "agent-secret"),
                token("ops", Role::Admin, "admin-secret"),
            ],
            None,
        )
    }

    #[tokio::test]
    async fn bearer_tokens_resolve_to_their_principal() {
        let auth = authenticator();
        let principal = auth.authenticate(Some("Bearer agent-secret")).await.unwrap();
        assert_eq!((principal.id.as_str(), principal.name.as_str()), ("ci", "ci"));
        assert_eq!(
            auth.authenticate(Some("bearer admin-secret")).await.unwrap().role,
            Role::Admin
        );
        assert_eq!(auth.authenticate(None).await, Err(AuthError::Missing));
        assert_eq!(auth.authenticate(Some("Bearer nope")).await, Err(AuthError::Invalid));
        assert_eq!(auth.authenticate(Some("Bearer a.b.c")).await, Err(AuthError::Invalid));
        assert_eq!(
            auth.authenticate(Some("Basic agent-secret")).await,
            Err(AuthError::Invalid)
        );
        assert_eq!(auth.authenticate(Some("agent-secret")).await, Err(AuthError::Invalid));
    }

    #[tokio::test]
    async fn without_tokens_everyone_is_the_anonymous_admin() {
        assert_eq!(
            Authenticator::default().authenticate(None).await,
            Ok(Principal::anonymous())
        );
    }

    #[test]
    fn ownership_rules() {
        let agent = Principal::token("ci", Role::Agent);
        let approver = Principal::token("lead", Role::Approver);
        let admin = Principal::token("ops", Role::Admin);
        let namesake = Principal {
            id: oidc::identity("https://idp.example.com", "ci"),
            name: "ci".into(),
            role: Role::Agent,
            signed_in: SignIn::Oidc {
                issuer: "https://idp.example.com".into(),
                subject: "u-17".into(),
                email: Some("ci@example.com".into()),
                groups: vec!["sre".into()],
            },
        };
        assert!(!namesake.may_see(Some("ci")) && !namesake.may_change(Some("ci")));
        assert!(!namesake.is_listed("ci") && namesake.is_listed("group:sre") && !namesake.is_listed("group:ops"));
        assert!(namesake.is_listed("user:ci@example.com") && namesake.is_listed("user:u-17"));
        assert!(
            !namesake.is_listed("user:ci") && !namesake.is_listed("sre"),
            "never by its name"
        );
        assert!(approver.is_listed("lead") && !approver.is_listed("user:lead") && !approver.is_listed("group:lead"));
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
