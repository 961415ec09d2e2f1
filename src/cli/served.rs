//! `baton transcript --server`: a run whose ledger is kept in PostgreSQL, read through
//! `baton server` (the CLI holds no credential of the database), with a bearer token the
//! server passes on to the API server. Followed (`-f`) by asking for what follows the last
//! position once a second until the run ends: a CLI's reader needs no more than that, and
//! it keeps one way of reading (`GET …/segments?after=`).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use kube::ResourceExt;

use super::{CliError, Session, print_lines};
use crate::cli::render::Transcript;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment};
use crate::ledger::own_segments_after;

/// How often a followed run is asked for its new segments.
const POLL: Duration = Duration::from_secs(1);

/// One run's segments, as `baton server` serves them.
pub struct ServerReader {
    http: reqwest::Client,
    url: String,
    token: String,
    run: String,
    uid: String,
}

impl ServerReader {
    /// The reader of `run` at the server `base`, with the token in `token_file`.
    pub fn new(base: &str, token_file: Option<&Path>, run: &AgentRun) -> Result<Self, CliError> {
        let failed = |detail: String| CliError::Ledger {
            name: run.name_any(),
            detail,
        };
        let path = token_file.ok_or_else(|| {
            failed("--server needs --token-file: the bearer token the server acts with".into())
        })?;
        let token = std::fs::read_to_string(path)
            .map_err(|e| failed(format!("--token-file {}: {e}", path.display())))?
            .trim()
            .to_string();
        crate::kube_util::ensure_crypto_provider();
        let url = format!(
            "{}/api/v1/namespaces/{}/runs/{}/segments",
            base.trim_end_matches('/'),
            run.namespace().unwrap_or_default(),
            run.name_any()
        );
        Ok(Self {
            http: reqwest::Client::new(),
            url,
            token,
            run: run.name_any(),
            uid: run.uid().unwrap_or_default(),
        })
    }

    /// The segments after position `after`: this run's only, contiguous from there.
    async fn after(&self, after: i64) -> Result<Vec<LedgerSegment>, CliError> {
        let failed = |detail: String| CliError::Ledger {
            name: self.run.clone(),
            detail,
        };
        let response = self
            .http
            .get(format!("{}?after={after}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| failed(format!("{}: {e}", self.url)))?;
        let code = response.status();
        if !code.is_success() {
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            let message = body["message"].as_str().unwrap_or("no message").to_string();
            return Err(failed(format!("the server answered {code}: {message}")));
        }
        let segments: Vec<LedgerSegment> = response
            .json()
            .await
            .map_err(|e| failed(format!("the server's answer does not read: {e}")))?;
        own_segments_after(segments, &self.run, &self.uid, after).map_err(|e| failed(e.to_string()))
    }
}

impl Session {
    /// Prints the run's transcript read through the server; with `follow`, until it ends.
    pub(super) async fn transcript_served(
        &self,
        run: &AgentRun,
        reader: &ServerReader,
        follow: bool,
        out: &mut impl Write,
    ) -> Result<(), CliError> {
        let mut transcript = Transcript::default();
        let mut tail = 0;
        let mut ended = !follow || super::is_finished(run);
        loop {
            for segment in reader.after(tail).await? {
                tail = segment.spec.seq;
                print_lines(out, transcript.segment(&segment))?;
            }
            if ended {
                break;
            }
            tokio::time::sleep(POLL).await;
            // One more read once the run has ended: its last segments come before its end.
            let namespace = run.namespace().unwrap_or_default();
            ended = match self.read_run(&namespace, &run.name_any()).await {
                Ok(now) => now.uid() != run.uid() || super::is_finished(&now),
                Err(CliError::RunNotFound { .. }) => true,
                Err(err) => return Err(err),
            };
        }
        print_lines(out, transcript.finish())
    }
}
