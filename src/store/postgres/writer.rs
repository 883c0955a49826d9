//! The one connection that writes: it takes every change waiting, applies them in one transaction, commits
//! once (group commit), then answers each and has the tail publish their events. Changes that may run
//! alongside each other (answers, calls and sessions as they start and end, and a few Requests raised far from
//! the caps) share transactions, and have their statements pipelined: the connection sends them without
//! waiting for each reply, and the server runs them in the order they arrive (see [`Plan`]).
//!
//! Every replica's transactions commit side by side: each change decides what it reads and writes by the rows'
//! own conditions and locks. A transaction takes only the locks its changes' [`Turn`] needs: the locks of the
//! principals whose caps they check, and the raising lock, shared when it raises a few far from the caps, else
//! alone (BENCHMARKS.md, "Store: PostgreSQL with BEGIN sent alongside and raising in its own turn"); no lock is
//! taken by every transaction ("Fleet: no lock that every transaction takes").
//!
//! An event's id is its transaction's id (`pg_current_xact_id()`, which the transaction takes at its first
//! write; the statement that inserts the event reads it) times [`EVENTS_PER_TRANSACTION`](super::EVENTS_PER_TRANSACTION) plus its place among
//! that transaction's events, so ids follow the order in which transactions took their ids, whatever the order
//! they commit in; the tail publishes an event only once every transaction with a lower id has ended (see
//! [`super::tail`]), where one write lock used to order every transaction (BENCHMARKS.md, "Fleet: one replica
//! vs three"). As nothing waits for the transaction's id, its `BEGIN` and locks are sent with the first
//! change's statements, in one exchange.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::sync::mpsc;
use tokio_postgres::Client;

use super::super::StoreError;
use super::super::shares::Held;
use super::heartbeat::NOT_TAKEN;
use super::tail::{self, Next, Publisher, log_page};
use super::tx::{Raised, Recorded, Sent, Turn, Tx, Work};
use super::written::LastWritten;
use super::{Borrowed, Connector, PRINCIPAL_LOCKS, Statements, unavailable};
use crate::lock;
use crate::time::Clock;

mod plan;

use plan::Plan;

/// How long a transaction of the writer may wait on the gateway (its process stopped, or cut off from the
/// database) before the server ends it, and the connection with it. A transaction waits on the gateway for
/// microseconds while it runs; an open one holds back every replica's events (see [`super::tail`]), and the
/// recovery of its replica's work wherever it holds the rows of calls.
const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(5);

/// The most changes one transaction takes.
const MAX_BATCH: usize = 512;

/// What a change's statements come to; the transaction is rolled back with one that failed.
pub type Outcome<'t> = Pin<Box<dyn Future<Output = Result<Applied, Failed>> + Send + 't>>;

/// A change that was not applied.
pub enum Failed {
    /// It failed, and has told its caller.
    Told,
    /// It ran alongside one that failed, whose error aborted the transaction before its own statements were
    /// done: it runs again, as this job, in the next transaction.
    Again(Job),
    /// It found, before it wrote anything, that it must run alone ([`Tx::run_alone`]): it runs again, as this
    /// job, in a later transaction, and this one goes on.
    Alone(Job),
    /// It lost a conflict with another replica's transaction (a deadlock), or a statement of it found that
    /// what it expected did not hold: the transaction is rolled back, and it runs again, as this job, in the
    /// next one.
    Conflict(Job),
}

/// The statements of one change, run inside the batch's transaction.
pub type Change = Box<dyn for<'t, 'c> FnOnce(&'t mut Tx<'c>) -> Outcome<'t> + Send>;

/// One change.
pub struct Job {
    pub change: Change,
    pub turn: Turn,
    /// The principals whose counts the change checks against a cap (a change run alongside others): its
    /// transaction holds each one's lock from its start until it ends, so that no other replica's change of
    /// them runs meanwhile, and what the change reads of them stays exact until it commits. Such a change
    /// runs apart from the other changes of its transaction (none of their statements runs between its own),
    /// so that it may write what it decided on what it read.
    pub principals: Vec<String>,
    /// What a change raising alongside others locks and adds (see [`Turn::RaisingAlongside`]).
    pub raised: Raised,
    /// Whether the change may end its transaction itself, when it is the transaction's only one (see
    /// [`Tx::closing`]).
    pub may_end: bool,
}

/// A change that was applied, waiting for its transaction to be kept.
pub struct Applied {
    /// Told what became of the transaction; a change that can run again (any but one written behind) returns
    /// itself when another change's failure rolled it back.
    pub reply: Box<dyn FnOnce(Fate) -> Option<Job> + Send>,
}

/// What became of a transaction, as its changes are told.
#[derive(Clone)]
pub enum Fate {
    Kept,
    /// Rolled back, because another of its changes failed: nothing of it was kept.
    RolledBack,
    /// Not kept (its commit failed).
    Lost(StoreError),
}

/// What became of a transaction's `COMMIT`.
struct Kept<'c> {
    result: Result<(), tokio_postgres::Error>,
    /// The read of the log sent behind the `COMMIT` (see [`log_page`]), if one was: its reply comes after the
    /// `COMMIT`'s.
    page: Option<Sent<'c, (crate::store::EventPage, u64)>>,
}

/// Runs the writer until every sender of `jobs` is gone, forgetting what `written` holds each time it connects.
pub async fn run(
    connector: Connector,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    written: Arc<Mutex<LastWritten>>,
    publisher: Arc<Publisher>,
    replica: String,
    clock: Clock,
) {
    let mut conn = None;
    let mut statements = Statements::default();
    while let Some(first) = jobs.recv().await {
        let mut batch = VecDeque::from([first]);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push_back(job),
                Err(_) => break,
            }
        }
        while !batch.is_empty() {
            let client = match conn
                .take()
                .filter(|client: &tokio_postgres::Client| !client.is_closed())
            {
                Some(client) => client,
                None => match connect(&connector, &replica).await {
                    Ok(client) => {
                        statements = Statements::default();
                        // What it wrote on the server it left may be lost, or written again otherwise: after a
                        // failover or a restore, transaction ids are given again.
                        *lock(&written) = LastWritten::default();
                        client
                    }
                    Err(error) => {
                        // Dropped unapplied, each change tells its caller that the store could not make it.
                        tracing::error!(%error, "the store's writer cannot connect");
                        batch.clear();
                        continue;
                    }
                },
            };
            if commit(&client, &statements, &mut batch, &jobs, &publisher, &replica, &clock).await {
                conn = Some(client);
            }
        }
    }
}

/// Applies changes from `batch` in one transaction (see [`Plan`]) until one fails; the ones applied share its
/// fate (the failure rolls them back: a change that fails midway leaves nothing of itself), except those that
/// can run again (any but those written behind), which do in the next transaction, first among the rest; those
/// that moved to run alone run after them, whatever became of the transaction, then those the failure left
/// unrun, then the rest of `batch`. Whether the connection is fit for the next transaction.
async fn commit(
    client: &Client,
    statements: &Statements,
    batch: &mut VecDeque<Job>,
    waiting: &mpsc::UnboundedReceiver<Job>,
    publisher: &Publisher,
    replica: &str,
    clock: &Clock,
) -> bool {
    let Some(plan) = Plan::take(batch) else {
        return true;
    };
    let begin = plan.begin();
    let recorded = Recorded::default();
    // A change alone in its transaction, with none waiting, may have the `COMMIT` sent right behind its last
    // statements, as soon as it has sent them (and before their replies come).
    let alone = batch.is_empty() && waiting.is_empty() && plan.only().is_some_and(|job| job.may_end);
    let sent_last = AtomicBool::new(false);
    let borrowed = Borrowed { client, statements };
    let changes = apply(borrowed, plan, replica, clock, &recorded, alone.then_some(&sent_last));
    // `BEGIN` is sent first, with the first change's statements right behind it, which the server runs once the
    // transaction holds its locks: one exchange for both. Its reply is read while the changes run (a reply left
    // unread stops the connection reading theirs). A failure here aborts the transaction, so every statement
    // after it fails.
    let (
        begun,
        Ran {
            applied,
            mut again,
            moved,
            unrun,
            failed,
        },
        ended,
    ) = {
        let mut work = std::pin::pin!(futures::future::join(client.batch_execute(&begin), changes));
        let (mut ending, mut ended) = (None, None);
        let (begun, ran) = std::future::poll_fn(|cx| {
            let done = work.as_mut().poll(cx);
            if ending.is_none() && sent_last.load(Ordering::Relaxed) {
                ending = Some(Box::pin(keep(borrowed, publisher, replica, recorded.any(), true)));
            }
            if let Some(keeping) = ending.as_mut().filter(|_| ended.is_none())
                && let Poll::Ready(kept) = keeping.as_mut().poll(cx)
            {
                ended = Some(kept);
            }
            done
        })
        .await;
        if ended.is_none()
            && let Some(keeping) = ending
        {
            ended = Some(keeping.await);
        }
        (begun, ran, ended)
    };
    // Behind the changes that run again, in the order they came.
    for job in unrun.into_iter().rev() {
        batch.push_front(job);
    }
    if let Err(error) = begun {
        tracing::error!(%error, "the store cannot start a transaction");
        let usable = roll_back(client).await;
        // Dropped, each change not kept tells its caller that the store could not make it.
        for done in applied {
            drop((done.reply)(Fate::RolledBack));
        }
        batch.clear();
        return usable;
    }
    // An aborted transaction is one a change failed in, whether or not it told its caller.
    let aborted = failed || !again.is_empty();
    if !failed {
        // Every change fails by telling its caller, so this does not happen; dropped, a change's caller is told
        // that it could not be made, rather than running it again for ever.
        again.clear();
    }
    let mut usable = true;
    let mut page = None;
    let kept = match ended {
        // Sent behind the change's last statements (it fails in a transaction an error aborted).
        Some(kept) => Some(kept),
        None if aborted => None,
        None => Some(
            keep(
                borrowed,
                publisher,
                replica,
                recorded.any(),
                batch.is_empty() && waiting.is_empty(),
            )
            .await,
        ),
    };
    let committed = match kept {
        Some(Kept {
            result: Ok(()),
            page: read,
        }) => {
            page = read;
            Ok(())
        }
        Some(Kept { result: Err(error), .. }) if !aborted => {
            if error.code().is_some_and(|code| code.code() == super::MISSED) {
                // Only the statement before `COMMIT` expects anything of a transaction no change failed in.
                tracing::error!("another replica took this one for gone: its changes are not kept");
            } else {
                tracing::error!(%error, "the store could not keep a change; it was not made");
            }
            // A statement that failed before `COMMIT` may leave the transaction open, aborted.
            usable = roll_back(client).await;
            Err(unavailable(&error))
        }
        _ => {
            usable = roll_back(client).await;
            Err(StoreError::Unavailable(
                "another change of the same transaction failed; nothing was changed".to_owned(),
            ))
        }
    };
    let recorded_any = recorded.any();
    let fate = match committed {
        Ok(()) => {
            // Its waiters are told as it commits; streams and webhooks once the tail publishes its events.
            if recorded_any {
                publisher.committed(recorded.kept());
            }
            Fate::Kept
        }
        Err(_) if failed => Fate::RolledBack,
        Err(error) => Fate::Lost(error),
    };
    let mut next = Vec::new();
    for done in applied {
        next.extend((done.reply)(fate.clone()));
    }
    let published = match page {
        Some(page) => page.replies().await.is_ok_and(|read| {
            read.into_iter()
                .all(|(page, newest)| publisher.publish(page, newest) == Next::Done)
        }),
        None => false,
    };
    if matches!(fate, Fate::Kept) && recorded_any && !published {
        publisher.wake();
    }
    // First in the next transaction, in the order they came.
    for job in next.into_iter().chain(again).chain(moved).rev() {
        batch.push_front(job);
    }
    usable
}

/// Commits the transaction, in one exchange: every replica's tail is told, when the transaction commits, that
/// `replica` recorded events, if it did. [`NOT_TAKEN`], sent before the `COMMIT`, fails in a transaction an error
/// aborted, where a `COMMIT` alone would roll it back and report success, and in one of a replica taken for
/// gone; the transaction is kept only if both succeed. It goes as a statement the connection prepared: parsed
/// and planned anew, it took four times longer than it runs, each commit (BENCHMARKS.md, "Store: the round
/// trip's checks planned once"). When `quiet` (no other change waits), the log is read right behind the
/// `COMMIT` too, to publish the events without another exchange (what that read cannot publish, this replica's
/// tail reads again); while changes keep coming, the tail reads once for several commits. It returns as the
/// `COMMIT`'s reply comes, so that the changes are answered before that read's.
async fn keep<'c>(
    borrowed: Borrowed<'c>,
    publisher: &Publisher,
    replica: &str,
    recorded: bool,
    quiet: bool,
) -> Kept<'c> {
    let client = borrowed.client;
    let not_taken = match borrowed.statements.get(client, NOT_TAKEN).await {
        Ok(statement) => statement,
        Err(error) => {
            return Kept {
                result: Err(error),
                page: None,
            };
        }
    };
    let commit = if recorded {
        format!("NOTIFY {}, {}; COMMIT", tail::CHANNEL, escaped_literal(replica))
    } else {
        "COMMIT".to_owned()
    };
    // Sent in this order, each as it is first polled: the check, the `COMMIT`, then the read.
    let mut checking = std::pin::pin!(client.execute(&not_taken, &[]));
    let checked = futures::poll!(checking.as_mut());
    let mut committing = std::pin::pin!(client.batch_execute(&commit));
    let sent = futures::poll!(committing.as_mut());
    let page = if quiet && recorded {
        let last = publisher.last();
        let read: Work<'c, _> = Box::pin(async move { log_page(&borrowed, last, tail::PAGE).await });
        Some(Sent::send(vec![read]).await)
    } else {
        None
    };
    let checked = match checked {
        Poll::Ready(result) => result,
        Poll::Pending => checking.await,
    };
    let committed = match sent {
        Poll::Ready(result) => result,
        Poll::Pending => committing.await,
    };
    Kept {
        result: checked.and(committed),
        page,
    }
}

/// What applying a transaction's changes came to.
struct Ran {
    applied: Vec<Applied>,
    /// The changes to run again in the next transaction.
    again: Vec<Job>,
    /// The changes moved to run alone in later transactions, whatever becomes of this one.
    moved: Vec<Job>,
    /// The changes of the plan not run, as one before them failed: they run in a later transaction.
    unrun: Vec<Job>,
    /// Whether a change failed (and told its caller).
    failed: bool,
}

/// Applies the groups of `plan` in turn, until one fails.
async fn apply<'c>(
    borrowed: Borrowed<'c>,
    plan: Plan,
    replica: &'c str,
    clock: &'c Clock,
    recorded: &'c Recorded,
    end: Option<&'c AtomicBool>,
) -> Ran {
    let mut ran = Ran {
        applied: Vec::new(),
        again: Vec::new(),
        moved: Vec::new(),
        unrun: Vec::new(),
        failed: false,
    };
    let mut groups = plan.groups.into_iter();
    for group in groups.by_ref() {
        let adds = group
            .iter()
            .fold(Held::default(), |adds, job| adds.plus(job.raised.adds));
        let raising = group.iter().any(|job| job.turn == Turn::RaisingAlongside);
        let holders = raising.then(|| super::caps::holders(borrowed));
        let mut txs: Vec<Tx> = group
            .iter()
            .map(|job| Tx {
                borrowed,
                turn: job.turn,
                beside: adds.less(job.raised.adds),
                holders: holders.clone(),
                moved_alone: AtomicBool::new(false),
                replica,
                recorded,
                clock,
                end,
            })
            .collect();
        let outcomes =
            futures::future::join_all(group.into_iter().zip(&mut txs).map(|(job, tx)| (job.change)(tx))).await;
        for outcome in outcomes {
            match outcome {
                Ok(done) => ran.applied.push(done),
                Err(Failed::Told) => ran.failed = true,
                Err(Failed::Again(job)) => ran.again.push(job),
                Err(Failed::Alone(job)) => ran.moved.push(job),
                Err(Failed::Conflict(job)) => {
                    ran.failed = true;
                    ran.again.push(job);
                }
            }
        }
        if ran.failed || !ran.again.is_empty() {
            break;
        }
    }
    ran.unrun = groups.flatten().collect();
    ran
}

/// The statement taking the principals' lock of key `key` (see [`principal_key`]) until the transaction ends.
pub(super) fn principal_lock(key: i32) -> String {
    format!("SELECT pg_advisory_xact_lock({PRINCIPAL_LOCKS}, {key})")
}

/// The key of a principal's lock, among [`PRINCIPAL_LOCKS`]: the FNV-1a hash of its name, the same on every
/// replica. Two principals whose keys are the same share one lock.
pub(super) fn principal_key(principal: &str) -> i32 {
    let hash = principal.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    i32::from_ne_bytes(hash.to_ne_bytes())
}

/// A connection for the writer of replica `replica`: its changes to pending Requests count in that replica's
/// rows of `pending_shares`, and the server ends a transaction of it that waits on the gateway for longer than
/// [`IDLE_IN_TRANSACTION`].
async fn connect(connector: &Connector, replica: &str) -> Result<Client, tokio_postgres::Error> {
    let client = connector.connect().await?;
    client
        .batch_execute(&format!(
            "SET toolnexus.replica = {}; SET idle_in_transaction_session_timeout = {}",
            escaped_literal(replica),
            IDLE_IN_TRANSACTION.as_millis()
        ))
        .await?;
    Ok(client)
}

/// Ends a transaction that is not to be kept; a connection that failed ends it by closing. Whether the
/// connection is fit for another transaction.
async fn roll_back(client: &Client) -> bool {
    match client.batch_execute("ROLLBACK").await {
        Ok(()) => true,
        Err(error) => {
            if !client.is_closed() {
                tracing::warn!(%error, "the store could not roll back a transaction; it connects again");
            }
            false
        }
    }
}

/// `text` as an SQL string literal, whatever `standard_conforming_strings` says.
fn escaped_literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::super::EVENTS_PER_TRANSACTION;
    use super::*;

    #[test]
    fn the_tail_reads_event_ids_as_the_writer_gives_them() {
        let published = super::super::tail::PUBLISHED;
        assert!(
            published.ends_with(&format!(" * {EVENTS_PER_TRANSACTION})")),
            "{published}"
        );
    }

    #[test]
    fn a_principals_lock_is_keyed_the_same_on_every_replica() {
        // FNV-1a of "a" (0xe40c292c), as every replica computes it.
        assert_eq!(principal_key("a"), i32::from_ne_bytes(0xe40c_292c_u32.to_ne_bytes()));
    }

    /// A transaction left open by a writer that stopped is ended by the server, with its connection.
    #[tokio::test]
    async fn the_server_ends_a_writers_transaction_left_open() {
        let url = crate::test_postgres::shared().database();
        let connector = Connector {
            config: url.parse().unwrap(),
        };
        let client = connect(&connector, "replica-stopped").await.unwrap();
        client.batch_execute("BEGIN; SELECT 1").await.unwrap();
        let deadline = std::time::Instant::now() + IDLE_IN_TRANSACTION * 6;
        while !client.is_closed() {
            assert!(std::time::Instant::now() < deadline, "the transaction is still open");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(client.batch_execute("COMMIT").await.is_err());
    }

    #[test]
    fn a_literal_escapes_quotes_and_backslashes() {
        assert_eq!(escaped_literal("vm-1.a_b"), "E'vm-1.a_b'");
        assert_eq!(escaped_literal(r"a'b\c"), r"E'a\'b\\c'");
    }
}
