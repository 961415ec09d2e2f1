//! The figures' sources: the controller's and API server's metrics parsed, the controller's RSS.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::Client;

pub type Samples = HashMap<String, f64>;

/// Waits (at most a minute) until the controller has published the start's Events, so the
/// window measures live runs' takeovers, not the start's tail; prints what it found.
pub async fn settle_events(port: u16) -> anyhow::Result<()> {
    let t = Instant::now();
    let metric = |s: &Samples, name: &str| s.get(name).copied().unwrap_or(0.0);
    loop {
        let now = scrape(port).await?;
        let queued = metric(&now, "baton_events_queued");
        if queued == 0.0 || t.elapsed() > Duration::from_secs(60) {
            println!(
                "bench: start's Events published {:.1} s after the last run started \
                 ({queued} still queued, {} dropped)",
                t.elapsed().as_secs_f64(),
                metric(&now, "baton_events_dropped_total")
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The controller's counters: every sample line of the exposition, by series.
pub async fn scrape(port: u16) -> anyhow::Result<Samples> {
    let body = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .text()
        .await?;
    Ok(samples(&body))
}

/// The API server's own metrics (its Go runtime's garbage collections, its heap).
pub async fn scrape_apiserver(client: &Client) -> anyhow::Result<Samples> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(samples(&client.request_text(request).await?))
}

/// Every sample line of a Prometheus text exposition, by series.
fn samples(body: &str) -> Samples {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse::<f64>().ok()?))
        })
        .collect()
}

/// Sum of the series whose name starts with `prefix`.
pub fn sum(samples: &Samples, prefix: &str) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, v)| v)
        .sum()
}

/// Per-series increase of the series starting with `prefix`, nonzero only.
pub fn deltas(before: &Samples, after: &Samples, prefix: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = after
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The upper bound of the histogram bucket holding quantile `q` of the observations made
/// between the two scrapes, of every series starting with `prefix` together (their buckets
/// added bound by bound).
pub fn bucket_quantile(before: &Samples, after: &Samples, prefix: &str, q: f64) -> String {
    let mut by_bound: Vec<(f64, f64)> = Vec::new();
    for (k, v) in after.iter().filter(|(k, _)| k.starts_with(prefix)) {
        let Some(le) = k.split("le=\"").nth(1).and_then(|s| s.split('"').next()) else {
            continue;
        };
        let le = match le {
            "+Inf" => f64::INFINITY,
            le => match le.parse() {
                Ok(le) => le,
                Err(_) => continue,
            },
        };
        let count = v - before.get(k).copied().unwrap_or(0.0);
        match by_bound.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, total)) => *total += count,
            None => by_bound.push((le, count)),
        }
    }
    let mut buckets = by_bound;
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return "n/a".into();
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map_or("n/a".into(), |(le, _)| format!("{le}"))
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}
