//! The PostgreSQL ledger against a real PostgreSQL (hack/postgres.sh, started by the bed's
//! script): the fenced append's every case, the namespace boundary the database keeps, the
//! schema migrated once by many, and the announcements followers wake on.

use std::time::Duration;

use baton::crd::v1alpha1::{LedgerEvent, Role};
use baton::fence::{CloseReason, Fence};
use baton::ledger::postgres::{Notice, PgError, PgLedger, schema};
use baton::ledger::{LedgerError, Replay, ReplayedMessage};

use baton_testkit::server::own_postgres::OwnPostgres;

/// The database the bed started; without one the test fails (it never skips).
async fn ledger() -> PgLedger {
    let url = std::env::var("BATON_TEST_POSTGRES_URL").expect(
        "BATON_TEST_POSTGRES_URL is not set: run the tests through hack/with-control-plane.sh, \
         which starts PostgreSQL (hack/postgres.sh)",
    );
    PgLedger::connect(&url, 4)
        .await
        .expect("connecting to the test PostgreSQL")
}

fn uid() -> String {
    format!("uid-{:032x}", rand::random::<u128>())
}

fn said(text: &str) -> Vec<LedgerEvent> {
    vec![LedgerEvent::Message {
        role: Role::Assistant,
        content: text.to_string(),
    }]
}

#[tokio::test]
async fn an_append_lands_at_the_free_position_and_reads_back_whole() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid());
    // A model's NUL character and every other byte of its text come back as written.
    let text = "line\u{0}with a NUL, \"quotes\", and ünïcödé";
    let appended = run.append(0, Fence::new(1), said(text)).await.unwrap();
    assert_eq!(appended.tail, 1);
    assert_eq!(appended.written.len(), 1);
    assert!(appended.slipped.is_empty());
    let listed = run.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].spec.events, said(text));
    assert_eq!(listed[0].spec.fence, Fence::new(1));
    let replay = Replay::from_segments(&listed).unwrap();
    assert_eq!(replay.tail, 1);
}

#[tokio::test]
async fn our_own_retry_at_a_taken_position_is_success() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid());
    run.append(0, Fence::new(1), said("once")).await.unwrap();
    // The same write again (its answer was lost): it is ours, nothing is written twice.
    let again = run.append(0, Fence::new(1), said("once")).await.unwrap();
    assert_eq!(again.tail, 1);
    assert_eq!(again.written.len(), 1);
    assert_eq!(run.list().await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_older_owners_segment_is_history_moved_past() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid());
    run.append(0, Fence::new(1), said("old")).await.unwrap();
    let appended = run.append(0, Fence::new(2), said("new")).await.unwrap();
    assert_eq!(appended.tail, 2);
    assert_eq!(appended.slipped.len(), 1);
    assert_eq!(appended.slipped[0].spec.events, said("old"));
    let fences: Vec<_> = run
        .list()
        .await
        .unwrap()
        .iter()
        .map(|s| s.spec.fence)
        .collect();
    assert_eq!(fences, [Fence::new(1), Fence::new(2)]);
}

#[tokio::test]
async fn a_newer_owner_or_another_content_under_our_fence_loses_the_run() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid());
    run.append(0, Fence::new(3), said("newer")).await.unwrap();
    let err = run
        .append(0, Fence::new(2), said("stale"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Superseded { seq: 1, theirs, .. } if theirs == Fence::new(3)),
        "{err}"
    );
    let err = run
        .append(0, Fence::new(3), said("not what we wrote"))
        .await
        .unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert_eq!(
        run.list().await.unwrap().len(),
        1,
        "nothing stale was written"
    );
}

#[tokio::test]
async fn a_seal_at_the_position_closes_the_ledger_for_its_worker() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid());
    run.append(0, Fence::new(1), said("working")).await.unwrap();
    // The controller's seal of a terminal claim, at fence 2, lands at position 2 first.
    let seal = vec![LedgerEvent::Closed {
        fence: Fence::new(2),
        reason: CloseReason::StopRequested,
    }];
    run.append(1, Fence::new(2), seal).await.unwrap();
    let err = run
        .append(1, Fence::new(1), said("late"))
        .await
        .unwrap_err();
    assert!(matches!(err, LedgerError::Closed { seq: 2, .. }), "{err}");
}

#[tokio::test]
async fn two_writers_racing_for_one_position_one_wins_the_other_learns_it() {
    let db = ledger().await;
    for _ in 0..30 {
        let uid = uid();
        let (a, b) = (
            db.for_run("team-a", "r", &uid),
            db.for_run("team-a", "r", &uid),
        );
        let (older, newer) = tokio::join!(
            a.append(0, Fence::new(1), said("older")),
            b.append(0, Fence::new(2), said("newer")),
        );
        // The newer writer always lands: after the older's segment (history to it), or first.
        let newer = newer.unwrap();
        let listed = a.list().await.unwrap();
        match older {
            Ok(older) => {
                assert_eq!((older.tail, newer.tail, newer.slipped.len()), (1, 2, 1));
                assert_eq!(listed.len(), 2);
            }
            Err(err) => {
                assert!(err.is_lost(), "{err}");
                assert_eq!(
                    (newer.tail, listed.len()),
                    (1, 1),
                    "the older wrote nothing"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_namespace_neither_reads_nor_writes_another_namespaces_rows() {
    let db = ledger().await;
    let uid = uid();
    let ours = db.for_run("team-a", "r", &uid);
    ours.append(0, Fence::new(1), said("secret of team-a"))
        .await
        .unwrap();
    // The same run UID asked for from team-b's session: the database shows it nothing...
    let theirs = db.for_run("team-b", "r", &uid);
    assert!(theirs.list().await.unwrap().is_empty());
    // ...and its append at the taken position neither overwrites nor reads the row.
    let err = theirs
        .append(0, Fence::new(9), said("forged"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("another namespace"), "{err}");
    assert_eq!(
        theirs.delete().await.unwrap(),
        0,
        "nothing of team-a deleted"
    );
    assert_eq!(
        ours.list().await.unwrap()[0].spec.events,
        said("secret of team-a")
    );
}

#[tokio::test]
async fn a_runs_rows_are_deleted_with_it_and_no_other_runs() {
    let db = ledger().await;
    let (gone, kept) = (
        db.for_run("team-a", "r1", &uid()),
        db.for_run("team-a", "r2", &uid()),
    );
    gone.append(0, Fence::new(1), said("a")).await.unwrap();
    gone.append(1, Fence::new(1), said("b")).await.unwrap();
    kept.append(0, Fence::new(1), said("c")).await.unwrap();
    assert_eq!(gone.delete().await.unwrap(), 2);
    assert!(gone.list().await.unwrap().is_empty());
    assert_eq!(kept.list().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_deleted_runs_writers_append_nothing_more() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid());
    run.append(0, Fence::new(1), said("a")).await.unwrap();
    run.append(1, Fence::new(2), said("b")).await.unwrap();
    assert_eq!(run.delete().await.unwrap(), 2);
    // Every position is free again, and no fence is there to oppose a writer: the
    // tombstone does. The writer at the tail and one far behind it both lose the run.
    for (tail, fence) in [(2, 2), (0, 1), (1, 3)] {
        let err = run
            .append(tail, Fence::new(fence), said("late"))
            .await
            .unwrap_err();
        assert!(matches!(err, LedgerError::Deleted { .. }), "{err}");
        assert!(err.is_lost());
    }
    assert!(run.list().await.unwrap().is_empty());
    assert_eq!(
        run.delete().await.unwrap(),
        0,
        "a second deletion finds nothing"
    );
}

#[tokio::test]
async fn an_append_that_waits_on_a_deletion_sees_its_tombstone() {
    let db = ledger().await;
    let uid = uid();
    let run = db.for_run("team-a", "r", &uid);
    run.append(0, Fence::new(1), said("a")).await.unwrap();
    // A deletion holding the lock, its tombstone written and not yet committed...
    let url = std::env::var("BATON_TEST_POSTGRES_URL").unwrap();
    let (mut deleter, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let tx = deleter.transaction().await.unwrap();
    tx.execute("SELECT set_config('baton.namespace', 'team-a', true)", &[])
        .await
        .unwrap();
    tx.batch_execute("LOCK TABLE ledger_segments IN SHARE ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    tx.execute(
        "INSERT INTO ledger_tombstones (namespace, run_uid) VALUES ('team-a', $1)",
        &[&uid],
    )
    .await
    .unwrap();
    // ...an append comes meanwhile, and waits for it.
    let writer = run.clone();
    let append = tokio::spawn(async move { writer.append(1, Fence::new(1), said("b")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !append.is_finished(),
        "the append waits for the deletion's lock"
    );
    tx.commit().await.unwrap();
    // Its snapshot is taken once the lock is released: it sees the tombstone, not a free
    // position.
    let err = append.await.unwrap().unwrap_err();
    assert!(matches!(err, LedgerError::Deleted { .. }), "{err}");
    assert_eq!(
        run.list().await.unwrap().len(),
        1,
        "nothing landed after it"
    );
}

#[tokio::test]
async fn big_events_are_split_across_positions_and_rebuilt() {
    let db = ledger().await;
    let run = db.for_run("team-a", "r", &uid()).with_budget(4096);
    let big = "x".repeat(20_000);
    let appended = run.append(0, Fence::new(1), said(&big)).await.unwrap();
    assert!(appended.tail > 1, "split over {} positions", appended.tail);
    let replay = Replay::from_segments(&run.list().await.unwrap()).unwrap();
    assert!(
        replay
            .messages
            .iter()
            .any(|m| matches!(m, ReplayedMessage::Assistant { text, .. } if *text == big)),
        "the event is rebuilt whole"
    );
}

#[tokio::test]
async fn many_replicas_connecting_at_once_to_a_fresh_database_migrate_it_once() {
    let fresh_url = fresh_database("migrate").await;
    let connects = (0..6).map(|_| PgLedger::connect(&fresh_url, 1));
    for connected in futures::future::join_all(connects).await {
        connected.expect("every replica connects");
    }
    let (db, connection) = tokio_postgres::connect(&fresh_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let versions: Vec<i32> = db
        .query("SELECT version FROM baton_schema ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        (1..=schema::VERSION).collect::<Vec<_>>(),
        "each step once"
    );
}

/// A database of its own on the bed's server (empty, no schema); its URL.
async fn fresh_database(what: &str) -> String {
    let url = std::env::var("BATON_TEST_POSTGRES_URL").expect("BATON_TEST_POSTGRES_URL");
    let fresh = format!("baton_{what}_{:016x}", rand::random::<u64>());
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE DATABASE {fresh}"))
        .await
        .unwrap();
    format!("{}/{fresh}", url.rsplit_once('/').unwrap().0)
}

/// During a rollout the previous release's servers keep serving the database the new one
/// migrated: a newer schema whose newest step allows this binary is served as it is (nothing
/// migrated, appends and reads work); one that does not, or that was recorded before the
/// rule, is refused at connect, naming both versions.
#[tokio::test]
async fn a_newer_schema_is_served_only_when_its_newest_step_allows_this_binary() {
    let url = fresh_database("newer").await;
    PgLedger::connect(&url, 1).await.expect("a fresh database");
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let known = schema::VERSION;
    let newer = |version: i32, oldest: Option<i32>| {
        let db = &db;
        async move {
            db.execute(
                "INSERT INTO baton_schema (version, oldest_reader) VALUES ($1, $2)",
                &[&version, &oldest],
            )
            .await
            .unwrap();
        }
    };
    // A newer binary's additive step.
    newer(known + 1, Some(known)).await;
    let served = PgLedger::connect(&url, 1)
        .await
        .expect("a newer schema that allows this binary is served");
    let run = served.for_run("ns", "r", &uid());
    run.append(0, Fence::new(1), said("still served"))
        .await
        .unwrap();
    assert_eq!(run.list().await.unwrap().len(), 1);
    // A newer binary's step this one cannot serve.
    newer(known + 2, Some(known + 2)).await;
    let refused = PgLedger::connect(&url, 1).await.err().expect("refused");
    assert!(
        matches!(refused, PgError::SchemaTooNew { found, known: k, oldest_reader }
            if found == known + 2 && k == known && oldest_reader == known + 2),
        "{refused}"
    );
    // A step recorded before the rule allows no older binary.
    newer(known + 3, None).await;
    let refused = PgLedger::connect(&url, 1).await.err().expect("refused");
    assert!(refused.to_string().contains("upgrade baton"), "{refused}");
}

#[tokio::test]
async fn followers_hear_of_every_append() {
    let db = ledger().await;
    let mut notices = db.listen(Duration::from_millis(200));
    // The listener announces itself ready with a resync.
    let ready = tokio::time::timeout(Duration::from_secs(10), notices.recv()).await;
    assert_eq!(ready.unwrap().unwrap(), Notice::Resync);
    let uid = uid();
    let run = db.for_run("team-a", "r", &uid);
    run.append(0, Fence::new(1), said("one")).await.unwrap();
    run.append(1, Fence::new(1), said("two")).await.unwrap();
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let notice = tokio::time::timeout(Duration::from_secs(10), notices.recv())
            .await
            .expect("an announcement within 10 s")
            .unwrap();
        if let Notice::Appended {
            run_uid,
            seq,
            namespace,
        } = notice
            && run_uid == uid
        {
            assert_eq!(namespace, "team-a");
            heard.push(seq);
        }
    }
    assert_eq!(heard, [1, 2]);
    assert_eq!(run.list_after(1).await.unwrap()[0].spec.seq, 2);
}

#[tokio::test]
async fn a_database_that_requires_tls_is_reached_only_with_its_certificate_trusted() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let issue = || baton::webhook::cert::issue(&["127.0.0.1".into()], now, 3600, None).unwrap();
    let issued = issue();
    let db = OwnPostgres::up_tls("tls", &issued.cert_pem, &issued.key_pem).await;
    assert!(db.url.ends_with("sslmode=require"), "{}", db.url);
    let ca = std::env::temp_dir().join(format!("baton-pg-ca-{:08x}.pem", rand::random::<u32>()));
    std::fs::write(&ca, &issued.ca_pem).unwrap();

    // Its CA trusted: the ledger works over TLS.
    let ledger = PgLedger::connect_trusting(&db.url, 1, &ca).await.unwrap();
    let run = ledger.for_run("team-a", "r", &uid());
    run.append(0, Fence::new(1), said("over TLS"))
        .await
        .unwrap();
    assert_eq!(run.list().await.unwrap().len(), 1);

    // The system's roots do not know this CA: refused, naming the certificate.
    let refused = |result: Result<PgLedger, PgError>| result.err().expect("refused").to_string();
    let err = refused(PgLedger::connect(&db.url, 1).await);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Another CA: refused too.
    std::fs::write(&ca, issue().ca_pem).unwrap();
    let err = refused(PgLedger::connect_trusting(&db.url, 1, &ca).await);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Without TLS the database itself refuses the connection.
    let plain = db.url.replace("sslmode=require", "sslmode=disable");
    let err = refused(PgLedger::connect(&plain, 1).await);
    assert!(err.contains("no pg_hba.conf entry"), "{err}");
    // A CA file that holds no certificate is named.
    std::fs::write(&ca, "not a certificate").unwrap();
    let err = refused(PgLedger::connect_trusting(&db.url, 1, &ca).await);
    assert!(err.contains(&ca.display().to_string()), "{err}");
    let _ = std::fs::remove_file(ca);
}
