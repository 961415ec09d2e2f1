use super::*;
use crate::fence::Fence;

#[test]
fn a_run_is_one_trace_in_every_process_and_a_namesake_another() {
    let a = RunTrace::from_parts("uid-a", None);
    assert_eq!(
        a,
        RunTrace::from_parts("uid-a", None),
        "the same in every process"
    );
    let b = RunTrace::from_parts("uid-b", None);
    assert_ne!(
        a.trace_id, b.trace_id,
        "a re-created namesake is another trace"
    );
    assert_ne!(a.root, b.root);
    assert_ne!(a.trace_id, TraceId::INVALID);
    let given = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap();
    let caller = SpanId::from_hex("00f067aa0ba902b7").unwrap();
    let continued = RunTrace::from_parts("uid-a", Some((given, caller)));
    assert_eq!(
        (continued.trace_id, continued.root, continued.parent),
        (given, a.root, Some(caller))
    );
    assert_eq!(a.parent, None, "a run no caller named is a trace's root");
}

#[test]
fn every_claim_attempt_and_tool_call_has_a_span_id_of_its_own_that_any_process_computes() {
    let a = RunTrace::from_parts("uid-a", None);
    let (one, two) = (Fence::new(1), Fence::new(2));
    let ids = [
        a.root,
        a.claim(one),
        a.claim(two),
        a.attempt(one),
        a.attempt(two),
        a.tool(one, 1),
        a.tool(two, 1),
        a.tool(one, 2),
    ];
    let distinct: std::collections::BTreeSet<String> =
        ids.iter().map(|id| id.to_string()).collect();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    assert!(ids.iter().all(|id| *id != SpanId::INVALID));
    let again = RunTrace::from_parts("uid-a", None);
    assert_eq!(
        (again.attempt(two), again.tool(one, 2)),
        (a.attempt(two), a.tool(one, 2))
    );
    let other = RunTrace::from_parts("uid-b", None);
    assert_ne!(
        other.attempt(one),
        a.attempt(one),
        "another run's attempt is another span"
    );
}

#[test]
fn only_a_well_formed_traceparent_is_taken() {
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (trace, span) = parse_traceparent(good).unwrap();
    assert_eq!(trace.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(span.to_string(), "00f067aa0ba902b7");
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ] {
        assert_eq!(parse_traceparent(bad), None, "{bad:?}");
    }
}
