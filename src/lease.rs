//! Work that one gateway of those sharing a store does at a time (a receiver's deliveries, the audit chain):
//! the gateway holding the work's lease in the store does it, renewing the lease as it goes. When that gateway
//! dies, another takes the work over within [`LEASE`] and one [`RENEW`]; a memory store or a SQLite file has
//! one gateway, which always holds it.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::store::{Lease, Store, StoreError};

/// How long a gateway holds a lease without renewing it.
const LEASE: Duration = Duration::from_secs(15);
/// How often the holder renews the lease (a third of it, so that two renewals may fail), and how often the
/// other gateways ask for it.
const RENEW: Duration = Duration::from_secs(5);

/// Work done by the gateway that holds its lease.
pub trait Leased: Send + Sync + 'static {
    /// Where the work goes on from.
    type Start: Send;

    /// What it is called in logs, and the key its lease (and cursor) are kept under: unique among leased work.
    fn key(&self) -> &str;

    /// Where the work goes on from once this gateway holds the lease; `saved` is the cursor kept with the
    /// lease (`None` until one is saved).
    fn resume(&self, saved: Option<u64>) -> impl Future<Output = Result<Self::Start, StoreError>> + Send;

    /// Does the work from `start`; returns only at `shutdown` (dropped when the lease is lost).
    fn work(&self, start: Self::Start, shutdown: &CancellationToken) -> impl Future<Output = ()> + Send;
}

/// Takes `work`'s lease as `holder` (this gateway, among those sharing the store) now, before the gateway
/// serves, then does the work whenever this gateway holds the lease, until `shutdown`.
pub async fn start<L: Leased>(
    work: L,
    holder: &str,
    store: &Store,
    shutdown: &CancellationToken,
    tracker: &TaskTracker,
) {
    let held = Held {
        work,
        holder: holder.to_owned(),
        store: store.clone(),
    };
    let first = held.take().await;
    tracker.spawn(held.run(first, shutdown.clone()));
}

/// One piece of leased work and where its lease is kept.
struct Held<L> {
    work: L,
    /// Who this gateway is to the other gateways sharing the store.
    holder: String,
    store: Store,
}

/// What an attempt to take a lease came to.
enum Taken<S> {
    /// This gateway does the work, from here.
    Mine(S),
    /// Another gateway holds the lease.
    Elsewhere,
    Failed(StoreError),
}

impl<L: Leased> Held<L> {
    fn key(&self) -> &str {
        self.work.key()
    }

    /// Works while this gateway holds the lease and waits for it while another does, until `shutdown`; `first`
    /// is what the first attempt to take it came to.
    async fn run(self, first: Taken<L::Start>, shutdown: CancellationToken) {
        let mut taken = first;
        loop {
            match taken {
                Taken::Mine(start) => {
                    let held_until = Instant::now() + LEASE;
                    tokio::select! {
                        () = self.work.work(start, &shutdown) => return,
                        () = self.keep(held_until) => {}
                    }
                }
                Taken::Elsewhere => {}
                Taken::Failed(error) => {
                    tracing::warn!(work = %self.key(), %error, "a lease could not be taken");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RENEW) => {}
                () = shutdown.cancelled() => return,
            }
            taken = self.take().await;
        }
    }

    /// Takes the lease, and where the work goes on from.
    async fn take(&self) -> Taken<L::Start> {
        match self.hold().await {
            Ok(Lease::Mine(saved)) => match self.work.resume(saved).await {
                Ok(start) => Taken::Mine(start),
                Err(error) => Taken::Failed(error),
            },
            Ok(Lease::Elsewhere) => Taken::Elsewhere,
            Err(error) => Taken::Failed(error),
        }
    }

    /// Takes or renews the lease.
    async fn hold(&self) -> Result<Lease, StoreError> {
        self.store.hold_webhook(self.key(), &self.holder, LEASE).await
    }

    /// Renews the lease every [`RENEW`]; returns once another gateway holds it, or once it may have run out
    /// (`held_until`, on this process's clock) while the store could not renew it.
    async fn keep(&self, mut held_until: Instant) {
        loop {
            tokio::time::sleep(RENEW).await;
            let asked = Instant::now();
            match self.hold().await {
                Ok(Lease::Mine(_)) => held_until = asked + LEASE,
                Ok(Lease::Elsewhere) => {
                    tracing::warn!(work = %self.key(), "another gateway took the work over");
                    return;
                }
                Err(error) if Instant::now() + RENEW < held_until => {
                    tracing::warn!(work = %self.key(), %error, "a lease could not be renewed");
                }
                Err(error) => {
                    tracing::warn!(work = %self.key(), %error, "a lease may have run out: its work stops");
                    return;
                }
            }
        }
    }
}
