-- wakuwaku SQLite log, schema version 1 (see docs/logs.md).
--
-- The file is marked with PRAGMA application_id = 0x776B776B ("wkwk") and
-- PRAGMA user_version = 1 by the code that runs this script, in the same
-- transaction; a file with another application id, or with tables but no
-- id, is refused as foreign.
--
-- Statements are run one by one inside BEGIN IMMEDIATE; keep each one
-- complete and free of triggers (the loader splits on complete statements).

-- Free-form facts about the file (who created it, when).
CREATE TABLE wk_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- One row per topic; the id keeps record keys small.
CREATE TABLE wk_topics (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,
    partitions INTEGER NOT NULL CHECK (partitions >= 1),
    created_at REAL    NOT NULL
);

-- One row per partition: the next offset to give (dense from 0) and the
-- lowest offset retention kept. Appends read and bump next_offset inside
-- their BEGIN IMMEDIATE transaction, so offsets stay dense across processes.
CREATE TABLE wk_partitions (
    topic_id     INTEGER NOT NULL,
    part         INTEGER NOT NULL,
    start_offset INTEGER NOT NULL DEFAULT 0,
    next_offset  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, part)
) WITHOUT ROWID;

-- The records, clustered by (topic, partition, offset): a read is one range
-- scan. headers is a msgpack map str -> bin.
CREATE TABLE wk_records (
    topic_id INTEGER NOT NULL,
    part     INTEGER NOT NULL,
    off      INTEGER NOT NULL,
    ts       REAL    NOT NULL,
    headers  BLOB    NOT NULL,
    body     BLOB    NOT NULL,
    PRIMARY KEY (topic_id, part, off)
) WITHOUT ROWID;

-- Committed offsets (the next offset to read) per consumer group.
CREATE TABLE wk_commits (
    grp          TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    part         INTEGER NOT NULL,
    off          INTEGER NOT NULL,
    committed_at REAL    NOT NULL,
    PRIMARY KEY (grp, topic, part)
) WITHOUT ROWID;

-- Retention and `topic describe` look commits up by topic.
CREATE INDEX wk_commits_by_topic ON wk_commits (topic, part);

-- Partition leases (design §15). A released lease keeps its row (member '',
-- expires_at 0) so the generation keeps growing: it is the fencing token.
CREATE TABLE wk_leases (
    grp        TEXT    NOT NULL,
    topic      TEXT    NOT NULL,
    part       INTEGER NOT NULL,
    member     TEXT    NOT NULL,
    generation INTEGER NOT NULL,
    expires_at REAL    NOT NULL,
    PRIMARY KEY (grp, topic, part)
) WITHOUT ROWID;
