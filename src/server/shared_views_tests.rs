//! The protocol views with a shared fold: every follower is sent exactly what a follower with
//! a fold of its own is sent, after its own cursor and as an answer to its own request.

use serde_json::{Value, json};

use super::a2a::translate::TaskIds;
use super::a2a::view::A2aView;
use super::held::Outgoing;
use super::responses::fold::PER_POSITION;
use super::responses::{ResponsesView, meta_of};
use super::shared_fold::Folds;
use super::view::View;
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment, Role};
use crate::fence::{Fence, test_segment};

fn run() -> AgentRun {
    serde_json::from_value(json!({
        "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": "r", "namespace": "ns", "uid": "u1"},
        "spec": {"thread": "chat", "input": "hi"},
    }))
    .unwrap()
}

/// A run that streams, calls a tool, answers and ends: one segment per position.
fn ledger() -> Vec<LedgerSegment> {
    let positions = vec![
        vec![LedgerEvent::Claimed {
            fence: Fence::new(1),
            pod: "p1".into(),
        }],
        vec![LedgerEvent::ModelDelta { text: "Hel".into() }],
        vec![LedgerEvent::ModelDelta { text: "lo".into() }],
        vec![LedgerEvent::StepIntent {
            step: 1,
            tool: "sh".into(),
            call_id: "c1".into(),
            input: "{}".into(),
            idempotent: false,
        }],
        vec![LedgerEvent::StepResult {
            step: 1,
            output: "done".into(),
            is_error: false,
        }],
        vec![LedgerEvent::Message {
            role: Role::Assistant,
            content: "Hello".into(),
        }],
        vec![LedgerEvent::Final {
            output: "Hello".into(),
        }],
    ];
    let segments = positions.into_iter().enumerate();
    segments
        .map(|(i, events)| test_segment(i as i64 + 1, 1, events))
        .collect()
}

/// Each event's data.
fn data(out: Vec<Outgoing>) -> Vec<Value> {
    let bytes: Vec<u8> = out.iter().flat_map(|o| o.as_bytes().to_vec()).collect();
    let text = String::from_utf8(bytes).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Every position's events as `views` send them, side by side.
fn stream(views: &mut [Box<dyn View>]) -> Vec<Vec<Vec<Value>>> {
    let run = run();
    let mut sent: Vec<Vec<Vec<Value>>> = views.iter().map(|_| Vec::new()).collect();
    for (view, sent) in views.iter_mut().zip(&mut sent) {
        sent.push(data(view.run(&run)));
    }
    for segment in ledger() {
        for (view, sent) in views.iter_mut().zip(&mut sent) {
            sent.push(data(view.segment(&segment, None)));
        }
    }
    sent
}

#[test]
fn responses_followers_sharing_a_fold_see_what_a_lone_follower_sees() {
    let (shared, own) = (Folds::default(), Folds::default());
    let view = |after: Option<i64>, folds: &Folds| -> Box<dyn View> {
        Box::new(ResponsesView::new(meta_of(&run()), after, "u1", folds))
    };
    let after = 3 * PER_POSITION;
    let mut views = [
        view(None, &shared),
        view(Some(after), &shared),
        view(None, &own),
    ];
    let [first, resumed, alone] = stream(&mut views).try_into().unwrap();
    assert_eq!(first, alone);
    let numbers = |events: &[Vec<Value>]| -> Vec<i64> {
        let events = events.iter().flatten();
        events
            .map(|e| e["sequence_number"].as_i64().unwrap())
            .collect()
    };
    let expected: Vec<i64> = numbers(&alone).into_iter().filter(|n| *n > after).collect();
    assert_eq!(numbers(&resumed), expected);
    assert!(expected.len() > 5, "{expected:?}");
}

#[test]
fn a2a_followers_sharing_a_fold_each_get_answers_to_their_own_request() {
    let (shared, own) = (Folds::default(), Folds::default());
    let ids = TaskIds {
        task: "r".into(),
        context: "chat".into(),
    };
    let first = json!({"kind": "task", "id": "r"});
    let view = |request: Value, folds: &Folds| -> Box<dyn View> {
        Box::new(A2aView::new(
            ids.clone(),
            &request,
            &run(),
            first.clone(),
            0,
            folds,
        ))
    };
    let mut views = [
        view(json!(1), &shared),
        view(json!("b"), &shared),
        view(json!(1), &own),
    ];
    let [one, b, alone] = stream(&mut views).try_into().unwrap();
    assert_eq!(one, alone);
    let (one, b): (Vec<Value>, Vec<Value>) = (one.concat(), b.concat());
    assert!(one.len() > 5 && one.len() == b.len());
    for (one, b) in one.iter().zip(&b) {
        assert_eq!((&one["id"], &b["id"]), (&json!(1), &json!("b")));
        assert_eq!(one["result"], b["result"]);
    }
}
