//! Budgets counted from the ledger: a run killed again and again near its limit still stops
//! at it, because every attempt sums what the ledger says was spent (status.usage), not what
//! it spent itself.

use baton::crd::v1alpha1::{BudgetSpec, LeaseSpec, LedgerEvent, Phase};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;

use super::{EXIT_TIMEOUT, create, status};

/// Model calls the ledger holds (each recorded with its turn's message).
async fn recorded_calls(ns: &TestNamespace, name: &str) -> usize {
    events(&segments(&ns.client, &ns.name, name).await)
        .iter()
        .filter(|(_, e)| matches!(e, LedgerEvent::ModelCall { .. }))
        .count()
}

#[tokio::test]
async fn a_run_killed_repeatedly_near_its_budget_stops_at_it() {
    let ns = TestNamespace::new("worker-budget").await;
    let counter = counter_file("budget");
    let name = "budget";
    // Eight tool turns of 2 s each; the budget allows four model calls.
    let effect = format!("echo x >> {}; sleep 2", counter.display());
    let turns = (1..=8)
        .map(|t| shell_turn(&format!("turn {t}"), "sh", &effect, 100))
        .collect();
    let mut run = scripted_run(
        name,
        turns,
        vec![shell_tool("sh", false)],
        LeaseSpec::default(),
    );
    run.spec.max_attempts = 10;
    run.spec.budget = Some(BudgetSpec {
        max_model_calls: Some(4),
        ..BudgetSpec::default()
    });
    create(&ns, &run).await;

    // Attempts 1 and 2 are killed during a tool step, each after one more model call.
    for fence in 1..=2 {
        let pod = claim(&ns.client, &ns.name, name, fence).await;
        let mut worker = spawn_worker(&ns.name, name, fence, &pod, &[]);
        let want = fence as usize;
        wait_until(EXIT_TIMEOUT, "a model call recorded", || async {
            recorded_calls(&ns, name).await >= want
        })
        .await;
        wait_until(EXIT_TIMEOUT, "the tool step running", || async {
            count(&counter) >= want
        })
        .await;
        worker.kill9().await;
    }
    let pod = claim(&ns.client, &ns.name, name, 3).await;
    let mut worker = spawn_worker(&ns.name, name, 3, &pod, &[]);
    let code = worker.wait(EXIT_TIMEOUT).await;
    assert_eq!(code, 0, "{}", worker.log_text());

    let st = status(&ns, name).await;
    assert_eq!(st.phase, Phase::Finishing, "{st:#?}");
    assert_eq!(st.outcome, Some(Phase::Failed), "{st:#?}");
    assert_eq!(st.reason.as_deref(), Some("BudgetExceeded"), "{st:#?}");
    let message = st.message.clone().unwrap_or_default();
    assert!(message.contains("spec.budget.maxModelCalls"), "{message}");
    // Four calls across three attempts: none lost to the kills, none counted twice.
    let usage = st.usage.clone().expect("status.usage");
    assert_eq!(usage.model_calls, 4, "{usage:?}");
    assert_eq!(recorded_calls(&ns, name).await, 4);
    assert!(usage.total_tokens > 0, "{usage:?}");
    // The killed steps were not re-run: each call's tool ran at most once.
    assert!(count(&counter) <= 4, "tool runs: {}", count(&counter));
    ns.cleanup().await;
}
