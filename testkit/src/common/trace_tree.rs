//! A run's spans as a trace backend gives them back (Phoenix's REST API: `context.trace_id`,
//! `context.span_id`, `parent_id`, `attributes`, `events`), and the tree a run whose first
//! attempt was killed with kill -9 while its first tool call ran must make: the bed's worker
//! test and the node's trace test check the same tree.

use baton::crd::v1alpha1::RunUsage;
use baton::fence::Fence;
use baton::traces::RunTrace;
use serde_json::Value;

/// Attribute `key` (dotted) of a span as Phoenix gives it: flat, or nested by its dots.
pub fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let attributes = &span["attributes"];
    attributes.get(key).or_else(|| {
        key.split('.')
            .try_fold(attributes, |node, part| node.get(part))
    })
}

/// The string at `path` in a span ("" if there is none).
pub fn text<'a>(span: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .fold(span, |node, part| &node[part])
        .as_str()
        .unwrap_or_default()
}

fn attribute_text<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    attribute(span, key).and_then(Value::as_str)
}

/// The spans of one run: those naming it (`baton.run`) or in its trace.
pub struct RunSpans<'a> {
    pub spans: Vec<&'a Value>,
    /// All of them, printed: what a failed check shows.
    pub shown: String,
}

impl<'a> RunSpans<'a> {
    pub fn of(all: &'a [Value], run: &str, trace: &RunTrace) -> Self {
        let trace_id = trace.trace_id.to_string();
        let spans: Vec<&Value> = all
            .iter()
            .filter(|s| {
                attribute_text(s, "baton.run") == Some(run)
                    || text(s, &["context", "trace_id"]) == trace_id
            })
            .collect();
        let shown = serde_json::to_string_pretty(&spans).unwrap_or_default();
        Self { spans, shown }
    }

    /// The span named `name`.
    pub fn named(&self, name: &str) -> &'a Value {
        self.spans
            .iter()
            .copied()
            .find(|s| text(s, &["name"]) == name)
            .unwrap_or_else(|| panic!("no span {name:?}: {}", self.shown))
    }

    /// The model calls (`gen_ai.operation.name` = chat).
    pub fn chats(&self) -> Vec<&'a Value> {
        self.spans
            .iter()
            .copied()
            .filter(|s| attribute_text(s, "gen_ai.operation.name") == Some("chat"))
            .collect()
    }

    /// Checks the tree of run `run` of trace `trace`, whose attempt 1 was killed in its first
    /// tool call (`tool`) and attempt 2 ended it Succeeded, with `usage` in its status: every
    /// span in the one trace; the root under the caller's span if it had one; both attempts
    /// under the root, at their computed ids; the killed attempt's model call under it, and its
    /// open tool call ended by attempt 2 with an unknown-effect event; no model call without
    /// its attempt; the model calls' tokens the run's. The killed tool call's span.
    pub fn check_killed_mid_tool(
        &self,
        run: &str,
        tool: &str,
        trace: &RunTrace,
        usage: &RunUsage,
    ) -> &'a Value {
        let shown = &self.shown;
        let trace_id = trace.trace_id.to_string();
        assert!(
            self.spans
                .iter()
                .all(|s| text(s, &["context", "trace_id"]) == trace_id),
            "every span of the run is in its one trace {trace_id}: {shown}"
        );
        let root = trace.root.to_string();
        let run_span = self.named(&format!("run {run}"));
        assert_eq!(text(run_span, &["context", "span_id"]), root, "{shown}");
        assert_eq!(
            attribute_text(run_span, "baton.phase"),
            Some("Succeeded"),
            "the last attempt wrote the run's root when it ended: {shown}"
        );
        match trace.parent {
            Some(caller) => assert_eq!(
                text(run_span, &["parent_id"]),
                caller.to_string(),
                "the run's root is a child of its caller's span: {shown}"
            ),
            None => assert!(
                run_span["parent_id"].is_null(),
                "no caller's traceparent, so the root is the trace's: {shown}"
            ),
        }
        let first_id = self.check_attempt(trace, 1, "killed");
        let second_id = self.check_attempt(trace, 2, "done");
        let tool_id = trace.tool(Fence::new(1), 1).to_string();
        let tool_span = self
            .spans
            .iter()
            .copied()
            .find(|s| text(s, &["context", "span_id"]) == tool_id)
            .unwrap_or_else(|| panic!("no span of the killed call, {tool_id}: {shown}"));
        assert_eq!(text(tool_span, &["name"]), format!("execute_tool {tool}"));
        assert_eq!(text(tool_span, &["parent_id"]), first_id, "{shown}");
        assert_eq!(
            attribute_text(tool_span, "baton.outcome"),
            Some("unknown"),
            "{shown}"
        );
        let events = tool_span["events"].as_array().cloned().unwrap_or_default();
        assert!(
            events
                .iter()
                .any(|e| text(e, &["name"]) == "baton.unknown_effect"),
            "the open tool call ended with an unknown-effect event: {shown}"
        );
        self.check_model_calls(&first_id, &second_id, usage);
        let said = [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.result",
        ];
        assert!(
            self.spans
                .iter()
                .all(|s| said.iter().all(|key| attribute(s, key).is_none())),
            "nothing said is on a span unless asked for: {shown}"
        );
        tool_span
    }

    /// Checks attempt `fence`'s span (under the root, at its computed id, ended as `exit`);
    /// its id.
    fn check_attempt(&self, trace: &RunTrace, fence: i64, exit: &str) -> String {
        let shown = &self.shown;
        let attempt = self.named(&format!("attempt {fence}"));
        let id = trace.attempt(Fence::new(fence)).to_string();
        assert_eq!(text(attempt, &["context", "span_id"]), id, "{shown}");
        assert_eq!(
            text(attempt, &["parent_id"]),
            trace.root.to_string(),
            "a child of the run's root: {shown}"
        );
        assert_eq!(attribute_text(attempt, "baton.exit"), Some(exit), "{shown}");
        id
    }

    /// The killed attempt exported its one model call before it died; every model call is
    /// under the attempt that made it; their tokens add up to the run's.
    fn check_model_calls(&self, first_id: &str, second_id: &str, usage: &RunUsage) {
        let shown = &self.shown;
        let chats = self.chats();
        let of_first: Vec<&Value> = chats
            .iter()
            .copied()
            .filter(|s| text(s, &["parent_id"]) == first_id)
            .collect();
        assert_eq!(
            of_first.len(),
            1,
            "the killed attempt's model call: {shown}"
        );
        assert_eq!(
            attribute_text(of_first[0], "gen_ai.response.finish_reasons"),
            Some("tool_calls"),
            "{shown}"
        );
        assert!(
            chats
                .iter()
                .all(|s| [first_id, second_id].contains(&text(s, &["parent_id"]))),
            "every model call under the attempt that made it: no orphan in the tree: {shown}"
        );
        assert!(
            chats.iter().any(|s| text(s, &["parent_id"]) == second_id),
            "the resumed attempt's model call, under its attempt: {shown}"
        );
        self.check_tokens(usage, "the model calls' tokens, summed over both attempts");
    }

    /// Checks that the model calls' tokens add up to the run's `usage`.
    pub fn check_tokens(&self, usage: &RunUsage, what: &str) {
        let chats = self.chats();
        let tokens = |key: &str| -> i64 {
            chats
                .iter()
                .filter_map(|s| attribute(s, key).and_then(Value::as_i64))
                .sum()
        };
        assert_eq!(
            (
                tokens("gen_ai.usage.input_tokens"),
                tokens("gen_ai.usage.output_tokens")
            ),
            (usage.input_tokens, usage.output_tokens),
            "{what} are the run's: {}",
            self.shown
        );
    }
}
