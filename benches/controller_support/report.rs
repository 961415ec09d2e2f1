//! What a pass prints: takeover lateness, RSS, API writes and load, errors, the lateness dump.

use std::collections::HashMap;
use std::time::Instant;

use crate::Args;
use baton_testkit::metrics::{Samples, bucket_quantile, deltas, sum};

/// What the API server (sharing the machine's cores with etcd, the controller and the bench)
/// went through during the window: its garbage collections stall its requests.
pub fn report_apiserver(before: &Samples, after: &Samples) {
    let delta =
        |series: &str| after.get(series).unwrap_or(&0.0) - before.get(series).unwrap_or(&0.0);
    let heap = after.get("go_memstats_heap_alloc_bytes").unwrap_or(&0.0) / (1024.0 * 1024.0);
    println!(
        "API server during the window: {:.0} Go GC cycles, heap {heap:.0} MiB at the end",
        delta("go_gc_duration_seconds_count")
    );
    // A 1.20 server counts a GET of a missing custom resource as `LIST` with code 404.
    println!("API server requests during the window (all clients, by verb, resource and code):");
    for ((verb, resource, code), n) in requests_by_verb(before, after) {
        println!("  {verb:>6} {resource:<28} {code} {n:>7.0}");
    }
}

/// Increase of `apiserver_request_total` summed per (verb, resource[/subresource], code).
fn requests_by_verb(before: &Samples, after: &Samples) -> Vec<((String, String, String), f64)> {
    let mut out: HashMap<(String, String, String), f64> = HashMap::new();
    for (series, n) in deltas(before, after, "apiserver_request_total{") {
        let label = |name: &str| {
            let key = format!("{name}=\"");
            series
                .split(&format!(",{key}"))
                .nth(1)
                .or_else(|| series.split(&format!("{{{key}")).nth(1))
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let mut resource = label("resource");
        let sub = label("subresource");
        if !sub.is_empty() {
            resource = format!("{resource}/{sub}");
        }
        *out.entry((label("verb"), resource, label("code")))
            .or_default() += n;
    }
    let mut out: Vec<_> = out.into_iter().collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

pub fn report(
    args: &Args,
    expiries: &HashMap<String, Instant>,
    claims: &HashMap<String, Instant>,
    before: &Samples,
    after: &Samples,
    elapsed: f64,
    rss: u64,
) {
    let mut late: Vec<f64> = expiries
        .iter()
        .filter_map(|(name, expiry)| {
            let at = claims.get(name)?;
            Some(at.saturating_duration_since(*expiry).as_secs_f64())
        })
        .collect();
    dump_lateness(expiries, claims);
    late.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        late.get(((late.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let delta = |prefix: &str| sum(after, prefix) - sum(before, prefix);
    let takeovers = delta("baton_takeovers_total").max(1.0);
    println!("runs:                      {}", args.runs);
    println!(
        "takeovers observed:        {} of {}",
        late.len(),
        expiries.len()
    );
    println!("takeover lateness p50:     {:.3} s", pct(0.50));
    println!("takeover lateness p99:     {:.3} s", pct(0.99));
    println!(
        "takeover lateness max:     {:.3} s",
        late.last().copied().unwrap_or(f64::NAN)
    );
    println!("controller RSS:            {:.1} MiB", rss as f64 / 1024.0);
    // With the baseline in it: the 1,000- and 5,000-run figures side by side give the margin.
    println!(
        "controller RSS per run:    {:.1} KiB",
        rss as f64 / args.runs.max(1) as f64
    );
    println!(
        "API writes per takeover:   {:.2} (Events excluded)",
        delta("baton_api_writes_total") / takeovers
    );
    for (series, d) in deltas(before, after, "baton_api_writes_total") {
        println!("  {series}: {d}");
    }
    println!(
        "reconciles per second:     {:.1}",
        delta("baton_reconciles_total") / elapsed
    );
    let quantiles = |histogram: &str| {
        let bucket = format!("{histogram}_bucket");
        (
            bucket_quantile(before, after, &bucket, 0.50),
            bucket_quantile(before, after, &bucket, 0.99),
        )
    };
    let (p50, p99) = quantiles("baton_takeover_lateness_seconds");
    println!("controller's own lateness: p50 <= {p50} s, p99 <= {p99} s (histogram bucket bounds)");
    // The claim's own API round trips, of that lateness: the rest is the wait for the expiry's
    // reconcile to start (the controller's queueing) and the watch's delay.
    let (p50, p99) = quantiles("baton_claim_api_seconds");
    println!("  of it, the claim's API calls: p50 <= {p50} s, p99 <= {p99} s");
    let dropped = delta("baton_events_dropped_total");
    if dropped > 0.0 {
        println!("events dropped:            {dropped}");
    }
    let errors = deltas(before, after, "baton_errors_total");
    if !errors.is_empty() {
        println!("reconcile errors during the window:");
        for (series, d) in errors {
            println!("  {series}: {d}");
        }
    }
}

/// `BATON_BENCH_DUMP=FILE`: one line per takeover, "<expiry, s after the first> <lateness, s>",
/// to see when in the window late takeovers happened.
fn dump_lateness(expiries: &HashMap<String, Instant>, claims: &HashMap<String, Instant>) {
    let Ok(path) = std::env::var("BATON_BENCH_DUMP") else {
        return;
    };
    let Some(first) = expiries.values().min().copied() else {
        return;
    };
    let mut lines: Vec<(f64, f64)> = expiries
        .iter()
        .filter_map(|(name, expiry)| {
            let at = claims.get(name)?;
            let offset = expiry.duration_since(first).as_secs_f64();
            Some((offset, at.saturating_duration_since(*expiry).as_secs_f64()))
        })
        .collect();
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    let wall = std::time::SystemTime::now() - first.elapsed();
    let unix = wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let header = format!("# first expiry at unix {:.3}\n", unix.as_secs_f64());
    let body: String = lines
        .iter()
        .map(|(t, l)| format!("{t:.3} {l:.3}\n"))
        .collect();
    let text = header + &body;
    if let Err(err) = std::fs::write(&path, text) {
        eprintln!("bench: cannot write {path}: {err}");
    }
}
