//! The PostgreSQL ledger's schema, migrated by baton itself when it connects: numbered steps,
//! each applied once in its own transaction and recorded in `baton_schema`, under an advisory
//! lock so replicas starting together migrate once. A database at a newer version than this
//! binary knows is refused (an older binary must not write rows a newer schema forbids).

use tokio_postgres::Client;

use super::PgError;

/// Any number, the same for every binary: the advisory lock migrations are taken under.
const MIGRATION_LOCK: i64 = 0x6261_746f_6e00_0001;

/// The steps, in order; step `i` moves the schema to version `i + 1`. Never edit a step that
/// has shipped: add one.
const STEPS: &[&str] = &[
    // 1: segments keyed by (run UID, position). The primary key is the fence's primitive:
    // "create at tail+1 if absent". Events are `json`, not `jsonb`: kept byte for byte (a
    // retry is recognised by its exact content) and a model's "\u0000" is stored, not refused.
    // Row-level security, forced so it binds the table's owner too: a statement sees and
    // writes only rows of the namespace its session named (`baton.namespace`); unset, none.
    r#"
    CREATE TABLE ledger_segments (
        namespace  text        NOT NULL CHECK (namespace <> ''),
        run        text        NOT NULL CHECK (run <> ''),
        run_uid    text        NOT NULL CHECK (run_uid <> ''),
        seq        bigint      NOT NULL CHECK (seq >= 1),
        fence      bigint      NOT NULL CHECK (fence >= 0),
        format     integer     NOT NULL,
        events     json        NOT NULL,
        written_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_uid, seq)
    );
    CREATE INDEX ledger_segments_by_run ON ledger_segments (namespace, run);
    ALTER TABLE ledger_segments ENABLE ROW LEVEL SECURITY;
    ALTER TABLE ledger_segments FORCE ROW LEVEL SECURITY;
    CREATE POLICY one_namespace ON ledger_segments
        USING (namespace = current_setting('baton.namespace', true))
        WITH CHECK (namespace = current_setting('baton.namespace', true));
    CREATE FUNCTION ledger_segments_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('baton_ledger', NEW.namespace || '/' || NEW.run_uid || '/' || NEW.seq);
        RETURN NULL;
    END $$;
    CREATE TRIGGER ledger_segments_notify AFTER INSERT ON ledger_segments
        FOR EACH ROW EXECUTE FUNCTION ledger_segments_notify();
    "#,
    // 2: a deleted run's tombstone. Deleting rows frees their positions, and a fenced
    // append is judged only where it collides: a writer still running would write at a
    // freed position unopposed. The append refuses a run with a tombstone; the tombstone is
    // written under a table lock that waits for appends in flight (see `PgLedger::bury`).
    // Namespaces apart, as for the segments (keyed by namespace too: a tombstone written in
    // one namespace's session never stands in for another's).
    r#"
    CREATE TABLE ledger_tombstones (
        namespace  text        NOT NULL CHECK (namespace <> ''),
        run_uid    text        NOT NULL CHECK (run_uid <> ''),
        deleted_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_uid, namespace)
    );
    ALTER TABLE ledger_tombstones ENABLE ROW LEVEL SECURITY;
    ALTER TABLE ledger_tombstones FORCE ROW LEVEL SECURITY;
    CREATE POLICY one_namespace ON ledger_tombstones
        USING (namespace = current_setting('baton.namespace', true))
        WITH CHECK (namespace = current_setting('baton.namespace', true));
    "#,
];

/// The schema version this binary writes.
pub const VERSION: i32 = STEPS.len() as i32;

/// Brings the database to [`VERSION`]; returns the version it found.
pub async fn migrate(client: &mut Client) -> Result<i32, PgError> {
    refuse_bypassing_role(client).await?;
    // The lock comes first: even `CREATE TABLE IF NOT EXISTS` fails when two sessions run it
    // at once (both see no table, one meets the other's type). Held by this session, it goes
    // with the connection if anything below fails.
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS baton_schema (
                 version    integer     PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    let result = apply_missing(client).await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    result
}

async fn apply_missing(client: &mut Client) -> Result<i32, PgError> {
    let found: i32 = client
        .query_one("SELECT coalesce(max(version), 0) FROM baton_schema", &[])
        .await?
        .get(0);
    if found > VERSION {
        return Err(PgError::SchemaTooNew {
            found,
            known: VERSION,
        });
    }
    for (i, step) in STEPS.iter().enumerate().skip(found as usize) {
        let version = i as i32 + 1;
        let tx = client.transaction().await?;
        tx.batch_execute(step).await?;
        tx.execute(
            "INSERT INTO baton_schema (version) VALUES ($1)",
            &[&version],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version, "PostgreSQL ledger schema migrated");
    }
    Ok(found)
}

/// Row-level security binds neither a superuser nor a role with BYPASSRLS: baton refuses to
/// serve as one, so the namespace boundary is the database's, not only baton's.
async fn refuse_bypassing_role(client: &Client) -> Result<(), PgError> {
    let row = client
        .query_one(
            "SELECT current_user::text, rolsuper OR rolbypassrls FROM pg_roles
             WHERE rolname = current_user",
            &[],
        )
        .await?;
    if row.get::<_, bool>(1) {
        return Err(PgError::BypassingRole {
            role: row.get::<_, String>(0),
        });
    }
    Ok(())
}
