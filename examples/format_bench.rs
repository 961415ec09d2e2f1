//! `make bench-format`: what reading a ledger event through the unknown-kind wrapper costs.
//!
//! `LedgerEvent`'s `Deserialize` reads each event into a `serde_json::Value` first, so that a
//! kind this version does not know can be kept whole (`Unrecognized`); the derived reader
//! underneath (serde's `remote = "Self"`) reads the known kinds straight from the text. This
//! reads every event of the checked-in format-1 fixtures, many times over, both ways, and
//! prints the time per event and the ratio (one run, one machine: compare the ratio).

use std::time::Instant;

use baton::crd::v1alpha1::LedgerEvent;

const ROUNDS: usize = 2_000;

fn main() {
    let events = fixture_events();
    let total = events.len() * ROUNDS;
    // Both ways once before timing (page cache, allocator), and the two must agree.
    for text in &events {
        assert_eq!(wrapped(text), derived(text), "{text}");
    }
    let bytes: usize = events.iter().map(String::len).sum();
    let wrapped_ns = time(&events, wrapped);
    let derived_ns = time(&events, derived);
    println!(
        "format figures: {} fixture events ({} bytes), read {ROUNDS} times each ({total} reads)",
        events.len(),
        bytes
    );
    println!(
        "  through the wrapper (Value first, unknown kinds kept): {:.0} ns per event",
        wrapped_ns / total as f64
    );
    println!(
        "  derived reader alone (known kinds only):               {:.0} ns per event",
        derived_ns / total as f64
    );
    println!("  ratio wrapper / derived: {:.2}", wrapped_ns / derived_ns);
}

/// Every event of every ledger in the fixture, as its JSON text.
fn fixture_events() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ledger/format-1.json"
    );
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).unwrap();
    let ledgers = fixture["ledgers"].as_object().expect("ledgers by name");
    ledgers
        .values()
        .flat_map(|segments| segments.as_array().cloned().unwrap_or_default())
        .flat_map(|segment| segment["events"].as_array().cloned().unwrap_or_default())
        .map(|event| event.to_string())
        .collect()
}

fn wrapped(text: &str) -> LedgerEvent {
    serde_json::from_str(text).expect("an event")
}

fn derived(text: &str) -> LedgerEvent {
    let mut reader = serde_json::Deserializer::from_str(text);
    LedgerEvent::deserialize(&mut reader).expect("an event")
}

/// Nanoseconds to read every event `ROUNDS` times with `read`.
fn time(events: &[String], read: fn(&str) -> LedgerEvent) -> f64 {
    let t0 = Instant::now();
    for _ in 0..ROUNDS {
        for text in events {
            std::hint::black_box(read(std::hint::black_box(text)));
        }
    }
    t0.elapsed().as_nanos() as f64
}
