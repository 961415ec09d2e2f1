//! The stock protocol clients' scripts (tests/clients/), run by the clients venv's Python
//! (tests/clients/requirements.txt: the official `openai` and `a2a-sdk`; hack/setup.sh installs
//! it), their JSON lines read as they come.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The A2A extension whose metadata carries an event's ledger number (docs/reference/a2a.md).
pub const CURSOR: &str = "https://baton.dev/a2a/ledger-cursor/v1";

/// The numbers of a full replay: `body`'s `data:` lines, each number as `number` finds it.
pub fn numbers_in(body: &str, number: impl Fn(&Value) -> Option<i64>) -> Vec<i64> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| number(&serde_json::from_str(d).unwrap()))
        .collect()
}

/// A Responses event's number.
pub fn response_number(data: &Value) -> Option<i64> {
    data["sequence_number"].as_i64()
}

/// An A2A event's number; None for the Task a resubscribe opens with.
pub fn task_event_number(data: &Value) -> Option<i64> {
    let result = &data["result"];
    (result["kind"] != "task")
        .then(|| result["metadata"][CURSOR]["sequenceNumber"].as_i64())
        .flatten()
}

/// The longest a client may be silent, or take to exit, on a loaded node.
const T: Duration = Duration::from_secs(180);

/// The Python of the clients venv.
pub fn clients_python() -> String {
    let python = crate::cache_dir().join("clients-venv/bin/python");
    python.display().to_string()
}

/// The client script, its JSON lines read as they come.
pub struct SdkClient {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    seen: Vec<Value>,
}

impl SdkClient {
    /// `tests/clients/<script>` with `args`.
    pub fn start(script: &str, args: &[&str]) -> Self {
        let script = crate::repo_root().join("tests/clients").join(script);
        let mut child = Command::new(clients_python())
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the clients venv's python (hack/setup.sh installs it)");
        let stdout = child.stdout.take().unwrap();
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        }
    }

    /// The next line that has `key`.
    pub async fn line_with(&mut self, key: &str) -> Value {
        loop {
            let next = tokio::time::timeout(T, self.lines.next_line()).await;
            let line = next.expect("the client answers").unwrap();
            let line = line.unwrap_or_else(|| panic!("the client ended before a {key:?} line"));
            let value: Value = serde_json::from_str(&line).unwrap();
            self.seen.push(value.clone());
            if value.get(key).is_some() {
                return value;
            }
        }
    }

    /// Every line until the client exits, which must be a success.
    pub async fn finish(mut self) -> Vec<Value> {
        while let Ok(Some(line)) = self.lines.next_line().await {
            self.seen.push(serde_json::from_str(&line).unwrap());
        }
        let status = tokio::time::timeout(T, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "the client failed: {:?}", self.seen);
        self.seen
    }
}
