//! Identifiers: each kind of id is a type of its own, so that one cannot be passed where another is meant.
//!
//! The gateway mints opaque, unguessable ids (a resource prefix followed by a UUID v7); a Request posted to
//! `POST /requests` may bring its own.

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Prefix of Request ids minted by the elicitation bridge.
pub const REQUEST: &str = "elc-";
/// Prefix of Request ids minted for Requests posted to `POST /requests`.
pub const POSTED: &str = "req-";
/// Prefix of the ids of approval Requests, raised before a call an approval policy covers is forwarded.
pub const APPROVAL: &str = "apv-";
/// Prefix of Call ids.
pub const CALL: &str = "call-";
/// Prefix of Session ids.
pub const SESSION: &str = "ses-";
/// Prefix of the ids of standing grants.
pub const GRANT: &str = "grt-";

/// Mints a fresh id with the given prefix.
pub fn mint(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// An id read back from where the gateway stored it.
            pub fn stored(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
    };
}

id_type! {
    /// The id of a Call: `call-` and a UUID v7.
    CallId
}

impl CallId {
    /// Mints the id of a new Call.
    pub fn mint() -> Self {
        Self(mint(CALL))
    }

    /// The Call id a client wrote, if it can name one: an id the gateway did not mint names no Call.
    pub fn parse(text: &str) -> Option<Self> {
        is_minted(text, CALL).then(|| Self(text.to_owned()))
    }
}

id_type! {
    /// The id of an upstream session: `ses-` and a UUID v7.
    SessionId
}

impl SessionId {
    /// Mints the id of a new session.
    pub fn mint() -> Self {
        Self(mint(SESSION))
    }

    /// The session id a client wrote, if it can name one: an id the gateway did not mint names no session.
    pub fn parse(text: &str) -> Option<Self> {
        is_minted(text, SESSION).then(|| Self(text.to_owned()))
    }
}

id_type! {
    /// The id of a standing grant: `grt-` and a UUID v7.
    GrantId
}

impl GrantId {
    /// Mints the id of a new grant.
    pub fn mint() -> Self {
        Self(mint(GRANT))
    }

    /// The grant id a client wrote, if it can name one: an id the gateway did not mint names no grant.
    pub fn parse(text: &str) -> Option<Self> {
        is_minted(text, GRANT).then(|| Self(text.to_owned()))
    }
}

id_type! {
    /// The id of a Request: minted by the gateway (`elc-`, `apv-` or `req-` and a UUID v7), or chosen by the
    /// client that posted it.
    RequestId
}

impl RequestId {
    /// Mints the id of a new Request with the given prefix ([`REQUEST`], [`POSTED`] or [`APPROVAL`]).
    pub fn mint(prefix: &str) -> Self {
        Self(mint(prefix))
    }

    /// The Request id a client wrote, if it can name one: a name ([`is_name`]), the shape of every id minted or
    /// taken.
    pub fn parse(text: &str) -> Option<Self> {
        is_name(text).then(|| Self(text.to_owned()))
    }

    /// Whether it is the id of an approval Request.
    pub fn is_approval(&self) -> bool {
        self.0.starts_with(APPROVAL)
    }
}

/// The longest name: a Request's id is one, and part of a path.
pub const MAX_NAME: usize = 128;

/// Whether `text` is a name, as a Request's id and kind are: 1 to [`MAX_NAME`] of `A-Z a-z 0-9 _ - . :`.
pub fn is_name(text: &str) -> bool {
    (1..=MAX_NAME).contains(&text.len())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// Whether `text` has the shape of an id minted with `prefix`: the prefix and 32 lowercase hex digits.
fn is_minted(text: &str, prefix: &str) -> bool {
    text.strip_prefix(prefix)
        .is_some_and(|uuid| uuid.len() == 32 && uuid.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_unique() {
        let a = CallId::mint();
        let b = CallId::mint();
        assert!(a.as_str().starts_with("call-"));
        assert_ne!(a, b);
        assert!(SessionId::mint().as_str().starts_with("ses-"));
    }

    #[test]
    fn only_minted_ids_parse() {
        let call = CallId::mint();
        assert_eq!(CallId::parse(call.as_str()), Some(call.clone()));
        assert_eq!(SessionId::parse(call.as_str()), None);
        assert_eq!(CallId::parse("call-nope"), None);
        assert_eq!(CallId::parse(&call.as_str().to_uppercase()), None);
        assert_eq!(CallId::parse(&format!("{call}0")), None);
        let session = SessionId::mint();
        assert_eq!(SessionId::parse(session.as_str()), Some(session));
    }

    #[test]
    fn request_ids_are_names() {
        let minted = RequestId::mint(APPROVAL);
        assert!(minted.is_approval());
        assert_eq!(RequestId::parse(minted.as_str()), Some(minted));
        assert!(RequestId::parse("ticket:42_a.b-c").is_some());
        for bad in ["", "a/b", "a b", "ü", &"x".repeat(MAX_NAME + 1)] {
            assert_eq!(RequestId::parse(bad), None, "{bad:?}");
        }
    }
}
