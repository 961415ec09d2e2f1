//! AgentRuns built in code, with the spec's defaults filled in as the API server fills them:
//! for programs that create runs, the tests and the benchmarks.
//!
//! ```
//! use baton::crd::v1alpha1::AgentRun;
//! let run = AgentRun::builder("r")
//!     .namespace("team-a")
//!     .input("count the files")
//!     .reply("There are 3 files.")
//!     .lease(10, 2, 60)
//!     .build();
//! assert_eq!(run.spec.lease.duration_seconds, 10);
//! assert_eq!(run.spec.max_attempts, 3);
//! ```

use crate::fence::value::Fence;
use std::collections::BTreeMap;

use super::{AgentRun, AgentRunSpec, AgentRunStatus, Phase, ScriptTurn, ToolSpec};

/// Builds an [`AgentRun`]; [`AgentRun::builder`] starts one.
#[derive(Debug, Clone)]
pub struct AgentRunBuilder {
    run: AgentRun,
}

impl AgentRun {
    /// A run named `name` with input "hi" and a scripted model that answers "done"; every
    /// other field at the schema's default.
    pub fn builder(name: &str) -> AgentRunBuilder {
        let run = serde_json::from_value(serde_json::json!({
            "apiVersion": "baton.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"input": "hi", "agent": {"model": {"script": [{"text": "done"}]}}}
        }))
        .expect("the minimal AgentRun deserializes");
        AgentRunBuilder { run }
    }
}

impl AgentRunBuilder {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.run.metadata.namespace = Some(namespace.into());
        self
    }

    /// As read from the API server: the UID (and generation 1) a stored run carries.
    pub fn stored(mut self, uid: &str) -> Self {
        self.run.metadata.uid = Some(uid.into());
        self.run.metadata.generation = Some(1);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.run
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn input(mut self, input: &str) -> Self {
        self.run.spec.input = input.into();
        self
    }

    /// The scripted model's turns.
    pub fn script(mut self, turns: Vec<ScriptTurn>) -> Self {
        self.run.spec.agent_mut().model.script = turns;
        self
    }

    /// A scripted model that says `text` and ends the run.
    pub fn reply(self, text: &str) -> Self {
        self.script(vec![ScriptTurn {
            text: Some(text.into()),
            ..ScriptTurn::default()
        }])
    }

    /// `spec.inputs`: the user's answers, in order.
    pub fn inputs(mut self, inputs: &[&str]) -> Self {
        self.run.spec.inputs = inputs.iter().map(|i| i.to_string()).collect();
        self
    }

    pub fn max_steps(mut self, n: i32) -> Self {
        self.run.spec.agent_mut().max_steps = n;
        self
    }

    pub fn tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.run.spec.agent_mut().tools = tools;
        self
    }

    /// `spec.lease`: duration, renewal interval and startup allowance, in seconds.
    pub fn lease(mut self, duration: i32, renew: i32, startup: i32) -> Self {
        let lease = &mut self.run.spec.lease;
        (lease.duration_seconds, lease.renew_seconds) = (duration, renew);
        lease.startup_seconds = startup;
        self
    }

    pub fn max_attempts(mut self, n: i32) -> Self {
        self.run.spec.max_attempts = n;
        self
    }

    /// A status at `phase` and `fence` (the attempt of the same number), with `failed`
    /// attempts that ended by dying.
    pub fn at(mut self, phase: Phase, fence: i64, failed: i32) -> Self {
        self.run.status = Some(AgentRunStatus {
            phase,
            fence: Fence::new(fence),
            attempt: fence,
            failed_attempts: failed,
            ..AgentRunStatus::default()
        });
        self
    }

    pub fn status(mut self, status: AgentRunStatus) -> Self {
        self.run.status = Some(status);
        self
    }

    pub fn build(self) -> AgentRun {
        self.run
    }

    /// Only the spec (for the code that checks or plans from a spec alone).
    pub fn spec(self) -> AgentRunSpec {
        self.run.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_run_has_the_schema_defaults_and_what_was_set() {
        let run = AgentRun::builder("r")
            .namespace("ns")
            .stored("u")
            .max_attempts(2)
            .at(Phase::Running, 3, 1)
            .build();
        assert_eq!(run.metadata.uid.as_deref(), Some("u"));
        assert_eq!(run.spec.max_attempts, 2);
        assert_eq!(
            run.spec.agent().unwrap().model.script[0].text.as_deref(),
            Some("done")
        );
        let status = run.status.unwrap();
        assert_eq!(
            (status.fence.get(), status.attempt, status.failed_attempts),
            (3, 3, 1)
        );
        let default = AgentRun::builder("d").build();
        assert_eq!(default.spec.lease.duration_seconds, 30);
    }
}
