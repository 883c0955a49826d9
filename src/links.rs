//! Signed answer links: a URL that lets whoever opens it answer one Request, as the person it was given to,
//! until the Request's expiry at the latest. The gateway signs what a link says (the Request, its holder, its
//! expiry) with HMAC-SHA256, so a link cannot be made for another Request, another person or a later time
//! without the key. A link answers like that person does through the API: the approver rules of the Request's
//! policy apply, and once the Request has resolved the link answers nothing.

use std::net::SocketAddr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use hmac::Mac;
use serde::{Deserialize, Serialize};

use crate::auth::{Principal, Role, SignIn};
use crate::ids::RequestId;
use crate::signature::Secret;
use crate::store::{Store, StoreError};
use crate::time::Timestamp;

/// The name the store keeps the key it made under.
const STORE_KEY: &str = "links";
/// Where a link's page is served, below the public URL.
pub const PATH: &str = "/r/";
/// What a link's signature covers besides the claims, so that no other signature the gateway makes passes for
/// one.
const CONTEXT: &[u8] = b"toolnexus-gateway answer link v1.";
/// What a sign-in session's signature covers besides its claims: a link is no session, nor a session a link.
const SESSION: &[u8] = b"toolnexus-gateway link session v1.";
/// The longest token taken: a bound on what an unauthenticated request makes the gateway decode.
const MAX_TOKEN: usize = 4096;
/// The longest token made: one that still fits a cookie with room to spare, as a sign-in attempt carries it.
pub const MAX_MADE: usize = 2048;

/// How links are made, from the config.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The address links start with, without a trailing `/`; unset, `http://` and the address listened at.
    pub public_url: Option<String>,
    /// The configured keys, the signing one first; none, the store's.
    pub keys: Vec<Secret>,
    /// Whether a link answers only once its person has signed in at the OpenID provider.
    pub sign_in: bool,
}

/// Makes and reads the links of this gateway.
#[derive(Debug, Clone)]
pub struct Links {
    public_url: String,
    /// The signing key first, then the others that are still taken.
    keys: Vec<Secret>,
    /// Whether a link answers only once its person has signed in.
    pub sign_in: bool,
}

/// Who a link lets answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// The principal that asked for the link (`POST /requests/{id}/links`), to answer from elsewhere.
    Asked(Principal),
    /// Whoever a notification channel sent it to: an address when the channel knows one.
    Sent { channel: String, to: Option<String> },
}

/// What a valid link says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub request: RequestId,
    pub holder: Holder,
    pub expires_at: Timestamp,
}

/// Why a token is no link to answer by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("this is not an answer link of this gateway")]
    Malformed,
    #[error("this link's signature does not match what it says: it was changed, or signed by a key no longer used")]
    Signature,
    #[error("this link has expired")]
    Expired,
}

/// A link's claims as signed: short keys, since they travel in the URL.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Claims {
    #[serde(rename = "r")]
    request: String,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "x")]
    expires_at: i64,
    #[serde(rename = "h")]
    holder: HolderClaims,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", deny_unknown_fields)]
enum HolderClaims {
    /// A principal that asked for it: its identity, name and role, and how it signed in.
    #[serde(rename = "p")]
    Asked {
        id: String,
        name: String,
        role: Role,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        oidc: Option<OidcClaims>,
    },
    #[serde(rename = "s")]
    Sent {
        channel: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OidcClaims {
    issuer: String,
    subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    email: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
}

impl Links {
    /// The links of `settings`, served at `listening`; without configured keys, signed by the key kept in
    /// `store` (made and kept the first time), which every replica of the store shares.
    pub async fn open(settings: Settings, listening: SocketAddr, store: &Store) -> Result<Self, LinksError> {
        let keys = if settings.keys.is_empty() {
            let made = Secret::generate().map_err(LinksError::Random)?.expose();
            let kept = store.kept_key(STORE_KEY, &made).await?;
            vec![Secret::parse(&kept).map_err(|_| LinksError::Kept)?]
        } else {
            settings.keys
        };
        if settings.public_url.is_none() && listening.ip().is_unspecified() {
            tracing::warn!(
                %listening,
                "answer links name an address people cannot open: set public_url to the address they reach the gateway at"
            );
        }
        Ok(Self {
            public_url: settings.public_url.unwrap_or_else(|| format!("http://{listening}")),
            keys,
            sign_in: settings.sign_in,
        })
    }

    /// The address links start with.
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// The URL of `link`'s page.
    pub fn url(&self, link: &Link) -> String {
        self.url_of(&self.token(link))
    }

    /// The URL of the page of the link whose token is `token`.
    pub fn url_of(&self, token: &str) -> String {
        format!("{}{PATH}{token}", self.public_url)
    }

    /// `link` as the token its URL ends with: the base64url of its claims, `.`, and the base64url of their
    /// signature.
    pub fn token(&self, link: &Link) -> String {
        self.sealed(CONTEXT, link)
    }

    /// A sign-in session: the person who signed in for `link`'s Request, sealed for that use alone.
    pub fn session(&self, link: &Link) -> String {
        self.sealed(SESSION, link)
    }

    fn sealed(&self, context: &[u8], link: &Link) -> String {
        let holder = match &link.holder {
            Holder::Asked(principal) => HolderClaims::Asked {
                id: principal.id.clone(),
                name: principal.name.clone(),
                role: principal.role,
                oidc: match &principal.signed_in {
                    SignIn::Oidc {
                        issuer,
                        subject,
                        email,
                        groups,
                    } => Some(OidcClaims {
                        issuer: issuer.clone(),
                        subject: subject.clone(),
                        email: email.clone(),
                        groups: groups.clone(),
                    }),
                    _ => None,
                },
            },
            Holder::Sent { channel, to } => HolderClaims::Sent {
                channel: channel.clone(),
                to: to.clone(),
            },
        };
        let claims = Claims {
            request: link.request.to_string(),
            expires_at: link.expires_at.millis(),
            holder,
        };
        self.seal(context, &claims)
    }

    /// `value` as `<base64url of its JSON>.<base64url of their HMAC-SHA256 under the signing key>`, the MAC
    /// taken over `context` first, so that nothing sealed for one use passes for another.
    pub fn seal<T: Serialize>(&self, context: &[u8], value: &T) -> String {
        let claims = BASE64URL.encode(serde_json::to_vec(value).expect("claims serialize"));
        let signature = BASE64URL.encode(sign(&self.keys[0], context, &claims));
        format!("{claims}.{signature}")
    }

    /// What [`Links::seal`] sealed for `context`, if one of the keys signed it.
    pub fn unseal<T: serde::de::DeserializeOwned>(&self, context: &[u8], sealed: &str) -> Result<T, LinkError> {
        if sealed.len() > MAX_TOKEN {
            return Err(LinkError::Malformed);
        }
        let (claims, signature) = sealed.split_once('.').ok_or(LinkError::Malformed)?;
        let signature = BASE64URL.decode(signature).map_err(|_| LinkError::Malformed)?;
        let signed = self
            .keys
            .iter()
            .any(|key| mac(key, context, claims).verify_slice(&signature).is_ok());
        if !signed {
            return Err(LinkError::Signature);
        }
        let claims = BASE64URL.decode(claims).map_err(|_| LinkError::Malformed)?;
        serde_json::from_slice(&claims).map_err(|_| LinkError::Malformed)
    }

    /// What `token` says, if one of the keys signed it and it has not expired at `now`.
    pub fn read(&self, token: &str, now: Timestamp) -> Result<Link, LinkError> {
        self.opened(CONTEXT, token, now)
    }

    /// What a sign-in session says, if one of the keys signed it as one and it has not expired at `now`.
    pub fn read_session(&self, session: &str, now: Timestamp) -> Result<Link, LinkError> {
        self.opened(SESSION, session, now)
    }

    fn opened(&self, context: &[u8], token: &str, now: Timestamp) -> Result<Link, LinkError> {
        let claims: Claims = self.unseal(context, token)?;
        let request = RequestId::parse(&claims.request).ok_or(LinkError::Malformed)?;
        let expires_at = Timestamp::from_millis(claims.expires_at);
        if now >= expires_at {
            return Err(LinkError::Expired);
        }
        let holder = match claims.holder {
            HolderClaims::Asked { id, name, role, oidc } => Holder::Asked(Principal {
                id,
                name,
                role,
                signed_in: match oidc {
                    Some(oidc) => SignIn::Oidc {
                        issuer: oidc.issuer,
                        subject: oidc.subject,
                        email: oidc.email,
                        groups: oidc.groups,
                    },
                    None => SignIn::Token,
                },
            }),
            HolderClaims::Sent { channel, to } => Holder::Sent { channel, to },
        };
        Ok(Link {
            request,
            holder,
            expires_at,
        })
    }
}

impl Holder {
    /// The principal that answers through the link: the one that asked for it, or, for a link a channel sent,
    /// an approver named by the address it went to (else by the channel).
    pub fn principal(&self) -> Principal {
        match self {
            Holder::Asked(principal) => Principal {
                signed_in: SignIn::Link {
                    asked: Some(Box::new(principal.signed_in.clone())),
                    to: None,
                },
                ..principal.clone()
            },
            Holder::Sent { channel, to } => {
                let name = to.clone().unwrap_or_else(|| channel.clone());
                Principal {
                    id: format!("link:{name}"),
                    name,
                    role: Role::Approver,
                    signed_in: SignIn::Link {
                        asked: None,
                        to: to.clone(),
                    },
                }
            }
        }
    }
}

/// `text` as a link's page and messages show it: each character that changes the direction of the text around
/// it or is invisible (the bidi embeddings, overrides, isolates and marks, zero-width and soft hyphen, word
/// joiners, tags) written as its code point, `⟨U+202E⟩`,
/// so that an argument or prompt cannot reorder what a person reads before deciding.
pub fn visible(text: &str) -> String {
    let hidden = |c: char| {
        matches!(c, '\u{00ad}' | '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}' | '\u{e0000}'..='\u{e007f}')
    };
    if !text.chars().any(hidden) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if hidden(c) {
                format!("⟨U+{:04X}⟩", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The MAC of encoded claims for `context`.
fn mac(key: &Secret, context: &[u8], claims: &str) -> hmac::Hmac<sha2::Sha256> {
    let mut mac = key.mac();
    mac.update(context);
    mac.update(claims.as_bytes());
    mac
}

/// The signature of encoded claims, for `context`.
fn sign(key: &Secret, context: &[u8], claims: &str) -> Vec<u8> {
    mac(key, context, claims).finalize().into_bytes().to_vec()
}

/// Why the links could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LinksError {
    #[error("no random bytes for a new key: {0}")]
    Random(getrandom::Error),
    #[error("the store could not keep the key that signs answer links: {0}")]
    Store(#[from] StoreError),
    #[error("the key the store keeps for answer links is not one (keys.name = 'links'); delete it to make another")]
    Kept,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ids;

    fn links(keys: &[&str]) -> Links {
        Links {
            public_url: "https://gateway.example.com".to_owned(),
            keys: keys.iter().map(|key| Secret::parse(key).unwrap()).collect(),
            sign_in: false,
        }
    }

    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const OTHER: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn link(holder: Holder) -> Link {
        Link {
            request: RequestId::mint(ids::APPROVAL),
            holder,
            expires_at: Timestamp::from_millis(2_000_000_000_000),
        }
    }

    fn oidc() -> Principal {
        Principal {
            id: "https://idp.example.com#alice".to_owned(),
            name: "alice@example.com".to_owned(),
            role: Role::Approver,
            signed_in: SignIn::Oidc {
                issuer: "https://idp.example.com".to_owned(),
                subject: "alice".to_owned(),
                email: Some("alice@example.com".to_owned()),
                groups: vec!["sre".to_owned()],
            },
        }
    }

    #[test]
    fn a_link_reads_back_as_it_was_made_until_it_expires() {
        let links = links(&[KEY]);
        let now = Timestamp::from_millis(1_900_000_000_000);
        for holder in [
            Holder::Asked(Principal::token("lead", Role::Approver)),
            Holder::Asked(oidc()),
            Holder::Sent {
                channel: "sre-mail".to_owned(),
                to: Some("sre@example.com".to_owned()),
            },
            Holder::Sent {
                channel: "sre-slack".to_owned(),
                to: None,
            },
        ] {
            let link = link(holder);
            let url = links.url(&link);
            let token = url.strip_prefix("https://gateway.example.com/r/").unwrap();
            assert_eq!(links.read(token, now), Ok(link.clone()));
            assert_eq!(links.read(token, link.expires_at), Err(LinkError::Expired));
            let later = link.expires_at.after(Duration::from_secs(1));
            assert_eq!(links.read(token, later), Err(LinkError::Expired));
        }
    }

    #[test]
    fn a_changed_or_foreign_link_is_refused() {
        let links = links(&[KEY]);
        let now = Timestamp::from_millis(1_900_000_000_000);
        let token = links.token(&link(Holder::Asked(Principal::token("lead", Role::Approver))));
        let (claims, signature) = token.split_once('.').unwrap();
        // The claims of a link for an admin, with the approver's signature.
        let raised = String::from_utf8(BASE64URL.decode(claims).unwrap())
            .unwrap()
            .replace("approver", "admin");
        let forged = format!("{}.{signature}", BASE64URL.encode(raised));
        assert_eq!(links.read(&forged, now), Err(LinkError::Signature));
        let mut flipped = signature.to_owned().into_bytes();
        flipped[3] = if flipped[3] == b'A' { b'B' } else { b'A' };
        let flipped = format!("{claims}.{}", String::from_utf8(flipped).unwrap());
        assert_eq!(links.read(&flipped, now), Err(LinkError::Signature));
        assert_eq!(self::links(&[OTHER]).read(&token, now), Err(LinkError::Signature));
        // Sealed for another use, the same claims are no link.
        let (claims, _) = token.split_once('.').unwrap();
        let value: serde_json::Value = serde_json::from_slice(&BASE64URL.decode(claims).unwrap()).unwrap();
        let elsewhere = links.seal(b"another use", &value);
        assert_eq!(links.read(&elsewhere, now), Err(LinkError::Signature));
        // A link is no sign-in session, nor a session a link.
        assert_eq!(links.read_session(&token, now), Err(LinkError::Signature));
        let session = links.session(&link(Holder::Asked(Principal::token("lead", Role::Approver))));
        assert_eq!(links.read(&session, now), Err(LinkError::Signature));
        assert!(links.read_session(&session, now).is_ok());
        for malformed in ["", "abc", "a.b.c", &"x".repeat(MAX_TOKEN + 1), claims] {
            assert!(links.read(malformed, now).is_err(), "{malformed}");
        }
    }

    #[test]
    fn a_new_key_signs_and_the_one_before_is_still_taken() {
        let now = Timestamp::from_millis(1_900_000_000_000);
        let link = link(Holder::Asked(Principal::token("lead", Role::Approver)));
        let old = links(&[KEY]).token(&link);
        let rotated = links(&[OTHER, KEY]);
        assert_eq!(rotated.read(&old, now), Ok(link.clone()));
        let new = rotated.token(&link);
        assert_ne!(new, old);
        assert_eq!(links(&[OTHER]).read(&new, now), Ok(link));
    }

    #[test]
    fn direction_changing_and_invisible_characters_are_shown_as_code_points() {
        assert_eq!(visible("plain é"), "plain é");
        assert_eq!(visible("rm \u{202e}fdp.exe"), "rm ⟨U+202E⟩fdp.exe");
        assert_eq!(visible("a\u{2066}b\u{200b}"), "a⟨U+2066⟩b⟨U+200B⟩");
        assert_eq!(visible("ta\u{e0041}g\u{ad}"), "ta⟨U+E0041⟩g⟨U+00AD⟩");
    }

    #[test]
    fn a_link_answers_as_its_holder_through_a_link() {
        let asked = Holder::Asked(oidc()).principal();
        assert_eq!(asked.id, oidc().id);
        assert!(asked.is_listed("group:sre") && asked.is_listed("user:alice"));
        let answerer = asked.answerer();
        assert_eq!(answerer.via, "link");
        assert_eq!(answerer.subject.as_deref(), Some("alice"));
        let sent = Holder::Sent {
            channel: "sre-mail".to_owned(),
            to: Some("bob@example.com".to_owned()),
        }
        .principal();
        assert_eq!((sent.name.as_str(), sent.role), ("bob@example.com", Role::Approver));
        assert!(sent.is_listed("user:bob@example.com"));
        assert!(!sent.is_listed("bob@example.com") && !sent.is_listed("group:sre"));
        // A token of the same name is someone else.
        assert_ne!(sent.id, Principal::token("bob@example.com", Role::Approver).id);
    }
}
