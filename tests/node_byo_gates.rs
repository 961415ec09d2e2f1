//! On the real node, agent frameworks from the agent image (hack/images.sh agents), unmodified,
//! where a run stops for a person or for the agent's own non-determinism, against scripted
//! model servers bound inside the node's namespace that answer in order and count what they
//! are asked, the tools' effects counted outside baton by the effects server:
//! - LangGraph whose `sh` tool needs an approval and which then asks the user: the run waits
//!   `WaitingApproval` (its pod gone, nothing run), runs the call once when approved, waits
//!   `WaitingInput`, and its replayed agent gets the answer; the server asked each call once;
//! - the OpenAI Agents SDK telling its model the time, killed while its tool runs: resumed, it
//!   fails `ResumeDiverged` naming the call and the field; under `onDivergence: Continue` it
//!   goes on live, its tool call answered from the record (unknown, never run again).

use baton::crd::v1alpha1::{
    AgentRun, LedgerEvent, ModelSpec, OnDivergence, Phase, ToolKind, ToolSpec,
};
use baton_testkit::common::own_agent::{
    approve_in, assert_diverged_at_the_prompt, image_agent_container,
};
use baton_testkit::common::worker_proc::shell_tool;
use baton_testkit::e2e::{Effects, Script};
use baton_testkit::model::{Reply, Server};
use baton_testkit::node::*;
use baton_testkit::worker::{chat_answer, chat_call};
use serde_json::json;

fn reply(answer: serde_json::Value) -> Reply {
    Reply::json(200, &answer.to_string())
}

/// The shell command of step `step` of run `name`: its effect sent to the effects server, then
/// `then`.
fn effect(env: &NodeEnv, name: &str, step: usize, then: &str) -> serde_json::Value {
    let (host, port) = env.effects.addr.rsplit_once(':').unwrap();
    let sent = format!("echo \"{name} {step} $BATON_STEP $BATON_FENCE\" > /dev/tcp/{host}/{port}");
    json!({ "command": format!("bash -c '{sent}'; {then}echo ok {step}") })
}

/// A run `name` of the image's agent `script` (`env` its container's), its model `server`
/// (Chat Completions, not streamed), offered `tools`.
fn own_agent_run(
    env: &NodeEnv,
    name: &str,
    server: &Server,
    script: &str,
    (tools, vars): (Vec<ToolSpec>, &[(&str, &str)]),
) -> AgentRun {
    let mut run = env.scripted(name, &Script::new(1, 100));
    run.spec.input = "deploy the release".into();
    let agent = run.spec.agent_mut();
    agent.tools = tools;
    agent.model = ModelSpec {
        name: Some("local-model".into()),
        endpoint: Some(format!("{}/v1", server.url)),
        ..server.openai_model()
    };
    let mut env_vars = vec![("AGENT_MODEL", "local-model")];
    env_vars.extend_from_slice(vars);
    agent.container = Some(image_agent_container(script, &env_vars));
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_langgraph_waits_for_an_approval_and_an_answer_and_runs_its_call_once() {
    let env = NodeEnv::start("byo-gates").await;
    let name = "gated";
    let question = json!({"question": "which environment?"});
    let server = Server::start_in_netns(
        NETNS,
        NODE_IP,
        vec![
            reply(chat_call("c1", "sh", &effect(&env, name, 1, ""))),
            reply(chat_call("c2", "ask", &question)),
            reply(chat_answer("deployed; staging next")),
        ],
    )
    .await;
    let mut sh = shell_tool("sh", false);
    sh.approval = Some(baton::crd::v1alpha1::ApprovalPolicy::Required);
    let ask = ToolSpec {
        kind: ToolKind::AskUser,
        ..shell_tool("ask", false)
    };
    let tools = (vec![sh, ask], &[][..]);
    env.create(&own_agent_run(
        &env,
        name,
        &server,
        "langgraph_agent.py",
        tools,
    ))
    .await;

    let st = env
        .wait_run(name, RUN_TIMEOUT, "WaitingApproval", |s| {
            s.phase == Phase::WaitingApproval
        })
        .await;
    let pending = st.pending_approval.expect("status.pendingApproval");
    assert_eq!((pending.step, pending.tool.as_str()), (1, "sh"));
    assert_eq!(
        Effects::read(&env.effects.file).count(name, 1),
        0,
        "not run yet"
    );
    approve_in(&env.client, &env.ns, name, "looks right").await;

    let st = env
        .wait_run(name, RUN_TIMEOUT, "WaitingInput", |s| {
            s.phase == Phase::WaitingInput
        })
        .await;
    assert_eq!(st.message.as_deref(), Some("which environment?"));
    env.answer(name, "staging").await;
    let st = env.wait_succeeded(name).await;
    assert_eq!(st.output.as_deref(), Some("deployed; staging next"));
    assert_eq!(
        Effects::read(&env.effects.file).count(name, 1),
        1,
        "run once, after the decision"
    );
    server.assert_received(3, "/v1/chat/completions");
    let last = server.received()[2].body.to_string();
    assert!(
        last.contains("staging"),
        "the answer reached the agent: {last}"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_the_agents_sdk_telling_its_model_the_time_fails_when_resumed_or_goes_on_live() {
    let env = NodeEnv::start("byo-diverge").await;
    let mut servers = Vec::new();
    for (name, on_divergence) in [
        ("strict", OnDivergence::Fail),
        ("lenient", OnDivergence::Continue),
    ] {
        // Step 1 sleeps after its effect, to be killed in; a live call 1 asks for it again.
        let step = chat_call("c1", "sh", &effect(&env, name, 1, "sleep 30; "));
        let replies = vec![reply(step.clone()), reply(step), reply(chat_answer("done"))];
        let server = Server::start_in_netns(NETNS, NODE_IP, replies).await;
        let tools = (
            vec![shell_tool("sh", false)],
            &[("AGENT_PROMPT_TIME", "1")][..],
        );
        let mut run = own_agent_run(&env, name, &server, "agents_sdk_agent.py", tools);
        if let Some(container) = run.spec.agent_mut().container.as_mut() {
            container.on_divergence = on_divergence;
        }
        env.create(&run).await;
        let (pod, _) = env.wait_worker(name, 1).await;
        env.wait_effect(name, 1).await;
        env.signal_worker(&pod, libc::SIGKILL).await;
        servers.push(server);
    }

    let strict = env
        .wait_run("strict", RUN_TIMEOUT, "ended", |s| s.outcome.is_some())
        .await;
    assert_diverged_at_the_prompt(&strict);
    assert_eq!(
        servers[0].received().len(),
        1,
        "a divergent call never reaches the model"
    );

    let st = env.wait_succeeded("lenient").await;
    assert_eq!(st.output.as_deref(), Some("done"));
    let diverged: Vec<(i64, String)> = env
        .ledger("lenient")
        .await
        .iter()
        .flat_map(|s| s.spec.events.iter())
        .filter_map(|e| match e {
            LedgerEvent::GatewayDiverged { call, field } => Some((*call, field.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(diverged, [(1, "/messages/0/content".to_string())]);
    assert_eq!(
        Effects::read(&env.effects.file).count("lenient", 1),
        1,
        "the tool call asked again was answered from its record"
    );
    let unknown: Vec<i64> = st.unknown_effects.iter().map(|u| u.step).collect();
    assert_eq!(unknown, [1], "{st:?}");
    servers[1].assert_received(3, "/v1/chat/completions");
    env.finish().await;
}
