//! Approvals end to end with a real worker process: a gated call waits (the worker exits and
//! frees its lease), `baton approve`/`deny` record the decision, the next worker runs or skips
//! exactly that call, a timed-out wait denies it by default, and a worker killed after the
//! approval was recorded never gets the call run twice.

use std::path::Path;
use std::time::Duration;

use crate::{create, status};
use baton::approval::{DecisionError, TIMED_OUT};
use baton::cli::{ApproveArgs, CliError, DenyArgs, RunArgs, Session, Verb};
use baton::crd::v1alpha1::{
    AgentRun, AgentRunStatus, ApprovalOutcome, ApprovalPolicy, LeaseSpec, LedgerEvent, Phase,
};
use baton::lease::LeaseClient;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, claim_because, events, segments};
use baton_testkit::common::worker_proc::*;
use kube::Api;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A run whose one tool, `deploy`, waits for approval; its command appends to `counter`.
pub(crate) async fn gated_run(ns: &TestNamespace, counter: &Path, sleep_seconds: u32) {
    let cmd = format!("echo x >> {}; sleep {sleep_seconds}", counter.display());
    let mut deploy = shell_tool("deploy", false);
    deploy.approval = Some(ApprovalPolicy::Required);
    let script = vec![
        shell_turn("deploying", "deploy", &cmd, 0),
        final_turn("done", 0),
    ];
    create(
        ns,
        &scripted_run("gated", script, vec![deploy], LeaseSpec::default()),
    )
    .await;
}

/// Attempt `fence` runs to its end (exit 0); returns the status it left.
async fn attempt(ns: &TestNamespace, fence: i64, reason: Option<&str>) -> AgentRunStatus {
    let pod = claim_because(&ns.client, &ns.name, "gated", fence, reason).await;
    let mut w = spawn_worker(&ns.name, "gated", fence, &pod, &[]);
    assert_eq!(w.wait(TIMEOUT).await, 0, "{}", w.log_text());
    status(ns, "gated").await
}

/// The first attempt: the call is recorded and waits; nothing ran, the lease is free.
async fn wait_for_approval(ns: &TestNamespace, counter: &Path) {
    let st = attempt(ns, 1, None).await;
    assert_eq!(st.phase, Phase::WaitingApproval, "{st:?}");
    let pending = st.pending_approval.expect("status.pendingApproval");
    assert_eq!(
        (
            pending.step,
            pending.call_id.as_str(),
            pending.tool.as_str()
        ),
        (1, "call_0_0", "deploy")
    );
    assert!(pending.arguments.contains("echo x"), "{pending:?}");
    assert_eq!(count(counter), 0, "nothing runs before the decision");
    let lease = LeaseClient::new(ns.client.clone(), &ns.name)
        .get("gated")
        .await
        .unwrap()
        .unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "the waiting worker freed its lease");
}

fn cli(ns: &TestNamespace) -> Session {
    Session::new(ns.client.clone(), "test".into(), ns.name.clone())
}

fn target(ns: &TestNamespace) -> RunArgs {
    RunArgs {
        run: "gated".into(),
        namespace: Some(ns.name.clone()),
    }
}

/// The CLI verb as `baton` runs it; what it printed.
async fn run_cli(ns: &TestNamespace, verb: Verb) -> Result<String, CliError> {
    let mut out = Vec::new();
    cli(ns).run(verb, &mut out).await?;
    Ok(String::from_utf8(out).unwrap())
}

pub(crate) async fn approve(ns: &TestNamespace, step: Option<i64>) -> Result<String, CliError> {
    let args = ApproveArgs {
        target: target(ns),
        step,
        reason: Some("looks right".into()),
    };
    run_cli(ns, Verb::Approve(args)).await
}

async fn deny(ns: &TestNamespace, reason: &str) -> Result<String, CliError> {
    let args = DenyArgs {
        target: target(ns),
        step: None,
        reason: reason.into(),
    };
    run_cli(ns, Verb::Deny(args)).await
}

/// The ledger's approval decisions, with the fence that recorded each.
async fn decisions(ns: &TestNamespace) -> Vec<(i64, ApprovalOutcome)> {
    events(&segments(&ns.client, &ns.name, "gated").await)
        .into_iter()
        .filter_map(|(f, e)| match e {
            LedgerEvent::ApprovalDecided { outcome, .. } => Some((f, outcome)),
            _ => None,
        })
        .collect()
}

/// Step 1's result as the model sees it.
async fn step_result(ns: &TestNamespace) -> (String, bool) {
    events(&segments(&ns.client, &ns.name, "gated").await)
        .into_iter()
        .find_map(|(_, e)| match e {
            LedgerEvent::StepResult {
                step: 1,
                output,
                is_error,
            } => Some((output, is_error)),
            _ => None,
        })
        .expect("step 1 has a result")
}

fn succeeded(st: &AgentRunStatus) {
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded)),
        "{st:?}"
    );
    assert_eq!(st.pending_approval, None, "nothing waits any more");
}

#[tokio::test]
async fn worker_an_approved_call_runs_once_and_stale_decisions_are_refused() {
    let ns = TestNamespace::new("worker-approve").await;
    let counter = counter_file("approve");
    gated_run(&ns, &counter, 0).await;
    wait_for_approval(&ns, &counter).await;

    let err = approve(&ns, Some(2)).await.unwrap_err();
    assert!(
        matches!(
            err,
            CliError::Decision(DecisionError::OtherStep {
                asked: 2,
                pending: 1,
                ..
            })
        ),
        "{err}"
    );
    let said = approve(&ns, Some(1)).await.expect("approving step 1");
    assert!(said.contains("step 1 approved"), "{said}");
    let err = approve(&ns, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            CliError::Decision(DecisionError::AlreadyDecided { step: 1, .. })
        ),
        "{err}"
    );
    // A worker claimed for another reason before the decision would go back to waiting;
    // this one finds the decision.
    let st = attempt(&ns, 2, Some("ApprovalDecided")).await;
    succeeded(&st);
    assert_eq!(count(&counter), 1, "the approved call ran once");
    assert_eq!(decisions(&ns).await, vec![(2, ApprovalOutcome::Approved)]);
    assert!(!step_result(&ns).await.1, "the approved call succeeded");
    let err = approve(&ns, Some(1)).await.unwrap_err();
    assert!(
        matches!(err, CliError::Decision(DecisionError::NotWaiting { .. })),
        "a decision after the run moved on: {err}"
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_a_denied_call_is_not_run_and_the_model_is_told_why() {
    let ns = TestNamespace::new("worker-deny").await;
    let counter = counter_file("deny");
    gated_run(&ns, &counter, 0).await;
    wait_for_approval(&ns, &counter).await;
    deny(&ns, "not on a Friday").await.expect("denying");
    succeeded(&attempt(&ns, 2, Some("ApprovalDecided")).await);
    assert_eq!(count(&counter), 0, "a denied call never runs");
    assert_eq!(decisions(&ns).await, vec![(2, ApprovalOutcome::Denied)]);
    let (told, is_error) = step_result(&ns).await;
    assert!(is_error && told.contains("not on a Friday"), "{told}");
    ns.cleanup().await;
}

#[tokio::test]
async fn worker_a_wait_goes_on_until_decided_or_timed_out_then_is_denied_by_default() {
    let ns = TestNamespace::new("worker-approval-timeout").await;
    let counter = counter_file("timeout");
    gated_run(&ns, &counter, 0).await;
    wait_for_approval(&ns, &counter).await;
    let st = attempt(&ns, 2, None).await;
    assert_eq!(
        st.phase,
        Phase::WaitingApproval,
        "no decision, no timeout: it waits again"
    );
    assert_eq!(st.pending_approval.map(|p| p.step), Some(1));
    succeeded(&attempt(&ns, 3, Some(TIMED_OUT)).await);
    assert_eq!(count(&counter), 0);
    assert_eq!(decisions(&ns).await, vec![(3, ApprovalOutcome::TimedOut)]);
    let (told, _) = step_result(&ns).await;
    assert!(told.contains("denied by default"), "{told}");
    ns.cleanup().await;
}

/// Killed while the approved call runs: the next worker reports its effect unknown, does not
/// run it again, and does not apply the decision a second time.
#[tokio::test]
async fn worker_killed_after_the_approval_was_recorded_never_runs_the_call_twice() {
    let ns = TestNamespace::new("worker-approval-kill").await;
    let counter = counter_file("approval-kill");
    gated_run(&ns, &counter, 20).await;
    wait_for_approval(&ns, &counter).await;
    approve(&ns, None).await.expect("approving");
    let pod = claim(&ns.client, &ns.name, "gated", 2).await;
    let mut b = spawn_worker(&ns.name, "gated", 2, &pod, &[]);
    wait_until(TIMEOUT, "the approved call's effect", || async {
        count(&counter) == 1
    })
    .await;
    b.kill9().await;
    let st = attempt(&ns, 3, None).await;
    succeeded(&st);
    assert_eq!(count(&counter), 1, "run once, never again");
    assert_eq!(st.unknown_effect_count, 1, "{st:?}");
    assert_eq!(decisions(&ns).await, vec![(2, ApprovalOutcome::Approved)]);
    let runs: Api<AgentRun> = ns.api();
    assert_eq!(runs.get("gated").await.unwrap().spec.approvals.len(), 1);
    ns.cleanup().await;
}
