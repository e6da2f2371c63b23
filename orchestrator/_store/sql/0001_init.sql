-- The PostgreSQL store's first schema (issue 10). Applied once per schema by
-- orchestrator._store.postgres_schema.migrate, inside a transaction, which then records version 1
-- in schema_version. Unqualified names: the tables go into the connection's current schema.

-- One row per session: where it ends, what a conditional write compares (D27).
CREATE TABLE sessions (
    id          text        PRIMARY KEY,
    -- Lines stored, header included: the next line's seq.
    line_count  bigint      NOT NULL CHECK (line_count >= 0),
    -- The id of the last entry line (Tail.last_id), NULL while there is none.
    last_id     text,
    -- Bytes the session takes as a pi file, newlines included (Tail.length).
    length      bigint      NOT NULL CHECK (length >= 0),
    -- Bumped by every write: the row version. A rewrite replaces every line.
    version     bigint      NOT NULL DEFAULT 1,
    -- Bumped by every rewrite (which replaces every line, header included).
    rewrites    bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- A session's lines in order, exactly as a pi file holds them, without the newline: the header
-- is seq 0. Unknown entry types and fields live in the text untouched (D2); entry_id and
-- entry_type are copies for queries, never read back.
CREATE TABLE session_lines (
    session_id  text   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq         bigint NOT NULL CHECK (seq >= 0),
    line        text   NOT NULL,
    entry_id    text,
    entry_type  text,
    PRIMARY KEY (session_id, seq)
);

CREATE INDEX session_lines_entry_id ON session_lines (session_id, entry_id)
    WHERE entry_id IS NOT NULL;

-- Who owns a session now (D27), for the refusal message: the lock itself is an advisory lock
-- held on the owner's connection; this row only names its holder.
CREATE TABLE session_owners (
    session_id  text        PRIMARY KEY,
    owner       text        NOT NULL,
    pid         integer     NOT NULL,
    host        text        NOT NULL,
    backend_pid integer     NOT NULL,
    since       timestamptz NOT NULL DEFAULT now()
);

-- The lifecycle journal (D24): one record per line, in the order written. A session's journal
-- may start before the session is stored, so there is no foreign key.
CREATE TABLE journal_lines (
    session_id  text        NOT NULL,
    seq         bigserial   NOT NULL,
    line        text        NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);
