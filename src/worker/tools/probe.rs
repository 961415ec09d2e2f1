//! Effect probes: at resume, a command that tells whether an unknown step's effect landed.
//! It runs with the step's `BATON_*` environment and its arguments as `BATON_ARG_<NAME>`.
//! Exit 0: applied. Exit 1: not applied. Anything else (other codes, timeout): unknown.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::shell::{self, Ending};
use super::{ToolEnv, Tools, parse_arguments};
use crate::crd::v1alpha1::{ProbeOutcome, ProbeSpec};

/// The probe's outcome for a shell ending.
pub fn outcome(ending: &Ending) -> ProbeOutcome {
    match ending {
        Ending::Exited(0) => ProbeOutcome::Applied,
        Ending::Exited(1) => ProbeOutcome::NotApplied,
        _ => ProbeOutcome::Unknown,
    }
}

/// `BATON_ARG_<NAME>` for each argument (name upper-cased, non-alphanumerics as `_`).
pub fn argument_vars(arguments: &str) -> Vec<(String, String)> {
    parse_arguments(arguments)
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| {
            let name: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            (format!("BATON_ARG_{name}"), value)
        })
        .collect()
}

/// Runs the probe for a step, in the tools container; no executor, or one that went away,
/// tells nothing: unknown.
pub async fn run(
    tools: &Tools,
    probe: &ProbeSpec,
    arguments: &str,
    tool_env: &ToolEnv,
    cancel: &CancellationToken,
) -> ProbeOutcome {
    let Ok(executor) = tools else {
        return ProbeOutcome::Unknown;
    };
    let mut vars = tool_env.process_vars();
    vars.extend(argument_vars(arguments));
    let timeout = Duration::from_secs(probe.timeout_seconds.max(1) as u64);
    match shell::run(executor, &probe.command, &vars, timeout, cancel).await {
        Ok(done) => outcome(&done.ending),
        Err(_) => ProbeOutcome::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::Fence;

    fn env() -> ToolEnv {
        ToolEnv {
            run: "r".into(),
            run_uid: "u".into(),
            fence: Fence::new(2),
            step: 9,
            traceparent: None,
        }
    }

    async fn probe(command: &str, timeout_seconds: i64) -> ProbeOutcome {
        let spec = ProbeSpec {
            command: command.into(),
            timeout_seconds,
        };
        let tools: Tools = Ok(std::sync::Arc::new(
            crate::worker::tools::executor::local_for_tests().await,
        ));
        run(
            &tools,
            &spec,
            r#"{"file":"/x y","n":1}"#,
            &env(),
            &CancellationToken::new(),
        )
        .await
    }

    #[tokio::test]
    async fn exit_codes_map_to_outcomes() {
        assert_eq!(probe("exit 0", 5).await, ProbeOutcome::Applied);
        assert_eq!(probe("exit 1", 5).await, ProbeOutcome::NotApplied);
        assert_eq!(probe("exit 7", 5).await, ProbeOutcome::Unknown);
        assert_eq!(probe("sleep 5", 1).await, ProbeOutcome::Unknown);
    }

    #[tokio::test]
    async fn the_probe_sees_the_step_env_and_arguments() {
        let check = r#"[ "$BATON_ARG_FILE" = "/x y" ] && [ "$BATON_ARG_N" = 1 ] && [ "$BATON_STEP" = 9 ] && [ "$BATON_IDEMPOTENCY_KEY" = u/9 ]"#;
        assert_eq!(probe(check, 5).await, ProbeOutcome::Applied);
    }
}
