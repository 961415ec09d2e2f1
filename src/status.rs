//! Compare-and-swap writes of an AgentRun's status, shared by the controller and the worker.
//!
//! Every phase write goes through here: the object carries the resourceVersion it was read
//! at, so the API server refuses it (409) if anything changed since. A worker's write also
//! requires the run to still be its run (same UID: a run deleted and re-created under the same
//! name is another run) at its fence, checked on the object it read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

use crate::crd::v1alpha1::{AgentRun, AgentRunStatus};
use crate::fence::{Fence, RunHolder};
use crate::kube_util::is_conflict;

/// How many times a fenced write re-reads and retries after a 409 while the fence is still ours.
const CONFLICT_RETRIES: usize = 8;

/// Errors of status writes.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The run's fence moved on: this writer lost the run and must stop writing.
    #[error("run {run} is at fence {current}, not ours ({ours}): the run was lost")]
    FenceMoved {
        run: String,
        ours: Fence,
        current: Fence,
    },
    /// The run's Lease no longer names this writer (its guard saw it): the run was lost.
    #[error("run {run}'s lease no longer names fence {ours}: the run was lost")]
    LeaseLost { run: String, ours: Fence },
    /// The run was deleted and re-created under the same name: it is not this writer's run.
    #[error("run {run} was re-created (uid {current}, ours {ours}): the run was lost")]
    Replaced {
        run: String,
        ours: String,
        current: String,
    },
    /// The object changed under a controller write: re-read and re-decide.
    #[error("run {run} changed since it was read")]
    Conflict { run: String },
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl StatusError {
    /// The writer lost the run (its fence moved, or the run is another one now): stop writing.
    pub fn is_lost(&self) -> bool {
        matches!(
            self,
            StatusError::FenceMoved { .. }
                | StatusError::LeaseLost { .. }
                | StatusError::Replaced { .. }
        )
    }

    pub fn label(&self) -> &'static str {
        match self {
            StatusError::FenceMoved { .. } => "fence_moved",
            StatusError::LeaseLost { .. } => "lease_lost",
            StatusError::Replaced { .. } => "replaced",
            StatusError::Conflict { .. } => "conflict",
            StatusError::Kube(_) => "kube",
        }
    }
}

/// Writes `status` on `run` as read: a single CAS, refused on any change since. Used by the
/// controller, which re-decides on conflict rather than retrying blindly.
pub async fn cas_status(
    api: &Api<AgentRun>,
    run: &AgentRun,
    status: AgentRunStatus,
) -> Result<AgentRun, StatusError> {
    let mut desired = run.clone();
    desired.status = Some(status);
    match api
        .replace_status(&run.name_any(), &PostParams::default(), &desired)
        .await
    {
        Ok(updated) => Ok(updated),
        Err(err) if is_conflict(&err) => Err(StatusError::Conflict {
            run: run.name_any(),
        }),
        Err(err) => Err(err.into()),
    }
}

/// A worker's fenced status write: reads the run, refuses if it is another run (UID) or its
/// fence is not ours, applies `change`, and writes by CAS; on 409 it re-reads and retries
/// while the run is still ours.
pub async fn fenced_update(
    api: &Api<AgentRun>,
    ours: &RunHolder,
    change: impl Fn(&mut AgentRunStatus),
) -> Result<AgentRun, StatusError> {
    let (name, fence) = (ours.run.as_str(), ours.fence);
    for _ in 0..CONFLICT_RETRIES {
        let run = api.get(name).await?;
        let uid = run.id().uid;
        if uid != ours.uid {
            return Err(StatusError::Replaced {
                run: name.into(),
                ours: ours.uid.clone(),
                current: uid,
            });
        }
        let mut status = run.status.clone().unwrap_or_default();
        if !crate::fence::status_names(status.fence, ours.fence) {
            return Err(StatusError::FenceMoved {
                run: name.into(),
                ours: fence,
                current: status.fence,
            });
        }
        change(&mut status);
        match cas_status(api, &run, status).await {
            Err(StatusError::Conflict { .. }) => continue,
            other => return other,
        }
    }
    Err(StatusError::Conflict { run: name.into() })
}

/// The most of an output the status holds: a run's status is read by every watcher of runs
/// (the controller caches it whole), so a long answer stays in the ledger only.
pub const OUTPUT_CAP_BYTES: usize = 32 * 1024;

/// Sets `status.output` to `output`, cut at [`OUTPUT_CAP_BYTES`] on a character boundary, and
/// says whether it was cut.
pub fn set_output(status: &mut AgentRunStatus, output: Option<String>) {
    let Some(mut text) = output else {
        status.output = None;
        status.output_truncated = false;
        return;
    };
    let cut = text.len() > OUTPUT_CAP_BYTES;
    if cut {
        text.truncate(crate::cut::char_floor(&text, OUTPUT_CAP_BYTES));
    }
    status.output = Some(text);
    status.output_truncated = cut;
}

/// Sets a condition in the Kubernetes convention: `lastTransitionTime` moves only when the
/// status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) {
    let status_str = if status { "True" } else { "False" };
    let now = Time(Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status_str {
                c.last_transition_time = now;
            }
            c.status = status_str.into();
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status: status_str.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation,
            last_transition_time: now,
        }),
    }
}

/// Condition types.
pub mod condition {
    pub const ADMITTED: &str = "Admitted";
    pub const LEASE_HELD: &str = "LeaseHeld";
    pub const RESUMED: &str = "Resumed";
    /// Runs with `spec.workspace`: whether the current pod has its workspace volume, and if
    /// not, why (an unbound claim, a volume not yet attached).
    pub const WORKSPACE_READY: &str = "WorkspaceReady";
    /// Runs with MCP tools: set when a server offers other tools than the run recorded when
    /// it started (the run goes on with the recorded ones).
    pub const MCP_TOOLS_CHANGED: &str = "McpToolsChanged";
    /// Set when a claim met segments that carry the run's UID label but are not its own
    /// (named for or claiming another run): they are ignored; the message names them.
    pub const FOREIGN_SEGMENTS: &str = "ForeignLedgerSegments";
    /// True once the run is in a terminal phase, whatever it is (as a Job's `Complete`, but
    /// also for runs that failed): `kubectl wait --for=condition=Complete` waits for the end.
    pub const COMPLETE: &str = "Complete";
    /// Set at the end: True when the run Succeeded, False otherwise (the reason says why):
    /// `kubectl wait --for=condition=Succeeded` waits for a success with any kubectl.
    pub const SUCCEEDED: &str = "Succeeded";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_is_cut_at_the_cap_on_a_character_boundary() {
        let mut status = AgentRunStatus::default();
        set_output(&mut status, Some("short".into()));
        assert_eq!(
            (status.output.as_deref(), status.output_truncated),
            (Some("short"), false)
        );
        // 'é' is two bytes: the cap falls inside one, so the cut moves back a byte.
        let long = format!("a{}", "é".repeat(OUTPUT_CAP_BYTES));
        set_output(&mut status, Some(long));
        let kept = status.output.clone().unwrap();
        assert!(status.output_truncated);
        assert_eq!(kept.len(), OUTPUT_CAP_BYTES - 1);
        set_output(&mut status, None);
        assert_eq!((status.output, status.output_truncated), (None, false));
    }
}
