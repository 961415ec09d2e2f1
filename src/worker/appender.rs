//! The one appender: a task that owns the ledger tail, so every append is strictly ordered.
//! Events are buffered and flushed every `interval` or `max_events`, whichever first; the hot
//! path's `stepIntent` append carries the buffer and is the only append it awaits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::events::EventType;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use super::guard::{LostGuard, RETRY_FIRST};
use super::holder::Holder;
use super::metrics::{AppendKind, FenceRejection, WorkerMetrics};
use super::outage::Outage;
use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment, LedgerStats};
use crate::ledger::{LedgerError, event_bytes};

/// When buffered events are flushed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlushPolicy {
    pub interval: Duration,
    pub max_events: usize,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            max_events: 32,
        }
    }
}

impl FlushPolicy {
    /// When the buffer must be flushed, if it holds anything.
    pub fn deadline(&self, oldest: Option<Instant>) -> Option<Instant> {
        oldest.map(|t| t + self.interval)
    }

    /// True when the buffer is due now.
    pub fn due(&self, buffered: usize, oldest: Option<Instant>, now: Instant) -> bool {
        buffered > 0
            && (buffered >= self.max_events || self.deadline(oldest).is_some_and(|d| now >= d))
    }
}

/// Why an append was refused.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The run is no longer ours: nothing more may be written.
    #[error("the run was lost: {0}")]
    Lost(String),
    /// The transcript would exceed the ledger cap: nothing more is appended.
    #[error("the ledger would grow to {bytes} bytes, over its cap of {max}")]
    TooLarge { bytes: u64, max: u64 },
    /// The appender task is gone.
    #[error("the appender stopped")]
    Gone,
}

/// An acknowledged append.
#[derive(Debug, Default)]
pub struct Acked {
    pub tail: i64,
    /// Older owners' segments that slipped in since the last acknowledgement.
    pub slipped: Vec<LedgerSegment>,
    /// API round trips this append took.
    pub requests: u64,
}

enum Command {
    Buffer(LedgerEvent),
    Append {
        events: Vec<LedgerEvent>,
        drop_deltas: bool,
        ack: oneshot::Sender<Result<Acked, AppendError>>,
    },
}

/// Where the appender starts: the ledger's tail and its size.
#[derive(Debug, Clone)]
pub struct Start {
    pub tail: i64,
    pub stats: LedgerStats,
}

/// The handle the agent talks to.
#[derive(Clone)]
pub struct Appender {
    tx: mpsc::UnboundedSender<Command>,
}

impl Appender {
    /// Starts the appender at `start`.
    pub fn spawn(
        holder: Holder,
        start: Start,
        max_bytes: u64,
        policy: FlushPolicy,
        guard: LostGuard,
        metrics: Arc<WorkerMetrics>,
    ) -> (Self, watch::Receiver<LedgerStats>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stats_tx, stats_rx) = watch::channel(start.stats.clone());
        let task = Task {
            holder,
            tail: start.tail,
            stats: start.stats,
            stats_tx,
            max_bytes,
            policy,
            guard,
            metrics,
            buffer: Vec::new(),
            oldest: None,
            slipped: Vec::new(),
            refused: None,
            outage: Outage::default(),
        };
        tokio::spawn(tracing::Instrument::in_current_span(task.run(rx)));
        (Self { tx }, stats_rx)
    }

    /// Buffers an event for the next flush (off the hot path).
    pub fn buffer(&self, event: LedgerEvent) {
        let _ = self.tx.send(Command::Buffer(event));
    }

    /// Appends the buffer plus `events` and waits for the API server's acknowledgement.
    /// `drop_deltas` discards buffered, unflushed `modelDelta`s: the turn's message replaces them.
    pub async fn append(
        &self,
        events: Vec<LedgerEvent>,
        drop_deltas: bool,
    ) -> Result<Acked, AppendError> {
        let (ack, rx) = oneshot::channel();
        self.tx
            .send(Command::Append {
                events,
                drop_deltas,
                ack,
            })
            .map_err(|_| AppendError::Gone)?;
        rx.await.map_err(|_| AppendError::Gone)?
    }
}

struct Task {
    holder: Holder,
    tail: i64,
    stats: LedgerStats,
    stats_tx: watch::Sender<LedgerStats>,
    max_bytes: u64,
    policy: FlushPolicy,
    guard: LostGuard,
    metrics: Arc<WorkerMetrics>,
    buffer: Vec<LedgerEvent>,
    oldest: Option<Instant>,
    slipped: Vec<LedgerSegment>,
    /// Set once an append was refused for good: every later one is refused the same way.
    refused: Option<AppendError>,
    outage: Outage,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            let deadline = self.policy.deadline(self.oldest);
            let command = tokio::select! {
                c = rx.recv() => c,
                _ = sleep_until(deadline) => {
                    let _ = self.flush(Vec::new(), AppendKind::Flush).await;
                    continue;
                }
            };
            match command {
                None => return,
                Some(Command::Buffer(event)) => {
                    push_coalesced(&mut self.buffer, event);
                    self.oldest.get_or_insert_with(Instant::now);
                    if self
                        .policy
                        .due(self.buffer.len(), self.oldest, Instant::now())
                    {
                        let _ = self.flush(Vec::new(), AppendKind::Flush).await;
                    }
                }
                Some(Command::Append {
                    events,
                    drop_deltas,
                    ack,
                }) => {
                    if drop_deltas {
                        self.buffer
                            .retain(|e| !matches!(e, LedgerEvent::ModelDelta { .. }));
                    }
                    let result = self
                        .flush(events, AppendKind::Awaited)
                        .await
                        .map(|mut acked| {
                            acked.slipped = std::mem::take(&mut self.slipped);
                            acked
                        });
                    let _ = ack.send(result);
                }
            }
        }
    }

    /// Appends the buffer followed by `events`, retrying transient errors until the lease
    /// would expire. A retried create that had landed is recognised as our own write.
    async fn flush(
        &mut self,
        extra: Vec<LedgerEvent>,
        kind: AppendKind,
    ) -> Result<Acked, AppendError> {
        let mut events = std::mem::take(&mut self.buffer);
        self.oldest = None;
        events.extend(extra);
        if let Some(refused) = &self.refused {
            return Err(clone_refusal(refused));
        }
        if events.is_empty() {
            return Ok(Acked {
                tail: self.tail,
                ..Acked::default()
            });
        }
        let bytes: u64 = events
            .iter()
            .map(|e| event_bytes(e).unwrap_or(0) as u64)
            .sum();
        if self.stats.bytes as u64 + bytes > self.max_bytes {
            return Err(self.refuse(AppendError::TooLarge {
                bytes: self.stats.bytes as u64 + bytes,
                max: self.max_bytes,
            }));
        }
        self.append_with_retries(events, kind).await
    }

    async fn append_with_retries(
        &mut self,
        events: Vec<LedgerEvent>,
        kind: AppendKind,
    ) -> Result<Acked, AppendError> {
        let mut backoff = RETRY_FIRST;
        let mut requests = 0;
        loop {
            if self.guard.is_lost() {
                return Err(self.refuse(AppendError::Lost(self.guard.reason())));
            }
            let attempt = tokio::select! {
                r = self.holder.append(self.tail, events.clone()) => Some(r),
                _ = self.guard.token().cancelled() => None,
            };
            let Some(attempt) = attempt else {
                return Err(self.refuse(AppendError::Lost(self.guard.reason())));
            };
            match attempt {
                Ok(appended) => {
                    self.outage_ended().await;
                    requests += (appended.written.len() + 2 * appended.slipped.len()) as u64;
                    self.record(&appended.written, kind);
                    self.tail = appended.tail;
                    self.slipped.extend(appended.slipped);
                    debug!(tail = self.tail, "appended");
                    return Ok(Acked {
                        tail: self.tail,
                        slipped: Vec::new(),
                        requests,
                    });
                }
                Err(err) if err.is_lost() => {
                    if let Some(rejection) = FenceRejection::of_ledger(&err) {
                        self.metrics.fence_rejected(rejection);
                    }
                    self.guard.lose(err.to_string());
                    return Err(self.refuse(AppendError::Lost(err.to_string())));
                }
                Err(err) => {
                    requests += 1;
                    self.transient(&err, &mut backoff).await;
                }
            }
        }
    }

    async fn transient(&mut self, err: &LedgerError, backoff: &mut Duration) {
        warn!(error = %err, label = err.label(), "append failed; retrying");
        if let Some(lasted) = self.outage.failed(Instant::now()) {
            let note = format!(
                "appending to the run's ledger has failed for {}s: {err}. The run waits, its \
                 lease kept, and retries: nothing it did is lost",
                lasted.as_secs()
            );
            let warning = EventType::Warning;
            self.holder
                .publish_event(warning, "LedgerUnavailable", "Append", &note)
                .await;
        }
        self.guard.pause_before_retry(backoff).await;
    }

    /// Says so when appends land again after an outage that was told.
    async fn outage_ended(&mut self) {
        if let Some(lasted) = self.outage.ended(Instant::now()) {
            let note = format!(
                "the run's ledger takes appends again, after {}s",
                lasted.as_secs()
            );
            let normal = EventType::Normal;
            self.holder
                .publish_event(normal, "LedgerAvailable", "Append", &note)
                .await;
        }
    }

    fn record(&mut self, written: &[LedgerSegment], kind: AppendKind) {
        let before = self.stats.bytes;
        for seg in written {
            self.stats.segments += 1;
            self.stats.events += seg.spec.events.len() as i64;
            self.stats.bytes += seg
                .spec
                .events
                .iter()
                .map(|e| event_bytes(e).unwrap_or(0) as i64)
                .sum::<i64>();
        }
        let bytes = (self.stats.bytes - before).max(0) as u64;
        self.metrics
            .ledger_appended(kind, written.len() as u64, bytes);
        let _ = self.stats_tx.send(self.stats.clone());
    }

    fn refuse(&mut self, err: AppendError) -> AppendError {
        let copy = clone_refusal(&err);
        self.refused = Some(err);
        copy
    }
}

fn clone_refusal(err: &AppendError) -> AppendError {
    match err {
        AppendError::Lost(s) => AppendError::Lost(s.clone()),
        AppendError::TooLarge { bytes, max } => AppendError::TooLarge {
            bytes: *bytes,
            max: *max,
        },
        AppendError::Gone => AppendError::Gone,
    }
}

/// Buffers `event`; streamed text joins the delta buffered just before it, so a streaming
/// model costs one event per flush, not one per token.
pub fn push_coalesced(buffer: &mut Vec<LedgerEvent>, event: LedgerEvent) {
    if let LedgerEvent::ModelDelta { text } = &event
        && let Some(LedgerEvent::ModelDelta { text: last }) = buffer.last_mut()
    {
        last.push_str(text);
        return;
    }
    buffer.push(event);
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// The size of a ledger as listed.
pub fn stats_of(segments: &[LedgerSegment]) -> LedgerStats {
    let mut stats = LedgerStats::default();
    for seg in segments {
        stats.segments += 1;
        stats.events += seg.spec.events.len() as i64;
        stats.bytes += seg
            .spec
            .events
            .iter()
            .map(|e| event_bytes(e).unwrap_or(0) as i64)
            .sum::<i64>();
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_is_due_at_once() {
        let p = FlushPolicy::default();
        let now = Instant::now();
        assert!(!p.due(0, None, now));
        assert!(!p.due(31, Some(now), now));
        assert!(p.due(32, Some(now), now));
    }

    #[test]
    fn an_old_buffer_is_due_after_the_interval() {
        let p = FlushPolicy::default();
        let t0 = Instant::now();
        assert!(!p.due(1, Some(t0), t0 + Duration::from_millis(499)));
        assert!(p.due(1, Some(t0), t0 + Duration::from_millis(500)));
        assert_eq!(p.deadline(Some(t0)), Some(t0 + Duration::from_millis(500)));
        assert_eq!(p.deadline(None), None);
    }

    #[test]
    fn streamed_text_is_coalesced_in_the_buffer() {
        let delta = |t: &str| LedgerEvent::ModelDelta { text: t.into() };
        let mut buffer = Vec::new();
        push_coalesced(&mut buffer, delta("a "));
        push_coalesced(&mut buffer, delta("b"));
        push_coalesced(&mut buffer, LedgerEvent::Handoff);
        push_coalesced(&mut buffer, delta("c"));
        assert_eq!(buffer, vec![delta("a b"), LedgerEvent::Handoff, delta("c")]);
    }
}
