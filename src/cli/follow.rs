//! Following a run's ledger as it grows (`transcript -f`, `chat`): segments printed in order,
//! without a gap or a repeat, until the run is where the caller says.

use std::io::Write;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};

use super::{CliError, Session, print_lines};
use crate::cli::render::Transcript;
use crate::crd::RUN_UID_LABEL;
use crate::crd::RunId;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::ledger::Contiguous;
use crate::ledger::is_segment_of;

impl Session {
    /// `run` once the controller has written its status: its first write records where the
    /// run's ledger is kept, so a run followed from its creation is read from the right one.
    pub(super) async fn first_status(&self, run: &AgentRun) -> Result<AgentRun, CliError> {
        let namespace = run.id().namespace;
        let name = run.name_any();
        let has_status = |r: Option<&AgentRun>| r.is_none_or(|r| r.status.is_some());
        let seen = kube::runtime::wait::await_condition(self.runs(&namespace), &name, has_status);
        match seen.await {
            Ok(Some(now)) if now.uid() == run.uid() => Ok(now),
            Ok(_) => Err(CliError::RunNotFound { namespace, name }),
            Err(e) => Err(CliError::Ledger {
                name,
                detail: format!("waiting for the run's first status: {e}"),
            }),
        }
    }

    /// Prints segments as they are appended, in order, until the run is where `ends` says
    /// (then the rest of the ledger is read once more and printed) or is deleted.
    pub(super) async fn follow(
        &self,
        run: &AgentRun,
        t: &mut Transcript,
        out: &mut impl Write,
        ends: fn(&AgentRun) -> bool,
    ) -> Result<(), CliError> {
        let RunId { namespace, uid, .. } = run.id();
        let selector = format!("{RUN_UID_LABEL}={uid}");
        let segments = watcher(
            self.segments(&namespace),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        .applied_objects();
        let runs = watcher(
            self.runs(&namespace),
            watcher::Config::default().fields(&format!("metadata.name={}", run.name_any())),
        )
        .default_backoff();
        let mut segments = std::pin::pin!(segments);
        let mut runs = std::pin::pin!(runs);
        let mut pending = Contiguous::after(t.tail);
        loop {
            tokio::select! {
                Some(seg) = segments.next() => {
                    if let Ok(seg) = seg.map(|s| own_or_reported(s, run)) && let Some(seg) = seg {
                        pending.offer(seg);
                        print_released(t, &mut pending, out)?;
                    }
                }
                Some(event) = runs.next() => {
                    if let Ok(event) = event && run_ended(&event, run, ends) {
                        break;
                    }
                }
                else => break,
            }
        }
        let rest = self.ledger(run).await?;
        rest.into_iter().for_each(|s| pending.offer(s));
        print_released(t, &mut pending, out)
    }
}

/// `seg` if it is `run`'s by all three of its marks (name, `spec.run`, UID label), as every
/// other reader checks; otherwise None, and reported: a segment labelled with this run's UID
/// but named for another run is somebody's forgery, never part of this transcript.
fn own_or_reported(seg: LedgerSegment, run: &AgentRun) -> Option<LedgerSegment> {
    let (name, uid) = (run.name_any(), run.id().uid);
    if is_segment_of(&seg, &name, &uid) {
        return Some(seg);
    }
    eprintln!(
        "warning: segment {} carries the UID of run {name} but is not one of its segments \
         (spec.run {:?}); not shown",
        seg.name_any(),
        seg.spec.run
    );
    None
}

/// True when a watch event on the run says it is where `ends` says, or was deleted.
fn run_ended(
    event: &watcher::Event<AgentRun>,
    run: &AgentRun,
    ends: fn(&AgentRun) -> bool,
) -> bool {
    match event {
        watcher::Event::Apply(current) | watcher::Event::InitApply(current) => {
            current.uid() == run.uid() && ends(current)
        }
        watcher::Event::Delete(_) => true,
        watcher::Event::Init | watcher::Event::InitDone => false,
    }
}

/// Prints the segments that continue the transcript without a gap.
fn print_released(
    t: &mut Transcript,
    pending: &mut Contiguous<LedgerSegment>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    for segment in pending.release() {
        print_lines(out, t.segment(&segment))?;
    }
    Ok(())
}
