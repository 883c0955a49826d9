//! The connections to the database: how to reach it, and the statements each has prepared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, NoTls, Row, Statement};

use crate::lock;
use crate::store::listing::Dialect;
use crate::store::sql::{Bind, Record, Run, Text};

/// How to reach the database.
#[derive(Clone)]
pub struct Connector {
    pub(super) config: tokio_postgres::Config,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

impl Connector {
    /// A new connection, driven on a task of its own until it closes.
    pub async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "a store connection ended");
            }
        });
        Ok(client)
    }
}

/// The statements a connection has prepared, by their SQL.
#[derive(Debug, Default)]
pub struct Statements(Mutex<HashMap<String, Statement>>);

impl Statements {
    /// `sql`, prepared once on the connection `client` belongs to.
    pub async fn get(&self, client: &impl GenericClient, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = lock(&self.0).get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql).await?;
        lock(&self.0).insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// A connection with the statements it has prepared.
#[derive(Debug)]
pub struct Conn {
    pub client: Client,
    statements: Statements,
}

impl Conn {
    pub(super) fn new(client: Client) -> Self {
        Self {
            client,
            statements: Statements::default(),
        }
    }
}

/// A read connection, made again by the first read that finds it missing or closed.
#[derive(Debug, Default)]
pub struct ReadSlot {
    conn: Mutex<Option<Arc<Conn>>>,
    /// Held while the connection is made: the reads that find it missing meanwhile wait for that connection
    /// rather than each making one (a burst of reads on a new replica, or after the database restarted, would
    /// otherwise open a connection each, up to the server's limit).
    connecting: tokio::sync::Mutex<()>,
    /// How many times the connection was made or failed to be.
    attempts: AtomicU64,
}

impl ReadSlot {
    /// The slot's connection, made with `connector` if it has none open; `None` if making it failed, here or
    /// in the attempt this read waited for.
    pub async fn conn(&self, connector: &Connector) -> Result<Arc<Conn>, Option<tokio_postgres::Error>> {
        let open = || {
            lock(&self.conn)
                .as_ref()
                .filter(|conn| !conn.client.is_closed())
                .cloned()
        };
        if let Some(conn) = open() {
            return Ok(conn);
        }
        let attempts = self.attempts.load(Ordering::Acquire);
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = open() {
            return Ok(conn);
        }
        if self.attempts.load(Ordering::Acquire) != attempts {
            return Err(None);
        }
        let made = connector.connect().await;
        self.attempts.fetch_add(1, Ordering::Release);
        let conn = Arc::new(Conn::new(made.map_err(Some)?));
        *lock(&self.conn) = Some(conn.clone());
        Ok(conn)
    }
}

/// What reads run on: a read connection, or the writer inside its transaction or between two. Each statement
/// is prepared once per connection.
pub trait Reader: Sync {
    /// The connection and the statements it has prepared.
    fn borrowed(&self) -> Borrowed<'_>;

    /// The rows of `sql`.
    fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send {
        let Borrowed { client, statements } = self.borrowed();
        async move { client.query(&statements.get(client, sql).await?, params).await }
    }

    /// The one row of `sql`, if any.
    fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Option<Row>, tokio_postgres::Error>> + Send {
        let Borrowed { client, statements } = self.borrowed();
        async move { client.query_opt(&statements.get(client, sql).await?, params).await }
    }

    /// The one row of `sql`.
    fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Row, tokio_postgres::Error>> + Send {
        let Borrowed { client, statements } = self.borrowed();
        async move { client.query_one(&statements.get(client, sql).await?, params).await }
    }

    /// Runs `sql`; how many rows it changed.
    fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, tokio_postgres::Error>> + Send {
        let Borrowed { client, statements } = self.borrowed();
        async move { client.execute(&statements.get(client, sql).await?, params).await }
    }
}

impl<R: Reader> Run for R {
    type Error = tokio_postgres::Error;
    const DIALECT: Dialect = Dialect::Postgres;

    async fn execute(&self, statement: &(impl Text + ?Sized), params: &[&dyn Bind]) -> Result<u64, Self::Error> {
        Reader::execute(self, statement.text(Self::DIALECT), &bound(params)).await
    }

    async fn rows<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> Result<Vec<T>, Self::Error> {
        let found = self.query(statement.text(Self::DIALECT), &bound(params)).await?;
        found.iter().map(T::read).collect()
    }

    async fn row<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> Result<Option<T>, Self::Error> {
        let found = self.query_opt(statement.text(Self::DIALECT), &bound(params)).await?;
        found.as_ref().map(T::read).transpose()
    }

    async fn one_row<T: Record>(
        &self,
        statement: &(impl Text + ?Sized),
        params: &[&dyn Bind],
    ) -> Result<T, Self::Error> {
        T::read(&self.query_one(statement.text(Self::DIALECT), &bound(params)).await?)
    }
}

/// Parameters as tokio-postgres binds them.
fn bound<'p>(params: &[&'p dyn Bind]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|param| *param as &(dyn ToSql + Sync)).collect()
}

/// A connection and its prepared statements, borrowed.
#[derive(Clone, Copy)]
pub struct Borrowed<'c> {
    pub client: &'c Client,
    pub statements: &'c Statements,
}

impl Reader for Borrowed<'_> {
    fn borrowed(&self) -> Borrowed<'_> {
        *self
    }
}

impl Reader for Conn {
    fn borrowed(&self) -> Borrowed<'_> {
        Borrowed {
            client: &self.client,
            statements: &self.statements,
        }
    }
}
