//! What is checked after a run: the ledger's invariants against its status and what the
//! recorder saw, the field manager of every worker segment, the model turns made again.

use baton::crd::v1alpha1::{AgentRunStatus, LedgerEvent, LedgerSegment};
use baton::fence::Fence;
use kube::ResourceExt;

use super::recorder::Recorded;

/// Checks one run's ledger against its status and what the recorder saw.
pub fn check_ledger(
    name: &str,
    st: &AgentRunStatus,
    segments: &[LedgerSegment],
    recorded: &Recorded,
) {
    // Contiguous from 1.
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(s.spec.seq, i as i64 + 1, "{name}: ledger not contiguous");
    }
    // No write from a stale fence after a seal; nothing at all after `closed`.
    let mut sealed: Option<(i64, Fence, bool)> = None; // (seq, fence, closed)
    let mut last_seal = Fence::default();
    for s in segments {
        if let Some((seq, fence, closed)) = sealed {
            assert!(
                !closed,
                "{name}: segment {} written after the ledger was closed at {seq}",
                s.spec.seq
            );
            assert!(
                s.spec.fence >= fence,
                "{name}: segment {} has fence {} after the seal claimed{{{fence}}} at {seq}",
                s.spec.seq,
                s.spec.fence
            );
        }
        for e in &s.spec.events {
            match e {
                LedgerEvent::Claimed { fence, .. } => {
                    sealed = Some((s.spec.seq, *fence, false));
                    last_seal = *fence;
                }
                LedgerEvent::Closed { fence, .. } => {
                    sealed = Some((s.spec.seq, *fence, true));
                    last_seal = *fence;
                }
                LedgerEvent::AttemptStarted { fence, .. } => assert_eq!(
                    *fence, s.spec.fence,
                    "{name}: attemptStarted{{{fence}}} in a segment of fence {}",
                    s.spec.fence
                ),
                _ => {}
            }
        }
    }
    if !inert_last_seal(st, segments, last_seal) {
        assert_eq!(
            st.fence, last_seal,
            "{name}: status fence {} is not the last seal's {last_seal}",
            st.fence
        );
    }
    // Unchanged since first seen.
    for s in segments {
        let n = s.name_any();
        if let Some(seen) = recorded.segments.get(&n) {
            assert_eq!(
                Some(seen.rv.as_str()),
                s.resource_version().as_deref(),
                "{name}: segment {n} changed after it was written"
            );
            assert_eq!(
                seen.spec,
                serde_json::to_value(&s.spec).unwrap(),
                "{name}: segment {n} content changed"
            );
        }
    }
}

/// The one benign way the last seal can be ahead of the status (docs/protocol.md, "A seal
/// after the end"): a claim sealed `claimed{f+1}` after the worker of `f` had appended its
/// ending, and then lost its status CAS to that worker's own status write. The seal is the
/// ledger's last segment, nothing of fence f+1 follows it, and no pod or Lease moved for it.
fn inert_last_seal(st: &AgentRunStatus, segments: &[LedgerSegment], last_seal: Fence) -> bool {
    let Some((last, before)) = segments.split_last() else {
        return false;
    };
    let is_that_seal = last.spec.events.iter().any(
        |e| matches!(e, LedgerEvent::Claimed { fence, .. } if *fence == last_seal && *fence == st.fence.next()),
    );
    let ended_before = before.iter().any(|s| {
        s.spec.fence == st.fence
            && s.spec.events.iter().any(|e| {
                matches!(
                    e,
                    LedgerEvent::Final { .. } | LedgerEvent::Failed { .. } | LedgerEvent::Stopped
                )
            })
    });
    st.phase.is_terminal() && is_that_seal && ended_before
}

/// The worker's writes carry its User-Agent, so the API server records `baton-worker` (not
/// `unknown`) as their field manager: every segment but the controller's seals.
pub fn check_worker_field_manager(name: &str, segments: &[LedgerSegment]) {
    let sealed_by_controller = |seg: &LedgerSegment| {
        seg.spec
            .events
            .iter()
            .any(|e| matches!(e, LedgerEvent::Claimed { .. } | LedgerEvent::Closed { .. }))
    };
    for seg in segments.iter().filter(|s| !sealed_by_controller(s)) {
        let managers: Vec<&str> = seg
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.as_deref())
            .collect();
        assert_eq!(
            managers,
            ["baton-worker"],
            "{name}: segment {} has field managers {managers:?}",
            seg.spec.seq
        );
    }
}

/// Model calls a run made again: every attempt that ended (died, or handed off) while a model
/// call was in flight or due — its last event before the next seal is neither a tool call in
/// flight (`stepIntent`) nor an end (`final`, `waitingInput`, `stopped`, `failed`) — has its
/// call made again by the next attempt (streamed text of a dead attempt is not promoted).
pub fn repeated_model_turns(segments: &[LedgerSegment]) -> usize {
    let mut repeated = 0;
    let mut last: Option<&LedgerEvent> = None; // last event of the current attempt
    for e in segments.iter().flat_map(|s| &s.spec.events) {
        match e {
            LedgerEvent::Claimed { .. } | LedgerEvent::Closed { .. } => {
                if let Some(l) = last.take()
                    && !matches!(
                        l,
                        LedgerEvent::StepIntent { .. }
                            | LedgerEvent::Final { .. }
                            | LedgerEvent::WaitingInput { .. }
                            | LedgerEvent::Stopped
                            | LedgerEvent::Failed { .. }
                    )
                {
                    repeated += 1;
                }
            }
            LedgerEvent::Handoff => {}
            LedgerEvent::AttemptStarted { .. } => last = Some(e),
            _ if last.is_some() => last = Some(e),
            _ => {}
        }
    }
    repeated
}

// ---------------------------------------------------------------------------------------------
// the segment recorder
