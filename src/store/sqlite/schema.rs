//! The database schema, as the migrations that build it: migration `n` takes a database from schema
//! version `n` to `n + 1` (SQLite's `user_version`).

/// The migrations, oldest first.
pub const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE sessions (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    server TEXT NOT NULL,
    owner TEXT,
    status TEXT NOT NULL,
    protocol_version TEXT,
    server_info TEXT,
    created_at INTEGER NOT NULL,
    closed_at INTEGER,
    detail TEXT
);
CREATE INDEX sessions_open ON sessions (owner) WHERE status IN ('starting', 'ready');
CREATE INDEX sessions_closed ON sessions (closed_at) WHERE closed_at IS NOT NULL;

CREATE TABLE calls (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    server TEXT NOT NULL,
    session TEXT NOT NULL,
    -- 1 when it runs on its server's shared session, which a retry after a restart may replace.
    shared INTEGER NOT NULL,
    tool TEXT NOT NULL,
    -- The arguments exactly as sent upstream: a retry echoes them.
    arguments TEXT NOT NULL,
    owner TEXT NOT NULL,
    -- The protocol version of the session it started on, and the capabilities declared on it.
    protocol_version TEXT,
    capabilities TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error_message TEXT,
    error_reason TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    ended_at INTEGER
);
CREATE INDEX calls_live ON calls (owner) WHERE status IN ('running', 'input_required');
CREATE INDEX calls_ended ON calls (ended_at) WHERE ended_at IS NOT NULL;

-- What each 2026-07-28 input_required result asked, to be answered and echoed back.
CREATE TABLE rounds (
    call_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    -- Byte for byte as the upstream sent it; NULL when it sent none.
    request_state TEXT,
    input_requests TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (call_id, round)
) WITHOUT ROWID;

CREATE TABLE requests (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    prompt TEXT NOT NULL,
    url TEXT,
    data TEXT,
    expires_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    server TEXT NOT NULL,
    session TEXT NOT NULL,
    call_id TEXT,
    -- The round and key it answers (2026-07-28); NULL for an elicitation request, which cannot outlive
    -- the upstream request it answers.
    round INTEGER,
    input_key TEXT,
    elicitation_id TEXT,
    owner TEXT,
    created_at INTEGER NOT NULL,
    resolved_at INTEGER,
    answer TEXT,
    answered_by TEXT,
    result TEXT,
    detail TEXT,
    completed_at INTEGER
);
CREATE INDEX requests_open ON requests (seq) WHERE status = 'pending';
CREATE INDEX requests_pending ON requests (expires_at) WHERE status = 'pending';
CREATE INDEX requests_call ON requests (call_id, status) WHERE call_id IS NOT NULL;
CREATE INDEX requests_resolved ON requests (resolved_at) WHERE resolved_at IS NOT NULL;
CREATE INDEX requests_completion ON requests (session, elicitation_id) WHERE elicitation_id IS NOT NULL;

-- Every change, in order: the audit trail, what event streams replay, and what webhooks deliver. Pruning
-- always keeps the newest event, so that numbering goes on from it.
CREATE TABLE events (
    seq INTEGER PRIMARY KEY,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    server TEXT NOT NULL,
    session TEXT NOT NULL,
    call_id TEXT,
    owner TEXT,
    data TEXT NOT NULL
);

-- The last event each webhook has had.
CREATE TABLE webhook_cursors (
    name TEXT PRIMARY KEY,
    delivered INTEGER NOT NULL
) WITHOUT ROWID;
",
    r"
-- What a Request holds against the pending caps (the size of what the upstream asked), as measured when it
-- was raised; NULL for Requests raised before this column.
ALTER TABLE requests ADD COLUMN bytes INTEGER;
",
    r"
-- The gateway that holds each session, as GET /sessions shows it.
ALTER TABLE sessions ADD COLUMN replica TEXT;
",
    r"
-- How each call was started: 'rest' or 'mcp'.
ALTER TABLE calls ADD COLUMN via TEXT NOT NULL DEFAULT 'rest';
",
    r"
-- A Request posted to POST /requests has no server or session: both become nullable. SQLite cannot drop
-- NOT NULL in place, so the table is built again, with its indexes.
CREATE TABLE requests_nullable (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    prompt TEXT NOT NULL,
    url TEXT,
    data TEXT,
    expires_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    -- NULL for a posted Request.
    server TEXT,
    session TEXT,
    call_id TEXT,
    round INTEGER,
    input_key TEXT,
    elicitation_id TEXT,
    owner TEXT,
    created_at INTEGER NOT NULL,
    resolved_at INTEGER,
    answer TEXT,
    answered_by TEXT,
    result TEXT,
    detail TEXT,
    completed_at INTEGER,
    bytes INTEGER
);
INSERT INTO requests_nullable (seq, id, kind, prompt, url, data, expires_at, status, server, session, call_id, round,
    input_key, elicitation_id, owner, created_at, resolved_at, answer, answered_by, result, detail, completed_at, bytes)
    SELECT seq, id, kind, prompt, url, data, expires_at, status, server, session, call_id, round, input_key,
        elicitation_id, owner, created_at, resolved_at, answer, answered_by, result, detail, completed_at, bytes
    FROM requests;
DROP TABLE requests;
ALTER TABLE requests_nullable RENAME TO requests;
CREATE INDEX requests_open ON requests (seq) WHERE status = 'pending';
CREATE INDEX requests_pending ON requests (expires_at) WHERE status = 'pending';
CREATE INDEX requests_call ON requests (call_id, status) WHERE call_id IS NOT NULL;
CREATE INDEX requests_resolved ON requests (resolved_at) WHERE resolved_at IS NOT NULL;
CREATE INDEX requests_completion ON requests (session, elicitation_id) WHERE elicitation_id IS NOT NULL;
",
    r"
-- When a call an approval held was sent upstream, so that one is sent once (calls already recorded count as sent).
ALTER TABLE calls ADD COLUMN forwarded_at INTEGER;
UPDATE calls SET forwarded_at = updated_at;
",
    r"
-- A call's Requests in the order they were raised, read without sorting; its pending ones found at once.
DROP INDEX requests_call;
CREATE INDEX requests_call ON requests (call_id, seq) WHERE call_id IS NOT NULL;
CREATE INDEX requests_call_pending ON requests (call_id) WHERE status = 'pending' AND call_id IS NOT NULL;
",
    r"
-- The decisions of an approval that needs several people (JSON), once one is given; who answered (JSON: how
-- they signed in, and an OpenID principal's provider and subject).
ALTER TABLE requests ADD COLUMN decisions TEXT;
ALTER TABLE requests ADD COLUMN answerer TEXT;
",
    r"
-- The task an upstream made of a call (JSON: its id, status, status message and expiry), followed to its end.
ALTER TABLE calls ADD COLUMN task TEXT;
",
    r"
-- Keys the gateway made for itself and that every replica uses (the one that signs answer links), each under a
-- name, in base64.
CREATE TABLE keys (
    name TEXT PRIMARY KEY,
    secret TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
",
    r"
-- Who let a call an approval held go upstream (JSON: who, the approval, and the arguments it was started with
-- when the approver changed them).
ALTER TABLE calls ADD COLUMN allowed TEXT;
",
    r"
-- Standing grants approvers gave with approvals (one at most each): later calls they cover run without asking.
-- `lasting` is JSON (the string session, or a duration); a session grant names its session, a grant for a time its end.
CREATE TABLE grants (
    id TEXT PRIMARY KEY,
    request TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    scope TEXT NOT NULL,
    digest TEXT,
    lasting TEXT NOT NULL,
    session TEXT,
    expires_at INTEGER,
    by_name TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    uses INTEGER NOT NULL DEFAULT 0,
    revoked_at INTEGER,
    revoked_by TEXT
);
CREATE INDEX grants_live ON grants (owner, server, tool) WHERE revoked_at IS NULL;
",
    r"
-- The audit chain: each event's hash and the hash of the event before it (src/audit.rs), computed after the
-- event was kept, in the order of the log. Pruned with the events, from the oldest: the first link kept says
-- what it follows, and the newest stays.
CREATE TABLE audit_chain (
    seq INTEGER PRIMARY KEY,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL
);
",
];

/// The schema version this build writes.
pub fn version() -> i64 {
    i64::try_from(MIGRATIONS.len()).expect("a handful of migrations")
}
