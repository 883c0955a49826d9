//! What the PostgreSQL server itself counted while gateways worked: transactions, statements and updated
//! rows of one database, read before and after a stretch of work.

use std::time::Duration;

use anyhow::Context;

use crate::cluster::Cluster;

/// How long a server backend may hold its transaction counts before publishing them: it does so once idle
/// for up to a second (`pg_stat_database` is not updated at each commit).
const STATS_FLUSH: Duration = Duration::from_secs(2);

/// One database's counters at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Counters {
    /// `pg_stat_database.xact_commit`: transactions committed, an autocommitted statement counting as one.
    commits: u64,
    /// `pg_stat_user_tables.n_tup_upd` of `requests`: rows of Requests updated.
    request_updates: u64,
    /// The sum of `pg_stat_statements.calls`: every statement run, `BEGIN` and `COMMIT` included; `None`
    /// when the server did not load `pg_stat_statements`.
    statements: Option<u64>,
}

/// What the work between two [`Counters`] cost per unit of work.
#[derive(Debug, Clone, Copy)]
pub struct PerAnswer {
    pub commits: f64,
    pub request_updates: f64,
    pub statements: Option<f64>,
}

impl Counters {
    /// Reads the counters of database `url`, once the server has published what its backends did.
    pub async fn read(cluster: &Cluster, url: &str, statements: bool) -> anyhow::Result<Self> {
        tokio::time::sleep(STATS_FLUSH).await;
        let calls = if statements {
            "(SELECT sum(calls) FROM pg_stat_statements WHERE dbid = d.datid)"
        } else {
            "NULL"
        };
        let sql = format!(
            "SELECT d.xact_commit, \
             (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'requests' AND schemaname = 'public'), \
             {calls} FROM pg_stat_database d WHERE d.datname = current_database()"
        );
        let row = cluster.query(url, &sql).map_err(anyhow::Error::msg)?;
        let fields: Vec<&str> = row.split('|').collect();
        let number = |at: usize| -> anyhow::Result<Option<u64>> {
            let field = fields.get(at).with_context(|| format!("no field {at} in {row:?}"))?;
            if field.is_empty() {
                return Ok(None);
            }
            Ok(Some(field.parse().with_context(|| format!("{field:?} in {row:?}"))?))
        };
        Ok(Self {
            commits: number(0)?.context("no xact_commit")?,
            request_updates: number(1)?.unwrap_or(0),
            statements: number(2)?,
        })
    }

    /// What happened from `self` to `later`, divided by `answers`.
    pub fn per_answer(&self, later: &Counters, answers: usize) -> PerAnswer {
        let per = |before: u64, after: u64| after.saturating_sub(before) as f64 / answers.max(1) as f64;
        PerAnswer {
            commits: per(self.commits, later.commits),
            request_updates: per(self.request_updates, later.request_updates),
            statements: self
                .statements
                .zip(later.statements)
                .map(|(before, after)| per(before, after)),
        }
    }
}

/// One statement's share of a stretch of work, as `pg_stat_statements` counted it.
#[derive(Debug, Clone)]
pub struct Statement {
    /// The statement's text, white space folded.
    pub text: String,
    /// Runs per unit of work.
    pub runs: f64,
    /// Execution time per unit of work, in µs (time waiting on locks or for a CPU included).
    pub micros: f64,
}

/// Forgets what `pg_stat_statements` counted so far in the whole server; false when it is not loaded in
/// database `url`.
pub fn reset_statements(cluster: &Cluster, url: &str) -> bool {
    cluster.counts_statements(url) && cluster.query(url, "SELECT pg_stat_statements_reset()").is_ok()
}

/// Database `url`'s statements since [`reset_statements`], per unit of `work`, the costliest first, read once
/// what the work left running (calls the last answers resumed) has had [`STATS_FLUSH`] to end.
pub async fn statements(cluster: &Cluster, url: &str, work: usize) -> anyhow::Result<Vec<Statement>> {
    tokio::time::sleep(STATS_FLUSH).await;
    let sql = "SELECT calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g') \
         FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         ORDER BY total_exec_time DESC";
    let out = cluster.query(url, sql).map_err(anyhow::Error::msg)?;
    let work = work.max(1) as f64;
    out.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let mut fields = line.splitn(3, '|');
            let mut next = || fields.next().with_context(|| format!("a short row {line:?}"));
            let runs: f64 = next()?.parse()?;
            let millis: f64 = next()?.parse()?;
            Ok(Statement {
                runs: runs / work,
                micros: millis * 1000.0 / work,
                text: next()?.trim().to_owned(),
            })
        })
        .collect()
}
