//! The ledger in PostgreSQL (docs/ledger-backends.md): the same segments, the same fence, for
//! clusters whose etcd should not hold every transcript byte.
//!
//! A segment is a row keyed by (run UID, position). An append is one statement: it inserts
//! the row if the position is free and otherwise returns the row that holds it, which
//! [`crate::fence::verdict`] judges exactly as it judges a LedgerSegment met by a create.
//! Every statement runs with its session naming one namespace (`baton.namespace`), and the
//! table's row-level security lets it see and write only that namespace's rows.

mod many;
pub mod schema;
mod sql;
mod tls;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::types::Json;
use tokio_postgres::{AsyncMessage, Row};

use sql::*;

use tls::Tls;

use crate::crd::v1alpha1::{LEDGER_FORMAT_VERSION, LedgerEvent, LedgerSegment};
use crate::fence::Fence;
use crate::ledger::append::{Appended, AtPosition, Positions, append_fenced, segment_of_run};
use crate::ledger::{LedgerError, SEGMENT_BUDGET_BYTES, check_contiguous_after, is_segment_of};

/// Errors of the PostgreSQL ledger.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("PostgreSQL: {}", crate::causes::with_causes(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("PostgreSQL connection pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("the PostgreSQL URL is not valid: {0}")]
    Url(String),
    /// The certificates to check the server's against could not be read.
    #[error("PostgreSQL TLS: {0}")]
    Tls(String),
    /// Row-level security would not bind this role: baton refuses to serve as it.
    #[error(
        "PostgreSQL role {role} is a superuser or has BYPASSRLS: row-level security would not \
         keep namespaces apart; connect as a role without either"
    )]
    BypassingRole { role: String },
    #[error(
        "the PostgreSQL ledger's schema is at version {found}, newer than this baton knows \
         ({known}), and it is served only by a baton of schema version {oldest_reader} or \
         later: upgrade baton"
    )]
    SchemaTooNew {
        found: i32,
        known: i32,
        oldest_reader: i32,
    },
    /// A position is taken by a row this namespace's session cannot see (a UID collision
    /// across namespaces: never a legitimate state).
    #[error("ledger position {seq} of run UID {uid} is taken by a row of another namespace")]
    Invisible { uid: String, seq: i64 },
}

impl PgError {
    /// The database could not be reached or dropped the connection (a restart, a failover):
    /// not an answer to the statement.
    pub fn is_connection(&self) -> bool {
        match self {
            PgError::Db(e) => e.is_closed() || e.as_db_error().is_none(),
            PgError::Pool(_) => true,
            _ => false,
        }
    }
}

/// How many connections a process keeps at most.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// A segment appended, as the database announces it (`NOTIFY baton_ledger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Appended {
        namespace: String,
        run_uid: String,
        seq: i64,
    },
    /// The listening connection was lost and made again: notices may have been missed, so
    /// every follower reads its run again.
    Resync,
}

/// The PostgreSQL ledger of a whole cluster: a connection pool, schema migrated.
#[derive(Clone)]
pub struct PgLedger {
    pool: Pool,
    config: tokio_postgres::Config,
    tls: Tls,
}

impl PgLedger {
    /// Connects to `url` (a `postgres://` URL or key=value string), checks the role cannot
    /// bypass row-level security, and migrates the schema. TLS as the URL's `sslmode` asks
    /// (`prefer`, the default: when the server offers it; `require`: always), the server's
    /// certificate checked against the system's roots.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Self, PgError> {
        Self::connect_with(url, pool_size, tls::system_roots()?).await
    }

    /// [`PgLedger::connect`], the server's certificate checked against the CA certificates
    /// (PEM) in `ca_file` instead (a managed database's own CA, say).
    pub async fn connect_trusting(
        url: &str,
        pool_size: usize,
        ca_file: &std::path::Path,
    ) -> Result<Self, PgError> {
        Self::connect_with(url, pool_size, tls::trusting(ca_file)?).await
    }

    async fn connect_with(url: &str, pool_size: usize, tls: Tls) -> Result<Self, PgError> {
        let config =
            tokio_postgres::Config::from_str(url).map_err(|e| PgError::Url(e.to_string()))?;
        let (mut client, connection) = config.connect(tls.clone()).await?;
        let driver = tokio::spawn(connection);
        let migrated = schema::migrate(&mut client).await;
        drop(client);
        let _ = driver.await;
        migrated?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .build()
            .map_err(|e| PgError::Url(e.to_string()))?;
        Ok(Self { pool, config, tls })
    }

    /// The ledger of one run: `run` with UID `uid` in `namespace`.
    pub fn for_run(&self, namespace: &str, run: &str, uid: &str) -> PgRunLedger {
        PgRunLedger {
            db: self.clone(),
            namespace: namespace.to_string(),
            run: run.to_string(),
            run_uid: uid.to_string(),
            budget: SEGMENT_BUDGET_BYTES,
        }
    }

    /// Rows of `query` run in `namespace`'s session, one round trip: the namespace statement
    /// and `query` go out together on one connection no one else uses meanwhile.
    async fn in_namespace(
        &self,
        namespace: &str,
        query: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, PgError> {
        let client = self.pool.get().await?;
        let scope = client.prepare_cached(IN_NAMESPACE).await?;
        let statement = client.prepare_cached(query).await?;
        let scope_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&namespace];
        let (_, rows) = futures::try_join!(
            client.query(&scope, &scope_params),
            client.query(&statement, params)
        )?;
        Ok(rows)
    }

    /// Writes the tombstone of run `run_uid` of `namespace`, after which no append to it
    /// lands. The lock waits for the appends in flight (their rows are then there to be
    /// deleted), and an append that waited for the lock takes its snapshot once it is
    /// released, so it sees the tombstone (READ COMMITTED takes a statement's snapshot after
    /// the statement's locks are held). The lock is held for this one insert.
    async fn bury(&self, namespace: &str, run_uid: &str) -> Result<(), PgError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute(IN_NAMESPACE_HERE, &[&namespace]).await?;
        tx.batch_execute(NO_APPENDS).await?;
        tx.execute(TOMBSTONE, &[&namespace, &run_uid]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Every append the database announces, from now on; a lost listening connection is made
    /// again (after `retry`) and announced as [`Notice::Resync`]. Ends when every receiver
    /// is gone.
    pub fn listen(&self, retry: Duration) -> broadcast::Receiver<Notice> {
        let (tx, rx) = broadcast::channel(1024);
        let (config, tls) = (self.config.clone(), self.tls.clone());
        // Every (re)connection announces itself with a resync once its LISTEN holds.
        tokio::spawn(async move {
            while tx.receiver_count() > 0 {
                if let Err(err) = forward_notices(&config, &tls, &tx).await {
                    tracing::warn!(%err, "listening for ledger appends failed; listening again");
                }
                tokio::time::sleep(retry).await;
            }
        });
        rx
    }
}

/// One listening connection's life: LISTEN, then every notification forwarded as a
/// [`Notice`], until the connection ends.
async fn forward_notices(
    config: &tokio_postgres::Config,
    tls: &Tls,
    tx: &broadcast::Sender<Notice>,
) -> Result<(), PgError> {
    let (client, mut connection) = config.connect(tls.clone()).await?;
    let (messages_tx, mut messages) = tokio::sync::mpsc::unbounded_channel();
    // The connection is polled for its messages here (tokio-postgres hands notifications out
    // only so); the client's LISTEN goes through it.
    let driver = tokio::spawn(async move {
        let mut stream = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            if messages_tx.send(message).is_err() {
                break;
            }
        }
    });
    client.batch_execute("LISTEN baton_ledger").await?;
    // The listening session's own reads would need a namespace; it reads nothing.
    let _ = tx.send(Notice::Resync);
    while let Some(message) = messages.recv().await {
        let AsyncMessage::Notification(n) = message? else {
            continue;
        };
        if let Some(notice) = parse_notice(n.payload())
            && tx.send(notice).is_err()
        {
            break;
        }
    }
    driver.abort();
    Ok(())
}

/// `<namespace>/<run UID>/<seq>`, as the insert trigger writes it.
fn parse_notice(payload: &str) -> Option<Notice> {
    let mut parts = payload.splitn(3, '/');
    let (namespace, run_uid, seq) = (parts.next()?, parts.next()?, parts.next()?);
    Some(Notice::Appended {
        namespace: namespace.to_string(),
        run_uid: run_uid.to_string(),
        seq: seq.parse().ok()?,
    })
}

/// A position is the row (run UID, seq): one statement inserts it or returns the one there.
impl Positions for PgRunLedger {
    fn run(&self) -> (&str, &str) {
        (&self.run, &self.run_uid)
    }

    fn budget(&self) -> usize {
        self.budget
    }

    async fn create_at(
        &self,
        seq: i64,
        fence: Fence,
        events: &[LedgerEvent],
    ) -> Result<AtPosition, LedgerError> {
        // A position taken by a transaction that commits while ours runs is neither inserted
        // nor visible to our snapshot: the statement comes back empty, and once more reads it.
        for _ in 0..2 {
            if let Some(found) = self.try_position(seq, fence, events).await? {
                return Ok(found);
            }
        }
        Err(PgError::Invisible {
            uid: self.run_uid.clone(),
            seq,
        }
        .into())
    }
}

/// One run's ledger in PostgreSQL: what [`crate::ledger::SegmentStore`] is in the API server.
#[derive(Clone)]
pub struct PgRunLedger {
    db: PgLedger,
    namespace: String,
    run: String,
    run_uid: String,
    budget: usize,
}

impl PgRunLedger {
    /// Overrides the per-segment budget (tests use a small one to exercise splitting).
    pub fn with_budget(mut self, budget: usize) -> Self {
        self.budget = budget;
        self
    }

    /// All segments of the run, ordered by position and checked to be contiguous.
    pub async fn list(&self) -> Result<Vec<LedgerSegment>, LedgerError> {
        self.list_after(0).await
    }

    /// The segments after position `after`, in order and checked contiguous from there (a
    /// follower's read).
    pub async fn list_after(&self, after: i64) -> Result<Vec<LedgerSegment>, LedgerError> {
        let segments = self.rows_after(after).await?;
        check_contiguous_after(after, &segments)?;
        Ok(segments)
    }

    /// At most `limit` segments after position `after`, in order and checked contiguous
    /// from there (a page of a reader that must not hold a whole ledger).
    pub async fn list_page(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LedgerSegment>, LedgerError> {
        let limit = limit as i64;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&self.run_uid, &after, &limit];
        let segments = self.rows(LIST_PAGE, &params).await?;
        check_contiguous_after(after, &segments)?;
        Ok(segments)
    }

    /// The rows after position `after`, in order, this run's only.
    async fn rows_after(&self, after: i64) -> Result<Vec<LedgerSegment>, LedgerError> {
        self.rows(LIST_AFTER, &[&self.run_uid, &after]).await
    }

    /// The rows `query` selects, this run's only (a row claiming another run is logged).
    async fn rows(
        &self,
        query: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<LedgerSegment>, LedgerError> {
        let rows = self.db.in_namespace(&self.namespace, query, params).await?;
        self.own_segments(&rows)
    }

    /// The segments `rows` hold, this run's only (a row claiming another run is logged).
    fn own_segments(&self, rows: &[Row]) -> Result<Vec<LedgerSegment>, LedgerError> {
        let mut segments = Vec::with_capacity(rows.len());
        for row in rows {
            let segment = self.segment_of_row(row, 0)?;
            if is_segment_of(&segment, &self.run, &self.run_uid) {
                segments.push(segment);
            } else {
                tracing::warn!(run = %self.run, claims = %segment.spec.run,
                    "a ledger row with this run's UID names another run: ignored");
            }
        }
        Ok(segments)
    }

    /// Deletes every segment of the run, for good: its tombstone first (no append lands
    /// after it), then its rows; returns how many there were. Idempotent.
    pub async fn delete(&self) -> Result<i64, LedgerError> {
        self.db.bury(&self.namespace, &self.run_uid).await?;
        let rows = self
            .db
            .in_namespace(&self.namespace, DELETE_RUN, &[&self.run_uid])
            .await?;
        Ok(rows.first().map_or(0, |r| r.get(0)))
    }

    /// Fenced append (docs/protocol.md), as [`crate::ledger::append`] rules it: `events` at
    /// `tail + 1` onwards under `fence`; each position one statement, one round trip.
    pub async fn append(
        &self,
        tail: i64,
        fence: Fence,
        events: Vec<LedgerEvent>,
    ) -> Result<Appended, LedgerError> {
        append_fenced(self, tail, fence, events).await
    }

    /// One [`APPEND`] statement at `seq`: the row created, or the row in the way; the run
    /// deleted is an error (lost).
    async fn try_position(
        &self,
        seq: i64,
        fence: Fence,
        events: &[LedgerEvent],
    ) -> Result<Option<AtPosition>, LedgerError> {
        let rows = self
            .db
            .in_namespace(
                &self.namespace,
                APPEND,
                &[
                    &self.namespace,
                    &self.run,
                    &self.run_uid,
                    &seq,
                    &fence.get(),
                    &LEDGER_FORMAT_VERSION,
                    &Json(events),
                ],
            )
            .await?;
        let found = |what: &str| rows.iter().find(|r| r.get::<_, &str>("found") == what);
        if found("deleted").is_some() {
            return Err(LedgerError::Deleted { seq });
        }
        if found("created").is_some() {
            let created = self.segment(seq, fence, LEDGER_FORMAT_VERSION, events.to_vec());
            return Ok(Some(AtPosition::Created(created)));
        }
        match found("taken") {
            Some(row) => Ok(Some(AtPosition::Taken(self.segment_of_row(row, seq)?))),
            None => Ok(None),
        }
    }

    /// The segment a row holds (`seq` when the row carries none).
    fn segment_of_row(&self, row: &Row, seq: i64) -> Result<LedgerSegment, LedgerError> {
        let seq = row.try_get::<_, i64>("seq").unwrap_or(seq);
        let Json(events): Json<Vec<LedgerEvent>> =
            row.try_get("events")
                .map_err(|e| LedgerError::CorruptChunk {
                    seq,
                    detail: format!("the row's events do not read as events: {e}"),
                })?;
        let mut segment =
            self.segment(seq, Fence::new(row.get("fence")), row.get("format"), events);
        segment.spec.run = row.get("run");
        Ok(segment)
    }

    /// A segment of this run, as the API server's ledger would hold it: the same name,
    /// labels and spec, so every reader and rule takes it alike.
    fn segment(
        &self,
        seq: i64,
        fence: Fence,
        format: i32,
        events: Vec<LedgerEvent>,
    ) -> LedgerSegment {
        let mut segment = segment_of_run(&self.run, &self.run_uid, seq, fence, events);
        segment.metadata.namespace = Some(self.namespace.clone());
        segment.spec.format = format;
        segment
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_read_from_the_triggers_payload() {
        assert_eq!(
            parse_notice("team-a/7f0c/12"),
            Some(Notice::Appended {
                namespace: "team-a".into(),
                run_uid: "7f0c".into(),
                seq: 12
            })
        );
        assert_eq!(parse_notice("team-a/7f0c/x"), None);
        assert_eq!(parse_notice("team-a/7f0c"), None);
    }
}
