-- Statements of wakuwaku.inbox.postgres.PostgresInbox (design §9).
-- {table} and {dead_table} are replaced by checked identifiers.
-- Every statement that reads or writes one key's row names exactly
-- (consumer_group, message_key), the primary key (seed 004).

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    consumer_group   text             NOT NULL,
    message_key      text             NOT NULL,
    status           text             NOT NULL CHECK (status IN ('done', 'failing')),
    claimed_at       double precision,
    failed_at        double precision,
    attempts         integer          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       text,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    CONSTRAINT {table}_pkey PRIMARY KEY (consumer_group, message_key),
    CHECK (status <> 'done' OR claimed_at IS NOT NULL),
    CHECK (num_nulls(source_topic, source_partition, source_offset) IN (0, 3))
);
CREATE INDEX IF NOT EXISTS {table}_by_age ON {table} (consumer_group, status, claimed_at);
CREATE TABLE IF NOT EXISTS {dead_table} (
    consumer_group   text             NOT NULL,
    message_key      text             NOT NULL,
    attempts         integer          NOT NULL,
    last_error       text,
    failed_at        double precision,
    dead_at          double precision NOT NULL,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    CONSTRAINT {dead_table}_pkey PRIMARY KEY (consumer_group, message_key)
);

-- name: claim
-- One statement per chunk, the keys as arrays in sorted order (the same lock
-- order for every claimer). A new key is inserted; a failing key becomes
-- done; a done key is left alone and not returned. The returned keys are
-- exactly the new claims.
INSERT INTO {table} AS t
    (consumer_group, message_key, claimed_at, source_topic, source_partition, source_offset,
     status, attempts)
SELECT %(grp)s, k.message_key, %(now)s, k.topic, k.part, k.off, 'done', 0
FROM unnest(%(keys)s::text[], %(topics)s::text[], %(parts)s::integer[], %(offs)s::bigint[])
     WITH ORDINALITY AS k(message_key, topic, part, off, ord)
ORDER BY k.ord
ON CONFLICT (consumer_group, message_key) DO UPDATE SET
    status = 'done',
    claimed_at = EXCLUDED.claimed_at,
    source_topic = coalesce(EXCLUDED.source_topic, t.source_topic),
    source_partition = coalesce(EXCLUDED.source_partition, t.source_partition),
    source_offset = coalesce(EXCLUDED.source_offset, t.source_offset)
WHERE t.status = 'failing'
RETURNING t.message_key

-- name: claimed
SELECT message_key FROM {table}
WHERE consumer_group = %(grp)s AND status = 'done' AND message_key = ANY(%(keys)s::text[])

-- name: entries
SELECT message_key, status, attempts, last_error, claimed_at, failed_at,
       source_topic, source_partition, source_offset
FROM {table}
WHERE consumer_group = %(grp)s AND message_key = ANY(%(keys)s::text[])

-- name: dead_entries
SELECT message_key, 'dead', attempts, last_error, NULL::double precision, failed_at,
       source_topic, source_partition, source_offset
FROM {dead_table}
WHERE consumer_group = %(grp)s AND message_key = ANY(%(keys)s::text[])

-- name: fail
-- A new failing row continues the count of an earlier dead letter of the key.
INSERT INTO {table} AS t
    (consumer_group, message_key, status, failed_at, last_error,
     source_topic, source_partition, source_offset, attempts)
VALUES (%(grp)s, %(key)s, 'failing', %(now)s, %(error)s,
        %(topic)s, %(partition)s, %(offset)s,
        1 + coalesce((SELECT d.attempts FROM {dead_table} AS d
                      WHERE d.consumer_group = %(grp)s AND d.message_key = %(key)s), 0))
ON CONFLICT (consumer_group, message_key) DO UPDATE SET
    attempts = t.attempts + 1,
    failed_at = EXCLUDED.failed_at,
    last_error = EXCLUDED.last_error,
    source_topic = coalesce(EXCLUDED.source_topic, t.source_topic),
    source_partition = coalesce(EXCLUDED.source_partition, t.source_partition),
    source_offset = coalesce(EXCLUDED.source_offset, t.source_offset)
WHERE t.status = 'failing'
RETURNING t.attempts

-- name: attempts
SELECT attempts FROM {table} WHERE consumer_group = %(grp)s AND message_key = %(key)s

-- name: bury
INSERT INTO {dead_table} AS d
    (consumer_group, message_key, attempts, last_error, failed_at, dead_at,
     source_topic, source_partition, source_offset)
SELECT consumer_group, message_key, attempts, last_error, failed_at, %(now)s,
       source_topic, source_partition, source_offset
FROM {table}
WHERE consumer_group = %(grp)s AND message_key = %(key)s AND status = 'failing'
ON CONFLICT (consumer_group, message_key) DO UPDATE SET
    attempts = EXCLUDED.attempts,
    last_error = EXCLUDED.last_error,
    failed_at = EXCLUDED.failed_at,
    dead_at = EXCLUDED.dead_at,
    source_topic = coalesce(EXCLUDED.source_topic, d.source_topic),
    source_partition = coalesce(EXCLUDED.source_partition, d.source_partition),
    source_offset = coalesce(EXCLUDED.source_offset, d.source_offset)

-- name: unfail
DELETE FROM {table}
WHERE consumer_group = %(grp)s AND message_key = %(key)s AND status = 'failing'

-- name: purge_unsourced
DELETE FROM {table}
WHERE consumer_group = %(grp)s AND status = 'done' AND claimed_at < %(cutoff)s
  AND source_offset IS NULL

-- name: purge_partition
DELETE FROM {table}
WHERE consumer_group = %(grp)s AND status = 'done' AND claimed_at < %(cutoff)s
  AND source_topic = %(topic)s AND source_partition = %(partition)s
  AND source_offset < %(offset)s

-- name: stats
SELECT
    (SELECT count(*) FROM {table} WHERE consumer_group = %(grp)s AND status = 'done'),
    (SELECT count(*) FROM {table} WHERE consumer_group = %(grp)s AND status = 'failing'),
    (SELECT count(*) FROM {dead_table} WHERE consumer_group = %(grp)s)

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
WHERE consumer_group = %(grp)s
ORDER BY dead_at DESC, message_key
LIMIT %(limit)s
