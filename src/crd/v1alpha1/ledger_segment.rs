//! The `LedgerSegment` custom resource: one immutable piece of a run's append-only ledger.

// kube's `printcolumn(...)` attributes repeat `type_` by design; clippy reads that as a mistake.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ContextPolicy;
use crate::fence::value::Fence;
use crate::fence::{CloseReason, EndReason};

/// The ledger format this build writes. Every worker reads all formats up to this one.
pub const LEDGER_FORMAT_VERSION: i32 = 1;

/// One segment of a run's durable, append-only ledger: the transcript and the write-ahead
/// step record. Created once at position `seq` by the owner of fence `fence`; never updated.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "baton.dev",
    version = "v1alpha1",
    kind = "LedgerSegment",
    plural = "ledgersegments",
    singular = "ledgersegment",
    shortname = "lseg",
    namespaced,
    printcolumn(name = "Run", type_ = "string", json_path = ".spec.run"),
    printcolumn(name = "Seq", type_ = "integer", json_path = ".spec.seq"),
    printcolumn(name = "Fence", type_ = "integer", json_path = ".spec.fence"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LedgerSegmentSpec {
    /// Name of the AgentRun this segment belongs to.
    #[schemars(length(min = 1))]
    pub run: String,
    /// Position in the ledger, from 1, without gaps.
    #[schemars(range(min = 1))]
    pub seq: i64,
    /// Fencing token of the writer.
    #[schemars(range(min = 1))]
    pub fence: Fence,
    /// Ledger format version of the events.
    #[serde(default = "default_format")]
    #[schemars(range(min = 1))]
    pub format: i32,
    /// The events, in order.
    #[schemars(schema_with = "events_schema")]
    pub events: Vec<LedgerEvent>,
}

fn default_format() -> i32 {
    LEDGER_FORMAT_VERSION
}

/// Events are a tagged union; Kubernetes' structural schemas cannot express one, so each event
/// is stored as an object whose `type` field is required and whose other fields are kept as written.
fn events_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "description": "The events, in order. Each has a `type` and the fields of that type.",
        "items": {
            "type": "object",
            "required": ["type"],
            "properties": { "type": { "type": "string" } },
            "x-kubernetes-preserve-unknown-fields": true
        }
    })
}

/// Who speaks in a transcript message.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// What a probe found about a step whose effect was unknown.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ProbeOutcome {
    /// The effect landed: recorded, not re-run.
    Applied,
    /// The effect did not land: the step is safe to run again.
    NotApplied,
    /// The probe could not tell.
    Unknown,
}

/// One tool of an MCP server, as listed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct McpToolRecord {
    /// The server's name for it.
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
}

/// An earlier turn a turn's history holds: which run (its UID too: a re-created namesake is
/// another turn) and up to which position of its ledger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryTurn {
    pub run: String,
    pub uid: String,
    pub up_to: i64,
    /// Where the turn's ledger is kept (absent: `LedgerSegments`, as in every history
    /// recorded before backends were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_backend: Option<super::LedgerBackend>,
}

/// How a waiting step was decided.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalOutcome {
    /// A human approved it: it runs.
    Approved,
    /// A human denied it: it does not run; the model is told why.
    Denied,
    /// No decision came within `approvalTimeoutSeconds`: denied by default.
    TimedOut,
}

/// One ledger event. Field names are part of the stored format: add, never rename. An event of
/// a kind this version does not know (a newer version wrote it) reads as
/// [`LedgerEvent::Unrecognized`], kept whole, never as a ledger that cannot be read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
// The derived (de)serializers are the known kinds' wire form; `Serialize` and `Deserialize`
// below wrap them with the unknown kinds' (serde's `remote = "Self"` keeps both).
#[serde(
    remote = "Self",
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum LedgerEvent {
    /// A worker with this fence started (its first write).
    AttemptStarted { fence: Fence, pod: String },
    /// A transcript message.
    Message { role: Role, content: String },
    /// Streamed model text. Never promoted to a message if its attempt dies.
    ModelDelta { text: String },
    /// A model call that completed, with the tokens it used (none: the provider did not say).
    /// Recorded with the turn's assistant message.
    ModelCall {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_tokens: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_tokens: Option<i64>,
    },
    /// Write-ahead record of a tool call, appended (and awaited) before the tool runs.
    StepIntent {
        step: i64,
        tool: String,
        call_id: String,
        input: String,
        idempotent: bool,
    },
    /// The step waits for a human's decision before it runs. Appended together with its
    /// `stepIntent`, so the step is never seen open (possibly run) before this.
    ApprovalRequested {
        step: i64,
        call_id: String,
        requested_at: Time,
    },
    /// The decision on a waiting step, recorded before the step runs (approved) or with its
    /// result (denied): a resumed run never applies a decision twice.
    ApprovalDecided {
        step: i64,
        outcome: ApprovalOutcome,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
    /// The tools an MCP server (the `mcp` tool `tool` of the spec) offered when the run first
    /// listed them: a resumed run offers these, whatever the server says later.
    McpTools {
        tool: String,
        tools: Vec<McpToolRecord>,
    },
    /// The tool's result.
    StepResult {
        step: i64,
        output: String,
        is_error: bool,
    },
    /// The step's worker died while it ran: its effect is unknown.
    StepUnknown { step: i64, attempt: Fence },
    /// A probe's finding for an unknown step.
    StepProbed { step: i64, outcome: ProbeOutcome },
    /// A user input consumed by the run (index into `spec.inputs`, from 0).
    Input { index: i64, content: String },
    /// The agent waits for the user's answer to an `askUser` step.
    WaitingInput { step: i64, question: String },
    /// The worker handed the run off gracefully.
    Handoff,
    /// The turn's final answer.
    Final { output: String },
    /// The turn failed for good (bad spec, permanent provider error, step budget).
    Failed { reason: EndReason, message: String },
    /// The run was stopped on request.
    Stopped,
    /// Seal: the controller claimed the run for `fence`; older owners' appends collide from here.
    Claimed { fence: Fence, pod: String },
    /// The conversation a turn continues: its thread's earlier turns, each up to the position
    /// its ledger had when this turn was first claimed. Written once, by the controller, with
    /// the turn's first seal (position 1), so every attempt rebuilds the same history.
    History {
        thread: String,
        turns: Vec<HistoryTurn>,
        /// The thread's context policy then (none: the whole history is sent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<ContextPolicy>,
    },
    /// Whole earlier turns a turn's model is not sent, oldest first, to fit its context
    /// policy, and the tokens they were estimated at. Recorded once, by its first attempt.
    HistoryDropped { turns: Vec<String>, tokens: i64 },
    /// Seal: the controller ended the run; nothing may be appended after it.
    Closed { fence: Fence, reason: CloseReason },
    /// A model call of an agent container, through the worker's gateway, complete: recorded
    /// before its last byte reaches the agent. A later attempt answers the call at place
    /// `call` (from 1) with `response`, while the agent's request equals `request` (its
    /// canonical form, `journal::canonical`). A later record of the same place (after a
    /// divergence the run continued past) replaces the earlier.
    GatewayCall {
        call: i64,
        /// Which API: `chat.completions`.
        api: String,
        request: serde_json::Value,
        /// The response body; for a streamed call, the stream's events' data in order.
        response: serde_json::Value,
    },
    /// A resumed agent's call at place `call` differed from the record at `field` (a JSON
    /// pointer into the canonical request); `onDivergence: Continue` went live from there.
    GatewayDiverged { call: i64, field: String },
    /// A piece of an event too large for one segment; `total` pieces rebuild its JSON.
    Chunk {
        index: i64,
        total: i64,
        data: String,
    },
    /// An event of a kind this version does not know, as written: readers pass over it (and
    /// say so), copies of the ledger keep it unchanged.
    #[serde(skip)]
    Unrecognized(UnrecognizedEvent),
}

/// An event a newer version wrote, whole: its `type` and every field as written.
#[derive(Clone, Debug, PartialEq)]
pub struct UnrecognizedEvent(pub serde_json::Map<String, serde_json::Value>);

impl UnrecognizedEvent {
    /// Its `type`, as written.
    pub fn kind(&self) -> &str {
        self.0
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or_default()
    }
}

impl Serialize for LedgerEvent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LedgerEvent::Unrecognized(event) => event.0.serialize(serializer),
            known => LedgerEvent::serialize(known, serializer),
        }
    }
}

impl<'de> Deserialize<'de> for LedgerEvent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let value = serde_json::Value::deserialize(deserializer)?;
        match LedgerEvent::deserialize(&value) {
            Ok(event) => Ok(event),
            // serde's words for a tag no variant has; a known kind with bad fields (or no
            // `type` at all) is an error, not an unknown kind.
            Err(err) if err.to_string().starts_with("unknown variant") => match value {
                serde_json::Value::Object(fields) => {
                    Ok(LedgerEvent::Unrecognized(UnrecognizedEvent(fields)))
                }
                _ => Err(D::Error::custom(err)),
            },
            Err(err) => Err(D::Error::custom(err)),
        }
    }
}
