-- Statements of wakuwaku.inbox.sqlite.SQLiteInbox (design §9).
-- {table} and {dead_table} are replaced by checked identifiers.
-- Every statement that reads or writes one key's row names exactly
-- (consumer_group, message_key), the primary key (seed 004).

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    consumer_group   TEXT    NOT NULL,
    message_key      TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('done', 'failing')),
    claimed_at       REAL,
    failed_at        REAL,
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       TEXT,
    source_topic     TEXT,
    source_partition INTEGER,
    source_offset    INTEGER,
    PRIMARY KEY (consumer_group, message_key),
    CHECK (status <> 'done' OR claimed_at IS NOT NULL),
    CHECK ((source_topic IS NULL) = (source_partition IS NULL)
           AND (source_partition IS NULL) = (source_offset IS NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {table}_by_age ON {table} (consumer_group, status, claimed_at);
CREATE TABLE IF NOT EXISTS {dead_table} (
    consumer_group   TEXT    NOT NULL,
    message_key      TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    last_error       TEXT,
    failed_at        REAL,
    dead_at          REAL    NOT NULL,
    source_topic     TEXT,
    source_partition INTEGER,
    source_offset    INTEGER,
    PRIMARY KEY (consumer_group, message_key)
) WITHOUT ROWID;

-- name: claim
-- One statement per chunk; {rows} is "(?, ?, ?, ?, ?, ?)" repeated, one per key.
-- A new key is inserted; a failing key becomes done; a done key is left alone
-- and not returned. The returned keys are exactly the new claims.
INSERT INTO {table} AS t
    (consumer_group, message_key, claimed_at, source_topic, source_partition, source_offset,
     status, attempts)
VALUES {rows}
ON CONFLICT (consumer_group, message_key) DO UPDATE SET
    status = 'done',
    claimed_at = excluded.claimed_at,
    source_topic = coalesce(excluded.source_topic, t.source_topic),
    source_partition = coalesce(excluded.source_partition, t.source_partition),
    source_offset = coalesce(excluded.source_offset, t.source_offset)
WHERE t.status = 'failing'
RETURNING message_key

-- name: claimed
-- The unary + keeps SQLite's planner on the primary key: with a long IN list
-- it otherwise picks the (consumer_group, status, claimed_at) index and scans
-- every done row of the group (40x slower on 300 000 claims).
SELECT message_key FROM {table}
WHERE consumer_group = ? AND message_key IN ({marks}) AND +status = 'done'

-- name: entries
SELECT message_key, status, attempts, last_error, claimed_at, failed_at,
       source_topic, source_partition, source_offset
FROM {table}
WHERE consumer_group = ? AND message_key IN ({marks})

-- name: dead_entries
SELECT message_key, 'dead', attempts, last_error, NULL, failed_at,
       source_topic, source_partition, source_offset
FROM {dead_table}
WHERE consumer_group = ? AND message_key IN ({marks})

-- name: fail
-- A new failing row continues the count of an earlier dead letter of the key.
INSERT INTO {table} AS t
    (consumer_group, message_key, status, failed_at, last_error,
     source_topic, source_partition, source_offset, attempts)
VALUES (:grp, :key, 'failing', :now, :error, :topic, :partition, :offset,
        1 + coalesce((SELECT d.attempts FROM {dead_table} AS d
                      WHERE d.consumer_group = :grp AND d.message_key = :key), 0))
ON CONFLICT (consumer_group, message_key) DO UPDATE SET
    attempts = t.attempts + 1,
    failed_at = excluded.failed_at,
    last_error = excluded.last_error,
    source_topic = coalesce(excluded.source_topic, t.source_topic),
    source_partition = coalesce(excluded.source_partition, t.source_partition),
    source_offset = coalesce(excluded.source_offset, t.source_offset)
WHERE t.status = 'failing'
RETURNING attempts

-- name: attempts
SELECT attempts FROM {table} WHERE consumer_group = :grp AND message_key = :key

-- name: bury
INSERT INTO {dead_table}
    (consumer_group, message_key, attempts, last_error, failed_at, dead_at,
     source_topic, source_partition, source_offset)
SELECT consumer_group, message_key, attempts, last_error, failed_at, :now,
       source_topic, source_partition, source_offset
FROM {table}
WHERE consumer_group = :grp AND message_key = :key AND status = 'failing'
ON CONFLICT (consumer_group, message_key) DO UPDATE SET
    attempts = excluded.attempts,
    last_error = excluded.last_error,
    failed_at = excluded.failed_at,
    dead_at = excluded.dead_at,
    source_topic = coalesce(excluded.source_topic, source_topic),
    source_partition = coalesce(excluded.source_partition, source_partition),
    source_offset = coalesce(excluded.source_offset, source_offset)

-- name: unfail
DELETE FROM {table} WHERE consumer_group = :grp AND message_key = :key AND status = 'failing'

-- name: purge_unsourced
DELETE FROM {table}
WHERE consumer_group = ? AND status = 'done' AND claimed_at < ? AND source_offset IS NULL

-- name: purge_partition
DELETE FROM {table}
WHERE consumer_group = ? AND status = 'done' AND claimed_at < ?
  AND source_topic = ? AND source_partition = ? AND source_offset < ?

-- name: stats
SELECT
    (SELECT count(*) FROM {table} WHERE consumer_group = :grp AND status = 'done'),
    (SELECT count(*) FROM {table} WHERE consumer_group = :grp AND status = 'failing'),
    (SELECT count(*) FROM {dead_table} WHERE consumer_group = :grp)

-- name: groups
-- Every group with a row: what a command names when asked about another one.
SELECT consumer_group FROM {table}
UNION
SELECT consumer_group FROM {dead_table}
ORDER BY 1

-- name: dead
SELECT message_key, attempts, last_error, failed_at, dead_at,
       source_topic, source_partition, source_offset
FROM {dead_table}
WHERE consumer_group = ?
ORDER BY dead_at DESC, message_key
LIMIT ?
