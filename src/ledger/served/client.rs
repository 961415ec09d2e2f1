//! A writer's side of a ledger served by `baton server` (runs kept in PostgreSQL): the same
//! fenced append and ordered read as a backend of its own, over HTTP, authenticated by the
//! writer's ServiceAccount token for [`LEDGER_AUDIENCE`]. The fence's verdict is the
//! server's (`append_fenced` runs there); a run lost comes back as the same error.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use kube::ResourceExt;

use super::wire::{AppendOutcome, AppendRequest, Deleted, ledger_path};
use super::wire::{LedgersRequest, MAX_RUNS_PER_READ, RunRef, ledgers_path};
use crate::crd::RUN_UID_LABEL;
use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment};
use crate::fence::Fence;
use crate::ledger::{
    Appended, LedgerError, SEGMENT_BUDGET_BYTES, encode_events, own_segments_after,
};

/// Where a writer's ledger token comes from.
#[derive(Clone, Debug)]
pub enum LedgerToken {
    /// A projected token file, read at every request: the kubelet rotates it.
    File(PathBuf),
    /// A token given once (tests; a process with no projected volume).
    Fixed(String),
}

impl LedgerToken {
    fn read(&self) -> Result<String, LedgerError> {
        match self {
            LedgerToken::Fixed(token) => Ok(token.clone()),
            LedgerToken::File(path) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|e| LedgerError::Client {
                    message: format!("reading the ledger token {}: {e}", path.display()),
                }),
        }
    }
}

/// `baton server`, as a ledger's writers reach it.
#[derive(Clone, Debug)]
pub struct LedgerClient {
    http: reqwest::Client,
    /// `http(s)://host:port`, no trailing slash.
    base: String,
    token: LedgerToken,
    /// The CA (PEM) the server's certificate must chain to, when it serves TLS: the only one
    /// trusted, so no public CA's certificate for that address is taken instead.
    ca: Option<String>,
}

/// The longest an append or a read may take before it is given up and retried. A server
/// replica that dies without closing its connections (its pod's network gone, no reset
/// sent) would otherwise hold a writer, and a worker's handoff, until TCP gave up minutes
/// later. A request the server still completes after this is met by the retry as our own.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

impl LedgerClient {
    pub fn new(base: &str, token: LedgerToken) -> Self {
        Self {
            http: client(Vec::new()).expect("an HTTP client with the process's TLS provider"),
            base: base.trim_end_matches('/').to_string(),
            token,
            ca: None,
        }
    }

    /// The same server, whose certificate must chain to the CA in `pem` (and to no other).
    pub fn trusting(self, pem: &str) -> Result<Self, LedgerError> {
        let refused = |detail: String| LedgerError::Client {
            message: format!("the ledger server's CA: {detail}"),
        };
        let roots = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| refused(e.to_string()))?;
        if roots.is_empty() {
            return Err(refused("no certificate in it".into()));
        }
        Ok(Self {
            http: client(roots).map_err(|e| refused(e.to_string()))?,
            ca: Some(pem.to_string()),
            ..self
        })
    }

    /// The CA (PEM) the server's certificate is checked against, if it serves TLS.
    pub fn ca(&self) -> Option<&str> {
        self.ca.as_deref()
    }

    /// The server's address.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The whole ledger of each run of `runs` in `namespace`, in their order, each ordered and
    /// checked contiguous: one request for every [`MAX_RUNS_PER_READ`] runs.
    pub async fn read_runs(
        &self,
        namespace: &str,
        runs: &[RunRef],
    ) -> Result<Vec<Vec<LedgerSegment>>, LedgerError> {
        let url = format!("{}{}", self.base, ledgers_path(namespace));
        let mut ledgers = Vec::with_capacity(runs.len());
        for chunk in runs.chunks(MAX_RUNS_PER_READ) {
            let request = LedgersRequest {
                runs: chunk.to_vec(),
            };
            let answer = self.send(self.http.post(&url).json(&request)).await;
            match answer {
                Ok(segments) => ledgers.extend(each_runs(segments, chunk)?),
                Err(err) if predates_reads_of_many(&err) => {
                    ledgers.extend(self.read_each(namespace, chunk).await?)
                }
                Err(err) => return Err(err),
            }
        }
        Ok(ledgers)
    }

    /// Each run's ledger on its own, one request each: what a server of a release before
    /// the read of several ledgers (0.1.0) serves, during a rollout.
    async fn read_each(
        &self,
        namespace: &str,
        runs: &[RunRef],
    ) -> Result<Vec<Vec<LedgerSegment>>, LedgerError> {
        let reads = runs
            .iter()
            .map(|r| async move { self.for_run(namespace, &r.run, &r.uid).list().await });
        futures::future::join_all(reads).await.into_iter().collect()
    }

    /// Sends `request` with the caller's token; the body of a 2xx answer.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, LedgerError> {
        let token = self.token.read()?;
        let response = request
            .bearer_auth(token)
            .send()
            .await
            .map_err(unreachable)?;
        answer(response).await
    }

    /// The served ledger of `run` (UID `uid`) in `namespace`.
    pub fn for_run(&self, namespace: &str, run: &str, uid: &str) -> ServedLedger {
        ServedLedger {
            server: self.clone(),
            url: format!("{}{}", self.base, ledger_path(namespace, run)),
            run: run.to_string(),
            uid: uid.to_string(),
        }
    }
}

/// One run's ledger, served.
#[derive(Clone, Debug)]
pub struct ServedLedger {
    server: LedgerClient,
    url: String,
    run: String,
    uid: String,
}

impl ServedLedger {
    /// Fenced append: `events` at `tail + 1` onwards under `fence`, ruled by the server. Sent
    /// as the segments it is stored as, one request each, each at the tail the one before
    /// reached (as the API-server backend creates them one by one): the server reads at most
    /// one segment's body per request.
    pub async fn append(
        &self,
        tail: i64,
        fence: Fence,
        events: Vec<LedgerEvent>,
    ) -> Result<Appended, LedgerError> {
        let mut appended = Appended {
            tail,
            ..Appended::default()
        };
        let mut groups = encode_events(events, SEGMENT_BUDGET_BYTES)?;
        if groups.is_empty() {
            // Still asked: the answer says whether the run is still this writer's.
            groups.push(Vec::new());
        }
        for group in groups {
            let request = AppendRequest {
                uid: self.uid.clone(),
                tail: appended.tail,
                fence,
                events: group,
            };
            let outcome: AppendOutcome = self
                .send(self.server.http.post(&self.url).json(&request))
                .await?;
            let step = outcome.into_result()?;
            appended.tail = step.tail;
            appended.slipped.extend(step.slipped);
            appended.written.extend(step.written);
        }
        Ok(appended)
    }

    /// All segments of the run, ordered and checked contiguous, this run's only.
    pub async fn list(&self) -> Result<Vec<LedgerSegment>, LedgerError> {
        self.list_after(0).await
    }

    /// The segments after position `after`, ordered and checked contiguous from there.
    pub async fn list_after(&self, after: i64) -> Result<Vec<LedgerSegment>, LedgerError> {
        let position = after.to_string();
        let params = [("uid", self.uid.as_str()), ("after", position.as_str())];
        let url = self.url_with(&params)?;
        let segments: Vec<LedgerSegment> = self.send(self.server.http.get(url)).await?;
        own_segments_after(segments, &self.run, &self.uid, after)
    }

    /// Deletes the run's ledger for good (baton's controller, once the run is being
    /// deleted); returns how many segments there were.
    pub async fn delete(&self) -> Result<i64, LedgerError> {
        let url = self.url_with(&[("uid", self.uid.as_str())])?;
        let deleted: Deleted = self.send(self.server.http.delete(url)).await?;
        Ok(deleted.segments)
    }

    /// Sends `request` with the writer's token; the body of a 2xx answer.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, LedgerError> {
        self.server.send(request).await
    }

    /// The run's ledger address with `params`.
    fn url_with(&self, params: &[(&str, &str)]) -> Result<reqwest::Url, LedgerError> {
        reqwest::Url::parse_with_params(&self.url, params).map_err(|e| LedgerError::Client {
            message: format!("the ledger server's address {}: {e}", self.url),
        })
    }
}

/// True when `err` is a server's answer that it has no read of several ledgers (404: no such
/// route; 405: the path is served, not that method).
fn predates_reads_of_many(err: &LedgerError) -> bool {
    matches!(
        err,
        LedgerError::Served {
            code: Some(404 | 405),
            ..
        }
    )
}

/// `segments` (as the server answered a read of `runs`) as each run's ledger, in the order
/// of `runs`, each its own run's only, ordered and checked contiguous.
fn each_runs(
    segments: Vec<LedgerSegment>,
    runs: &[RunRef],
) -> Result<Vec<Vec<LedgerSegment>>, LedgerError> {
    let mut by_uid: HashMap<String, Vec<LedgerSegment>> = HashMap::new();
    for segment in segments {
        if let Some(uid) = segment.labels().get(RUN_UID_LABEL) {
            by_uid.entry(uid.clone()).or_default().push(segment);
        }
    }
    runs.iter()
        .map(|r| {
            let found = by_uid.get(&r.uid).cloned().unwrap_or_default();
            own_segments_after(found, &r.run, &r.uid, 0)
        })
        .collect()
}

/// The writers' HTTP client: bounded waits, and when `roots` are given, those alone trusted.
fn client(roots: Vec<reqwest::Certificate>) -> reqwest::Result<reqwest::Client> {
    crate::kube_util::ensure_crypto_provider();
    let builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .tcp_keepalive(CONNECT_TIMEOUT);
    match roots.is_empty() {
        true => builder.build(),
        false => builder.tls_certs_only(roots).build(),
    }
}

/// A request that got no answer, with every cause under it: a refused certificate says
/// why only in its source (an unknown issuer, a name that does not match).
fn unreachable(err: reqwest::Error) -> LedgerError {
    LedgerError::Served {
        code: None,
        message: format!(
            "cannot reach the ledger server: {}",
            crate::causes::with_causes(&err)
        ),
    }
}

/// The body of a 2xx answer; any other answer as the server's own message.
async fn answer<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Result<T, LedgerError> {
    let code = response.status();
    if !code.is_success() {
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let message = body["message"].as_str().unwrap_or("no message").to_string();
        return Err(LedgerError::Served {
            code: Some(code.as_u16()),
            message,
        });
    }
    response.json().await.map_err(|e| LedgerError::Served {
        code: Some(code.as_u16()),
        message: format!("the answer does not read: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What this process cannot send is not the server's answer: a worker whose token file
    /// is unreadable fails at once instead of retrying "transient" for as long as its lease
    /// holds.
    #[test]
    fn an_unreadable_token_or_ca_is_not_transient() {
        let token = LedgerToken::File(PathBuf::from("/nonexistent/baton/token"));
        let err = token.read().unwrap_err();
        assert!(matches!(err, LedgerError::Client { .. }), "{err:?}");
        assert!(!err.is_transient(), "{err}");
        let server = LedgerClient::new("http://127.0.0.1:1", LedgerToken::Fixed("t".into()));
        let err = server.trusting("not a certificate").unwrap_err();
        assert!(!err.is_transient(), "{err}");
    }

    /// During a rollout a worker may reach a server of 0.1.0, which has no read of several
    /// ledgers (404): the history is read run by run, as that release's workers read it.
    #[tokio::test]
    async fn a_server_without_the_read_of_many_is_read_run_by_run() {
        use crate::ledger::segment_of_run;
        use crate::ledger::served::ReadQuery;
        use axum::extract::{Path, Query};
        use axum::routing::get;
        let one_run = |Path((_, run)): Path<(String, String)>, Query(q): Query<ReadQuery>| async move {
            let segments =
                [1, 2].map(|seq| segment_of_run(&run, &q.uid, seq, Fence::new(1), vec![]));
            axum::Json(segments.to_vec())
        };
        let app = axum::Router::new().route(&ledger_path("{ns}", "{run}"), get(one_run));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            use crate::serving::{Stop, Tls, serve};
            serve("test", listener, app, Tls::Plain, Stop::WithTheProcess).await
        });
        let server = LedgerClient::new(&base, LedgerToken::Fixed("t".into()));
        let runs = ["a", "b", "c"].map(|r| RunRef {
            run: r.into(),
            uid: format!("uid-{r}"),
        });
        let ledgers = server.read_runs("ns", &runs).await.unwrap();
        let read: Vec<(String, i64)> = ledgers
            .iter()
            .flatten()
            .map(|s| (s.spec.run.clone(), s.spec.seq))
            .collect();
        let expected: Vec<(String, i64)> = ["a", "b", "c"]
            .iter()
            .flat_map(|r| [(r.to_string(), 1), (r.to_string(), 2)])
            .collect();
        assert_eq!(read, expected);
    }
}
