//! Wall-clock timestamps rendered as RFC 3339 UTC, and the clock a gateway reads them from.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::Notify;

/// The wall clock one gateway reads: the system's, moved on by what [`Clock::advance`] added, so that a test
/// can let a Request's hours pass at once for its own gateway while the system clock and every timeout run
/// as they do.
#[derive(Debug, Clone, Default)]
pub struct Clock(Arc<Advance>);

#[derive(Debug, Default)]
struct Advance {
    millis: AtomicU64,
    /// Wakes what sleeps until an instant of this clock, to measure again.
    moved: Notify,
}

impl Clock {
    /// The current instant, to the millisecond: as precise as the API shows it and the store keeps it.
    pub fn now(&self) -> Timestamp {
        Timestamp::from_millis(Timestamp(SystemTime::now() + self.advanced()).millis())
    }

    /// How long from now until `instant` (zero once it has passed).
    pub fn until(&self, instant: Timestamp) -> Duration {
        instant.0.duration_since(self.now().0).unwrap_or_default()
    }

    /// How long since `instant` (zero if it is in the future).
    pub fn since(&self, instant: Timestamp) -> Duration {
        self.now().0.duration_since(instant.0).unwrap_or_default()
    }

    /// Sleeps until this clock reaches `instant`, however it gets there.
    pub async fn sleep_until(&self, instant: Timestamp) {
        self.sleep_while(|| self.until(instant)).await;
    }

    /// Sleeps for `duration` as this clock counts it: the time that passes, plus what [`Clock::advance`] adds
    /// meanwhile. Unlike [`Clock::sleep_until`], a step of the system clock does not lengthen it.
    pub async fn sleep(&self, duration: Duration) {
        let deadline = tokio::time::Instant::now() + duration;
        let advanced_before = self.advanced();
        self.sleep_while(|| {
            let advanced = self.advanced().saturating_sub(advanced_before);
            deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .saturating_sub(advanced)
        })
        .await;
    }

    /// Sleeps until `left` says no time is left, asking it again whenever this clock is moved.
    async fn sleep_while(&self, left: impl Fn() -> Duration) {
        loop {
            let moved = self.0.moved.notified();
            let mut moved = std::pin::pin!(moved);
            moved.as_mut().enable();
            let left = left();
            if left.is_zero() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(left) => {}
                () = moved => {}
            }
        }
    }

    /// What [`Clock::advance`] has added so far.
    fn advanced(&self) -> Duration {
        Duration::from_millis(self.0.millis.load(Ordering::Relaxed))
    }

    /// Moves this clock on by `by` (to the millisecond), waking what sleeps on it.
    pub fn advance(&self, by: Duration) {
        let millis = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0.millis.fetch_add(millis, Ordering::Relaxed);
        self.0.moved.notify_waiters();
    }
}

/// A wall-clock instant that serializes as RFC 3339 UTC with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(SystemTime);

/// From the Unix epoch to 9999-12-31T23:59:59.999Z.
const LAST_WRITABLE: Duration = Duration::from_millis(253_402_300_799_999);

impl Timestamp {
    /// This instant moved forward by `duration`, at the latest the last instant of the year 9999, the last
    /// RFC 3339 can write (a server may give a task a time to live of a million years).
    pub fn after(self, duration: Duration) -> Self {
        let last = SystemTime::UNIX_EPOCH + LAST_WRITABLE;
        Self(self.0.checked_add(duration).map_or(last, |after| after.min(last)))
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

    /// The instant RFC 3339 `text` names.
    pub fn parse(text: &str) -> Option<Self> {
        humantime::parse_rfc3339(text).ok().map(Self)
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

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(deserializer)?;
        humantime::parse_rfc3339(&text)
            .map(Self)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advancing_moves_now_and_what_is_due() {
        let clock = Clock::default();
        let before = clock.now();
        let due = before.after(Duration::from_secs(3600));
        assert!(clock.until(due) > Duration::from_secs(3599));
        clock.advance(Duration::from_secs(3600));
        assert!(clock.since(before) >= Duration::from_secs(3600));
        assert_eq!(clock.until(due), Duration::ZERO);
    }

    #[test]
    fn an_instant_far_ahead_stops_at_the_last_one_rfc_3339_writes() {
        let now = Clock::default().now();
        for far in [Duration::from_millis(u64::MAX), Duration::MAX] {
            let later = now.after(far);
            assert_eq!(later.rfc3339(), "9999-12-31T23:59:59.999Z");
            assert_eq!(serde_json::to_string(&later).unwrap(), "\"9999-12-31T23:59:59.999Z\"");
        }
    }

    #[test]
    fn a_clock_is_its_own_and_its_clones() {
        let (clock, other) = (Clock::default(), Clock::default());
        let shared = clock.clone();
        clock.advance(Duration::from_secs(60));
        assert!(shared.now() >= other.now().after(Duration::from_secs(59)));
    }

    #[tokio::test]
    async fn a_sleep_until_an_instant_ends_when_the_clock_is_moved_past_it() {
        let clock = Clock::default();
        let due = clock.now().after(Duration::from_secs(3600));
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(due).await }
        });
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(3600));
        let woken = tokio::time::timeout(Duration::from_secs(60), sleeper).await;
        woken
            .expect("the sleep did not end with the clock moved past its instant")
            .unwrap();
        assert_eq!(clock.until(due), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_sleep_for_a_while_ends_when_the_clock_is_moved_on_by_it() {
        let clock = Clock::default();
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(1800));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "half the hour is not the hour");
        clock.advance(Duration::from_secs(1800));
        let woken = tokio::time::timeout(Duration::from_secs(60), sleeper).await;
        woken
            .expect("the sleep did not end with the clock moved on by its length")
            .unwrap();
    }
}
