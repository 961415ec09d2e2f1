//! Unit tests of the pure CLI rendering.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::describe::*;
use super::render::*;
use crate::crd::v1alpha1::Resolution;
use crate::crd::v1alpha1::{
    AgentRun, AgentRunStatus, LedgerEvent, LedgerSegment, Phase, ProbeOutcome, Role, UnknownEffect,
};
use crate::display::age;
use crate::fence::test_segment as seg;
use crate::fence::{CloseReason, Fence};

fn now() -> Timestamp {
    "2025-01-01T12:00:00Z".parse().unwrap()
}

fn run(name: &str, ns: &str, status: AgentRunStatus) -> AgentRun {
    let mut run = AgentRun::builder(name)
        .namespace(ns)
        .stored("u")
        .status(status)
        .build();
    run.metadata.creation_timestamp = Some(Time("2025-01-01T11:55:00Z".parse().unwrap()));
    run
}

fn unknown(step: i64, tool: &str) -> UnknownEffect {
    UnknownEffect {
        step,
        tool: tool.into(),
        attempt: Fence::new(1),
        resolution: Resolution::Unknown,
        summary: "rm -rf /tmp/x".into(),
    }
}

#[test]
fn the_table_has_kubectl_columns_and_spells_out_unknown_effects() {
    let status = AgentRunStatus {
        phase: Phase::Running,
        attempt: 2,
        steps: 4,
        worker: Some("r1-w2".into()),
        unknown_effects: vec![unknown(3, "shell")],
        unknown_effect_count: 1,
        ..Default::default()
    };
    let table = runs_table(
        &[run("r1", "a", status), run("r2", "b", Default::default())],
        true,
        now(),
    );
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("NAMESPACE   NAME   PHASE"), "{table}");
    assert!(
        lines[1].contains("Running")
            && lines[1].contains("1 (#3 shell)")
            && lines[1].contains("5m"),
        "{table}"
    );
    assert!(
        lines[2].contains("Pending") && lines[2].contains("<none>"),
        "{table}"
    );
    // Columns line up.
    let col = lines[0].find("PHASE").unwrap();
    assert_eq!(&lines[1][col..col + 7], "Running");
}

#[test]
fn ages_read_like_kubectl() {
    let at = |s: &str| Time(s.parse().unwrap());
    assert_eq!(age(Some(&at("2025-01-01T11:59:15Z")), now()), "45s");
    assert_eq!(age(Some(&at("2025-01-01T11:00:00Z")), now()), "60m");
    assert_eq!(age(Some(&at("2024-12-31T00:00:00Z")), now()), "36h");
    assert_eq!(age(Some(&at("2024-12-01T00:00:00Z")), now()), "31d");
    assert_eq!(age(None, now()), "<unknown>");
}

fn ledger() -> Vec<LedgerSegment> {
    use LedgerEvent as E;
    vec![
        seg(
            1,
            1,
            vec![E::Claimed {
                fence: Fence::new(1),
                pod: "r-w1".into(),
            }],
        ),
        seg(
            2,
            1,
            vec![
                E::AttemptStarted {
                    fence: Fence::new(1),
                    pod: "r-w1".into(),
                },
                E::Message {
                    role: Role::User,
                    content: "clean up".into(),
                },
                E::Message {
                    role: Role::Assistant,
                    content: "On it.".into(),
                },
                E::StepIntent {
                    step: 1,
                    tool: "shell".into(),
                    call_id: "c1".into(),
                    input: "{\"command\":\"ls\"}".into(),
                    idempotent: true,
                },
                E::StepResult {
                    step: 1,
                    output: "a\nb".into(),
                    is_error: false,
                },
                E::StepIntent {
                    step: 2,
                    tool: "shell".into(),
                    call_id: "c2".into(),
                    input: "rm x".into(),
                    idempotent: false,
                },
                E::ModelDelta {
                    text: "half an ans".into(),
                },
            ],
        ),
        seg(
            3,
            2,
            vec![E::Claimed {
                fence: Fence::new(2),
                pod: "r-w2".into(),
            }],
        ),
        seg(
            4,
            2,
            vec![
                E::AttemptStarted {
                    fence: Fence::new(2),
                    pod: "r-w2".into(),
                },
                E::StepUnknown {
                    step: 2,
                    attempt: Fence::new(1),
                },
                E::StepProbed {
                    step: 2,
                    outcome: ProbeOutcome::Unknown,
                },
                E::Handoff,
            ],
        ),
        seg(
            5,
            3,
            vec![E::Claimed {
                fence: Fence::new(3),
                pod: "r-w3".into(),
            }],
        ),
        seg(
            6,
            3,
            vec![
                E::AttemptStarted {
                    fence: Fence::new(3),
                    pod: "r-w3".into(),
                },
                E::WaitingInput {
                    step: 3,
                    question: "Really?".into(),
                },
                E::Input {
                    index: 0,
                    content: "yes".into(),
                },
                E::Final {
                    output: "Done.".into(),
                },
            ],
        ),
    ]
}

#[test]
fn the_transcript_shows_messages_steps_unknown_effects_attempts_and_fences() {
    let text = transcript(&ledger());
    let expected = [
        "=== claimed: attempt 1 goes to pod r-w1 (fence 1)",
        "=== attempt 1 started in pod r-w1",
        "[user] clean up",
        "[assistant] On it.",
        "-> step 1: shell (idempotent) {\"command\":\"ls\"}",
        "<- step 1 result (shell):\n    a\n    b",
        "-> step 2: shell rm x",
        "[assistant, streamed; its attempt ended before it was recorded] half an ans",
        "=== claimed: attempt 2 goes to pod r-w2 (fence 2)",
        "!! step 2 (shell): effect UNKNOWN: the worker of attempt 1 died while it ran; it was not re-run",
        "   probe of step 2: could not tell (still unknown)",
        "=== attempt 2 handed off",
        "?? waiting for input (step 3): Really?",
        "[user input #1] yes",
        "=== final answer: Done.",
    ];
    let mut from = 0;
    for want in expected {
        let at = text[from..]
            .find(want)
            .unwrap_or_else(|| panic!("missing or out of order: {want:?}\n{text}"));
        from += at + want.len();
    }
}

#[test]
fn chunked_events_are_rebuilt_across_segments() {
    use base64::Engine;
    let event = LedgerEvent::Final {
        output: "x".repeat(50),
    };
    let json = serde_json::to_vec(&event).unwrap();
    let (a, b) = json.split_at(20);
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    let segments = vec![
        seg(
            1,
            1,
            vec![LedgerEvent::Chunk {
                index: 0,
                total: 2,
                data: b64(a),
            }],
        ),
        seg(
            2,
            1,
            vec![LedgerEvent::Chunk {
                index: 1,
                total: 2,
                data: b64(b),
            }],
        ),
    ];
    let text = transcript(&segments);
    assert_eq!(text, format!("=== final answer: {}\n", "x".repeat(50)));
}

#[test]
fn attempt_history_says_how_each_attempt_ended() {
    let history = attempt_history(&ledger());
    let ends: Vec<(i64, &str, &str)> = history
        .iter()
        .map(|(f, p, e)| (f.get(), p.as_str(), e.as_str()))
        .collect();
    assert_eq!(
        ends,
        [
            (1, "r-w1", "superseded (claimed for a new attempt)"),
            (2, "r-w2", "handed off"),
            (3, "r-w3", "finished with a final answer"),
        ]
    );
}

/// A terminal claim seals `claimed{2}` (a pod that never runs), then records `closed{2}`: the
/// history ends the attempt that ran, and lists no attempt 2.
#[test]
fn attempt_history_ends_the_last_attempt_at_a_terminal_claim() {
    let claimed = |fence: i64| LedgerEvent::Claimed {
        fence: Fence::new(fence),
        pod: format!("r-w{fence}"),
    };
    let ledger = [
        seg(1, 1, vec![claimed(1)]),
        seg(
            2,
            1,
            vec![LedgerEvent::AttemptStarted {
                fence: Fence::new(1),
                pod: "r-w1".into(),
            }],
        ),
        seg(3, 2, vec![claimed(2)]),
        seg(
            4,
            2,
            vec![LedgerEvent::Closed {
                fence: Fence::new(2),
                reason: CloseReason::MaxAttemptsExceeded,
            }],
        ),
    ];
    let history = attempt_history(&ledger);
    assert_eq!(
        history,
        [(
            Fence::new(1),
            "r-w1".to_string(),
            "closed by the controller".to_string()
        )]
    );
}

#[test]
fn describe_lists_phase_attempts_unknown_effects_conditions_and_events() {
    let status = AgentRunStatus {
        phase: Phase::Succeeded,
        attempt: 3,
        fence: Fence::new(3),
        failed_attempts: 1,
        unknown_effects: vec![unknown(2, "shell")],
        output: Some("Done.".into()),
        conditions: vec![Condition {
            type_: "Complete".into(),
            status: "True".into(),
            reason: "Succeeded".into(),
            message: "final answer".into(),
            last_transition_time: Time("2025-01-01T11:59:00Z".parse().unwrap()),
            observed_generation: None,
        }],
        ..Default::default()
    };
    let r = run("r", "ns", status);
    let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e1", "namespace": "ns", "creationTimestamp": "2025-01-01T11:58:00Z"},
        "involvedObject": {"kind": "AgentRun", "name": "r"},
        "type": "Warning", "reason": "UnknownEffect", "message": "step 2 (shell) ...",
        "reportingComponent": "baton-worker"
    }))
    .unwrap();
    let segments = ledger();
    let text = describe(&Description {
        run: &r,
        segments: &segments,
        events: &[event],
        now: now(),
    });
    for want in [
        "Phase:           Succeeded",
        "Fence:           3",
        "Failed attempts: 1 of 3",
        "fence 2   pod r-w2",
        "handed off",
        "step 2 (shell), attempt 1: unknown - rm -rf /tmp/x",
        "Complete   True",
        "Warning   UnknownEffect   2m    baton-worker",
        "Output:          Done.",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn describe_says_none_when_there_is_nothing() {
    let text = describe(&Description {
        run: &run("r", "ns", Default::default()),
        segments: &[],
        events: &[],
        now: now(),
    });
    assert!(
        text.contains("Attempts (from the ledger):\n  <none>"),
        "{text}"
    );
    assert!(
        text.contains("Conditions: <none>") && text.contains("Events: <none>"),
        "{text}"
    );
}
