//! The claim (docs/protocol.md): seal → ONE status CAS → Lease move → pod creation, as a
//! pipeline of typed stages. The first two stages (prepare, seal) are every claim's, the
//! terminal claim's too ([`terminal_claim`], ended by [`super::close`]).
//!
//! Pod rule: a pod is created only right after this pass moved the Lease to it (or found the
//! Lease behind and moved it). A Lease already naming the pod of the current fence means its
//! pod was (or was about to be) created; if that pod is missing, `decide` ends the attempt
//! and claims fence+1 once the worker renewed or `POD_CREATE_GRACE` passed. So no fence ever
//! gets two pods, even across controller restarts or a force-deleted pod.

use std::ops::ControlFlow::{self, Break, Continue};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;
use tracing::Instrument;

use super::Error;
use super::access::{ensure_run_rbac, ensure_workspace};
use super::attempt_pod::attempt_pod;
use super::close::{self, delete_pod};
use super::context::{Context, SealMemory};
use super::decide::{Claim, ClaimReason, Close, CloseReason};
use super::ledger_end::{LedgerEnd, ledger_end, report_claimants};
use super::leftovers;
use super::observe::sight;
use super::statuses::{self, run_name};
use super::warm;
use super::writer::{Applied, Wrote};
use crate::crd::controlled_by_run;
use crate::crd::v1alpha1::{AgentRun, LedgerEvent};
use crate::fence::{Fence, RunHolder, run_lease_name, worker_pod_name};
use crate::kube_util::{is_retry_soon, refused_for_what_it_is};
use crate::lease::{LeaseError, lease_fence, lease_holder};
use crate::owned::{Ownership, owner_reference};
use crate::traces::RunTrace;
use crate::traces::between::{self, Claimed};

/// Where a stage of the claim leaves it: on to the next stage, or stopped (and what that
/// came to: the caches were behind, the run changed under a write, or the run has ended).
type Stage<T> = ControlFlow<Applied, T>;

/// Stage 1, prepared: the trigger confirmed against the API server, the end of the ledger
/// found, the new holder named. (A claim also carries where its Lease move starts from.)
pub(super) struct Prepared<'a> {
    pub(super) run: &'a AgentRun,
    pub(super) holder: RunHolder,
    end: LedgerEnd,
    /// Segments that claim the run without being its own (reported, never folded in).
    claimants: Vec<String>,
}

/// Stage 2, sealed: `claimed{fence, pod}` is in the ledger (this pass's, or an earlier one's).
pub(super) struct Sealed<'a>(pub(super) Prepared<'a>);

/// Stage 3, status written: the run says Running at the new fence with the new pod. Either
/// this pass wrote it, or the objects show it (a claim that stopped after its status write:
/// [`StatusWritten::shown_by`]), and the claim goes on from here.
pub struct StatusWritten {
    run: AgentRun,
    holder: RunHolder,
    lease: LeaseBase,
}

/// Stage 4, Lease moved: the run's Lease names the new pod at the new fence, moved by this
/// pass (so this pass, and only it, creates the pod).
struct LeaseMoved {
    run: AgentRun,
    holder: RunHolder,
}

/// A claim of `run` for fence+1 (docs/protocol.md, "The claim"): prepared → sealed → status
/// written → Lease moved → pod created, each stage a type that only the one before makes.
pub async fn claim(ctx: &Context, run: &AgentRun, claim: Claim) -> Result<Applied, Error> {
    let span = crate::run_span!("claim", run);
    claim_stages(ctx, run, claim).instrument(span).await
}

async fn claim_stages(ctx: &Context, run: &AgentRun, claim: Claim) -> Result<Applied, Error> {
    let started = Instant::now();
    let confirm = confirm_trigger(ctx, run, claim.reason);
    let (prepared, lease) = match prepare(ctx, run, confirm).await? {
        Continue(prepared) => prepared,
        Break(applied) => return Ok(applied),
    };
    let sealed = match seal(ctx, prepared).await? {
        Continue(sealed) => sealed,
        Break(applied) => return Ok(applied),
    };
    let written = match write_claim_status(ctx, sealed, claim, lease).await? {
        Continue(written) => written,
        Break(applied) => return Ok(applied),
    };
    ctx.metrics().claim_api(started.elapsed().as_secs_f64());
    record_claim(ctx, run, claim, &written.holder);
    claim_span(run, claim, &written.holder, started);
    // The old pod's deletion does not wait for the new one (the fence, not the deletion,
    // protects the run). A pod confirmed gone is not deleted again.
    let old_pod = async {
        match claim.reason {
            ClaimReason::PodGone => Ok(()),
            _ => delete_pod(ctx, run, Fence::of_run(run)).await,
        }
    };
    futures::try_join!(complete(ctx, written), old_pod)?;
    Ok(Applied::Done)
}

/// Stages 4 and 5 from a written status: the Lease moved, then the pod created.
pub async fn complete(ctx: &Context, written: StatusWritten) -> Result<Applied, Error> {
    match move_lease(ctx, written).await? {
        Continue(moved) => create_pod(ctx, moved).await.map(|_| Applied::Done),
        Break(applied) => Ok(applied),
    }
}

impl StatusWritten {
    /// The claim the objects show half done: the run's status at its fence and pod, its
    /// Lease behind (decided by `decide`: `CompleteClaim`). The Lease is read afresh.
    pub fn shown_by(run: &AgentRun) -> Self {
        Self {
            holder: RunHolder::of(run, Fence::of_run(run)),
            run: run.clone(),
            lease: LeaseBase::Fresh,
        }
    }
}

/// Stage 1, for a claim and a terminal claim alike. No namesake's leftovers may hold the new
/// fence's objects; the trigger is confirmed (`confirm`: what the claim goes on with, or why it
/// stops) and the end of the ledger found, both reads at once. A `closed` record found there
/// was written after the run's terminal status, or, by a version before the terminal claim
/// sealed with `claimed`, perhaps without it: [`close::complete_recorded`].
pub(super) async fn prepare<'a, T>(
    ctx: &Context,
    run: &'a AgentRun,
    confirm: impl Future<Output = Result<Stage<T>, Error>>,
) -> Result<Stage<(Prepared<'a>, T)>, Error> {
    let holder = RunHolder::of(run, Fence::of_run(run).next());
    let fence = holder.fence;
    if !leftovers::cleared(ctx, run, fence).await? {
        return Ok(Break(Applied::Requeue));
    }
    let (confirmed, found) = futures::try_join!(confirm, ledger_end(ctx, run, fence))?;
    report_claimants(ctx, run, &found.claimants);
    let (end, claimants) = (found.end, found.claimants);
    if let LedgerEnd::Closed { .. } = end {
        return close::complete_recorded(ctx, run).await.map(Break);
    }
    Ok(match confirmed {
        Continue(confirmed) => Continue((
            Prepared {
                run,
                holder,
                end,
                claimants,
            },
            confirmed,
        )),
        Break(applied) => Break(applied),
    })
}

/// Stage 2: appends the seal `claimed{fence, pod}` (unless the ledger already holds a claim at
/// this fence). Stopped with a conflict when the run was lost to a newer claim or closed:
/// re-read it and re-decide. Safety rests on the `create` at tail+1 (a taken position collides
/// and is classified), never on how the tail was found; [`ledger_end`] finds it without
/// reading the whole ledger.
pub(super) async fn seal<'a>(
    ctx: &Context,
    prepared: Prepared<'a>,
) -> Result<Stage<Sealed<'a>>, Error> {
    let (run, holder) = (prepared.run, &prepared.holder);
    let fence = holder.fence;
    let tail = match prepared.end {
        LedgerEnd::Tail(tail) => tail,
        LedgerEnd::Sealed(seq) => {
            // Sealed by an earlier pass (or a racing controller): the status CAS decides.
            remember_seal(ctx, run, fence, seq);
            return Ok(Continue(Sealed(prepared)));
        }
        LedgerEnd::Lost | LedgerEnd::Closed { .. } => return Ok(Break(Applied::Conflict)),
    };
    let mut seal = vec![LedgerEvent::Claimed {
        fence,
        pod: holder.pod.clone(),
    }];
    // A turn's first seal fixes its history: every attempt rebuilds the same request from it.
    if fence.is_first() {
        seal.extend(super::turn::history(ctx, run).await?);
    }
    let store = ctx.ledger(run)?;
    let appended = match ctx
        .write_fenced("seal", store.append(tail, fence, seal))
        .await?
    {
        Err(err) if err.is_lost() => return Ok(Break(Applied::Conflict)),
        other => other?,
    };
    remember_seal(ctx, run, fence, appended.tail);
    Ok(Continue(Sealed(prepared)))
}

/// Stage 3: ONE status CAS on the run as read: Running at the new fence and pod.
async fn write_claim_status(
    ctx: &Context,
    Sealed(prepared): Sealed<'_>,
    claim: Claim,
    lease: LeaseBase,
) -> Result<Stage<StatusWritten>, Error> {
    let holder = prepared.holder;
    let (fence, pod) = (holder.fence, holder.pod.as_str());
    let mut desired = statuses::claimed(prepared.run, claim, fence, pod);
    statuses::note_claimants(&mut desired, &prepared.claimants);
    let Some(run) = ctx.write_status(prepared.run, desired).await? else {
        return Ok(Break(Applied::Conflict));
    };
    Ok(Continue(StatusWritten { run, holder, lease }))
}

fn remember_seal(ctx: &Context, run: &AgentRun, fence: Fence, seq: i64) {
    if seq < 1 {
        return;
    }
    let uid = run.id().uid;
    ctx.remember(run, |m| m.seal = Some(SealMemory { uid, fence, seq }));
}

/// What the Lease move starts from (the base of its CAS).
#[derive(Debug, Clone)]
pub enum LeaseBase {
    /// Just read from the API server (None: there is no Lease).
    Read(Option<Box<Lease>>),
    /// The watch cache's copy: a stale one costs a refused write and a re-read.
    Cached,
    /// Read it from the API server first.
    Fresh,
}

/// Before a takeover, the cache's view is checked against the API server: the Lease is
/// re-read (a renewal the cache missed cancels the expiry; a release sends the claim back to
/// the run, [`confirm_current`]), a missing pod is confirmed gone. Stopped (Requeue) when the
/// trigger did not hold. Otherwise what the Lease move will start from: the Lease as just
/// read, or the cache's copy when the Lease is not expected to move meanwhile, or a fresh
/// read for a handoff (the worker releases its Lease right after writing `Handoff`).
async fn confirm_trigger(
    ctx: &Context,
    run: &AgentRun,
    reason: ClaimReason,
) -> Result<Stage<LeaseBase>, Error> {
    let ns = run.id().namespace;
    match reason {
        ClaimReason::LeaseExpired => {
            let fresh = ctx.lease_edge(&ns).get(&run.name_any()).await?;
            let Some(fresh) = fresh else {
                return Ok(Continue(LeaseBase::Read(None)));
            };
            // Still expired on our clock as the API server has it now? (A version the
            // controller had not seen is a change: a new allowance starts now.)
            let now = Instant::now();
            let seen = sight(ctx, run, &fresh, now);
            if !seen.sighting.expired(&run.spec.lease, now) {
                return Ok(Break(Applied::Requeue));
            }
            if lease_holder(&fresh).is_none()
                && let Break(applied) = confirm_current(ctx, run).await?
            {
                return Ok(Break(applied));
            }
            Ok(Continue(LeaseBase::Read(Some(Box::new(fresh)))))
        }
        ClaimReason::PodGone => {
            let name = worker_pod_name(&run.name_any(), Fence::of_run(run));
            let pod = ctx.api::<Pod>(&ns).get_opt(&name).await?;
            // A pod of that name the run does not control is one started ahead that it never
            // adopted: not its attempt's.
            Ok(match pod {
                Some(pod) if controlled_by_run(&pod, &run.id().uid) => Break(Applied::Requeue),
                _ => Continue(LeaseBase::Cached),
            })
        }
        ClaimReason::Handoff => Ok(Continue(LeaseBase::Fresh)),
        _ => Ok(Continue(LeaseBase::Cached)),
    }
}

/// Stops a claim (Conflict: re-read the run and decide again) when the run as the API server
/// has it now is not the copy the claim was decided on. A claim needs this where its trigger
/// may be a worker's own ending that the copy has not caught up with: a released Lease (the
/// worker wrote its status before releasing), and every terminal claim.
pub(super) async fn confirm_current(ctx: &Context, run: &AgentRun) -> Result<Stage<()>, Error> {
    let now = ctx.runs_api(run).get_opt(&run.name_any()).await?;
    let same = now.is_some_and(|r| r.resource_version() == run.resource_version());
    Ok(if same {
        Continue(())
    } else {
        Break(Applied::Conflict)
    })
}

fn record_claim(ctx: &Context, run: &AgentRun, claim: Claim, holder: &RunHolder) {
    let (fence, pod) = (holder.fence, holder.pod.as_str());
    let reason = claim.reason.as_str();
    ctx.metrics().claim(reason, claim.reason.is_death());
    if claim.reason == ClaimReason::LeaseExpired
        && let Some(s) = ctx.memory_of(run).sighting
    {
        let late = Instant::now().saturating_duration_since(s.deadline(&run.spec.lease));
        ctx.metrics().takeover_lateness(late.as_secs_f64());
    }
    tracing::info!(run = %run_name(run), %fence, pod, reason, "claimed");
    let note = format!("attempt {fence} claimed for pod {pod} ({reason})");
    ctx.event(
        run,
        claim.reason.is_death(),
        &format!("Claimed{reason}"),
        note,
    );
}

/// The claim's span in the run's trace, from `started` to now (its status landed).
fn claim_span(run: &AgentRun, claim: Claim, holder: &RunHolder, started: Instant) {
    let began = std::time::SystemTime::now() - started.elapsed();
    let claimed = Claimed {
        run: &holder.run,
        namespace: &holder.namespace,
        fence: holder.fence,
        pod: &holder.pod,
        reason: claim.reason.as_str(),
        takeover: claim.reason.is_death(),
        began,
    };
    between::claimed(&RunTrace::of(run), &claimed);
}

/// Stage 4: the Lease moved (CAS) to the new holder, status being ahead of it. A Lease already
/// at the fence means the pod was handled by whoever moved it: nothing is created here, and
/// neither is it when the move finds the Lease moved by someone else meanwhile.
async fn move_lease(ctx: &Context, written: StatusWritten) -> Result<Stage<LeaseMoved>, Error> {
    let StatusWritten { run, holder, lease } = written;
    let leases = ctx.lease_edge(&holder.namespace);
    let current = match lease {
        LeaseBase::Read(read) => read.map(|l| *l),
        LeaseBase::Cached => cached_lease(ctx, &run),
        LeaseBase::Fresh => leases.get(&holder.run).await?,
    };
    let fence = holder.fence;
    if crate::fence::lease_reached(current.as_ref().and_then(lease_fence), holder.fence) {
        return Ok(Break(Applied::Requeue));
    }
    // The pod runs as the run's own ServiceAccount: it (and its Role) exist before the pod.
    ensure_run_rbac(ctx, &run, holder.fence.is_first()).await?;
    ensure_workspace(ctx, &run).await?;
    let owner = owner_reference(&run, Ownership::Controller).unwrap_or_default();
    let duration = run.spec.lease.duration_seconds;
    let request = leases.move_from(&holder.run, current, owner, &holder.pod, fence, duration);
    let moved = match ctx.write_fenced("lease", request).await? {
        // A deleted namesake's, which the next pass's leftover check removes.
        Err(LeaseError::NotTheRuns { leftover: true, .. }) => return Ok(Break(Applied::Requeue)),
        Err(err @ LeaseError::NotTheRuns { .. }) => {
            let taken = Close {
                reason: CloseReason::LeaseNotOwned,
                message: err.to_string(),
                failed: false,
            };
            return terminal_claim(ctx, &run, &taken).await.map(Break);
        }
        other => other?,
    };
    if moved.is_none() {
        // Someone else moved it meanwhile: the pod is theirs to create.
        return Ok(Break(Applied::Requeue));
    }
    Ok(Continue(LeaseMoved { run, holder }))
}

/// Stage 5: the attempt's pod, created by the pass that moved the Lease to it.
async fn create_pod(ctx: &Context, moved: LeaseMoved) -> Result<(), Error> {
    let LeaseMoved { run, holder } = moved;
    let pod = attempt_pod(ctx, &run, holder.fence);
    let created = create_pod_patiently(ctx, &run, &pod).await;
    if let Err(Error::Kube(err)) = &created
        && let Some(message) = refused_for_what_it_is(err)
    {
        // Every attempt's pod would be refused alike: the run fails, saying why.
        let refused = Close {
            reason: CloseReason::PodRejected,
            message: format!("the API server refuses the worker pod: {message}"),
            failed: false,
        };
        return terminal_claim(ctx, &run, &refused).await.map(|_| ());
    }
    if let Err(err) = created {
        // Perhaps the ServiceAccount was removed behind our back: check again next time.
        ctx.remember(&run, |m| m.rbac_for = None);
        return Err(err);
    }
    Ok(())
}

/// How long a pod refused with "retry soon" is tried again within its attempt.
const POD_CREATE_PATIENCE: Duration = Duration::from_secs(20);

/// Creates the attempt's pod. Its Lease has moved already and a pod is created once per attempt,
/// so giving up here would cost the run an attempt: a refusal the server means to be retried
/// (a new ServiceAccount without its token yet: HTTP 500 "No API token found ..., retry after")
/// is retried with backoff for [`POD_CREATE_PATIENCE`]. AlreadyExists is our own earlier create,
/// or a pod started ahead for the run (a thread's next turn), which the run adopts when it is
/// the pod this attempt would have created ([`warm::take_over`]).
async fn create_pod_patiently(ctx: &Context, run: &AgentRun, pod: &Pod) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + POD_CREATE_PATIENCE;
    let mut delay = Duration::from_millis(200);
    let api = ctx.api::<Pod>(&run.id().namespace);
    loop {
        match ctx
            .write("pod", api.create(&PostParams::default(), pod))
            .await
        {
            Ok(Wrote::Exists) => return warm::take_over(ctx, run, pod).await,
            // Gone: the namespace is being deleted (so is the run).
            Ok(_) => return Ok(()),
            Err(Error::Kube(err))
                if is_retry_soon(&err) && tokio::time::Instant::now() + delay < deadline =>
            {
                tracing::info!(pod = %pod.name_any(), %err, ?delay, "pod refused for now; creating it again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(err) => return Err(err),
        }
    }
}

/// The run Lease as the watch cache has it.
fn cached_lease(ctx: &Context, run: &AgentRun) -> Option<Lease> {
    let ns = run.id().namespace;
    let name = run_lease_name(&run.name_any());
    ctx.lease_cache()
        .get(&ObjectRef::new(&name).within(&ns))
        .map(|l| (*l).clone())
}

/// A terminal claim (docs/protocol.md, "The terminal claim"): ends `run` as `close` says by a
/// claim for its next fence, the claim's own first two stages sealing `claimed{F+1}`, then
/// [`close::end`]. The run as read must still be the run in the API server (a copy behind it
/// is re-read: Conflict).
pub async fn terminal_claim(
    ctx: &Context,
    run: &AgentRun,
    close: &Close,
) -> Result<Applied, Error> {
    let (prepared, ()) = match prepare(ctx, run, confirm_current(ctx, run)).await? {
        Continue(prepared) => prepared,
        Break(applied) => return Ok(applied),
    };
    match seal(ctx, prepared).await? {
        Continue(Sealed(prepared)) => {
            close::end(ctx, prepared.run, prepared.holder.fence, close).await
        }
        Break(applied) => Ok(applied),
    }
}
