//! A model server's answer read within bounds: of silence (before it begins, between the
//! events of a stream) and of size. A server that stalls or never stops ends the call with an
//! error that says so, never a silent wait. What the answer is, is sorted by [`super::answer`].

use std::time::Duration;

use bytes::Bytes;
use reqwest::Response;
use serde_json::Value;
use tokio::time::Instant;

use super::ModelError;
use super::endpoint::{ApiKey, clean, error_chain};
use crate::crd::v1alpha1::ModelSpec;

/// How long a call waits with nothing from the server, by default (`idleTimeoutSeconds`):
/// models can think for minutes before their first token.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The most one answer may send: far above any model's output (a 100,000-token answer
/// streams about 20 MB), and a bound on a server that never stops.
pub const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;
/// How much of an unexpected body an error shows.
pub(super) const SHOWN_BYTES: usize = 300;

/// The bounds of one model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The longest silence: before the answer begins, and between two events of a stream.
    pub idle: Duration,
    /// The most bytes one answer may send.
    pub max_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            idle: DEFAULT_IDLE_TIMEOUT,
            max_bytes: MAX_ANSWER_BYTES,
        }
    }
}

impl Bounds {
    /// The spec's `idleTimeoutSeconds`, or the default.
    pub fn for_spec(spec: &ModelSpec) -> Self {
        let idle = spec
            .idle_timeout_seconds
            .filter(|s| *s > 0)
            .map_or(DEFAULT_IDLE_TIMEOUT, |s| Duration::from_secs(s as u64));
        Self {
            idle,
            ..Self::default()
        }
    }
}

/// Where a call goes, with which key (never shown) and within which bounds: what every error
/// of the call names.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub key: ApiKey,
    pub bounds: Bounds,
}

impl Target {
    /// `message` about this call, the key redacted, bounded.
    pub fn error_text(&self, message: &str) -> String {
        clean(&self.key, &format!("POST {}: {message}", self.url))
    }

    /// A JSON answer that holds neither an answer (`missing` is what it lacks) nor an error.
    pub fn not_an_answer(&self, answer: &Value, missing: &str) -> ModelError {
        let text = answer.to_string();
        let shown: String = text.chars().take(SHOWN_BYTES).collect();
        ModelError::Permanent {
            status: None,
            message: self.error_text(&format!(
                "a JSON answer without {missing}, neither an answer nor an error: {shown}"
            )),
        }
    }

    /// The server sent nothing for the idle bound.
    pub(super) fn silent(&self, when: &str) -> ModelError {
        let seconds = self.bounds.idle.as_secs();
        ModelError::Retryable {
            message: self.error_text(&format!(
                "the model server sent nothing for {seconds} s {when} (agent.model.idleTimeoutSeconds)"
            )),
            retry_after: None,
        }
    }
}

/// A response body read chunk by chunk within the call's bounds, keeping its first bytes for
/// the errors that need to show what came.
pub struct BodyReader {
    response: Response,
    target: Target,
    read: usize,
    first: Vec<u8>,
    /// When the answer last moved: its start, then each event (pings and comments aside).
    moved: Instant,
    /// Whether any of the answer came yet (the errors say "before" or "mid-answer").
    began: bool,
}

impl std::fmt::Debug for BodyReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyReader")
            .field("url", &self.target.url)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl BodyReader {
    pub fn new(response: Response, target: Target) -> Self {
        Self {
            response,
            target,
            read: 0,
            first: Vec::new(),
            moved: Instant::now(),
            began: false,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The answer moved: the idle bound counts from now.
    pub fn moved(&mut self) {
        self.moved = Instant::now();
    }

    /// The next chunk; None at the end. Fails when the server was silent for the idle bound
    /// since the answer last moved (retryable), when the answer passes its size bound (not
    /// retryable: the same request would be answered the same), or when the connection
    /// breaks (retryable).
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ModelError> {
        let deadline = self.moved + self.target.bounds.idle;
        let chunk = match tokio::time::timeout_at(deadline, self.response.chunk()).await {
            Err(_) => return Err(self.target.silent(self.place())),
            Ok(Err(e)) => return Err(self.broken(&e)),
            Ok(Ok(chunk)) => chunk,
        };
        let Some(chunk) = chunk else { return Ok(None) };
        self.began = true;
        self.read += chunk.len();
        if self.first.len() < SHOWN_BYTES {
            let room = SHOWN_BYTES - self.first.len();
            self.first
                .extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        if self.read > self.target.bounds.max_bytes {
            return Err(self.too_large());
        }
        Ok(Some(chunk))
    }

    /// The first bytes of the body, as text, the key redacted.
    pub fn shown(&self) -> String {
        let text = String::from_utf8_lossy(&self.first);
        let text = text.trim();
        match text.is_empty() {
            true => "(nothing)".into(),
            false => self.target.key.redact(text),
        }
    }

    /// Reads until `n` bytes came or the body ended (for an error to show them).
    pub(super) async fn read_some(&mut self, n: usize) -> Result<(), ModelError> {
        while self.read < n && self.chunk().await?.is_some() {}
        Ok(())
    }

    /// The whole body as one JSON document; a body that is not one fails the call for good,
    /// naming the content type it claimed and its first bytes.
    pub(super) async fn whole_json(&mut self, content_type: &str) -> Result<Value, ModelError> {
        let mut body = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            self.moved();
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| ModelError::Permanent {
            status: None,
            message: self.target.error_text(&format!(
                "the answer ({content_type}) is not JSON ({e}); it began: {}",
                self.shown()
            )),
        })
    }

    fn place(&self) -> &'static str {
        match self.began {
            true => "mid-answer",
            false => "before its answer began",
        }
    }

    fn broken(&self, err: &reqwest::Error) -> ModelError {
        ModelError::Retryable {
            message: self.target.error_text(&format!(
                "the connection broke {} after {} bytes: {}",
                self.place(),
                self.read,
                error_chain(err)
            )),
            retry_after: None,
        }
    }

    fn too_large(&self) -> ModelError {
        let mib = self.target.bounds.max_bytes / (1024 * 1024);
        ModelError::Permanent {
            status: None,
            message: self.target.error_text(&format!(
                "the answer passed {mib} MiB, the bound on one model answer: not read further"
            )),
        }
    }
}
