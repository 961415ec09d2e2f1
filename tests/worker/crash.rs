//! kill -9 at each write-ahead boundary, then a claim with fence+1 and a second worker: the
//! side effect happened at most once, the ledger is contiguous and no earlier segment
//! changed, the unknown step is reported, and the run reaches Finishing/Succeeded.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec, LedgerEvent, LedgerSegment, Phase, Role};
use baton::fence::Fence;
use baton_testkit::common::TestNamespace;
use baton_testkit::common::claim::{claim, events, segments};
use baton_testkit::common::worker_proc::*;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Where the first worker is killed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Boundary {
    BeforeIntent,
    DuringTool,
    BeforeResultFlush,
    DuringStreaming,
}

struct Scenario {
    ns: TestNamespace,
    name: String,
    counter: PathBuf,
}

impl Scenario {
    async fn start(boundary: Boundary) -> (Scenario, WorkerProc) {
        let tag = format!("{boundary:?}").to_lowercase();
        let ns = TestNamespace::new(&format!("crash-{tag}")).await;
        let counter = counter_file(&tag);
        let name = "crash".to_string();
        let (script, flags) = script_for(boundary, &counter);
        let run = scripted_run(
            &name,
            script,
            vec![shell_tool("sh", false)],
            LeaseSpec::default(),
        );
        let runs: Api<AgentRun> = ns.api();
        runs.create(&PostParams::default(), &run).await.unwrap();
        let pod = claim(&ns.client, &ns.name, &name, 1).await;
        let worker = spawn_worker(&ns.name, &name, 1, &pod, &flags);
        (Scenario { ns, name, counter }, worker)
    }

    async fn segments(&self) -> Vec<LedgerSegment> {
        segments(&self.ns.client, &self.ns.name, &self.name).await
    }

    async fn has_event(&self, pred: impl Fn(&LedgerEvent) -> bool) -> bool {
        events(&self.segments().await).iter().any(|(_, e)| pred(e))
    }
}

fn script_for(
    boundary: Boundary,
    counter: &std::path::Path,
) -> (Vec<baton::crd::v1alpha1::ScriptTurn>, Vec<&'static str>) {
    let effect = format!("echo x >> {}", counter.display());
    let long_text = (0..40)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    match boundary {
        Boundary::BeforeIntent => (
            vec![
                shell_turn("thinking", "sh", &effect, 4000),
                final_turn("done", 0),
            ],
            vec![],
        ),
        Boundary::DuringTool => (
            vec![
                shell_turn("run it", "sh", &format!("{effect}; sleep 20"), 0),
                final_turn("done", 0),
            ],
            vec![],
        ),
        Boundary::BeforeResultFlush => (
            vec![
                shell_turn("run it", "sh", &effect, 0),
                final_turn("done", 6000),
            ],
            vec!["--flush-millis", "60000"],
        ),
        Boundary::DuringStreaming => (
            vec![
                shell_turn(&long_text, "sh", &effect, 8000),
                final_turn("done", 0),
            ],
            vec!["--flush-millis", "100"],
        ),
    }
}

/// Kills worker A at `boundary`, resumes with B at fence 2, checks the promises.
async fn crash_and_resume(boundary: Boundary) {
    let (sc, mut a) = Scenario::start(boundary).await;
    land_at(&sc, boundary).await;
    a.kill9().await;
    let before = sc.segments().await;
    let counted = count(&sc.counter);

    let pod = claim(&sc.ns.client, &sc.ns.name, &sc.name, 2).await;
    let mut b = spawn_worker(&sc.ns.name, &sc.name, 2, &pod, &[]);
    assert_eq!(b.wait(TIMEOUT).await, 0, "{}", b.log_text());

    let after = sc.segments().await;
    assert_unchanged(&before, &after);
    let runs: Api<AgentRun> = sc.ns.api();
    let st = runs.get(&sc.name).await.unwrap().status.unwrap();
    assert_eq!(
        (st.phase, st.outcome),
        (Phase::Finishing, Some(Phase::Succeeded)),
        "{st:?}"
    );
    assert_eq!(st.output.as_deref(), Some("done"));
    assert_eq!(
        count(&sc.counter),
        1,
        "the side effect happened exactly once"
    );
    let evs = events(&after);
    let unknown = matches!(boundary, Boundary::DuringTool | Boundary::BeforeResultFlush);
    if unknown {
        assert_eq!(counted, 1, "the effect had landed before the kill");
        assert_eq!(st.unknown_effect_count, 1, "{:?}", st.unknown_effects);
        let e = &st.unknown_effects[0];
        assert_eq!(
            (
                e.step,
                e.tool.as_str(),
                e.attempt.get(),
                e.resolution.as_str()
            ),
            (1, "sh", 1, "unknown")
        );
        assert!(evs.iter().any(|(f, e)| *f == 2
            && *e
                == LedgerEvent::StepUnknown {
                    step: 1,
                    attempt: Fence::new(1)
                }));
        assert!(
            !evs.iter()
                .any(|(_, e)| matches!(e, LedgerEvent::StepResult { step: 1, .. })),
            "not re-run"
        );
    } else {
        assert_eq!(counted, 0, "killed before the intent");
        assert!(st.unknown_effects.is_empty(), "{:?}", st.unknown_effects);
    }
    // attemptStarted right after the seal, before any other write of fence 2.
    let seal = evs
        .iter()
        .position(|(_, e)| matches!(e, LedgerEvent::Claimed { fence, .. } if fence.get() == 2))
        .unwrap();
    assert!(matches!(
        evs[seal + 1].1,
        LedgerEvent::AttemptStarted { fence, .. } if fence.get() == 2
    ));
    // The dead attempt's streamed text is not promoted: one assistant message per turn.
    let assistant = evs
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                LedgerEvent::Message {
                    role: Role::Assistant,
                    ..
                }
            )
        })
        .count();
    assert_eq!(assistant, 2, "{evs:#?}");
    if boundary == Boundary::DuringStreaming {
        assert!(
            evs.iter()
                .any(|(f, e)| *f == 1 && matches!(e, LedgerEvent::ModelDelta { .. }))
        );
    }
    sc.ns.cleanup().await;
}

/// Polls the ledger (and the counter) until worker A sits at `boundary`.
async fn land_at(sc: &Scenario, boundary: Boundary) {
    match boundary {
        Boundary::BeforeIntent => {
            wait_until(TIMEOUT, "attemptStarted", || async {
                sc.has_event(|e| matches!(e, LedgerEvent::AttemptStarted { .. }))
                    .await
            })
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(
                !sc.has_event(|e| matches!(e, LedgerEvent::StepIntent { .. }))
                    .await
            );
        }
        Boundary::DuringTool => {
            wait_until(TIMEOUT, "the tool's effect", || async {
                count(&sc.counter) == 1
            })
            .await;
            assert!(
                sc.has_event(|e| matches!(e, LedgerEvent::StepIntent { .. }))
                    .await
            );
        }
        Boundary::BeforeResultFlush => {
            wait_until(TIMEOUT, "the tool's effect", || async {
                count(&sc.counter) == 1
            })
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(
                !sc.has_event(|e| matches!(e, LedgerEvent::StepResult { .. }))
                    .await
            );
        }
        Boundary::DuringStreaming => {
            wait_until(TIMEOUT, "streamed deltas", || async {
                sc.has_event(|e| matches!(e, LedgerEvent::ModelDelta { .. }))
                    .await
            })
            .await;
            assert!(
                !sc.has_event(|e| matches!(
                    e,
                    LedgerEvent::Message {
                        role: Role::Assistant,
                        ..
                    }
                ))
                .await
            );
        }
    }
}

/// Every segment that existed before the resume is still there, byte for byte.
fn assert_unchanged(before: &[LedgerSegment], after: &[LedgerSegment]) {
    let after: BTreeMap<String, &LedgerSegment> = after.iter().map(|s| (s.name_any(), s)).collect();
    for seg in before {
        let now = after.get(&seg.name_any()).expect("segment still there");
        assert_eq!(
            now.resource_version(),
            seg.resource_version(),
            "{} changed",
            seg.name_any()
        );
        assert_eq!(now.spec, seg.spec);
    }
}

#[tokio::test]
async fn worker_crash_before_the_intent_append() {
    crash_and_resume(Boundary::BeforeIntent).await;
}

#[tokio::test]
async fn worker_crash_after_the_intent_while_the_tool_runs() {
    crash_and_resume(Boundary::DuringTool).await;
}

#[tokio::test]
async fn worker_crash_after_the_tool_before_its_result_is_flushed() {
    crash_and_resume(Boundary::BeforeResultFlush).await;
}

#[tokio::test]
async fn worker_crash_during_model_streaming() {
    crash_and_resume(Boundary::DuringStreaming).await;
}
