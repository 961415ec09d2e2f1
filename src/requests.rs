//! What a person asks of a run: stop it, send it an input, decide the call it waits on. The
//! CLI's verbs and `baton server`'s POSTs both come here, with the asker's own client: each
//! request is checked against the run as read, and lands by a resourceVersion
//! compare-and-swap, so a concurrent append to the same append-only list is never lost.

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use crate::approval::{self, DecisionError};
use crate::crd::v1alpha1::{AgentRun, AgentThread, LedgerSegment, Phase, Verdict};
use crate::kube_util::{is_already_exists, is_conflict, is_not_found};
use crate::ledger::{LedgerError, Ledgers};

/// How many times a request re-reads and retries when the run changes under it.
const UPDATE_RETRIES: usize = 5;
/// Segments read at once while looking back through a ledger for a call.
const LOOK_BACK_PAGE: usize = 4;

/// Creates `turn` of `thread` (made by [`AgentThread::new_turn`]). A turn under the name the
/// thread offers (its next turn's pod started ahead) that finds the name taken meanwhile, by
/// another turn or any run of that name, is created again under a name the API server picks:
/// it starts a pod of its own.
pub async fn create_turn(
    api: &Api<AgentRun>,
    thread: &AgentThread,
    turn: AgentRun,
) -> kube::Result<AgentRun> {
    let params = PostParams::default();
    match api.create(&params, &turn).await {
        Err(err) if is_already_exists(&err) && turn.metadata.name.is_some() => {
            api.create(&params, &thread.named_by_server(turn)).await
        }
        created => created,
    }
}

/// Why a request on a run was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("run {name} not found in namespace {namespace}")]
    NotFound { name: String, namespace: String },
    #[error("run {name} is not waiting for input (phase {phase})")]
    NotWaitingForInput { name: String, phase: Phase },
    #[error(transparent)]
    Decision(#[from] DecisionError),
    #[error(
        "the call of step {step} is not in the ledger of run {name}: not approving a call that cannot be shown whole"
    )]
    CallNotShown { name: String, step: i64 },
    #[error("run {name} kept changing while we tried to update it; try again")]
    Contended { name: String },
    #[error("reading the ledger of run {name}: {detail}")]
    Ledger {
        name: String,
        detail: String,
        /// Whether a retry may get past it ([`LedgerError::is_transient`]).
        transient: bool,
    },
    #[error(transparent)]
    Kube(kube::Error),
}

impl RequestError {
    /// A failure a retry may get past: the API server or the ledger's backend unreachable or
    /// overloaded for a moment. Never a refusal, a missing run or a broken ledger.
    pub fn is_transient(&self) -> bool {
        match self {
            RequestError::Kube(e) => crate::ledger::kube_is_transient(e),
            RequestError::Ledger { transient, .. } => *transient,
            _ => false,
        }
    }
}

/// What a stop request found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// `spec.stop` is now set; the run was in this phase.
    Requested(Phase),
    /// The run had already ended in this phase: nothing was written.
    AlreadyEnded(Phase),
}

/// A decision that landed, with the call it decided as the ledger records it (an approval
/// always has one: what a human approves is what runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub step: i64,
    pub call: Option<RecordedCall>,
}

/// A tool call as its `stepIntent` records it, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    pub call_id: String,
    pub tool: String,
    pub arguments: String,
}

/// The requests on the runs of one namespace, made with one asker's client.
pub struct RunRequests {
    runs: Api<AgentRun>,
    client: kube::Client,
    namespace: String,
    /// Where ledgers are read: the API server with the asker's client, unless the caller says
    /// more ([`RunRequests::reading`]).
    ledgers: Ledgers,
}

impl RunRequests {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            runs: Api::namespaced(client.clone(), namespace),
            ledgers: Ledgers::api_server(client.clone()),
            client,
            namespace: namespace.to_string(),
        }
    }

    /// Reads ledgers from `ledgers` (`baton server`: PostgreSQL as well, which it holds), for
    /// an asker RBAC lets read ledgers in the namespace.
    pub fn reading(mut self, ledgers: Ledgers) -> Self {
        self.ledgers = ledgers;
        self
    }

    /// Sets `spec.stop` unless the run already ended.
    pub async fn stop(&self, name: &str) -> Result<Stopped, RequestError> {
        let run = self.read(name).await?;
        let phase = phase_of(&run);
        if phase.is_terminal() {
            return Ok(Stopped::AlreadyEnded(phase));
        }
        let patch = serde_json::json!({ "spec": { "stop": true } });
        self.runs
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| self.error(e, name))?;
        Ok(Stopped::Requested(phase))
    }

    /// Appends `text` to `spec.inputs` of a run that waits for input; returns how many inputs
    /// it has now.
    pub async fn input(&self, name: &str, text: &str) -> Result<usize, RequestError> {
        self.append_to_spec(name, |run| {
            let phase = phase_of(run);
            if phase != Phase::WaitingInput {
                return Err(RequestError::NotWaitingForInput {
                    name: name.to_string(),
                    phase,
                });
            }
            let mut inputs = run.spec.inputs.clone();
            inputs.push(text.to_string());
            Ok((serde_json::json!({ "inputs": inputs }), inputs.len()))
        })
        .await
    }

    /// Appends a decision on the call the run waits on (`step`: the one the asker means, if
    /// they said). An approval is refused unless the ledger shows the call whole.
    pub async fn decide(
        &self,
        name: &str,
        step: Option<i64>,
        verdict: Verdict,
        reason: Option<String>,
    ) -> Result<Decided, RequestError> {
        let call = match verdict {
            Verdict::Approve => Some(self.recorded_call(name, step).await?),
            Verdict::Deny => None,
        };
        let (step, call) = match call {
            Some((step, call)) => (Some(step), Some(call)),
            None => (step, None),
        };
        let step = self
            .append_to_spec(name, |run| {
                let decision = approval::decision(run, step, verdict, reason.clone())?;
                let step = decision.step;
                let mut approvals = run.spec.approvals.clone();
                approvals.push(decision);
                Ok((serde_json::json!({ "approvals": approvals }), step))
            })
            .await?;
        Ok(Decided { step, call })
    }

    /// The call an approval of `step` (None: the waiting one) would run, as the ledger
    /// records it, with its step; refused when the decision would be, or when the ledger does
    /// not show the call whole.
    pub async fn recorded_call(
        &self,
        name: &str,
        step: Option<i64>,
    ) -> Result<(i64, RecordedCall), RequestError> {
        let run = self.read(name).await?;
        let decision = approval::decision(&run, step, Verdict::Approve, None)?;
        let Some((tool, arguments)) = self.find_call(&run, &decision).await? else {
            return Err(RequestError::CallNotShown {
                name: name.into(),
                step: decision.step,
            });
        };
        let call = RecordedCall {
            call_id: decision.call_id.clone(),
            tool,
            arguments,
        };
        Ok((decision.step, call))
    }

    /// The tool and arguments of the call `decision` is about, read from the ledger a page at
    /// a time from its end backwards: a call waiting for approval is among the last recorded,
    /// so this reads a page or two, never the whole ledger. Pages past the length the run's
    /// status gives (written after it) are read first.
    async fn find_call(
        &self,
        run: &AgentRun,
        decision: &crate::crd::v1alpha1::ApprovalDecision,
    ) -> Result<Option<(String, String)>, RequestError> {
        let owned = |(tool, arguments): (&str, &str)| (tool.to_string(), arguments.to_string());
        let stats = run.status.as_ref().and_then(|s| s.ledger.as_ref());
        let known = stats.map_or(0, |l| l.segments).max(0);
        let mut after = known;
        loop {
            let page = self.ledger_page(run, after, LOOK_BACK_PAGE).await?;
            if let Some(found) = approval::recorded_call(&page, decision) {
                return Ok(Some(owned(found)));
            }
            match page.last() {
                Some(last) if page.len() == LOOK_BACK_PAGE => after = last.spec.seq,
                _ => break,
            }
        }
        let mut end = known;
        while end > 0 {
            let start = (end - LOOK_BACK_PAGE as i64).max(0);
            let page = self.ledger_page(run, start, (end - start) as usize);
            if let Some(found) = approval::recorded_call(&page.await?, decision) {
                return Ok(Some(owned(found)));
            }
            end = start;
        }
        Ok(None)
    }

    /// The run, or `NotFound` naming it.
    pub async fn read(&self, name: &str) -> Result<AgentRun, RequestError> {
        self.runs.get(name).await.map_err(|e| self.error(e, name))
    }

    /// At most `limit` of the run's segments after position `after`, checked by the store's
    /// reader (contiguous from there, its own run's segments). A ledger kept in PostgreSQL is
    /// read with this process's credential, never the asker's: the API server is asked first
    /// whether the asker may read ledgers here, the same question it answers for
    /// LedgerSegments (RBAC grants it per namespace, never per run).
    pub async fn ledger_page(
        &self,
        run: &AgentRun,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LedgerSegment>, RequestError> {
        let unreadable = |e: LedgerError| match e {
            LedgerError::Kube(e) => RequestError::Kube(e),
            other => RequestError::Ledger {
                name: run.name_any(),
                detail: other.to_string(),
                transient: other.is_transient(),
            },
        };
        let ledger = self.ledgers.for_run(run).map_err(unreadable)?;
        if ledger.read_bypasses_rbac() {
            let namespace = run.namespace().unwrap_or_else(|| self.namespace.clone());
            self.probe_ledgers_in(&namespace).await?;
        }
        ledger.list_page(after, limit).await.map_err(unreadable)
    }

    /// Fails as a read of a ledger in the namespace would (403 for a caller who may not list
    /// LedgerSegments here; RBAC grants it per namespace, never per run), reading one segment
    /// at most: a stream is refused with a plain HTTP answer before it opens, not part-way.
    pub async fn probe_ledgers(&self) -> Result<(), RequestError> {
        self.probe_ledgers_in(&self.namespace).await
    }

    async fn probe_ledgers_in(&self, namespace: &str) -> Result<(), RequestError> {
        let api: Api<LedgerSegment> = Api::namespaced(self.client.clone(), namespace);
        let params = kube::api::ListParams::default().limit(1);
        api.list_metadata(&params)
            .await
            .map_err(RequestError::Kube)?;
        Ok(())
    }

    /// Reads the run, asks `change` for the spec fields to merge (an append to one of its
    /// append-only lists) and merges them if the run has not changed since; re-reads and
    /// asks again when it has, a few times. Returns what `change` said of the change that
    /// landed.
    async fn append_to_spec<T>(
        &self,
        name: &str,
        change: impl Fn(&AgentRun) -> Result<(serde_json::Value, T), RequestError>,
    ) -> Result<T, RequestError> {
        for _ in 0..UPDATE_RETRIES {
            let run = self.read(name).await?;
            let (spec, said) = change(&run)?;
            if self.patch_spec(&run, spec).await? {
                return Ok(said);
            }
        }
        Err(RequestError::Contended { name: name.into() })
    }

    /// Merges `spec` into the run as read, only if it has not changed since: false when it
    /// had (read it again). The resourceVersion makes the merge patch a compare-and-swap.
    async fn patch_spec(
        &self,
        run: &AgentRun,
        spec: serde_json::Value,
    ) -> Result<bool, RequestError> {
        let name = run.name_any();
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": run.resource_version() },
            "spec": spec,
        });
        match self
            .runs
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(self.error(e, &name)),
        }
    }

    fn error(&self, err: kube::Error, name: &str) -> RequestError {
        if is_not_found(&err) {
            return RequestError::NotFound {
                name: name.to_string(),
                namespace: self.namespace.clone(),
            };
        }
        RequestError::Kube(err)
    }
}

/// The run's phase as its status says (Pending before it has one).
pub fn phase_of(run: &AgentRun) -> Phase {
    run.status.as_ref().map(|s| s.phase).unwrap_or_default()
}
