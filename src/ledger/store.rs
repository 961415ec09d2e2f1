//! The segment store: the only code that reads or writes LedgerSegments.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use super::append::{Appended, Next, segment_of_run, settle};
use super::{LedgerError, SEGMENT_BUDGET_BYTES, check_contiguous, encode_events, is_segment_of};
use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};
use crate::fence::{Fence, segment_name};
use crate::kube_util::is_already_exists;
use crate::owned::{Ownership, owner_reference};

/// One run's ledger in the API server.
#[derive(Clone)]
pub struct SegmentStore {
    api: Api<LedgerSegment>,
    run: String,
    run_uid: String,
    owner: OwnerReference,
    budget: usize,
}

/// The segments of `run` (UID `uid`), ordered and checked contiguous; one that carries the
/// UID label but is named for another run is left out, and logged.
async fn list_of(
    api: &Api<LedgerSegment>,
    run: &str,
    uid: &str,
) -> Result<Vec<LedgerSegment>, LedgerError> {
    let selector = format!("{RUN_UID_LABEL}={uid}");
    let mut segments = api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    segments.retain(|s| {
        let ours = is_segment_of(s, run, uid);
        if !ours {
            tracing::warn!(%run, segment = %s.name_any(), claims = %s.spec.run,
                "a segment with this run's UID label is named for another run: ignored");
        }
        ours
    });
    segments.sort_by_key(|s| s.spec.seq);
    check_contiguous(&segments)?;
    Ok(segments)
}

impl SegmentStore {
    /// The ledger of `run` (which must have been read from the API server: it needs its UID).
    pub fn for_run(client: Client, run: &AgentRun) -> Self {
        let namespace = run.namespace().unwrap_or_default();
        Self {
            api: Api::namespaced(client, &namespace),
            run: run.name_any(),
            run_uid: run.uid().unwrap_or_default(),
            owner: owner_reference(run, Ownership::Reference).unwrap_or_default(),
            budget: SEGMENT_BUDGET_BYTES,
        }
    }

    /// Overrides the per-segment budget (tests use a small one to exercise splitting).
    pub fn with_budget(mut self, budget: usize) -> Self {
        self.budget = budget;
        self
    }

    /// All segments of the run, ordered by position and checked to be contiguous. A segment
    /// that carries the run's UID label but is named for another run is not the run's: it is
    /// left out, and logged.
    pub async fn list(&self) -> Result<Vec<LedgerSegment>, LedgerError> {
        list_of(&self.api, &self.run, &self.run_uid).await
    }

    /// Reads (never writes) the ledger of another run of the namespace, `run` with UID `uid`:
    /// as [`SegmentStore::list`] does. A turn reads its thread's earlier turns so.
    pub async fn list_run(
        client: Client,
        namespace: &str,
        run: &str,
        uid: &str,
    ) -> Result<Vec<LedgerSegment>, LedgerError> {
        list_of(&Api::namespaced(client, namespace), run, uid).await
    }

    /// Fenced append (docs/protocol.md): writes `events` at `tail + 1` onwards under `fence`.
    ///
    /// A position taken by our own retried write is success; one taken by an older owner is
    /// history to replay and we move past it; one taken by a newer owner, or a closed ledger,
    /// means the run is lost and nothing more is written.
    pub async fn append(
        &self,
        tail: i64,
        fence: Fence,
        events: Vec<LedgerEvent>,
    ) -> Result<Appended, LedgerError> {
        let mut appended = Appended {
            tail,
            ..Appended::default()
        };
        for group in encode_events(events, self.budget)? {
            self.append_group(&mut appended, fence, group).await?;
        }
        Ok(appended)
    }

    async fn append_group(
        &self,
        appended: &mut Appended,
        fence: Fence,
        events: Vec<LedgerEvent>,
    ) -> Result<(), LedgerError> {
        loop {
            let seq = appended.tail + 1;
            let segment = self.segment(seq, fence, events.clone());
            match self.api.create(&PostParams::default(), &segment).await {
                Ok(created) => {
                    appended.tail = seq;
                    appended.written.push(created);
                    return Ok(());
                }
                Err(err) if is_already_exists(&err) => {
                    let existing = self.api.get(&segment_name(&self.run, seq)).await?;
                    self.check_ours(&existing)?;
                    if settle(appended, fence, &events, existing)? == Next::Stored {
                        return Ok(());
                    }
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    fn check_ours(&self, segment: &LedgerSegment) -> Result<(), LedgerError> {
        if !is_segment_of(segment, &self.run, &self.run_uid) {
            return Err(LedgerError::ForeignSegment {
                name: segment.name_any(),
            });
        }
        Ok(())
    }

    fn segment(&self, seq: i64, fence: Fence, events: Vec<LedgerEvent>) -> LedgerSegment {
        let mut segment = segment_of_run(&self.run, &self.run_uid, seq, fence, events);
        segment.metadata.owner_references = Some(vec![self.owner.clone()]);
        segment
    }
}
