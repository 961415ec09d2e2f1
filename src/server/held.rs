//! What the streams hold for their clients, all streams together. Every event a stream sends
//! is counted against one budget of bytes from before it is made until its connection has
//! written it (`Bytes::from_owner` keeps the count with the bytes through hyper), and a
//! ledger page is read only by a stream holding one of a few reading places, which it keeps
//! until the page's events are counted. So a thousand clients reading slowly hold the budget
//! and a few pages, not a thousand ledgers. A stream whose event does not fit waits for other
//! clients' to be written; a client that takes nothing is dropped (`stream::SLOW_FOLLOWER`,
//! sooner while others wait: `watchdog`), its connection cut, and what it held is free again.
//!
//! The Server-Sent Events body is written here rather than with axum's `Sse`, which encodes
//! each event out of sight: its bytes could not carry their count.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// Bytes of events all streams hold at once by default (`--max-stream-bytes`).
pub const DEFAULT_STREAM_BYTES: usize = 32 * 1024 * 1024;
/// Streams reading a ledger page at once: each holds at most a page of segments outside the
/// budget, until its events are counted.
pub const READS_AT_ONCE: usize = 4;

/// The one budget of every stream's events, and the reading places.
#[derive(Clone)]
pub struct EventBudget {
    kib: Arc<Semaphore>,
    total_kib: u32,
    reads: Arc<Semaphore>,
    /// Streams waiting for room now.
    waiting: Arc<AtomicUsize>,
}

impl EventBudget {
    pub fn new(bytes: usize) -> Self {
        let total_kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        Self {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            reads: Arc::new(Semaphore::new(READS_AT_ONCE)),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// True while a stream waits for room: the streams holding it must keep up or be cut.
    pub fn pressed(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }

    /// Room for `event`, waited for, counted in `tally` too. An event larger than the whole
    /// budget takes all of it.
    pub async fn hold(&self, event: Outgoing, tally: &Arc<Tally>) -> Held {
        self.hold_all(vec![event], tally)
            .await
            .pop()
            .expect("one event held")
    }

    /// Room for all of `events` at once, waited for (all or nothing: a stream never holds
    /// part of a page while it waits for the rest, so streams cannot wait on each other).
    /// Their sizes together must fit the budget, or they must be one event ([`Self::batches`]).
    pub async fn hold_all(&self, events: Vec<Outgoing>, tally: &Arc<Tally>) -> Vec<Held> {
        let sizes: Vec<u32> = events.iter().map(|e| self.kib_of(e)).collect();
        let total = sizes.iter().fold(0u32, |a, b| a.saturating_add(*b));
        let room = self.room(total.min(self.total_kib)).await;
        let mut room = Some(room);
        let last = events.len().saturating_sub(1);
        let mut held = Vec::with_capacity(events.len());
        for (i, (event, kib)) in events.into_iter().zip(sizes).enumerate() {
            // Each takes its size; the last takes what is left (all of it, for one event
            // over the whole budget). The sizes fit what was acquired: the split succeeds.
            let share = match i == last {
                true => room.take(),
                false => room.as_mut().and_then(|r| r.split(kib as usize)),
            };
            tally.handed();
            held.push(Held {
                bytes: event.0,
                _room: share.expect("the room acquired covers every event"),
                tally: tally.clone(),
            });
        }
        held
    }

    /// `kib` of room, at once when it is free; else waited for, counted as waiting meanwhile.
    async fn room(&self, kib: u32) -> OwnedSemaphorePermit {
        if let Ok(room) = self.kib.clone().try_acquire_many_owned(kib) {
            return room;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waited = Waited(&self.waiting);
        let room = self.kib.clone().acquire_many_owned(kib).await;
        drop(waited);
        room.expect("the budget's semaphore is never closed")
    }

    /// `events` in runs that each fit the budget (one event over it is a run of its own).
    pub fn batches(&self, events: Vec<Outgoing>) -> Vec<Vec<Outgoing>> {
        let mut batches: Vec<Vec<Outgoing>> = Vec::new();
        let mut filled = u32::MAX;
        for event in events {
            let kib = self.kib_of(&event);
            if filled.saturating_add(kib) > self.total_kib {
                batches.push(Vec::new());
                filled = 0;
            }
            filled = filled.saturating_add(kib);
            batches.last_mut().expect("a batch was started").push(event);
        }
        batches
    }

    fn kib_of(&self, event: &Outgoing) -> u32 {
        u32::try_from(event.0.len().div_ceil(1024).max(1)).unwrap_or(u32::MAX)
    }

    /// A reading place, waited for; reading ends when it is dropped.
    pub async fn reading(&self) -> OwnedSemaphorePermit {
        let place = self.reads.clone().acquire_owned();
        place.await.expect("the reading places are never closed")
    }

    /// Bytes held now, all streams together (a gauge of `/metrics`).
    pub fn held_bytes(&self) -> u64 {
        let free = self.kib.available_permits() as u64;
        (u64::from(self.total_kib) - free.min(u64::from(self.total_kib))) * 1024
    }
}

/// A stream counted as waiting for room until this is dropped (also when its wait is
/// abandoned: the client left).
struct Waited<'a>(&'a AtomicUsize);

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One Server-Sent Event, encoded: `event`, `id` when given, one `data` line.
pub struct Outgoing(Vec<u8>);

impl Outgoing {
    /// `data` is one line of JSON (JSON escapes every newline, so nothing a model or a tool
    /// wrote can end an event early or forge one).
    #[cfg(test)]
    pub fn new(name: &str, id: Option<&str>, data: &str) -> Self {
        let mut event = Self::opened(name, id, data.len());
        event.0.extend_from_slice(data.as_bytes());
        event.closed()
    }

    /// An event whose `data` is `data` as compact JSON (one line, as [`Self::new`] needs),
    /// written straight into it.
    pub fn json(name: &str, id: Option<&str>, data: &impl serde::Serialize) -> Self {
        let mut event = Self::opened(name, id, 256);
        if let Err(err) = serde_json::to_writer(&mut event.0, data) {
            // Only a map with non-string keys fails; none of the server's events has one.
            tracing::error!(%err, "an event's data could not be written as JSON");
            event.0.extend_from_slice(b"null");
        }
        event.closed()
    }

    /// The events `(name, data)` (each `data` one line of JSON, as [`Self::new`] needs) written
    /// one after the other as one piece: what one ledger position makes in a view that makes
    /// several events of it is handed to the connection at once (one channel send and one
    /// write, not one per event); None for no events.
    pub fn joined<N: AsRef<str>, D: AsRef<str>>(
        events: impl IntoIterator<Item = (N, D)>,
    ) -> Option<Self> {
        let mut bytes = Vec::new();
        for (name, data) in events {
            let (name, data) = (name.as_ref().as_bytes(), data.as_ref().as_bytes());
            for part in [&b"event: "[..], name, b"\ndata: ", data, b"\n\n"] {
                bytes.extend_from_slice(part);
            }
        }
        (!bytes.is_empty()).then_some(Self(bytes))
    }

    /// `event`, `id` and the start of the `data` line.
    fn opened(name: &str, id: Option<&str>, room: usize) -> Self {
        let mut bytes = Vec::with_capacity(room + name.len() + 32);
        for (field, value) in [("event", Some(name)), ("id", id)] {
            if let Some(value) = value {
                bytes.extend_from_slice(field.as_bytes());
                bytes.extend_from_slice(b": ");
                bytes.extend_from_slice(value.as_bytes());
                bytes.push(b'\n');
            }
        }
        bytes.extend_from_slice(b"data: ");
        Self(bytes)
    }

    fn closed(mut self) -> Self {
        self.0.extend_from_slice(b"\n\n");
        self
    }

    #[cfg(test)]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// An event and its room in the budget: the room is given back when the bytes are dropped,
/// that is once the connection has written them or is gone.
pub struct Held {
    bytes: Vec<u8>,
    _room: OwnedSemaphorePermit,
    tally: Arc<Tally>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.tally.taken();
    }
}

/// One stream's events its client has not taken yet, and since when it has been waiting on
/// the client: what tells a slow client from a quiet run.
pub struct Tally {
    born: Instant,
    outstanding: AtomicUsize,
    /// Milliseconds after `born` when the client last took an event, or its first event
    /// after none began to wait.
    waiting_since_ms: AtomicU64,
}

impl Tally {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            born: Instant::now(),
            outstanding: AtomicUsize::new(0),
            waiting_since_ms: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn handed(&self) {
        if self.outstanding.fetch_add(1, Ordering::SeqCst) == 0 {
            self.waiting_since_ms.store(self.now_ms(), Ordering::SeqCst);
        }
    }

    fn taken(&self) {
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
        self.waiting_since_ms.store(self.now_ms(), Ordering::SeqCst);
    }

    /// True when events wait for the client and it has taken none for `patience`.
    pub fn stalled(&self, patience: Duration) -> bool {
        let waited = self.now_ms()
            - self
                .waiting_since_ms
                .load(Ordering::SeqCst)
                .min(self.now_ms());
        self.outstanding.load(Ordering::SeqCst) > 0 && waited > patience.as_millis() as u64
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Cuts a stream's connection: set by the stream when its client took nothing for too long,
/// so the events it holds are dropped with the connection instead of waiting on it.
pub type Cut = watch::Receiver<bool>;

/// The response of a stream: its events as they come, a heartbeat comment after every
/// `heartbeat` of silence, and the connection cut (an error ends an HTTP/1 body by closing
/// the connection) once `cut` turns true.
pub fn sse_response(events: mpsc::Receiver<Held>, cut: Cut, heartbeat: Duration) -> Response {
    let frames = futures::stream::unfold((events, cut), move |(mut events, mut cut)| async move {
        let next = tokio::select! {
            held = events.recv() => Next::Event(held),
            () = cut_when_set(&mut cut) => Next::Cut,
            () = tokio::time::sleep(heartbeat) => Next::Heartbeat,
        };
        let frame = match next {
            Next::Event(held) => Ok(Bytes::from_owner(held?)),
            Next::Cut => Err(SlowClient),
            Next::Heartbeat => Ok(Bytes::from_static(b": heartbeat\n\n")),
        };
        Some((frame, (events, cut)))
    });
    let mut response = (
        [("content-type", "text/event-stream")],
        Body::from_stream(frames),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

enum Next {
    Event(Option<Held>),
    Cut,
    Heartbeat,
}

/// Returns once the stream asks for its connection to be cut; never, if the stream ended
/// without asking (its sender dropped).
async fn cut_when_set(cut: &mut Cut) {
    if cut.wait_for(|cut| *cut).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Why a stream's connection was cut.
#[derive(Debug)]
struct SlowClient;

impl std::fmt::Display for SlowClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client took no event for too long")
    }
}

impl std::error::Error for SlowClient {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_stalled_only_while_events_wait_for_it() {
        let budget = EventBudget::new(1024 * 1024);
        let tally = Tally::new();
        let patience = Duration::from_millis(30);
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            !tally.stalled(patience),
            "nothing waits: a quiet run, not a slow client"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let held = rt.block_on(budget.hold(Outgoing::new("e", None, "{}"), &tally));
        assert!(
            !tally.stalled(patience),
            "it waits since now, not since the stream began"
        );
        std::thread::sleep(Duration::from_millis(40));
        assert!(tally.stalled(patience));
        drop(held);
        assert!(!tally.stalled(patience), "taken");
    }

    #[test]
    fn an_event_is_its_fields_and_a_blank_line() {
        let e = Outgoing::new("segment", Some("u:3"), r#"{"a":"b\nc"}"#);
        assert_eq!(
            e.as_bytes(),
            b"event: segment\nid: u:3\ndata: {\"a\":\"b\\nc\"}\n\n"
        );
        let e = Outgoing::new("end", None, "{}");
        assert_eq!(e.as_bytes(), b"event: end\ndata: {}\n\n");
        let e = Outgoing::json("status", None, &serde_json::json!({"m": "a\nb"}));
        assert_eq!(e.as_bytes(), b"event: status\ndata: {\"m\":\"a\\nb\"}\n\n");
    }

    #[test]
    fn events_joined_are_each_event_in_turn() {
        let e = Outgoing::joined([("a", "{}"), ("b", "[1]")]).unwrap();
        assert_eq!(
            e.as_bytes(),
            b"event: a\ndata: {}\n\nevent: b\ndata: [1]\n\n"
        );
        assert!(Outgoing::joined(Vec::<(&str, &str)>::new()).is_none());
    }

    #[tokio::test]
    async fn a_page_is_held_in_runs_that_fit_all_at_once() {
        let budget = EventBudget::new(10 * 1024);
        let event = |kib: usize| Outgoing::new("e", None, &"x".repeat(kib * 1024 - 20));
        let sizes =
            |batches: &[Vec<Outgoing>]| -> Vec<usize> { batches.iter().map(Vec::len).collect() };
        let page = vec![event(4), event(4), event(4), event(20), event(1)];
        let batches = budget.batches(page);
        assert_eq!(
            sizes(&batches),
            [2, 1, 1, 1],
            "4+4 | 4 | 20 (over it all) | 1"
        );
        let mut batches = batches.into_iter();
        let tally = Tally::new();
        let first = budget.hold_all(batches.next().unwrap(), &tally).await;
        assert_eq!((first.len(), budget.held_bytes()), (2, 8 * 1024));
        drop(first);
        let over = budget.hold_all(batches.nth(1).unwrap(), &tally).await;
        assert_eq!(
            budget.held_bytes(),
            10 * 1024,
            "one event over the budget takes it all"
        );
        drop(over);
        assert_eq!(budget.held_bytes(), 0);
    }

    #[tokio::test]
    async fn held_events_count_until_dropped_and_a_full_budget_waits() {
        let budget = EventBudget::new(4 * 1024);
        let tally = Tally::new();
        let big = budget
            .hold(Outgoing::new("e", None, &"x".repeat(3000)), &tally)
            .await;
        assert_eq!(budget.held_bytes(), 3 * 1024);
        let waiting = budget.hold(Outgoing::new("e", None, &"y".repeat(2000)), &tally);
        tokio::pin!(waiting);
        let early = tokio::time::timeout(Duration::from_millis(50), &mut waiting).await;
        assert!(early.is_err(), "2 KiB more than the budget holds must wait");
        drop(Bytes::from_owner(big));
        let _second = waiting.await;
        assert_eq!(budget.held_bytes(), 2 * 1024);
        let huge = budget.hold(Outgoing::new("e", None, &"z".repeat(64 * 1024)), &tally);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), huge)
                .await
                .is_err(),
            "an event over the whole budget waits for all of it"
        );
    }
}
