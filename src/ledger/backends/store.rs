//! The segment store: the only code that reads or writes LedgerSegments.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::crd::v1alpha1::{AgentRun, LedgerEvent, LedgerSegment};
use crate::crd::{RUN_UID_LABEL, THREAD_UID_LABEL};
use crate::fence::{Fence, segment_name};
use crate::kube_util::is_already_exists;
use crate::ledger::append::{Appended, AtPosition, Positions, append_fenced, segment_of_run};
use crate::ledger::{
    LedgerError, SEGMENT_BUDGET_BYTES, check_contiguous, check_contiguous_after, is_segment_of,
};
use crate::owned::{Ownership, owner_reference};

/// Segments of a page read from the API server at once.
const PAGE_READS_AT_ONCE: usize = 8;

/// One run's ledger in the API server.
#[derive(Clone)]
pub struct SegmentStore {
    api: Api<LedgerSegment>,
    run: String,
    run_uid: String,
    /// The UID of the thread the run is a turn of: its segments carry it as a label.
    thread_uid: Option<String>,
    owner: OwnerReference,
    budget: usize,
}

/// The segments of `run` (UID `uid`), ordered and checked contiguous; one that carries the
/// UID label but is named for another run is left out, and logged.
///
/// Read from the API server's watch cache, then confirmed with one read of the position after
/// the last it holds: a list from etcd reads and decodes every segment of the namespace to
/// filter by label (0.87 s at 5,000 segments on the bed, where the cache answers in 5 ms;
/// `make bench-thread`). Positions are created one after another, each only past one that
/// exists, and never change: a cache that holds 1..=n while n + 1 is free is the whole ledger.
/// A cache behind (n + 1 taken), or a read that fails, costs the list from etcd.
async fn list_of(
    api: &Api<LedgerSegment>,
    run: &str,
    uid: &str,
) -> Result<Vec<LedgerSegment>, LedgerError> {
    let selector = format!("{RUN_UID_LABEL}={uid}");
    let cached = ListParams::default().labels(&selector).match_any();
    let segments = own_ordered(api.list(&cached).await?.items, run, uid);
    let next = segments.last().map_or(1, |s| s.spec.seq + 1);
    if check_contiguous(&segments).is_ok() && position_free(api, run, uid, next).await {
        return Ok(segments);
    }
    let fresh = ListParams::default().labels(&selector);
    let segments = own_ordered(api.list(&fresh).await?.items, run, uid);
    check_contiguous(&segments)?;
    Ok(segments)
}

/// `segments` that are `run`'s (UID `uid`) by all three marks, ordered by position; the others
/// logged.
fn own_ordered(mut segments: Vec<LedgerSegment>, run: &str, uid: &str) -> Vec<LedgerSegment> {
    segments.retain(|s| {
        let ours = is_segment_of(s, run, uid);
        if !ours {
            tracing::warn!(%run, segment = %s.name_any(), claims = %s.spec.run,
                "a segment with this run's UID label is named for another run: ignored");
        }
        ours
    });
    segments.sort_by_key(|s| s.spec.seq);
    segments
}

/// True when position `seq` of `run` (UID `uid`) holds none of its segments now (read from
/// etcd). A failed read is not an answer: false.
async fn position_free(api: &Api<LedgerSegment>, run: &str, uid: &str, seq: i64) -> bool {
    match api.get_opt(&segment_name(run, seq)).await {
        Ok(found) => !found.is_some_and(|s| is_segment_of(&s, run, uid)),
        Err(_) => false,
    }
}

impl SegmentStore {
    /// The ledger of `run` (which must have been read from the API server: it needs its UID).
    pub fn for_run(client: Client, run: &AgentRun) -> Self {
        let id = run.id();
        Self {
            api: Api::namespaced(client, &id.namespace),
            run: id.name,
            run_uid: id.uid,
            thread_uid: run.thread_owner().map(|o| o.uid.clone()),
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

    /// At most `limit` segments after position `after`, in order and checked contiguous from
    /// there: a reader holds a page, never the whole ledger. Read by name (a segment's name is
    /// its run's and its position, `segment_name`), a few at once, up to the first position
    /// not yet written: the API server's list cannot start at a position, so a page by list
    /// would read every page before it again.
    pub async fn list_page(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LedgerSegment>, LedgerError> {
        use futures::StreamExt;
        let positions = (after + 1..).take(limit);
        let reads = futures::stream::iter(positions)
            .map(|seq| {
                let name = segment_name(&self.run, seq);
                async move { self.api.get_opt(&name).await }
            })
            .buffered(PAGE_READS_AT_ONCE);
        let mut reads = std::pin::pin!(reads);
        // The page ends at the first position not written, or written for another run (an
        // earlier run of the same name, not yet collected): that is not this run's. No read
        // is started past it but the few already in flight (a page of 100 at the ledger's end
        // is a handful of reads, not 100).
        let mut page = Vec::new();
        while let Some(found) = reads.next().await {
            match found? {
                Some(s) if is_segment_of(&s, &self.run, &self.run_uid) => page.push(s),
                _ => break,
            }
        }
        check_contiguous_after(after, &page)?;
        Ok(page)
    }

    /// Every segment of `namespace` labelled for the thread of UID `thread_uid`, in one list:
    /// the earlier turns' ledgers a turn's history is built from. Unchecked: the caller takes
    /// each turn's own by run and UID, and reads alone a turn this does not hold whole.
    ///
    /// Served from the API server's watch cache (any version): a list from etcd reads and
    /// decodes every segment of the namespace to filter by label (about a second at 5,000
    /// segments on the bed, `make bench-thread`). A cache that lags costs only those reads
    /// alone: the turns before this one ended before its history was fixed, so what the cache
    /// holds of them is final.
    pub async fn list_thread(
        client: Client,
        namespace: &str,
        thread_uid: &str,
    ) -> Result<Vec<LedgerSegment>, kube::Error> {
        let api: Api<LedgerSegment> = Api::namespaced(client, namespace);
        let selector = format!("{THREAD_UID_LABEL}={thread_uid}");
        let params = ListParams::default().labels(&selector).match_any();
        Ok(api.list(&params).await?.items)
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

    /// Fenced append (docs/protocol.md): writes `events` at `tail + 1` onwards under `fence`,
    /// as [`crate::ledger::append`] rules it.
    pub async fn append(
        &self,
        tail: i64,
        fence: Fence,
        events: Vec<LedgerEvent>,
    ) -> Result<Appended, LedgerError> {
        append_fenced(self, tail, fence, events).await
    }

    fn segment(&self, seq: i64, fence: Fence, events: Vec<LedgerEvent>) -> LedgerSegment {
        let mut segment = segment_of_run(&self.run, &self.run_uid, seq, fence, events);
        segment.metadata.owner_references = Some(vec![self.owner.clone()]);
        if let Some(thread) = &self.thread_uid {
            segment
                .labels_mut()
                .insert(THREAD_UID_LABEL.into(), thread.clone());
        }
        segment
    }
}

/// A position is a LedgerSegment named `<run>-<seq>`: creating it is the API server's
/// "create if absent"; the one in the way is read by its name.
impl Positions for SegmentStore {
    fn run(&self) -> (&str, &str) {
        (&self.run, &self.run_uid)
    }

    fn budget(&self) -> usize {
        self.budget
    }

    async fn create_at(
        &self,
        seq: i64,
        fence: Fence,
        events: &[LedgerEvent],
    ) -> Result<AtPosition, LedgerError> {
        let segment = self.segment(seq, fence, events.to_vec());
        match self.api.create(&PostParams::default(), &segment).await {
            Ok(created) => Ok(AtPosition::Created(created)),
            Err(err) if is_already_exists(&err) => {
                let existing = self.api.get(&segment_name(&self.run, seq)).await?;
                Ok(AtPosition::Taken(existing))
            }
            Err(err) => Err(err.into()),
        }
    }
}
