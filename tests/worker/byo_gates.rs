//! Agent frameworks from PyPI, unmodified, where a run stops for a person or for the agent's
//! own non-determinism, against the LiteLLM proxy's steps model (tests/litellm/steps.yaml),
//! counted at the server:
//! - LangGraph whose tool needs an approval for each call: each decision is a new attempt that
//!   replays the agent up to the call and then runs it, once;
//! - the OpenAI Agents SDK whose tool is an `askUser`: the user's answer reaches the replayed
//!   agent as the tool's result;
//! - the Agents SDK telling its model the time: resumed, it asks otherwise, and the run fails
//!   `ResumeDiverged` naming the call and the field, or under `onDivergence: Continue` records
//!   the divergence and goes on live, no effect run twice.

use std::path::PathBuf;
use std::time::Duration;

use baton::crd::v1alpha1::{
    AgentRun, ApprovalPolicy, LedgerEvent, OnDivergence, Phase, ToolKind, ToolSpec,
};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{events, segments};
use baton_testkit::common::litellm::{self, LiteLlm};
use baton_testkit::common::own_agent::{
    agent_container, approve, assert_diverged_at_the_prompt, counted, finish_attempt, lines,
    start_attempt, steps_run,
};
use baton_testkit::common::worker_proc::*;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// The worker's own key for the proxy (the agent never holds it).
const KEY: [(&str, &str); 1] = [("BATON_MODEL_API_KEY", litellm::KEY)];

/// The test's file `what` (effects, the proxy's count).
fn file(ns: &TestNamespace, what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("baton-{}-{what}", ns.name))
}

#[tokio::test]
async fn langgraph_whose_tool_needs_approval_runs_each_call_once_after_its_decision() {
    let ns = TestNamespace::new("worker-byo-langgraph-approval").await;
    let (effects, calls) = (file(&ns, "effects"), file(&ns, "model-calls"));
    let command = format!("echo {{n}} >> {}", effects.display());
    let proxy = LiteLlm::steps(&calls, 2, "command", &command).await;
    let mut run = steps_run("gated", &proxy, "langgraph_agent.py", 2);
    run.spec.agent_mut().tools[0].approval = Some(ApprovalPolicy::Required);
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    for step in 1..=2 {
        let st = finish_attempt(&ns, "gated", step, &KEY).await;
        let st = st.status.unwrap_or_default();
        assert_eq!(st.phase, Phase::WaitingApproval, "{st:?}");
        let pending = st.pending_approval.expect("status.pendingApproval");
        assert_eq!((pending.step, pending.tool.as_str()), (step, "sh"));
        assert_eq!(
            lines(&effects).len(),
            step as usize - 1,
            "step {step} waits for its decision"
        );
        approve(&ns, "gated", "go on").await;
    }
    let st = finish_attempt(&ns, "gated", 3, &KEY).await;
    let st = st.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("done after 2 steps"));
    assert_eq!(
        lines(&effects),
        ["1", "2"],
        "each step run once, after its decision"
    );
    assert_eq!(
        counted(&calls).await,
        3,
        "each model call reached the model once: the replayed ones came from the ledger"
    );
}

#[tokio::test]
async fn the_agents_sdk_asking_the_user_gets_the_answer_when_replayed() {
    let ns = TestNamespace::new("worker-byo-agents-sdk-ask").await;
    let calls = file(&ns, "model-calls");
    let proxy = LiteLlm::steps(&calls, 1, "question", "which environment for step {n}?").await;
    let mut run = steps_run("ask", &proxy, "agents_sdk_agent.py", 1);
    run.spec.agent_mut().tools = vec![ToolSpec {
        kind: ToolKind::AskUser,
        ..shell_tool("ask", false)
    }];
    let runs: Api<AgentRun> = ns.api();
    runs.create(&PostParams::default(), &run).await.unwrap();

    let st = finish_attempt(&ns, "ask", 1, &KEY).await;
    let st = st.status.unwrap_or_default();
    assert_eq!(st.phase, Phase::WaitingInput, "{st:?}");
    assert_eq!(st.message.as_deref(), Some("which environment for step 1?"));
    let answer = serde_json::json!({"spec": {"inputs": ["staging, said the user"]}});
    runs.patch("ask", &PatchParams::default(), &Patch::Merge(&answer))
        .await
        .unwrap();

    let st = finish_attempt(&ns, "ask", 2, &KEY).await;
    let st = st.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("done after 1 steps"));
    assert_eq!(st.inputs_consumed, 1);
    assert_eq!(
        counted(&calls).await,
        2,
        "the first call replayed, not asked again"
    );
    let requests = gateway_requests(&ns, "ask").await;
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(
        requests[1].contains("staging, said the user"),
        "the answer reached the agent as the tool's result: {}",
        requests[1]
    );
}

#[tokio::test]
async fn the_agents_sdk_telling_its_model_the_time_fails_when_resumed_or_goes_on_live() {
    let ns = TestNamespace::new("worker-byo-agents-sdk-diverge").await;
    let calls = file(&ns, "model-calls");
    // Each run's effects in a file of its own; step 2 sleeps, to be killed in.
    let effects = |run: &str| file(&ns, &format!("effects-{run}"));
    let command = format!(
        "echo {{n}} >> {}-$BATON_RUN; if [ {{n}} = 2 ]; then sleep 60; fi",
        file(&ns, "effects").display()
    );
    let proxy = LiteLlm::steps(&calls, 3, "command", &command).await;
    let runs: Api<AgentRun> = ns.api();
    for (name, on_divergence) in [
        ("strict", OnDivergence::Fail),
        ("lenient", OnDivergence::Continue),
    ] {
        let mut run = steps_run(name, &proxy, "agents_sdk_agent.py", 3);
        let env = [("AGENT_MODEL", "mock-steps"), ("AGENT_PROMPT_TIME", "1")];
        let mut container = agent_container("agents_sdk_agent.py", &env);
        container.on_divergence = on_divergence;
        run.spec.agent_mut().container = Some(container);
        runs.create(&PostParams::default(), &run).await.unwrap();
        let mut worker = start_attempt(&ns, name, 1, &KEY).await;
        wait_until(Duration::from_secs(120), "step 2's effect", || async {
            lines(&effects(name)).len() == 2
        })
        .await;
        worker.kill9().await;
    }
    assert_eq!(counted(&calls).await, 4, "two calls of each first attempt");

    let st = finish_attempt(&ns, "strict", 2, &KEY).await;
    assert_diverged_at_the_prompt(&st.status.unwrap_or_default());
    assert_eq!(
        counted(&calls).await,
        4,
        "a divergent call never reaches the model"
    );

    let st = finish_attempt(&ns, "lenient", 2, &KEY).await;
    let st = st.status.unwrap_or_default();
    assert_eq!(st.outcome, Some(Phase::Succeeded), "{st:?}");
    assert_eq!(st.output.as_deref(), Some("done after 3 steps"));
    let diverged = ledger_events(&ns, "lenient")
        .await
        .into_iter()
        .filter_map(|e| match e {
            LedgerEvent::GatewayDiverged { call, field } => Some((call, field)),
            _ => None,
        });
    let diverged: Vec<_> = diverged.collect();
    assert_eq!(diverged, [(1, "/messages/0/content".to_string())]);
    // Live from call 1: the model asks for steps 1 and 2 again, answered from their records
    // (step 2 unknown: it was running at the kill), then step 3 runs.
    assert_eq!(
        lines(&effects("lenient")),
        ["1", "2", "3"],
        "each effect once"
    );
    let unknown: Vec<_> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [2], "the step the worker died in");
    assert_eq!(
        counted(&calls).await,
        4 + 4,
        "the lenient run's 4 calls, live again"
    );
}

/// The events of `name`'s ledger, in order.
async fn ledger_events(ns: &TestNamespace, name: &str) -> Vec<LedgerEvent> {
    let listed = segments(&ns.client, &ns.name, name).await;
    events(&listed).into_iter().map(|(_, e)| e).collect()
}

/// The requests of `name`'s recorded model calls, as JSON text, in ledger order.
async fn gateway_requests(ns: &TestNamespace, name: &str) -> Vec<String> {
    let calls = ledger_events(ns, name).await.into_iter();
    let requests = calls.filter_map(|e| match e {
        LedgerEvent::GatewayCall { request, .. } => Some(request.to_string()),
        _ => None,
    });
    requests.collect()
}
