//! Budgets (pure): whether a run may make its next model call or tool step, from what its
//! ledger says it spent. A limit is reached when the next call would pass it, so the run
//! passes a limit by at most the one call in flight when it was checked.

use std::time::Duration;

use crate::crd::v1alpha1::{BudgetSpec, RunUsage};
use crate::fence::EndReason;

/// What comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    ModelCall,
    ToolStep,
}

/// A limit reached: the run's failure reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub reason: EndReason,
    pub message: String,
}

/// The first limit `next` would pass, if any. `elapsed` is the time since the run started
/// (None: unknown, so the deadline is not judged).
pub fn check(
    budget: Option<&BudgetSpec>,
    usage: &RunUsage,
    elapsed: Option<Duration>,
    next: Next,
) -> Option<Reached> {
    let budget = budget?;
    let over = |used: i64, max: Option<i64>, field: &str, what: &str| {
        max.filter(|max| used >= *max).map(|max| Reached {
            reason: EndReason::BudgetExceeded,
            message: format!(
                "the run used {used} {what}, its budget is {max} (spec.budget.{field})"
            ),
        })
    };
    if let (Some(max), Some(elapsed)) = (budget.deadline_seconds, elapsed)
        && elapsed.as_secs() as i64 >= max
    {
        return Some(Reached {
            reason: EndReason::DeadlineExceeded,
            message: format!(
                "the run started {}s ago, its deadline is {max}s (spec.budget.deadlineSeconds)",
                elapsed.as_secs()
            ),
        });
    }
    let tokens = over(usage.total_tokens, budget.max_tokens, "maxTokens", "tokens");
    let more = match next {
        Next::ModelCall => over(
            usage.model_calls,
            budget.max_model_calls,
            "maxModelCalls",
            "model calls",
        ),
        Next::ToolStep => over(
            usage.tool_calls,
            budget.max_tool_calls,
            "maxToolCalls",
            "tool calls",
        ),
    };
    tokens.or(more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: i64, model_calls: i64, tool_calls: i64) -> RunUsage {
        RunUsage {
            total_tokens: tokens,
            model_calls,
            tool_calls,
            ..RunUsage::default()
        }
    }

    fn budget() -> BudgetSpec {
        BudgetSpec {
            max_tokens: Some(1000),
            max_model_calls: Some(3),
            max_tool_calls: Some(2),
            deadline_seconds: Some(60),
        }
    }

    #[test]
    fn no_budget_no_limit() {
        assert_eq!(
            check(None, &usage(1 << 40, 99, 99), None, Next::ModelCall),
            None
        );
    }

    #[test]
    fn a_limit_is_reached_when_the_next_call_would_pass_it() {
        let b = budget();
        let at = |u: RunUsage, next| check(Some(&b), &u, Some(Duration::from_secs(1)), next);
        assert_eq!(at(usage(999, 2, 1), Next::ModelCall), None);
        assert_eq!(at(usage(999, 2, 1), Next::ToolStep), None);
        let calls = at(usage(10, 3, 0), Next::ModelCall).unwrap();
        assert_eq!(calls.reason, EndReason::BudgetExceeded);
        assert!(
            calls.message.contains("spec.budget.maxModelCalls"),
            "{}",
            calls.message
        );
        // Three model calls do not stop a tool step the third call asked for.
        assert_eq!(at(usage(10, 3, 1), Next::ToolStep), None);
        let tools = at(usage(10, 3, 2), Next::ToolStep).unwrap();
        assert!(tools.message.contains("maxToolCalls"), "{}", tools.message);
        let tokens = at(usage(1000, 1, 0), Next::ToolStep).unwrap();
        assert!(
            tokens
                .message
                .contains("used 1000 tokens, its budget is 1000"),
            "{}",
            tokens.message
        );
    }

    #[test]
    fn the_deadline_counts_from_the_runs_start_when_it_is_known() {
        let b = budget();
        let late = check(
            Some(&b),
            &usage(0, 0, 0),
            Some(Duration::from_secs(61)),
            Next::ModelCall,
        );
        assert_eq!(late.unwrap().reason, EndReason::DeadlineExceeded);
        assert_eq!(
            check(Some(&b), &usage(0, 0, 0), None, Next::ModelCall),
            None
        );
    }
}
