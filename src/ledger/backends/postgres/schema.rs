//! The PostgreSQL ledger's schema, migrated by baton itself when it connects: numbered steps,
//! each applied once in its own transaction and recorded in `baton_schema`, under an advisory
//! lock so replicas starting together migrate once.
//!
//! During a rollout the previous release's servers keep serving the database the new one
//! migrated. So each step says the oldest schema version whose binaries may still serve a
//! database at its version (`oldest_reader`, recorded with it): an additive step (a table, a
//! nullable column, an index) keeps the one before it; a step that older binaries cannot
//! serve safely (they would write rows the new schema forbids, or skip what it requires)
//! names its own version. A binary serves a newer database only when its newest step allows
//! it, and then migrates nothing; otherwise it refuses to start, saying which it needs.
//! Binaries before this rule refuse every newer database: the rule holds from the release
//! that brought it on.

use tokio_postgres::Client;

use super::PgError;

/// Any number, the same for every binary: the advisory lock migrations are taken under.
const MIGRATION_LOCK: i64 = 0x6261_746f_6e00_0001;

/// A step of the schema: its SQL, and the oldest schema version whose binaries may still serve
/// a database at this step's version.
struct Step {
    sql: &'static str,
    oldest_reader: i32,
}

/// The steps, in order; step `i` moves the schema to version `i + 1`. Never edit a step that
/// has shipped: add one.
const STEPS: &[Step] = &[
    // 1: segments keyed by (run UID, position). The primary key is the fence's primitive:
    // "create at tail+1 if absent". Events are `json`, not `jsonb`: kept byte for byte (a
    // retry is recognised by its exact content) and a model's "\u0000" is stored, not refused.
    // Row-level security, forced so it binds the table's owner too: a statement sees and
    // writes only rows of the namespace its session named (`baton.namespace`); unset, none.
    Step {
        oldest_reader: 1,
        sql: r#"
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
    },
    // 2: a deleted run's tombstone. Deleting rows frees their positions, and a fenced
    // append is judged only where it collides: a writer still running would write at a
    // freed position unopposed. The append refuses a run with a tombstone; the tombstone is
    // written under a table lock that waits for appends in flight (see `PgLedger::bury`).
    // Namespaces apart, as for the segments (keyed by namespace too: a tombstone written in
    // one namespace's session never stands in for another's).
    // Not servable by a binary of version 1: it would append past a tombstone.
    Step {
        oldest_reader: 2,
        sql: r#"
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
    },
];

/// The schema version this binary writes.
pub const VERSION: i32 = STEPS.len() as i32;

/// Brings the database to [`VERSION`], or leaves a newer one this binary may serve as it is;
/// returns the version it found.
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
                 applied_at timestamptz NOT NULL DEFAULT now());
             ALTER TABLE baton_schema ADD COLUMN IF NOT EXISTS oldest_reader integer;",
        )
        .await?;
    let result = apply_missing(client).await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    result
}

async fn apply_missing(client: &mut Client) -> Result<i32, PgError> {
    let newest = client
        .query_opt(
            "SELECT version, oldest_reader FROM baton_schema ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await?;
    let (found, oldest_reader) = newest.map_or((0, None), |row| (row.get(0), row.get(1)));
    let from = match plan(found, oldest_reader, VERSION)? {
        Plan::Migrate { from } => from,
        Plan::ServeNewer => {
            tracing::info!(
                found,
                known = VERSION,
                "PostgreSQL ledger schema is newer than this binary and says it may serve it"
            );
            return Ok(found);
        }
    };
    for (i, step) in STEPS.iter().enumerate().skip(from as usize) {
        let version = i as i32 + 1;
        let tx = client.transaction().await?;
        tx.batch_execute(step.sql).await?;
        tx.execute(
            "INSERT INTO baton_schema (version, oldest_reader) VALUES ($1, $2)",
            &[&version, &step.oldest_reader],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version, "PostgreSQL ledger schema migrated");
    }
    Ok(found)
}

/// What a binary that knows versions up to `known` does with a database at `found`.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Apply the steps after `from` (none when `from == known`).
    Migrate { from: i32 },
    /// Serve the newer database as it is: its newest step allows binaries of `known`.
    ServeNewer,
}

/// The decision of [`migrate`], apart from the database: `oldest_reader` is what the newest
/// step recorded (None: recorded before the rule, by a binary that allows no older one).
pub fn plan(found: i32, oldest_reader: Option<i32>, known: i32) -> Result<Plan, PgError> {
    if found <= known {
        return Ok(Plan::Migrate { from: found });
    }
    match oldest_reader {
        Some(oldest) if oldest <= known => Ok(Plan::ServeNewer),
        _ => Err(PgError::SchemaTooNew {
            found,
            known,
            oldest_reader: oldest_reader.unwrap_or(found),
        }),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_at_or_behind_the_binary_is_migrated_from_where_it_is() {
        assert_eq!(plan(0, None, 2).unwrap(), Plan::Migrate { from: 0 });
        assert_eq!(plan(1, Some(1), 2).unwrap(), Plan::Migrate { from: 1 });
        assert_eq!(plan(2, None, 2).unwrap(), Plan::Migrate { from: 2 });
    }

    #[test]
    fn a_newer_database_is_served_only_when_its_newest_step_allows_the_binary() {
        assert_eq!(plan(3, Some(2), 2).unwrap(), Plan::ServeNewer);
        assert_eq!(plan(4, Some(1), 2).unwrap(), Plan::ServeNewer);
        let refused = plan(3, Some(3), 2).unwrap_err().to_string();
        assert!(
            refused.contains("version 3") && refused.contains("(2)"),
            "{refused}"
        );
        assert!(refused.contains("schema version 3 or later"), "{refused}");
        assert!(matches!(
            plan(3, None, 2),
            Err(PgError::SchemaTooNew {
                oldest_reader: 3,
                ..
            })
        ));
    }

    #[test]
    fn every_step_allows_no_binary_newer_than_itself_and_none_older_than_the_step_before() {
        let mut floor = 1;
        for (i, step) in STEPS.iter().enumerate() {
            let version = i as i32 + 1;
            assert!(
                (floor..=version).contains(&step.oldest_reader),
                "step {version}: oldest_reader {} outside {floor}..={version}",
                step.oldest_reader
            );
            floor = step.oldest_reader;
        }
    }
}
