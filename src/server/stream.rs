//! A run's stream: its status, then its ledger from the client's cursor, read with the
//! caller's own credential, then the live tail from the caller's hub, in order, without a gap
//! or a repeat, and an `end` event once the run has ended. The client leaving ends only the
//! stream: nothing here writes to the run.
//!
//! What the client is sent of all that is its view's ([`super::view`]): baton's own events,
//! by default:
//! - `status` (no id): the run's phase, reason, message and pending approval, when it changes;
//! - `segment` (id `<run UID>:<position>`): one ledger segment, its chunked events rebuilt
//!   whole ([`super::whole`]);
//! - `end` (no id): the run ended (its phase) or was deleted;
//! - `error` (no id): the ledger could not be read, or the caller may no longer read it
//!   (asked again every minute); the stream closes.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, broadcast, mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::held::{EventBudget, Held, Outgoing, Tally};
use super::hub::{Change, Hub};
use super::metrics::Counted;
use super::view::{Native, View};
use super::watchdog::Watchdog;
use super::whole::{earlier_chunks, rebuild};
use crate::causes::with_causes;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::ledger::Contiguous;
use crate::ledger::is_segment_of;
use crate::requests::{RequestError, RunRequests, phase_of};
use crate::serving::cut::ConnectionCut;
use crate::traces::between::StreamSpan;

/// How a run's stream ended.
#[derive(Debug)]
pub enum Ended {
    /// The run ended; its `end` event was sent.
    Run,
    /// The run was deleted; its `end` event was sent.
    Deleted,
    /// The client went away.
    ClientGone,
    /// The ledger could not be read; an `error` event was sent.
    Failed,
}

impl Ended {
    /// As a span says it (`baton.ended`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Ended::Run => "run",
            Ended::Deleted => "deleted",
            Ended::ClientGone => "client_gone",
            Ended::Failed => "failed",
        }
    }
}

/// How often an open stream asks again whether its caller may still read transcripts here.
pub const ACCESS_RECHECK: Duration = Duration::from_secs(60);
/// Events a stream holds for its client beyond what the connection has taken: with a page
/// of the replay in hand, what one stream can hold is bounded by these two, not by a ledger.
/// One: a client that reads nothing holds as little as can be while it waits to be cut.
pub const STREAM_BUFFER: usize = 1;
/// Segments read at once for a replay.
pub const REPLAY_PAGE: usize = 4;
/// Reads of one replay page that fails transiently before the stream ends with an `error`
/// event; the pause between them doubles from [`REPLAY_PAUSE`]. A long ledger is many reads,
/// and one connection a busy API server resets must not end a stream.
pub const REPLAY_TRIES: u32 = 4;
pub const REPLAY_PAUSE: Duration = Duration::from_secs(1);
/// A client that takes no event for this long is dropped, its connection cut: it reconnects
/// with its cursor and loses nothing, instead of pinning what its stream holds for as long
/// as it likes (sooner while other streams wait for room: [`super::watchdog`]).
pub const SLOW_FOLLOWER: Duration = Duration::from_secs(60);

/// One client's stream: the caller's reads, the caller's hub, the client's channel.
pub struct Follow {
    requests: RunRequests,
    changes: broadcast::Receiver<Change>,
    out: mpsc::Sender<Held>,
    /// Every stream's events together ([`super::held`]).
    budget: EventBudget,
    /// Cuts the client's connection ([`super::held::sse_response`]); thrown by its watchdog.
    cut: Arc<watch::Sender<bool>>,
    /// What the client has not taken yet, and since when it waits on it.
    tally: Arc<Tally>,
    _hub: Arc<Hub>,
    /// When the caller's access is asked again ([`ACCESS_RECHECK`]), and how often.
    next_check: Instant,
    recheck_every: Duration,
    /// How long one event may wait for the client ([`SLOW_FOLLOWER`]).
    patience: Duration,
    /// The client's connection, cut with the stream ([`crate::connection`]).
    connection: Option<ConnectionCut>,
    /// Counts this stream while it reads its ledger.
    replaying: Gauge,
    /// What the client's protocol makes of the run ([`super::view`]).
    view: Box<dyn View>,
}

impl Follow {
    /// Subscribes to `hub` now, before anything is read: a change from here on is seen either
    /// in what is read or on the channel (or both: the cursor drops repeats).
    pub fn new(
        requests: RunRequests,
        hub: Arc<Hub>,
        out: mpsc::Sender<Held>,
        budget: EventBudget,
        cut: watch::Sender<bool>,
    ) -> Self {
        Self {
            requests,
            changes: hub.subscribe(),
            out,
            budget,
            cut: Arc::new(cut),
            tally: Tally::new(),
            _hub: hub,
            next_check: Instant::now() + ACCESS_RECHECK,
            recheck_every: ACCESS_RECHECK,
            patience: SLOW_FOLLOWER,
            connection: None,
            replaying: Gauge::default(),
            view: Box::new(Native::default()),
        }
    }

    /// Shows the run to the client as `view` does instead of in baton's own events.
    pub fn viewed_as(mut self, view: Box<dyn View>) -> Self {
        self.view = view;
        self
    }

    /// Counts this stream in `gauge` while it reads its ledger.
    pub fn counting_replays(mut self, gauge: Gauge) -> Self {
        self.replaying = gauge;
        self
    }

    /// Cuts `connection` too when the client is cut: what it holds in the connection's write
    /// buffer is freed only so.
    pub fn on_connection(mut self, connection: Option<ConnectionCut>) -> Self {
        self.connection = connection;
        self
    }

    /// Drops a client that takes no event for `patience` instead of [`SLOW_FOLLOWER`].
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Asks the caller's access again every `every` instead of [`ACCESS_RECHECK`].
    pub fn rechecking_every(mut self, every: Duration) -> Self {
        self.next_check = Instant::now() + every;
        self.recheck_every = every;
        self
    }

    /// The watchdog that cuts this stream's client when it takes nothing (the stream runs
    /// under it: [`Watchdog::beside`]).
    pub fn watchdog(&self) -> Watchdog {
        Watchdog::new(
            self.tally.clone(),
            self.budget.clone(),
            self.cut.clone(),
            self.connection.clone(),
            self.patience,
        )
    }

    pub fn requests(&self) -> &RunRequests {
        &self.requests
    }

    /// The next change of the namespace, or None once the client is gone or may no longer
    /// read transcripts here (asked again every [`ACCESS_RECHECK`]: a stream does not outlive
    /// the revocation of its caller's rights by more than that). A follower that fell behind
    /// is told to read again.
    pub async fn next_change(&mut self) -> Option<Change> {
        loop {
            tokio::select! {
                _ = self.out.closed() => return None,
                change = self.changes.recv() => return match change {
                    Ok(change) => Some(change),
                    Err(broadcast::error::RecvError::Lagged(_)) => Some(Change::Resync),
                    Err(broadcast::error::RecvError::Closed) => None,
                },
                () = tokio::time::sleep_until(self.next_check) => {
                    self.next_check = Instant::now() + self.recheck_every;
                    if !self.still_allowed().await {
                        return None;
                    }
                }
            }
        }
    }

    /// False once the API server refuses the caller (401 or 403) what a stream reads; an
    /// `error` event says so. Any other failure (the API server out of reach) is asked again
    /// at the next check.
    async fn still_allowed(&mut self) -> bool {
        let refused = match self.requests.probe_ledgers().await {
            Err(RequestError::Kube(kube::Error::Api(status))) => {
                matches!(status.code, 401 | 403).then_some(status.message)
            }
            _ => None,
        };
        let Some(message) = refused else {
            return true;
        };
        let event = self.view.error(None, &format!("access revoked: {message}"));
        let _ = self.send(event).await;
        false
    }

    /// Sends one event; false once the client is gone, or took nothing for [`SLOW_FOLLOWER`]
    /// (its connection is cut, and the client reconnects with its cursor).
    pub async fn send(&self, event: Outgoing) -> bool {
        match self.hold(event).await {
            Some(held) => self.deliver(held).await,
            None => false,
        }
    }

    /// Room for `event` in the budget, waited for; None once the client is gone.
    async fn hold(&self, event: Outgoing) -> Option<Held> {
        tokio::select! {
            _ = self.out.closed() => None,
            held = self.budget.hold(event, &self.tally) => Some(held),
        }
    }

    /// Hands a counted event to the client's connection; false once it is gone (a client
    /// that takes nothing is cut by the stream's watchdog, which ends this wait too).
    async fn deliver(&self, held: Held) -> bool {
        self.out.send(held).await.is_ok()
    }

    /// Streams `run` from after position `after` until it ends, is deleted, or the client
    /// leaves.
    pub async fn run(&mut self, run: AgentRun, after: i64) -> Ended {
        let span = crate::run_span!("stream", &run);
        let traced = StreamSpan::begin(&run, after);
        let ended = self.stream(run, after).instrument(span).await;
        traced.end(ended.as_str());
        ended
    }

    async fn stream(&mut self, run: AgentRun, after: i64) -> Ended {
        let mut state = RunState {
            name: run.name_any(),
            uid: run.id().uid,
            sent: Contiguous::after(self.view.read_from(after)),
            run: run.clone(),
        };
        let mut current = run;
        // The ledger is read at the start, after a gap or a resync, and once more when the
        // run has ended (its last segments may come after its last change); a change of the
        // run alone needs no read.
        let mut must_read = true;
        loop {
            let status = self.view.run(&current);
            if !self.send_all(status).await {
                return Ended::ClientGone;
            }
            let ended = phase_of(&current).is_terminal();
            if (must_read || ended)
                && let Some(stop) = self.read_ledger(&current, &mut state).await
            {
                return stop;
            }
            if ended {
                return self.end(&current).await;
            }
            match self.wait(&mut state).await {
                Moved::Run(run, read) => {
                    current = *run;
                    must_read = read;
                }
                Moved::Gap => must_read = true,
                Moved::Deleted => return self.deleted(&current).await,
                Moved::Stopped(ended) => return ended,
            }
        }
    }

    /// Sends the run's segments as the hub brings them, until something needs more than
    /// that: a gap, a change of the run, a resync, its deletion or the client leaving.
    async fn wait(&mut self, state: &mut RunState) -> Moved {
        loop {
            match self.next_change().await {
                None => return Moved::Stopped(Ended::ClientGone),
                Some(Change::Segment(s)) if is_segment_of(&s, &state.name, &state.uid) => {
                    state.sent.offer(s);
                    if let Err(ended) = self.send_ready(state, None).await {
                        return Moved::Stopped(ended);
                    }
                    if state.sent.has_gap() {
                        return Moved::Gap;
                    }
                }
                Some(Change::Appended { run_uid, seq })
                    if run_uid == state.uid && seq > state.sent.tail() =>
                {
                    return Moved::Gap;
                }
                Some(Change::Run(r)) if r.uid().as_deref() == Some(&state.uid) => {
                    return Moved::Run(Box::new((*r).clone()), false);
                }
                Some(Change::RunDeleted(r)) if r.uid().as_deref() == Some(&state.uid) => {
                    return Moved::Deleted;
                }
                Some(Change::Resync) => {
                    return match self.requests.read(&state.name).await {
                        Ok(r) if r.uid().as_deref() == Some(&state.uid) => {
                            Moved::Run(Box::new(r), true)
                        }
                        Ok(_) | Err(RequestError::NotFound { .. }) => Moved::Deleted,
                        Err(_) => Moved::Gap,
                    };
                }
                Some(_) => {}
            }
        }
    }

    /// Reads the ledger (the caller's credential, the store's checks) a page at a time and
    /// sends what follows the cursor, each page before the next is read; Some when the
    /// stream must end.
    async fn read_ledger(&mut self, run: &AgentRun, state: &mut RunState) -> Option<Ended> {
        let _replaying = Counted::new(&self.replaying);
        loop {
            let after = state.sent.tail();
            let reading = tokio::select! {
                _ = self.out.closed() => return Some(Ended::ClientGone),
                place = self.budget.reading() => place,
            };
            match self.read_page(run, after, REPLAY_PAGE).await {
                Ok(segments) => {
                    let last_page = segments.len() < REPLAY_PAGE;
                    for s in segments {
                        state.sent.offer(Arc::new(s));
                    }
                    if let Err(ended) = self.send_ready(state, Some(reading)).await {
                        return Some(ended);
                    }
                    if last_page || state.sent.tail() == after {
                        return None;
                    }
                }
                Err(err) => return Some(self.failed(run, &err).await),
            }
        }
    }

    /// `limit` segments of the ledger after `after`, read again after a pause while it fails
    /// in a way a retry may get past ([`REPLAY_TRIES`]).
    async fn read_page(
        &self,
        run: &AgentRun,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LedgerSegment>, RequestError> {
        let mut pause = REPLAY_PAUSE;
        let mut tries = 1;
        loop {
            match self.requests.ledger_page(run, after, limit).await {
                Err(err) if err.is_transient() && tries < REPLAY_TRIES => {
                    let error = with_causes(&err);
                    tracing::warn!(run = %run.name_any(), after, %error, "a ledger page could not be read; trying again");
                    tokio::select! {
                        _ = self.out.closed() => return Err(err),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause *= 2;
                    tries += 1;
                }
                read => return read,
            }
        }
    }

    /// Sends the segments the cursor releases. Their room in the budget is taken at once for
    /// as many as fit it (a stream never waits for room while holding room its client has not
    /// been handed: streams cannot wait on each other), and a page's reading place is kept
    /// until all its events are counted: what a stream holds uncounted is at most a page and
    /// the chunked events it ends, and only while it has a reading place (one is taken, before
    /// any room, when a segment from the hub ends a chunked event).
    async fn send_ready(
        &mut self,
        state: &mut RunState,
        reading: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Ended> {
        let released = state.sent.release();
        let mut reading = reading;
        if reading.is_none() && released.iter().any(|s| earlier_chunks(s).is_some()) {
            reading = tokio::select! {
                _ = self.out.closed() => return Err(Ended::ClientGone),
                place = self.budget.reading() => Some(place),
            };
        }
        let mut events = Vec::with_capacity(released.len());
        for segment in &released {
            let rebuilt = match earlier_chunks(segment) {
                Some((after, count)) => {
                    let read = |at, limit| self.read_page(&state.run, at, limit);
                    match rebuild(after, count, segment, REPLAY_PAGE, read).await {
                        Ok(rebuilt) => Some(rebuilt),
                        // The client comes back with its cursor; the event is rebuilt then.
                        Err(err) => return Err(self.failed(&state.run, &err).await),
                    }
                }
                None => None,
            };
            events.extend(self.view.segment(segment, rebuilt));
        }
        let batches = self.budget.batches(events);
        let count = batches.len();
        for (i, batch) in batches.into_iter().enumerate() {
            let held = tokio::select! {
                _ = self.out.closed() => return Err(Ended::ClientGone),
                held = self.budget.hold_all(batch, &self.tally) => held,
            };
            // Nothing of the page is uncounted any more: its reading place is free.
            if i + 1 == count {
                drop(reading.take());
            }
            for h in held {
                if !self.deliver(h).await {
                    return Err(Ended::ClientGone);
                }
            }
        }
        Ok(())
    }

    /// Sends an `error` event: the ledger could not be read.
    async fn failed(&mut self, run: &AgentRun, err: &RequestError) -> Ended {
        let event = self.view.error(Some(&run.name_any()), &with_causes(err));
        let _ = self.send(event).await;
        Ended::Failed
    }

    /// Sends `events` in order; false once the client is gone.
    async fn send_all(&self, events: Vec<Outgoing>) -> bool {
        for event in events {
            if !self.send(event).await {
                return false;
            }
        }
        true
    }

    async fn end(&mut self, run: &AgentRun) -> Ended {
        let events = self.view.ended(run);
        match self.send_all(events).await {
            true => Ended::Run,
            false => Ended::ClientGone,
        }
    }

    async fn deleted(&mut self, run: &AgentRun) -> Ended {
        let events = self.view.deleted(run);
        match self.send_all(events).await {
            true => Ended::Deleted,
            false => Ended::ClientGone,
        }
    }
}

/// What moved a run's stream on.
enum Moved {
    /// The run as it is now; true when the ledger must be read again.
    Run(Box<AgentRun>, bool),
    /// A segment is missing, or the database announced one the hub does not carry: read
    /// the ledger again.
    Gap,
    Deleted,
    /// The stream ends so.
    Stopped(Ended),
}

/// The run a stream follows and what it has sent.
struct RunState {
    name: String,
    uid: String,
    sent: Contiguous,
    /// The run as the stream began: where its ledger is read from.
    run: AgentRun,
}
