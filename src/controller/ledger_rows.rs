//! A run kept in PostgreSQL takes its ledger with it when it is deleted (docs/ledger-backends.md,
//! "A run's rows"). LedgerSegments go by themselves (owner references, the garbage
//! collector); rows have no owner the cluster knows of. So such a run holds the finalizer
//! [`LEDGER_FINALIZER`] from its first reconcile, before its first pod (and so before its
//! first row). Once the run is being deleted, the controller deletes its rows through
//! `baton server`, and only then lets the run go.
//!
//! A finalizer, not a sweeper: a sweeper would have to decide from the outside that a run is
//! gone, and the one wrong guess (a run it could not see, a cache behind) deletes a live
//! run's transcript. A finalizer deletes when the API server itself says the run is going.

use kube::ResourceExt;
use kube::api::PostParams;

use super::Error;
use super::context::Context;
use super::writer::{Applied, Wrote};
use crate::crd::v1alpha1::{AgentRun, LedgerBackend};

/// The finalizer a run kept in PostgreSQL holds until its rows are deleted.
pub const LEDGER_FINALIZER: &str = "baton.dev/ledger";

/// What a run's ledger rows need of this reconcile (pure: see [`step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsStep {
    /// Nothing: reconcile the run as usual.
    Nothing,
    /// Kept in PostgreSQL and not guarded yet: the finalizer first, before anything else.
    Guard,
    /// Being deleted and guarded: its rows go, then the finalizer.
    Release,
}

/// The step for `run`, whose ledger is kept in `backend`.
pub fn step(run: &AgentRun, backend: LedgerBackend) -> RowsStep {
    let guarded = run.finalizers().iter().any(|f| f == LEDGER_FINALIZER);
    let deleting = run.metadata.deletion_timestamp.is_some();
    match (deleting, guarded) {
        (true, true) => RowsStep::Release,
        (false, false) if backend == LedgerBackend::PostgreSQL => RowsStep::Guard,
        _ => RowsStep::Nothing,
    }
}

/// Takes the step `run` needs; None: reconcile it as usual.
pub async fn tend(ctx: &Context, run: &AgentRun) -> Result<Option<Applied>, Error> {
    match step(run, ctx.ledgers().backend_of(run)) {
        RowsStep::Nothing => Ok(None),
        RowsStep::Guard => {
            let guard = |f: &mut Vec<String>| {
                if !f.iter().any(|f| f == LEDGER_FINALIZER) {
                    f.push(LEDGER_FINALIZER.to_string())
                }
            };
            set_finalizers(ctx, run, guard, "finalizer").await.map(Some)
        }
        RowsStep::Release => release(ctx, run).await.map(Some),
    }
}

/// Deletes the rows of a run being deleted, then drops its finalizer. A failure leaves the
/// finalizer (the run stays until its rows are gone) and says why in a Warning.
async fn release(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let deleted = match ctx.ledger(run) {
        Ok(ledger) => ctx.write_fenced("ledger deletion", ledger.delete()).await?,
        Err(err) => Err(err),
    };
    match deleted {
        Ok(segments) => ctx.event(
            run,
            false,
            "LedgerDeleted",
            format!("its ledger is deleted ({segments} segments)"),
        ),
        Err(err) => {
            ctx.event(
                run,
                true,
                "LedgerNotDeleted",
                format!(
                    "its ledger could not be deleted: {err}; the run stays (finalizer \
                     {LEDGER_FINALIZER}) until it is"
                ),
            );
            return Err(err.into());
        }
    }
    let release = |f: &mut Vec<String>| f.retain(|f| f != LEDGER_FINALIZER);
    set_finalizers(ctx, run, release, "finalizer removal").await
}

/// Changes the finalizers of the run as it is now (the cache keeps runs without their big
/// fields, so it is read whole first), only if it has not changed since that read (the
/// replace carries its resourceVersion). A run gone, or another run by that name, is left.
async fn set_finalizers(
    ctx: &Context,
    run: &AgentRun,
    change: impl FnOnce(&mut Vec<String>),
    kind: &'static str,
) -> Result<Applied, Error> {
    let (api, name, params) = (ctx.runs_api(run), run.name_any(), PostParams::default());
    let Some(mut fresh) = api.get_opt(&name).await? else {
        return Ok(Applied::Done);
    };
    if fresh.uid() != run.uid() {
        return Ok(Applied::Done);
    }
    change(fresh.metadata.finalizers.get_or_insert_with(Vec::new));
    let request = api.replace(&name, &params, &fresh);
    Ok(match ctx.write(kind, request).await? {
        Wrote::Written(_) | Wrote::Gone | Wrote::Exists => Applied::Done,
        Wrote::Conflict => Applied::Conflict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(finalizers: &[&str], deleting: bool) -> AgentRun {
        let mut run: AgentRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u"},
            "spec": {"input": "hi"}
        }))
        .expect("a run");
        run.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        if deleting {
            run.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            );
        }
        run
    }

    #[test]
    fn a_run_in_postgresql_is_guarded_before_anything_and_released_only_while_deleted() {
        use LedgerBackend::{LedgerSegments, PostgreSQL};
        use RowsStep::*;
        let other = "example.com/keep";
        let cases = [
            (run(&[], false), PostgreSQL, Guard),
            (run(&[other], false), PostgreSQL, Guard),
            (run(&[LEDGER_FINALIZER], false), PostgreSQL, Nothing),
            (run(&[LEDGER_FINALIZER], true), PostgreSQL, Release),
            // Deleted before it was guarded: it never had a pod, so it has no row.
            (run(&[], true), PostgreSQL, Nothing),
            (run(&[], false), LedgerSegments, Nothing),
            (run(&[other], true), LedgerSegments, Nothing),
            // A guard set, whatever the backend reads as now, is honoured.
            (run(&[LEDGER_FINALIZER], true), LedgerSegments, Release),
        ];
        for (i, (run, backend, want)) in cases.into_iter().enumerate() {
            assert_eq!(step(&run, backend), want, "case {i}");
        }
    }
}
