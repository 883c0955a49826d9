//! The tamper-evident audit trail: each event of the store's log carries the hash of the event before it and
//! its own, so that an event changed, removed or moved breaks the chain. The hashes are computed after the
//! fact, in the order of the log, by one chainer per store ([`chainer`]); `GET /audit` exports the chained
//! events as JSON Lines, one [`Entry`] a line, and [`verify`] checks such an export.
//!
//! An event's hash is the lowercase hex SHA-256 of its entry's canonical form: the entry as a JSON object
//! without its `hash` member, keys sorted, no whitespace (see [`Entry::canonical`]). Every member is a string,
//! an integer or null, and `data` is the event's JSON kept as text, byte for byte, so that no verifier has to
//! agree with another on how to write a number.

pub mod chainer;
pub mod verify;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::approvals::canonical_json;
use crate::auth::{digest_hex, hex};
use crate::records::{Event, EventKind};
use crate::time::Timestamp;

/// What the keys of the audit trail's leases start with (webhooks may not take it).
pub const KEY_PREFIX: &str = "audit:";

/// The hash the first event of a chain follows.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The members of an entry, in the order a line writes them; each is required.
pub const MEMBERS: [&str; 10] = [
    "id", "at", "kind", "server", "session", "call", "owner", "data", "prev", "hash",
];

/// An event's place in the chain: its hash, and the hash of the event before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The event's id.
    pub id: u64,
    /// The hash of the event before it in the chain ([`GENESIS`] for the first).
    pub prev: String,
    /// The hash of the event's entry.
    pub hash: String,
}

/// One event of the audit trail, as a line of the export writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = AuditEntry)]
pub struct Entry {
    /// The event's id: its place in the log.
    pub id: u64,
    /// When it was recorded.
    pub at: Timestamp,
    /// Its type, as `GET /events` names it (`request.created`, `call.updated`, …).
    #[schema(value_type = String)]
    pub kind: EventKind,
    /// The server it is about; empty for a posted Request.
    pub server: String,
    /// The session it is about; empty for a posted Request.
    pub session: String,
    /// The call it is about, if any.
    pub call: Option<String>,
    /// The principal that owns what it is about; null for the gateway's own.
    pub owner: Option<String>,
    /// The object that changed, as JSON text exactly as recorded (what `GET /events` sends as `data`).
    pub data: String,
    /// The hash of the event before it in the chain; 64 zeros for the first.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub prev: String,
    /// The SHA-256 of this entry's canonical form, in lowercase hex.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub hash: String,
}

impl Link {
    /// The link of `event` chained after `prev`: its hash, computed from the event as it is, with no entry built.
    pub fn of(event: &Event, prev: &str) -> Self {
        Self {
            id: event.id,
            prev: prev.to_owned(),
            hash: Covered::of(event, prev).hash(),
        }
    }
}

/// What an entry's hash covers, borrowed from its event: every member but `hash`, declared in the order of
/// their names' UTF-8 bytes, so that serde writes it out in the canonical form (`canonical_json` of the same
/// members, as the tests check) without copying the event's data.
#[derive(Serialize)]
struct Covered<'a> {
    at: Timestamp,
    call: Option<&'a str>,
    data: &'a str,
    id: u64,
    kind: EventKind,
    owner: Option<&'a str>,
    prev: &'a str,
    server: &'a str,
    session: &'a str,
}

impl<'a> Covered<'a> {
    fn of(event: &'a Event, prev: &'a str) -> Self {
        Self {
            at: event.at,
            call: event.call.as_deref(),
            data: &event.data,
            id: event.id,
            kind: event.kind,
            owner: event.owner.as_deref(),
            prev,
            server: &event.server,
            session: &event.session,
        }
    }

    /// The lowercase hex SHA-256 of the canonical form, written straight into the hash.
    fn hash(&self) -> String {
        let mut hasher = Hashing(Sha256::new());
        serde_json::to_writer(&mut hasher, self).expect("the covered members serialize");
        hex(&hasher.0.finalize().into())
    }
}

/// A SHA-256 that what is written to goes into.
struct Hashing(Sha256);

impl std::io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Entry {
    /// The entry of `event`, chained after `prev`, with its hash.
    pub fn chained(event: &Event, prev: &str) -> Self {
        Self::linked(event, Link::of(event, prev))
    }

    /// The entry of `event` with the link the store keeps for it.
    pub fn linked(event: &Event, link: Link) -> Self {
        Self {
            id: event.id,
            at: event.at,
            kind: event.kind,
            server: event.server.clone(),
            session: event.session.clone(),
            call: event.call.clone(),
            owner: event.owner.clone(),
            data: event.data.clone(),
            prev: link.prev,
            hash: link.hash,
        }
    }

    /// Its link in the chain.
    pub fn link(&self) -> Link {
        Link {
            id: self.id,
            prev: self.prev.clone(),
            hash: self.hash.clone(),
        }
    }

    /// The hash its members call for (whatever its `hash` says).
    pub fn digest(&self) -> String {
        let Ok(Value::Object(members)) = serde_json::to_value(self) else {
            unreachable!("an entry is a JSON object")
        };
        digest(&members)
    }

    /// Its canonical form: what its hash covers.
    pub fn canonical(&self) -> String {
        let Ok(Value::Object(members)) = serde_json::to_value(self) else {
            unreachable!("an entry is a JSON object")
        };
        canonical(&members)
    }
}

/// The canonical form of an entry's members: every member but `hash`, as JSON with the keys sorted by their
/// UTF-8 bytes and no whitespace, strings escaped as JSON requires and nothing more (`"`, `\` and the control
/// characters; `\b \f \n \r \t` in short, the others as `\u00xx`), non-ASCII written as it is.
pub fn canonical(members: &serde_json::Map<String, Value>) -> String {
    let mut covered = members.clone();
    covered.remove("hash");
    canonical_json(&Value::Object(covered))
}

/// The lowercase hex SHA-256 of the canonical form of an entry's members.
pub fn digest(members: &serde_json::Map<String, Value>) -> String {
    digest_hex(&canonical(members))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Tags;

    /// A `call.updated` event whose data is the text `data`.
    fn event(id: u64, data: &str) -> Event {
        let tags = Tags {
            server: "demo",
            session: "ses-1",
            call: Some("call-1"),
            owner: None,
        };
        Event {
            id,
            at: Timestamp::from_millis(1_767_225_600_000),
            data: data.to_owned(),
            ..Event::new(EventKind::CallUpdated, &(), tags)
        }
    }

    #[test]
    fn the_canonical_form_sorts_the_members_and_keeps_the_data_byte_for_byte() {
        let entry = Entry::chained(&event(7, "{\"z\": 1E+20, \"a\":\"é\\n\u{1}\"}"), GENESIS);
        assert_eq!(
            entry.canonical(),
            format!(
                r#"{{"at":"2026-01-01T00:00:00.000Z","call":"call-1","data":"{{\"z\": 1E+20, \"a\":\"é\\n\u0001\"}}","id":7,"kind":"call.updated","owner":null,"prev":"{GENESIS}","server":"demo","session":"ses-1"}}"#
            )
        );
        let expected: String = Sha256::digest(entry.canonical().as_bytes())
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(entry.hash, expected);
        assert_eq!(entry.digest(), entry.hash);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Text with what the canonical form escapes (quotes, backslashes, every control character) mixed into
        /// any other characters.
        fn text() -> impl Strategy<Value = String> {
            let char = prop_oneof![
                any::<char>(),
                Just('"'),
                Just('\\'),
                (0u8..0x20).prop_map(char::from),
                Just('\u{7f}'),
            ];
            prop::collection::vec(char, 0..48).prop_map(String::from_iter)
        }

        proptest! {
            #[test]
            fn an_events_hash_is_that_of_its_entrys_canonical_form(
                id in any::<u64>(),
                data in text(),
                server in text(),
                owner in proptest::option::of(text()),
            ) {
                let mut event = event(id, &data);
                event.server = server;
                event.owner = owner;
                let entry = Entry::chained(&event, GENESIS);
                prop_assert_eq!(&entry.hash, &entry.digest());
            }
        }
    }

    #[test]
    fn every_member_but_the_hash_is_covered() {
        let entry = Entry::chained(&event(7, r#"{"status":"completed"}"#), GENESIS);
        let line = serde_json::to_value(&entry).unwrap();
        let keys: Vec<&str> = line.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, MEMBERS, "a line writes every member, in order");
        for member in MEMBERS.into_iter().filter(|member| *member != "hash") {
            let mut changed = line.as_object().unwrap().clone();
            changed[member] = Value::String("changed".into());
            assert_ne!(digest(&changed), entry.hash, "{member} is covered");
        }
        let mut rehashed = line.as_object().unwrap().clone();
        rehashed["hash"] = Value::String(GENESIS.into());
        assert_eq!(digest(&rehashed), entry.hash, "the hash covers every member but itself");
        let next = Entry::chained(&event(8, "{}"), &entry.hash);
        assert_eq!(next.prev, entry.hash);
    }
}
