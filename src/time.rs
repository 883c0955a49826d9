//! Wall-clock timestamps rendered as RFC 3339 UTC.

use std::time::{Duration, SystemTime};

use serde::{Serialize, Serializer};

/// A wall-clock instant that serializes as RFC 3339 UTC with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(SystemTime);

impl Timestamp {
    /// The current instant, to the millisecond: as precise as the API shows it and the store keeps it.
    pub fn now() -> Self {
        Self::from_millis(Self(SystemTime::now()).millis())
    }

    /// This instant moved forward by `duration`.
    pub fn after(self, duration: Duration) -> Self {
        Self(self.0 + duration)
    }

    /// This instant moved back by `duration` (the epoch at the earliest).
    pub fn before(self, duration: Duration) -> Self {
        Self(self.0.checked_sub(duration).unwrap_or(SystemTime::UNIX_EPOCH))
    }

    /// Milliseconds since the Unix epoch, as the store keeps instants.
    pub fn millis(self) -> i64 {
        let since = self.0.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    }

    /// The instant `millis` milliseconds after the Unix epoch.
    pub fn from_millis(millis: i64) -> Self {
        let millis = u64::try_from(millis).unwrap_or(0);
        Self(SystemTime::UNIX_EPOCH + Duration::from_millis(millis))
    }

    /// How long from now until this instant (zero once it has passed).
    pub fn until(self) -> Duration {
        self.0.duration_since(SystemTime::now()).unwrap_or_default()
    }

    /// How long since this instant (zero if it is in the future).
    pub fn elapsed(self) -> Duration {
        SystemTime::now().duration_since(self.0).unwrap_or_default()
    }

    /// RFC 3339 UTC text, e.g. `2026-01-01T00:00:00.000Z`.
    pub fn rfc3339(self) -> String {
        humantime::format_rfc3339_millis(self.0).to_string()
    }
}

impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::{KnownFormat, ObjectBuilder, SchemaFormat, schema::Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .into()
    }
}

impl utoipa::ToSchema for Timestamp {}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_rfc3339_millis(self.0))
    }
}
