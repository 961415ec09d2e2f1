use super::*;

#[test]
fn traces_are_on_only_with_an_endpoint_and_not_disabled() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        }
    };
    assert!(!configured(env(&[])));
    assert!(!configured(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
    assert!(configured(env(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://c:4318"
    )])));
    assert!(configured(env(&[(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "http://c:4318/v1/traces"
    )])));
    assert!(!configured(env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_SDK_DISABLED", "TRUE"),
    ])));
}

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
    let continued = RunTrace::from_parts("uid-a", Some(given));
    assert_eq!((continued.trace_id, continued.root), (given, a.root));
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
