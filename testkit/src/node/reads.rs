//! What a scenario reads back from a run: its ledger (from the API server, or from the rows of
//! a run kept in PostgreSQL), its workers' logs, and the chaos invariants over both.

use super::*;

impl NodeEnv {
    /// Run `name`'s ledger, contiguous, from where the run keeps it.
    pub async fn ledger(&self, name: &str) -> Vec<LedgerSegment> {
        let runs = self.runs();
        let run = retry(|| runs.get(name)).await;
        let backend = LedgerBackend::of(run.status.as_ref());
        match (&self.rows, backend) {
            (Some(rows), LedgerBackend::PostgreSQL) => rows
                .for_run(&self.ns, name, &run.uid().unwrap_or_default())
                .list()
                .await
                .expect("reading the ledger's rows (contiguous)"),
            (None, LedgerBackend::PostgreSQL) => panic!("{name} is kept in PostgreSQL: with_rows"),
            _ => baton::ledger::SegmentStore::for_run(self.client.clone(), &run)
                .list()
                .await
                .expect("listing the ledger (contiguous)"),
        }
    }

    /// The last lines of every worker pod's log of run `name` (for failure messages).
    pub async fn pod_logs(&self, name: &str) -> String {
        let mut out = String::new();
        let Ok(list) = self.pods().list(&ListParams::default()).await else {
            return out;
        };
        for pod in list
            .items
            .iter()
            .filter(|p| p.name_any().starts_with(&format!("{name}-w")))
        {
            let params = LogParams {
                container: Some("worker".into()),
                tail_lines: Some(25),
                ..LogParams::default()
            };
            let text = self
                .pods()
                .logs(&pod.name_any(), &params)
                .await
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!(
                "---- {} (last lines) ----\n{text}\n",
                pod.name_any()
            ));
        }
        out
    }

    /// The chaos invariants for `names`, which must all be terminal: ledgers contiguous, no
    /// stale-fence write after a seal, no segment changed, no non-idempotent effect twice.
    pub async fn check_invariants(&self, names: &[String]) {
        let effects = Effects::read(&self.effects.file);
        let recorded = self.recorder.snapshot();
        for name in names {
            let st = self.status(name).await;
            assert!(st.phase.is_terminal(), "{name} is not terminal: {st:#?}");
            let segments = self.ledger(name).await;
            check_ledger(name, &st, &segments, &recorded);
            // Rows carry no field manager: the ledger server admits a worker's write only
            // from its attempt's pod (tests/server/ledger.rs plays every other writer).
            if st.ledger_backend != Some(LedgerBackend::PostgreSQL) {
                check_worker_field_manager(name, &segments);
            }
            for (turn, n) in effects.per_turn(name) {
                assert!(
                    n <= 1,
                    "{name}: the non-idempotent effect of turn {turn} ran {n} times\n{}",
                    self.pod_logs(name).await
                );
            }
        }
        assert!(
            recorded.updated.is_empty(),
            "segments changed: {:?}",
            recorded.updated
        );
    }
}
