//! What both SQL engines run, written once: statements, and the verbs that run them alike (its submodules, over
//! [`Run`] and [`Change`], which each engine implements on its connections and its writer's transaction).
//!
//! Each statement is written as PostgreSQL takes it (parameters `$1`, `$2`, …) and made SQLite's at compile time,
//! each `$N` becoming `?N`: SQLite reads `$1` as a parameter *named* `$1`, numbered by where it first appears,
//! which binds `SET a = $2 WHERE id = $1` the wrong way round.
//!
//! A statement or verb written in one engine alone is one the other writes differently for a reason: PostgreSQL folds
//! into one statement what SQLite runs as several in its process, or the engine has a mechanism of its own
//! (PostgreSQL's counts for a fleet, SQLite's deferred calls). Each such place names the BENCHMARKS.md section
//! that measured it.

pub mod audit;
pub mod calls;
pub mod grants;
pub mod maintenance;
pub mod requests;
mod run;
pub mod sessions;

pub use run::{Bind, Change, Record, Run, Text, at_once};

use super::rows::{
    call_columns, event_columns, grant_columns, postgres_requests_of_call, request_columns, session_columns,
    sqlite_requests_of_call,
};

/// A count or a limit as both engines bind it.
pub fn limit(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// A statement in each engine's form.
#[derive(Clone, Copy)]
pub struct Shared {
    pub postgres: &'static str,
    pub sqlite: &'static str,
}

/// `sql` with each `$` that a digit follows made `?`: the same length, and ASCII for ASCII.
const fn numbered<const N: usize>(sql: &str) -> [u8; N] {
    let bytes = sql.as_bytes();
    let mut out = [0; N];
    let mut at = 0;
    while at < N {
        let parameter = bytes[at] == b'$' && at + 1 < N && bytes[at + 1].is_ascii_digit();
        out[at] = if parameter { b'?' } else { bytes[at] };
        at += 1;
    }
    out
}

/// `$sql`, written as PostgreSQL takes it, in SQLite's form.
macro_rules! sqlite_form {
    ($sql:expr) => {{
        const SQLITE: [u8; $sql.len()] = numbered::<{ $sql.len() }>($sql);
        match std::str::from_utf8(&SQLITE) {
            Ok(sql) => sql,
            Err(_) => panic!("a statement that is not UTF-8"),
        }
    }};
}

macro_rules! shared {
    ($($(#[$doc:meta])* $name:ident = $sql:expr;)*) => {$(
        $(#[$doc])*
        pub const $name: Shared = Shared {
            postgres: $sql,
            sqlite: sqlite_form!($sql),
        };
    )*};
}

/// Statements that read calls whole, written once but for how each engine gathers a call's Requests: each
/// `$before`, the call's columns, then `$after`.
macro_rules! calls {
    ($($(#[$doc:meta])* $name:ident = $before:literal, $after:literal;)*) => {$(
        $(#[$doc])*
        pub const $name: Shared = Shared {
            postgres: concat!($before, call_columns!(postgres_requests_of_call!()), $after),
            sqlite: sqlite_form!(concat!($before, call_columns!(sqlite_requests_of_call!()), $after)),
        };
    )*};
}

calls! {
    /// The columns of a call's read, for a statement built around them.
    CALL_COLUMN_LIST = "", "";
    /// A call.
    CALL = "SELECT ", " FROM calls AS c WHERE c.id = $1";
    /// The calls that have not ended, of session `$1` or of all when it is NULL.
    CALLS_RUNNING = "SELECT ", " FROM calls AS c WHERE c.status IN ('running', 'input_required') \
        AND (CAST($1 AS TEXT) IS NULL OR c.session = $1) ORDER BY c.seq";
}

shared! {
    /// A session that has not closed is ready, with what its server said it is.
    SESSION_READY = "UPDATE sessions SET status = 'ready', protocol_version = $2, server_info = $3 \
        WHERE id = $1 AND status IN ('starting', 'ready')";
    /// A session that has not closed closes.
    SESSION_ENDED = "UPDATE sessions SET status = $2, closed_at = $3, detail = $4 \
        WHERE id = $1 AND status IN ('starting', 'ready')";
    /// A session closes, whatever it was.
    SESSION_CLOSED = "UPDATE sessions SET status = $2, closed_at = $3, detail = $4 WHERE id = $1";
    /// A running call is handed to its session, once, noting who allowed it and the arguments it is sent with.
    CALL_FORWARDED = "UPDATE calls SET forwarded_at = $2, updated_at = $2, allowed = $3, arguments = $4 \
        WHERE id = $1 AND forwarded_at IS NULL AND status = 'running'";
    /// A call's status and owner.
    CALL_STATUS = "SELECT status, owner FROM calls WHERE id = $1";
    /// How many calls have each status.
    CALLS_BY_STATUS = "SELECT status, count(*) FROM calls GROUP BY status ORDER BY status";
    /// Whether a Request of that id was ever raised.
    REQUEST_TAKEN = "SELECT EXISTS (SELECT 1 FROM requests WHERE id = $1)";
    /// A Request's status and owner.
    REQUEST_STATUS = "SELECT status, owner FROM requests WHERE id = $1";
    /// A 2026-07-28 round raised on a call.
    ROUND_RAISED = "INSERT INTO rounds (call_id, round, request_state, input_requests, created_at) \
        VALUES ($1, $2, $3, $4, $5)";
    /// When the first pending Request expires.
    NEXT_DEADLINE = "SELECT min(expires_at) FROM requests WHERE status = 'pending'";
    /// The latest Request a session's elicitation of that id raised.
    ELICITATION = "SELECT id FROM requests WHERE session = $1 AND elicitation_id = $2 ORDER BY seq DESC LIMIT 1";
    /// A URL-mode Request's completion, once.
    COMPLETED = "UPDATE requests SET completed_at = $2 WHERE id = $1 AND completed_at IS NULL";
    /// An answered Request whose answer never reached its upstream.
    UNDELIVERED = "UPDATE requests SET status = 'cancelled', detail = $2 WHERE id = $1 AND status = 'answered'";
    /// A Request's detail.
    DETAIL = "UPDATE requests SET detail = $2 WHERE id = $1";
    /// The last event a webhook was sent.
    WEBHOOK_DELIVERED = "SELECT delivered FROM webhook_cursors WHERE name = $1";
    /// A key kept under a name, unless one is kept under it already.
    KEY_KEPT = "INSERT INTO keys (name, secret, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";
    /// The key kept under a name.
    KEY = "SELECT secret FROM keys WHERE name = $1";
    /// The newest link of the audit chain.
    CHAIN_HEAD = "SELECT seq, prev, hash FROM audit_chain ORDER BY seq DESC LIMIT 1";
    /// Up to `$2` events chained after event `$1`, with their links, in order.
    CHAINED = concat!(
        "SELECT ",
        event_columns!(),
        ", prev, hash FROM events JOIN audit_chain USING (seq) WHERE seq > $1 ORDER BY seq LIMIT $2"
    );
    /// A Request.
    REQUEST = concat!("SELECT ", request_columns!(), " FROM requests WHERE id = $1");
    /// A session.
    SESSION = concat!("SELECT ", session_columns!(), " FROM sessions WHERE id = $1");
    /// The sessions open, or all of them if `$1`.
    SESSIONS = concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE CAST($1 AS BOOLEAN) OR status IN ('starting', 'ready') ORDER BY seq"
    );
    /// A Request raised, pending.
    REQUEST_RAISED = "INSERT INTO requests (id, kind, prompt, url, data, expires_at, status, server, session, call_id, \
        round, input_key, elicitation_id, owner, created_at, bytes) \
        VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10, $11, $12, $13, $14, $15)";
    /// A call that has not ended ends.
    CALL_ENDED = "UPDATE calls SET status = $2, result = $3, error_message = $4, error_reason = $5, \
        updated_at = $6, ended_at = $6 WHERE id = $1 AND status IN ('running', 'input_required')";
    /// A call that has not ended notes its upstream task as last seen.
    CALL_TASK = "UPDATE calls SET task = $2, updated_at = $3 WHERE id = $1 \
        AND status IN ('running', 'input_required')";
}

/// How many of the grants that cover a call a use reads (`GRANTS_COVERING`) to find one its policy still offers:
/// those a policy no longer offers are passed over, and few are expected.
pub const COVERING: i64 = 16;

// Standing grants.
shared! {
    /// A grant given with an approval, unless that approval gave one already.
    GRANT_GIVEN = "INSERT INTO grants (id, request, owner, server, tool, scope, digest, lasting, session, expires_at, \
        by_name, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (request) DO NOTHING";
    /// The grant an approval gave.
    GRANT_OF_REQUEST = concat!("SELECT ", grant_columns!(), " FROM grants WHERE request = $1");
    /// A grant.
    GRANT = concat!("SELECT ", grant_columns!(), " FROM grants WHERE id = $1");
    /// The oldest grants that hold at `$6` and cover a call of principal `$1` of tool `$3` on server `$2` with
    /// arguments of digest `$4` on session `$5` (see `GrantView::covers`), at most `$7`.
    GRANTS_COVERING = concat!(
        "SELECT ",
        grant_columns!(),
        " FROM grants WHERE owner = $1 AND server = $2 AND tool = $3 AND revoked_at IS NULL \
        AND (digest IS NULL OR digest = $4) AND (session IS NULL OR session = $5) \
        AND (expires_at IS NULL OR expires_at > $6) ORDER BY created_at, id LIMIT $7"
    );
    /// One use of a grant, if it still holds at `$2`: a revocation that commits first is seen.
    GRANT_USED = concat!(
        "UPDATE grants SET uses = uses + 1 WHERE id = $1 AND revoked_at IS NULL \
        AND (expires_at IS NULL OR expires_at > $2) RETURNING ",
        grant_columns!()
    );
    /// A grant that holds at `$2` is revoked.
    GRANT_REVOKED = concat!(
        "UPDATE grants SET revoked_at = $2, revoked_by = $3 WHERE id = $1 AND revoked_at IS NULL \
        AND (expires_at IS NULL OR expires_at > $2) RETURNING ",
        grant_columns!()
    );
    /// Up to `$3` grants that hold at `$1`, of principal `$2` or of all when it is NULL, oldest first: not revoked,
    /// their time not up, their session (if they last as long as one) open.
    GRANTS_LIVE = concat!(
        "SELECT ",
        grant_columns!(),
        " FROM grants AS g WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1) \
        AND (CAST($2 AS TEXT) IS NULL OR owner = $2) AND (session IS NULL OR EXISTS (SELECT 1 FROM sessions AS s \
        WHERE s.id = g.session AND s.status IN ('starting', 'ready'))) ORDER BY created_at, id LIMIT $3"
    );
}

// The ids of the Requests that a resolution of several takes.
shared! {
    /// Every pending Request.
    PENDING = "SELECT id FROM requests WHERE status = 'pending'";
    /// A session's pending elicitations (Requests outside a round).
    PENDING_OF_SESSION = "SELECT id FROM requests WHERE status = 'pending' AND session = $1 AND round IS NULL";
    /// Every session's pending elicitations.
    PENDING_ELICITATIONS = "SELECT id FROM requests \
        WHERE status = 'pending' AND round IS NULL AND session IS NOT NULL";
    /// The `$2` pending Requests that expire first, of those due at `$1`.
    PENDING_DUE = "SELECT id FROM requests WHERE status = 'pending' AND expires_at <= $1 ORDER BY expires_at LIMIT $2";
    /// The Requests of a call's latest round.
    LATEST_ROUND = "SELECT id FROM requests \
        WHERE call_id = $1 AND round = (SELECT max(round) FROM rounds WHERE call_id = $1)";
}

// The pruning's statements, each deleting at most `$2` rows of what ended before `$1`.
shared! {
    /// Requests resolved.
    PRUNE_REQUESTS = "DELETE FROM requests WHERE seq IN \
        (SELECT seq FROM requests WHERE resolved_at < $1 AND status != 'pending' LIMIT $2)";
    /// Rounds whose call is gone or ended, from the rounds' side, so that each batch finds rounds to delete while
    /// any are due.
    PRUNE_ROUNDS = "DELETE FROM rounds WHERE call_id IN \
        (SELECT r.call_id FROM rounds AS r LEFT JOIN calls AS c ON c.id = r.call_id \
        WHERE c.id IS NULL OR c.ended_at < $1 LIMIT $2)";
    /// Calls ended.
    PRUNE_CALLS = "DELETE FROM calls WHERE seq IN (SELECT seq FROM calls WHERE ended_at < $1 LIMIT $2)";
    /// Sessions closed.
    PRUNE_SESSIONS = "DELETE FROM sessions WHERE seq IN (SELECT seq FROM sessions WHERE closed_at < $1 LIMIT $2)";
    /// Grants revoked or whose time is up, and those whose session is gone.
    PRUNE_GRANTS = "DELETE FROM grants WHERE id IN (SELECT id FROM grants AS g WHERE revoked_at < $1 \
        OR expires_at < $1 OR (session IS NOT NULL AND NOT EXISTS (SELECT 1 FROM sessions AS s WHERE s.id = g.session)) \
        LIMIT $2)";
}

shared! {
    /// The links of the audit chain whose events were pruned (the chain is pruned with the log, from the oldest,
    /// and each link keeps the hash it follows).
    PRUNE_CHAIN = "DELETE FROM audit_chain WHERE seq < (SELECT min(seq) FROM events)";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_numbers_its_parameters_where_postgres_does() {
        assert_eq!(
            COMPLETED.sqlite,
            "UPDATE requests SET completed_at = ?2 WHERE id = ?1 AND completed_at IS NULL"
        );
        assert_eq!(CALLS_BY_STATUS.sqlite, CALLS_BY_STATUS.postgres);
    }

    #[test]
    fn a_call_is_read_with_each_engines_gathering_of_its_requests() {
        let postgres =
            "COALESCE((SELECT json_agg(r.id ORDER BY r.seq)::TEXT FROM requests AS r WHERE r.call_id = c.id), '[]')";
        let sqlite =
            "(SELECT json_group_array(id) FROM (SELECT r.id FROM requests AS r WHERE r.call_id = c.id ORDER BY r.seq))";
        let columns = |requests: &str| {
            format!(
                "c.id, c.server, c.session, c.tool, c.arguments, c.owner, c.status, c.result, c.error_message, \
                 c.error_reason, c.created_at, c.updated_at, {requests}, c.via, c.task, c.allowed"
            )
        };
        assert_eq!(CALL_COLUMN_LIST.postgres, columns(postgres));
        assert_eq!(CALL_COLUMN_LIST.sqlite, columns(sqlite));
        assert_eq!(
            CALL.postgres,
            format!("SELECT {} FROM calls AS c WHERE c.id = $1", columns(postgres))
        );
        assert_eq!(
            CALL.sqlite,
            format!("SELECT {} FROM calls AS c WHERE c.id = ?1", columns(sqlite))
        );
        assert!(
            CALLS_RUNNING
                .sqlite
                .contains("(CAST(?1 AS TEXT) IS NULL OR c.session = ?1) ORDER BY c.seq")
        );
    }
}
