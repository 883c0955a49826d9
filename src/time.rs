//! Wall-clock timestamps rendered as RFC 3339 UTC.

use std::time::{Duration, SystemTime};

use serde::{Serialize, Serializer};

/// A wall-clock instant that serializes as RFC 3339 UTC with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(SystemTime);

impl Timestamp {
    /// The current instant.
    pub fn now() -> Self {
        Self(SystemTime::now())
    }

    /// This instant moved forward by `duration`.
    pub fn after(self, duration: Duration) -> Self {
        Self(self.0 + duration)
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
