//! Checking an export of the audit trail, as `toolnexus-gateway audit verify FILE` does: every line is an
//! [`Entry`](super::Entry) whose hash is the hash of its members, and that follows the line before it. The
//! first line follows whatever its `prev` says, unless the hash it must follow is given (the last hash of the
//! previous export, kept elsewhere).

use std::io::BufRead;

use serde_json::{Map, Value};

use super::{GENESIS, MEMBERS, digest};

/// What a verified export holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// How many events it holds.
    pub events: usize,
    /// The ids of its first and last event, if it holds any.
    pub ids: Option<(u64, u64)>,
    /// The hash its first event follows.
    pub follows: Option<String>,
    /// The hash of its last event: what the next export's first event follows.
    pub last: Option<String>,
}

impl std::fmt::Display for Verified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (Some((first, last)), Some(follows), Some(hash)) = (self.ids, &self.follows, &self.last) else {
            return write!(f, "verified 0 events: the export is empty");
        };
        let start = if follows == GENESIS {
            "the start of the chain".to_owned()
        } else {
            follows.clone()
        };
        write!(
            f,
            "verified {} events, ids {first} to {last}, following {start}; last hash {hash}",
            self.events
        )
    }
}

/// Where an export's chain breaks, and why.
#[derive(Debug, thiserror::Error)]
pub enum Broken {
    #[error("cannot read the export: {0}")]
    Read(#[from] std::io::Error),
    /// A line that is not an entry of the audit trail.
    #[error("line {line}: not an audit entry: {why}")]
    Malformed { line: usize, why: String },
    /// A line whose hash is not that of its members.
    #[error("line {line}, event {id}: its hash is not the hash of its members: the event was changed")]
    Changed { line: usize, id: u64 },
    /// A line that does not follow the one before.
    #[error(
        "line {line}, event {id}: it does not follow the line before (it follows {prev}, the line before hashes to \
         {before}): an event was removed, added or moved"
    )]
    Unlinked {
        line: usize,
        id: u64,
        prev: String,
        before: String,
    },
    /// The first line does not follow the hash it was to follow.
    #[error(
        "line 1, event {id}: it follows {prev}, not {expected}: events before it were removed or changed, or the \
         export does not start where the last one ended"
    )]
    Start { id: u64, prev: String, expected: String },
}

/// Checks the export read from `lines`; `follows` is the hash its first event must follow, when it is known.
pub fn verify(lines: impl BufRead, follows: Option<&str>) -> Result<Verified, Broken> {
    let mut verified = Verified {
        events: 0,
        ids: None,
        follows: None,
        last: None,
    };
    for (index, text) in lines.lines().enumerate() {
        let line = index + 1;
        let text = text?;
        let members = parse(&text).map_err(|why| Broken::Malformed { line, why })?;
        let (id, prev, hash) = (
            members["id"].as_u64().unwrap_or_default(),
            text_of(&members, "prev"),
            text_of(&members, "hash"),
        );
        if digest(&members) != hash {
            return Err(Broken::Changed { line, id });
        }
        match (&verified.last, follows) {
            (Some(before), _) if *before != prev => {
                return Err(Broken::Unlinked {
                    line,
                    id,
                    prev,
                    before: before.clone(),
                });
            }
            (None, Some(expected)) if expected != prev => {
                return Err(Broken::Start {
                    id,
                    prev,
                    expected: expected.to_owned(),
                });
            }
            _ => {}
        }
        verified.events += 1;
        verified.ids = Some((verified.ids.map_or(id, |(first, _)| first), id));
        verified.follows.get_or_insert(prev);
        verified.last = Some(hash);
    }
    Ok(verified)
}

/// A line's members, each there and of its type; why not, otherwise.
fn parse(text: &str) -> Result<Map<String, Value>, String> {
    let members: Map<String, Value> = serde_json::from_str(text).map_err(|error| error.to_string())?;
    if let Some(unknown) = members.keys().find(|key| !MEMBERS.contains(&key.as_str())) {
        return Err(format!("it has a member {unknown:?} that entries do not have"));
    }
    for member in MEMBERS {
        let value = members
            .get(member)
            .ok_or_else(|| format!("its member {member:?} is missing"))?;
        let fits = match member {
            "id" => value.is_u64(),
            "call" | "owner" => value.is_string() || value.is_null(),
            "prev" | "hash" => value.as_str().is_some_and(is_hash),
            _ => value.is_string(),
        };
        if !fits {
            return Err(format!("its member {member:?} is not what entries hold: {value}"));
        }
    }
    Ok(members)
}

/// Whether `text` is a hash as entries write them: 64 lowercase hex digits.
pub fn is_hash(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

fn text_of(members: &Map<String, Value>, member: &str) -> String {
    members[member].as_str().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::super::Entry;
    use super::*;
    use crate::records::{Event, EventKind, Tags};
    use crate::time::Timestamp;

    /// An export of `count` events chained from the start, one line each.
    fn export(count: u64) -> Vec<String> {
        let tags = Tags {
            server: "demo",
            session: "ses-1",
            call: None,
            owner: Some("ada"),
        };
        let mut prev = GENESIS.to_owned();
        (1..=count)
            .map(|id| {
                let event = Event {
                    id: id * 3,
                    at: Timestamp::from_millis(1_767_225_600_000 + i64::try_from(id).unwrap()),
                    ..Event::new(EventKind::SessionUpdated, &serde_json::json!({"n": id}), tags)
                };
                let entry = Entry::chained(&event, &prev);
                prev.clone_from(&entry.hash);
                serde_json::to_string(&entry).unwrap()
            })
            .collect()
    }

    fn check(lines: &[String], follows: Option<&str>) -> Result<Verified, Broken> {
        verify(lines.join("\n").as_bytes(), follows)
    }

    #[test]
    fn an_export_verifies_and_says_where_it_ends() {
        let lines = export(4);
        let verified = check(&lines, None).unwrap();
        let last: Value = serde_json::from_str(&lines[3]).unwrap();
        assert_eq!(verified.events, 4);
        assert_eq!(verified.ids, Some((3, 12)));
        assert_eq!(verified.follows.as_deref(), Some(GENESIS));
        assert_eq!(verified.last.as_deref(), last["hash"].as_str());
        assert!(verified.to_string().contains("the start of the chain"), "{verified}");
        let rest = check(&lines[2..], Some(&hash_of(&lines[1]))).unwrap();
        assert_eq!(rest.events, 2, "an export that starts later follows the hash before it");
        assert_eq!(check(&[], None).unwrap().events, 0);
    }

    fn hash_of(line: &str) -> String {
        serde_json::from_str::<Value>(line).unwrap()["hash"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn an_edited_event_is_named_as_changed() {
        let mut lines = export(4);
        lines[2] = lines[2].replace(r#"\"n\":3"#, r#"\"n\":30"#);
        assert!(matches!(check(&lines, None), Err(Broken::Changed { line: 3, id: 9 })));
    }

    #[test]
    fn an_event_edited_with_its_hash_breaks_the_link_after_it() {
        let mut lines = export(4);
        let mut edited: Map<String, Value> = serde_json::from_str(&lines[1]).unwrap();
        edited["owner"] = Value::String("mallory".into());
        edited["hash"] = Value::String(digest(&edited));
        lines[1] = serde_json::to_string(&edited).unwrap();
        assert!(matches!(
            check(&lines, None),
            Err(Broken::Unlinked { line: 3, id: 9, .. })
        ));
    }

    #[test]
    fn a_removed_event_is_named_at_the_line_after_it() {
        let mut lines = export(4);
        lines.remove(1);
        let broken = check(&lines, None).unwrap_err();
        assert!(matches!(broken, Broken::Unlinked { line: 2, id: 9, .. }), "{broken}");
        assert!(broken.to_string().contains("line 2, event 9"), "{broken}");
    }

    #[test]
    fn reordered_events_are_named_where_the_order_breaks() {
        let mut lines = export(4);
        lines.swap(1, 2);
        assert!(matches!(
            check(&lines, None),
            Err(Broken::Unlinked { line: 2, id: 9, .. })
        ));
    }

    #[test]
    fn a_first_event_removed_shows_only_against_the_hash_kept_before() {
        let lines = export(4);
        assert!(check(&lines[1..], None).is_ok(), "nothing inside the export tells");
        assert!(matches!(
            check(&lines[1..], Some(GENESIS)),
            Err(Broken::Start { id: 6, .. })
        ));
    }

    #[test]
    fn a_line_that_is_no_entry_is_named() {
        let mut lines = export(2);
        for (broken, why) in [
            ("not json".to_owned(), "expected"),
            (r#"{"id": 1}"#.to_owned(), "missing"),
            (lines[0].replace(r#""owner""#, r#""other""#), "that entries do not have"),
            (lines[0].replace(r#""id":3"#, r#""id":"3""#), "not what entries hold"),
        ] {
            lines[1] = broken;
            let error = check(&lines, None).unwrap_err();
            assert!(
                matches!(&error, Broken::Malformed { line: 2, why: text } if text.contains(why)),
                "{error}"
            );
        }
    }
}
