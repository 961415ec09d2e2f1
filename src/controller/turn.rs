//! Turns of a thread (docs/architecture.md, "AgentThread"). A turn (an AgentRun with
//! `spec.thread`) first joins its thread: one CAS copies the thread's agent and settings into
//! its spec and makes the thread its owner. Its first seal then fixes its history (the
//! thread's earlier turns, each up to its ledger's end), and the thread's status follows its
//! turns.

use kube::ResourceExt;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;

use super::Error;
use super::context::Context;
use super::statuses::{self, run_name};
use super::warm;
use super::writer::{Applied, Wrote};
use crate::crd::v1alpha1::{
    AgentRun, AgentThread, AgentThreadStatus, BusyPolicy, HistoryTurn, LedgerBackend, LedgerEvent,
    RunUsage, ThreadPhase,
};
use crate::crd::{INTERRUPTED_BY_ANNOTATION, THREAD_GENERATION_ANNOTATION};
use crate::lease::{lease_holder, thread_lease_name};
use crate::ledger::recorded_history;
use crate::status::set_condition;

/// The cached thread `run` is a turn of.
fn thread_of(ctx: &Context, run: &AgentRun) -> Option<std::sync::Arc<AgentThread>> {
    let thread = run.spec.thread.as_deref()?;
    let key = ObjectRef::new(thread).within(&run.id().namespace);
    ctx.thread_cache().get(&key)
}

/// The busy policy of the thread `run` is a turn of (Enqueue for a run that is no turn).
pub fn busy_policy(ctx: &Context, run: &AgentRun) -> BusyPolicy {
    thread_of(ctx, run).map_or(BusyPolicy::Enqueue, |t| t.spec.on_busy)
}

/// The live turn that holds `run`'s thread, when it is a turn of the same thread (a plain
/// run of a `threadKey` of the same name is never stopped for a turn).
fn holder_turn(ctx: &Context, run: &AgentRun) -> Option<std::sync::Arc<AgentRun>> {
    let thread = run.spec.thread.as_deref()?;
    let ns = run.id().namespace;
    let key = ObjectRef::new(&thread_lease_name(thread)).within(&ns);
    let lease = ctx.lease_cache().get(&key)?;
    let holder = lease_holder(&lease)?.to_string();
    ctx.run_cache()
        .get(&ObjectRef::new(&holder).within(&ns))
        .filter(|h| h.spec.thread.as_deref() == Some(thread))
}

/// True when the turn that holds `run`'s thread was asked to stop already.
pub fn holder_stopping(ctx: &Context, run: &AgentRun) -> bool {
    holder_turn(ctx, run).is_some_and(|h| h.spec.stop)
}

/// `onBusy: Interrupt`: stops the turn `holder` of `run`'s thread as `baton stop` does, and
/// names `run` on it (its end's reason is `Interrupted`), in one CAS on the holder as the API
/// server has it. A holder that is no turn of the thread, or stopped already, is left alone.
pub async fn interrupt(ctx: &Context, run: &AgentRun, holder: &str) -> Result<Applied, Error> {
    let api = ctx.runs_api(run);
    let Some(mut live) = api.get_opt(holder).await? else {
        return Ok(Applied::Requeue);
    };
    if live.spec.thread != run.spec.thread || live.spec.stop {
        return Ok(Applied::Requeue);
    }
    live.spec.stop = true;
    live.annotations_mut()
        .insert(INTERRUPTED_BY_ANNOTATION.into(), run.name_any());
    let params = PostParams::default();
    let wrote = ctx.write("interrupt", api.replace(holder, &params, &live));
    if let Wrote::Written(stopped) = wrote.await? {
        let thread = run.spec.thread.as_deref().unwrap_or_default();
        tracing::info!(run = %run_name(&stopped), by = %run.name_any(), "interrupted");
        let note = format!(
            "stopped for turn {} of thread {thread} (onBusy: Interrupt)",
            run.name_any()
        );
        ctx.event(&stopped, false, "Interrupted", note);
    }
    Ok(Applied::Requeue)
}

/// Joins the turn to its thread: its spec takes the thread's agent, budget, worker, lease and
/// attempts, and the thread becomes its owner (deleting the thread deletes its turns), in one
/// CAS on the run as the API server has it (the cache holds no user texts). A thread that does
/// not exist ends the turn `Failed`, naming it.
pub async fn join(ctx: &Context, run: &AgentRun) -> Result<Applied, Error> {
    let (ns, name) = (run.id().namespace, run.name_any());
    let thread_name = run.spec.thread.clone().unwrap_or_default();
    let (runs, threads) = (ctx.runs_api(run), ctx.api::<AgentThread>(&ns));
    let (fresh, thread) = futures::try_join!(runs.get_opt(&name), threads.get_opt(&thread_name))?;
    let Some(mut fresh) = fresh.filter(|f| f.uid() == run.uid()) else {
        return Ok(Applied::Conflict);
    };
    let Some(thread) = thread else {
        let message = format!("spec.thread: no AgentThread {thread_name} exists in namespace {ns}");
        let status = statuses::rejected(&fresh, &message);
        return Ok(match ctx.write_status(&fresh, status).await? {
            Some(_) => Applied::Done,
            None => Applied::Conflict,
        });
    };
    if let Some(message) = changed_since_admitted(&fresh, &thread) {
        let status = statuses::rejected(&fresh, &message);
        return Ok(match ctx.write_status(&fresh, status).await? {
            Some(_) => Applied::Done,
            None => Applied::Conflict,
        });
    }
    // The turn's place first, counted on the thread by CAS: two joins never share one. A
    // controller that stops before the turn's write leaves a place unused, never reused.
    let place = thread.status.as_ref().map_or(0, |s| s.joined) + 1;
    let mut counted = thread.clone();
    counted.status.get_or_insert_with(Default::default).joined = place;
    let params = PostParams::default();
    let count = threads.replace_status(&thread_name, &params, &counted);
    if ctx.write("join", count).await?.written().is_none() {
        return Ok(Applied::Conflict);
    }
    thread.lend_to(&mut fresh, place);
    let api = ctx.runs_api(run);
    match ctx
        .write("join", api.replace(&name, &PostParams::default(), &fresh))
        .await?
    {
        Wrote::Written(_) => {
            tracing::info!(run = %run_name(run), thread = %thread_name, "joined its thread");
            Ok(Applied::Done)
        }
        _ => Ok(Applied::Conflict),
    }
}

/// Why `turn` may not take `thread`'s settings, or None: the webhook stamped the turn with the
/// thread generation its creator was asked about, and the thread changed since, so its agent
/// and worker are not what its creator was found allowed to borrow (DESIGN §12). A turn with no
/// stamp was admitted with the webhook off, where nothing was asked.
pub fn changed_since_admitted(turn: &AgentRun, thread: &AgentThread) -> Option<String> {
    let stamped = turn.annotations().get(THREAD_GENERATION_ANNOTATION)?;
    let now = thread.metadata.generation.unwrap_or_default();
    (stamped.parse::<i64>().ok() != Some(now)).then(|| {
        format!(
            "spec.thread: thread {} changed after this turn was admitted (generation {stamped}, \
             now {now}); its creator was not asked about what it lends now, so create the turn \
             again",
            thread.name_any()
        )
    })
}

/// The `history` event of a turn's first seal: the thread's earlier turns that ended, in
/// order, each up to its ledger's end now. The turn before carries on the history its own seal
/// fixed, so one ledger is read however long the thread. None for a run that is no turn.
pub async fn history(ctx: &Context, run: &AgentRun) -> Result<Option<LedgerEvent>, Error> {
    let Some(thread) = run.spec.thread.clone().filter(|_| run.has_joined()) else {
        return Ok(None);
    };
    let mut earlier = earlier_turns(ctx, run);
    let mut turns = Vec::new();
    let runs = ctx.api::<AgentRun>(&run.id().namespace);
    while let Some(cached) = earlier.pop() {
        // Read fresh: the turn before ended moments ago (its end admitted this one), and the
        // cache may not show it yet; a history fixed without it would be fixed for good.
        let uid = cached.id().uid;
        let Some(previous) = runs.get_opt(&cached.name_any()).await? else {
            continue;
        };
        let ended = previous
            .status
            .as_ref()
            .is_some_and(|s| s.phase.is_terminal());
        if previous.uid().as_deref() != Some(uid.as_str()) || !ended {
            continue;
        }
        let segments = ctx.ledger_of(&previous).await?;
        if segments.is_empty() {
            continue;
        }
        if let Some(fixed) = recorded_history(&segments) {
            turns = fixed.turns;
        }
        turns.push(HistoryTurn {
            run: previous.name_any(),
            uid,
            up_to: segments.len() as i64,
            ledger_backend: Some(LedgerBackend::of(previous.status.as_ref())),
        });
        break;
    }
    let context = thread_of(ctx, run).and_then(|t| t.spec.context.clone());
    Ok(Some(LedgerEvent::History {
        thread,
        turns,
        context,
    }))
}

/// The turns of `run`'s thread that joined before it, oldest first, as the cache shows them
/// (whether each ended is for the caller to read fresh).
fn earlier_turns(ctx: &Context, run: &AgentRun) -> Vec<std::sync::Arc<AgentRun>> {
    let Some(owner) = run.thread_owner() else {
        return Vec::new();
    };
    let before = run.turn_order();
    let ns = run.id().namespace;
    let mut turns: Vec<_> = turns_of(ctx, &ns, &owner.name, &owner.uid)
        .into_iter()
        .filter(|t| t.turn_order() < before)
        .collect();
    turns.sort_by_cached_key(|t| t.turn_order());
    turns
}

/// The cached turns of thread `thread` (UID `uid`) in `ns` that joined it (an owner reference
/// only the controller writes, to the thread their `spec.thread` names).
pub(super) fn turns_of(
    ctx: &Context,
    ns: &str,
    thread: &str,
    uid: &str,
) -> Vec<std::sync::Arc<AgentRun>> {
    ctx.run_cache()
        .state()
        .into_iter()
        .filter(|r| r.namespace().as_deref() == Some(ns))
        .filter(|r| r.has_joined() && r.is_turn_of(thread, uid))
        .collect()
}

/// Writes the status of `run`'s thread as its turns show it, when it differs from the thread's.
/// A conflict means the thread cache is behind a write (another turn's, or another replica's):
/// the thread is read again and the status recomputed from the turns as they are then, so the
/// last write always counts every turn. Without that, a turn's deletion (which no later
/// reconcile of that turn follows) could leave its thread counting it. Then the thread's next
/// turn started ahead is tended (`warm::ensure`), which says when to look again.
pub async fn publish_thread_status(
    ctx: &Context,
    run: &AgentRun,
) -> Result<Option<std::time::Duration>, Error> {
    const ATTEMPTS: usize = 5;
    let Some(owner) = run.thread_owner() else {
        return Ok(None);
    };
    let ns = run.id().namespace;
    let key = ObjectRef::new(&owner.name).within(&ns);
    let api = ctx.api::<AgentThread>(&ns);
    let params = PostParams::default();
    let mut thread = ctx.thread_cache().get(&key).map(|t| (*t).clone());
    for _ in 0..ATTEMPTS {
        let Some(mut desired) = thread.filter(|t| t.uid() == Some(owner.uid.clone())) else {
            return Ok(None);
        };
        let mut status = thread_status(
            &turns_of(ctx, &ns, &owner.name, &owner.uid),
            desired.status.as_ref(),
        );
        let taken = |name: &str| {
            ctx.run_cache()
                .get(&ObjectRef::new(name).within(&ns))
                .is_some()
        };
        status.next_turn = warm::offered_name(&desired, taken, || warm::fresh_name(&owner.name));
        if desired.status.as_ref() == Some(&status) {
            return warm::ensure(ctx, &desired).await;
        }
        desired.status = Some(status);
        let request = api.replace_status(&owner.name, &params, &desired);
        match ctx.write("thread_status", request).await? {
            Wrote::Conflict => thread = api.get_opt(&owner.name).await?,
            Wrote::Written(written) => return warm::ensure(ctx, &written).await,
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// The status of a thread whose turns are `turns`, its conditions carried on from `previous`
/// (a condition's transition time moves only when it changes).
pub fn thread_status(
    turns: &[std::sync::Arc<AgentRun>],
    previous: Option<&AgentThreadStatus>,
) -> AgentThreadStatus {
    let live = |r: &AgentRun| {
        r.status
            .as_ref()
            .is_some_and(|s| !s.phase.is_terminal() && !s.fence.never_claimed())
    };
    let last = turns
        .iter()
        .filter(|r| r.status.as_ref().is_some_and(|s| !s.fence.never_claimed()))
        .max_by_key(|r| r.turn_order());
    let mut usage = RunUsage::default();
    for turn in turns {
        if let Some(spent) = turn.status.as_ref().and_then(|s| s.usage.as_ref()) {
            usage.add(spent);
        }
    }
    let live_turn = turns.iter().find(|r| live(r)).map(|r| r.name_any());
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let (reason, message) = match &live_turn {
        Some(turn) => ("TurnLive", format!("turn {turn} is live")),
        None => ("NoLiveTurn", "no turn is live".to_string()),
    };
    set_condition(
        &mut conditions,
        "Busy",
        live_turn.is_some(),
        reason,
        &message,
        None,
    );
    AgentThreadStatus {
        phase: if live_turn.is_some() {
            ThreadPhase::Busy
        } else {
            ThreadPhase::Idle
        },
        turns: turns.len() as i64,
        last_turn: last.map(|r| r.name_any()),
        last_turn_phase: last.and_then(|r| r.status.as_ref().map(|s| s.phase)),
        usage,
        joined: previous.map_or(0, |p| p.joined),
        next_turn: previous.and_then(|p| p.next_turn.clone()),
        conditions,
    }
}

#[cfg(test)]
#[path = "turn_tests.rs"]
mod tests;
