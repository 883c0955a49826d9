//! What a verb written once for both SQL engines runs its statements on: [`Run`] for reads, [`Change`] for a
//! change that records events. SQLite implements them on its connection and its writer's transaction,
//! PostgreSQL on its connections and its writer's transaction.
//!
//! A verb is an `async fn` over them. PostgreSQL awaits it; SQLite runs it with [`at_once`], since each of its
//! statements completes as it is called.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use super::Shared;
use crate::audit::{Entry, Link};
use crate::ids::RequestId;
use crate::records::{CallView, Event, GrantView, RequestView, SessionView};
use crate::store::listing::Dialect;
use crate::store::rows::{self, Columns};
use crate::time::Timestamp;

/// A value both drivers bind as a statement's parameter.
pub trait Bind: rusqlite::ToSql + tokio_postgres::types::ToSql + Sync {}

impl<T: rusqlite::ToSql + tokio_postgres::types::ToSql + Sync> Bind for T {}

/// A statement's text: a pair written once ([`Shared`]), of which each engine takes its own, or text already
/// in the engine's form.
pub trait Text: Sync {
    fn text(&self, dialect: Dialect) -> &str;
}

impl Text for Shared {
    fn text(&self, dialect: Dialect) -> &str {
        match dialect {
            Dialect::Postgres => self.postgres,
            Dialect::Sqlite => self.sqlite,
        }
    }
}

impl Text for str {
    fn text(&self, _: Dialect) -> &str {
        self
    }
}

impl Text for String {
    fn text(&self, _: Dialect) -> &str {
        self
    }
}

/// What a row of either driver reads as.
pub trait Record: Sized {
    fn read<R: Columns>(row: &R) -> Result<Self, R::Error>;
}

/// A value one column holds.
pub trait Column: Sized {
    fn at<R: Columns>(row: &R, at: usize) -> Result<Self, R::Error>;
}

impl Column for String {
    fn at<R: Columns>(row: &R, at: usize) -> Result<Self, R::Error> {
        row.text(at)
    }
}

impl Column for Option<String> {
    fn at<R: Columns>(row: &R, at: usize) -> Result<Self, R::Error> {
        row.text_opt(at)
    }
}

impl Column for i64 {
    fn at<R: Columns>(row: &R, at: usize) -> Result<Self, R::Error> {
        row.integer(at)
    }
}

impl Column for Option<i64> {
    fn at<R: Columns>(row: &R, at: usize) -> Result<Self, R::Error> {
        row.integer_opt(at)
    }
}

impl Column for RequestId {
    fn at<R: Columns>(row: &R, at: usize) -> Result<Self, R::Error> {
        row.text(at).map(RequestId::stored)
    }
}

impl<A: Column> Record for A {
    fn read<R: Columns>(row: &R) -> Result<Self, R::Error> {
        A::at(row, 0)
    }
}

impl<A: Column, B: Column> Record for (A, B) {
    fn read<R: Columns>(row: &R) -> Result<Self, R::Error> {
        Ok((A::at(row, 0)?, B::at(row, 1)?))
    }
}

/// A Request read after its `seq`, as a listing reads it.
impl Record for (i64, RequestView) {
    fn read<R: Columns>(row: &R) -> Result<Self, R::Error> {
        Ok((row.integer(0)?, rows::request_at(row, 1)?))
    }
}

/// The records read with the column lists of `store::rows`.
macro_rules! records {
    ($($record:ty => $read:path),* $(,)?) => {$(
        impl Record for $record {
            fn read<R: Columns>(row: &R) -> Result<Self, R::Error> {
                $read(row)
            }
        }
    )*};
}

records!(
    RequestView => rows::request,
    CallView => rows::call,
    SessionView => rows::session,
    GrantView => rows::grant,
    Entry => rows::entry,
    Link => rows::link,
);

/// A connection, or a transaction, that statements run on.
pub trait Run {
    /// The driver's error.
    type Error;
    /// The form its statements take.
    const DIALECT: Dialect;

    /// Runs `statement`, giving how many rows it changed.
    fn execute(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> impl Future<Output = Result<u64, Self::Error>>;

    /// The rows `statement` reads.
    fn rows<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> impl Future<Output = Result<Vec<T>, Self::Error>>;

    /// The row `statement` reads, if any: it reads one at most (PostgreSQL's driver refuses more).
    fn row<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> impl Future<Output = Result<Option<T>, Self::Error>>;

    /// The one row `statement` reads: the driver's error if it reads none (or, on PostgreSQL, more).
    fn one_row<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> impl Future<Output = Result<T, Self::Error>>;
}

/// A change's transaction: its statements, the time it is made at, and the events it records (published once
/// it is kept).
pub trait Change: Run {
    fn now(&self) -> Timestamp;

    fn record(&mut self, event: Event) -> impl Future<Output = Result<(), Self::Error>>;

    /// Records the change's last event, after which it sends no statement: PostgreSQL sends the transaction's
    /// `COMMIT` right behind it when the change may end its transaction.
    fn record_last(&mut self, event: Event) -> impl Future<Output = Result<(), Self::Error>> {
        self.record(event)
    }
}

/// The value of a verb run on SQLite, whose statements never wait: its future, polled once.
pub fn at_once<T>(verb: impl Future<Output = T>) -> T {
    match pin!(verb).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("a SQLite statement waited"),
    }
}
