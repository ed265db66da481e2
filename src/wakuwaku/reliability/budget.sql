-- Retry budget on SQLite (design §11): the same contract as budget_spend.lua.
-- Statements are separated by "-- name: <name>" lines; budget.py runs each
-- one on its own, and "spend" as one IMMEDIATE transaction.
-- Times are seconds since the epoch (REAL); a row whose expires_at has
-- passed counts as absent, exactly like an expired Redis key.

-- name: schema
CREATE TABLE IF NOT EXISTS wk_retry_budget (
    job_id     TEXT    NOT NULL,
    step       TEXT    NOT NULL,
    attempts   INTEGER NOT NULL,
    expires_at REAL    NOT NULL,
    PRIMARY KEY (job_id, step)
) WITHOUT ROWID;

-- name: schema_index
CREATE INDEX IF NOT EXISTS wk_retry_budget_expiry ON wk_retry_budget (expires_at);

-- name: purge
DELETE FROM wk_retry_budget WHERE expires_at <= :now;

-- name: spend
-- The expiry moves with every spend (a sliding TTL), like PEXPIRE in the script.
INSERT INTO wk_retry_budget (job_id, step, attempts, expires_at)
VALUES (:job_id, :step, 1, :expires_at)
ON CONFLICT (job_id, step) DO UPDATE SET
    attempts = CASE
        WHEN wk_retry_budget.expires_at <= :now THEN 1
        ELSE wk_retry_budget.attempts + 1
    END,
    expires_at = excluded.expires_at;

-- name: spent
SELECT attempts FROM wk_retry_budget
WHERE job_id = :job_id AND step = :step AND expires_at > :now;

-- name: clear
DELETE FROM wk_retry_budget WHERE job_id = :job_id AND step = :step;
