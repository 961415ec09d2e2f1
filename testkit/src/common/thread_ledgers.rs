//! A long thread made without a model or a pod: its earlier turns as the controller and a
//! worker leave them (each joined to the thread, with a five-position ledger: the seal, the
//! input, a tool call, its result and the answer, the close). What `make bench-thread` and the
//! history-read tests build a thread of a thousand turns from, in seconds.

use baton::crd::TURN_ANNOTATION;
use baton::crd::v1alpha1::{
    AgentRun, AgentRunStatus, AgentThread, HistoryTurn, LedgerBackend, LedgerEvent, Role,
};
use baton::fence::{CloseReason, Fence, worker_pod_name};
use baton::ledger::Ledgers;
use futures::StreamExt;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

/// Turns written at once.
const AT_ONCE: usize = 16;

/// What turn `place`'s user asked, its tool printed and its agent answered: about 1 KiB.
pub fn texts(place: i64) -> (String, String, String) {
    let filler = "lorem ipsum dolor sit amet ".repeat(8);
    (
        format!("question {place}: {filler}"),
        format!("tool output {place}: {}", filler.repeat(2)),
        format!("answer {place}: {filler}"),
    )
}

/// The ledger of turn `place`, position by position.
fn ledger(place: i64, pod: &str) -> Vec<Vec<LedgerEvent>> {
    let fence = Fence::new(1);
    let (question, output, answer) = texts(place);
    vec![
        vec![LedgerEvent::Claimed {
            fence,
            pod: pod.into(),
        }],
        vec![
            LedgerEvent::AttemptStarted {
                fence,
                pod: pod.into(),
            },
            LedgerEvent::Message {
                role: Role::User,
                content: question,
            },
        ],
        vec![
            LedgerEvent::Message {
                role: Role::Assistant,
                content: format!("checking {place}"),
            },
            LedgerEvent::StepIntent {
                step: 1,
                tool: "sh".into(),
                call_id: format!("call-{place}"),
                input: format!("echo {place}"),
                idempotent: false,
            },
        ],
        vec![
            LedgerEvent::StepResult {
                step: 1,
                output,
                is_error: false,
            },
            LedgerEvent::Message {
                role: Role::Assistant,
                content: answer.clone(),
            },
            LedgerEvent::Final { output: answer },
        ],
        vec![LedgerEvent::Closed {
            fence: Fence::new(2),
            reason: CloseReason::StopRequested,
        }],
    ]
}

/// Where [`write_turns_in`] keeps the turns' ledgers: `ledgers` reach it, `backend` is it
/// (each turn's status records it, as the controller's first status write does).
pub struct TurnLedgers<'a> {
    pub ledgers: &'a Ledgers,
    pub backend: LedgerBackend,
}

/// Turn `place` of `thread` (read from the API server), joined, with its ledger written where
/// `kept` says; as the history of a later turn names it.
async fn write_turn(
    client: &Client,
    kept: &TurnLedgers<'_>,
    thread: &AgentThread,
    place: i64,
) -> HistoryTurn {
    let ns = thread
        .namespace()
        .expect("a thread read from the API server");
    let name = format!("{}-turn-{place:05}", thread.name_any());
    let mut turn = crate::common::run_posing_as_a_turn(thread, &name);
    turn.annotations_mut()
        .insert(TURN_ANNOTATION.into(), place.to_string());
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &ns);
    let mut turn = runs
        .create(&PostParams::default(), &turn)
        .await
        .expect("creating a turn");
    turn.status = Some(AgentRunStatus {
        ledger_backend: Some(kept.backend),
        ..AgentRunStatus::default()
    });
    let turn = runs
        .replace_status(&name, &PostParams::default(), &turn)
        .await
        .expect("recording the turn's ledger backend");
    let store = kept.ledgers.for_run(&turn).expect("a ledger it can reach");
    let pod = worker_pod_name(&name, Fence::new(1));
    let positions = ledger(place, &pod);
    let up_to = positions.len() as i64;
    for (tail, events) in positions.into_iter().enumerate() {
        let fence = match events.first() {
            Some(LedgerEvent::Closed { fence, .. }) => *fence,
            _ => Fence::new(1),
        };
        store
            .append(tail as i64, fence, events)
            .await
            .expect("appending to a turn's ledger");
    }
    HistoryTurn {
        run: name,
        uid: turn.uid().expect("a created run has a UID"),
        up_to,
        ledger_backend: Some(kept.backend),
    }
}

/// Turns `first..first + count` of `thread`, in order of place.
pub async fn write_turns(
    client: &Client,
    thread: &AgentThread,
    first: i64,
    count: usize,
) -> Vec<HistoryTurn> {
    let ledgers = Ledgers::api_server(client.clone());
    let kept = TurnLedgers {
        ledgers: &ledgers,
        backend: LedgerBackend::LedgerSegments,
    };
    write_turns_in(client, &kept, thread, first, count).await
}

/// [`write_turns`], the ledgers kept as `kept` says.
pub async fn write_turns_in(
    client: &Client,
    kept: &TurnLedgers<'_>,
    thread: &AgentThread,
    first: i64,
    count: usize,
) -> Vec<HistoryTurn> {
    let places = first..first + count as i64;
    futures::stream::iter(places)
        .map(|place| write_turn(client, kept, thread, place))
        .buffered(AT_ONCE)
        .collect()
        .await
}

/// Creates thread `name` in `namespace`: its agent is never asked anything (its turns are
/// written, not run).
pub async fn create_thread(client: &Client, namespace: &str, name: &str) -> AgentThread {
    let thread: AgentThread = serde_json::from_value(serde_json::json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentThread",
        "metadata": {"name": name},
        "spec": {"agent": {"model": {"provider": "openai", "name": "never-asked"}}},
    }))
    .expect("a thread");
    Api::<AgentThread>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &thread)
        .await
        .expect("creating the thread")
}
