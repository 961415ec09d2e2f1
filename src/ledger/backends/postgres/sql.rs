//! The ledger's statements, each one round trip (the schema is `schema`'s).

/// The statement that names the namespace a session works in; sent ahead of every statement
/// on the same connection, in the same round trip.
pub(super) const IN_NAMESPACE: &str = "SELECT set_config('baton.namespace', $1, false)";

/// [`IN_NAMESPACE`] for the rest of one transaction only.
pub(super) const IN_NAMESPACE_HERE: &str = "SELECT set_config('baton.namespace', $1, true)";

/// The fenced append, one statement: the row is inserted if its position is free and the
/// run has no tombstone; if not, the row holding it comes back (the `NOT EXISTS` arm reads it
/// in the same snapshot), or the tombstone.
pub(super) const APPEND: &str = "
    WITH inserted AS (
        INSERT INTO ledger_segments (namespace, run, run_uid, seq, fence, format, events)
        SELECT $1, $2, $3, $4::bigint, $5::bigint, $6::integer, $7::json
         WHERE NOT EXISTS (SELECT 1 FROM ledger_tombstones WHERE run_uid = $3)
        ON CONFLICT (run_uid, seq) DO NOTHING
        RETURNING seq)
    SELECT 'created' AS found, NULL::text AS run, NULL::bigint AS fence,
           NULL::integer AS format, NULL::json AS events
      FROM inserted
    UNION ALL
    SELECT 'taken', run, fence, format, events FROM ledger_segments
     WHERE run_uid = $3 AND seq = $4 AND NOT EXISTS (SELECT 1 FROM inserted)
    UNION ALL
    SELECT 'deleted', NULL, NULL, NULL, NULL FROM ledger_tombstones WHERE run_uid = $3";

/// A lock no append to the table can share (an insert holds ROW EXCLUSIVE): taken, it waits
/// for the appends in flight to commit, and an append that comes meanwhile waits for it.
pub(super) const NO_APPENDS: &str = "LOCK TABLE ledger_segments IN SHARE ROW EXCLUSIVE MODE";

pub(super) const TOMBSTONE: &str = "
    INSERT INTO ledger_tombstones (namespace, run_uid) VALUES ($1, $2)
    ON CONFLICT (run_uid, namespace) DO NOTHING";

pub(super) const LIST_AFTER: &str = "
    SELECT run, seq, fence, format, events FROM ledger_segments
     WHERE run_uid = $1 AND seq > $2 ORDER BY seq";

/// Every segment of the runs of the UIDs in `$1`: a turn's history in one round trip.
pub(super) const LIST_RUNS: &str = "
    SELECT run_uid, run, seq, fence, format, events FROM ledger_segments
     WHERE run_uid = ANY($1) ORDER BY run_uid, seq";

pub(super) const LIST_PAGE: &str = "
    SELECT run, seq, fence, format, events FROM ledger_segments
     WHERE run_uid = $1 AND seq > $2 ORDER BY seq LIMIT $3";

pub(super) const DELETE_RUN: &str = "
    WITH deleted AS (DELETE FROM ledger_segments WHERE run_uid = $1 RETURNING 1)
    SELECT count(*) FROM deleted";
