//! `baton transcript --server`: a run whose ledger is kept in PostgreSQL, read through
//! `baton server` (the CLI holds no credential of the database).
//!
//! The server acts with its caller's own bearer token, so the CLI sends the kubeconfig's
//! (a token, a token file, an exec plugin or an auth provider: kube's own client resolves
//! and refreshes each) or `--token-file`'s. Followed (`-f`) through the run's event stream,
//! which the server feeds from the database's announcements; a stream that breaks (a
//! server rollout) is opened again after the last position printed, so nothing is printed
//! twice or skipped.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use http::{Request, StatusCode};
use kube::ResourceExt;
use kube::config::AuthInfo;
use serde::Deserialize;
use sse_stream::SseStream;

use super::{CliError, Session, print_lines};
use crate::causes::with_causes;
use crate::cli::render::Transcript;
use crate::crd::v1alpha1::{AgentRun, LedgerSegment, LedgerSegmentSpec};
use crate::ledger::{own_segments_after, segment_of_run};

/// The server sends a heartbeat every 15 s: a stream silent for this long is dead (a
/// half-open connection after a node's loss) and is opened again.
const SILENCE: Duration = Duration::from_secs(60);
/// The pause before opening a broken stream again.
const REOPEN_PAUSE: Duration = Duration::from_secs(1);
/// Segments asked for at once (`GET …/segments?limit=`; the server answers at most its own
/// page, 100 today, whatever is asked).
const PAGE: usize = 100;
/// How many times in a row a stream may fail to open (or break before any new segment)
/// before `-f` gives up: longer than a server rollout takes.
const MAX_REOPENS: u32 = 60;

/// One run's segments, as `baton server` serves them.
pub struct ServerReader {
    client: kube::Client,
    base: String,
    path: String,
    run: String,
    uid: String,
}

/// What a followed stream brought.
enum Streamed {
    Segment(Box<LedgerSegment>),
    End,
}

/// Why a stream stopped short of its `end`.
enum Broken {
    /// The server or the network failed: opened again after the last position.
    Retry(String),
    /// The server refused, or sent what no stream of this run may hold.
    Fatal(String),
}

/// A `segment` event's data (`server/stream.rs`): the spec as stored, and the run's UID.
#[derive(Deserialize)]
struct SegmentEvent {
    uid: String,
    #[serde(flatten)]
    spec: LedgerSegmentSpec,
}

/// Who the CLI is to the server, and whom it trusts.
pub struct Credentials<'a> {
    /// `--token-file`: a bearer token instead of the kubeconfig user's.
    pub token_file: Option<&'a Path>,
    /// `--server-ca-file`: the CA an `https://` server's certificate chains to.
    pub ca_file: Option<&'a Path>,
    pub kubeconfig: &'a kube::Config,
}

impl ServerReader {
    /// The reader of `run` at the server `base`, acting with the token in `token_file`, else
    /// with the bearer credential of the kubeconfig's user.
    pub fn new(base: &str, with: &Credentials, run: &AgentRun) -> Result<Self, CliError> {
        let failed = |detail: String| CliError::Ledger {
            name: run.name_any(),
            detail,
        };
        let mut config = server_config(base, with.token_file, with.kubeconfig).map_err(failed)?;
        if let Some(path) = with.ca_file {
            config.root_cert = Some(ca_of(path).map_err(failed)?);
        }
        crate::kube_util::ensure_crypto_provider();
        let client = kube::Client::try_from(config)
            .map_err(|e| failed(format!("a client for --server {base}: {e}")))?;
        let path = format!(
            "/api/v1/namespaces/{}/runs/{}",
            run.id().namespace,
            run.name_any()
        );
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_string(),
            path,
            run: run.name_any(),
            uid: run.id().uid,
        })
    }

    fn failed(&self, detail: String) -> CliError {
        CliError::Ledger {
            name: self.run.clone(),
            detail,
        }
    }

    fn get(&self, path_and_query: String) -> Result<Request<Vec<u8>>, CliError> {
        Request::get(path_and_query)
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .body(Vec::new())
            .map_err(|e| self.failed(e.to_string()))
    }

    /// The segments after position `after`: this run's only, contiguous from there, read a
    /// page at a time until one comes back empty (a server may answer fewer than asked).
    async fn after(&self, mut after: i64) -> Result<Vec<LedgerSegment>, CliError> {
        let mut all = Vec::new();
        loop {
            let page = self.page(after).await?;
            let Some(last) = page.last() else {
                return Ok(all);
            };
            after = last.spec.seq;
            all.extend(page);
        }
    }

    /// One page of the segments after position `after`.
    async fn page(&self, after: i64) -> Result<Vec<LedgerSegment>, CliError> {
        let request = self.get(format!("{}/segments?after={after}&limit={PAGE}", self.path))?;
        let segments: Vec<LedgerSegment> =
            self.client.request(request).await.map_err(|e| match e {
                kube::Error::Api(s) => self.failed(format!(
                    "the server at {} answered {}: {}",
                    self.base, s.code, s.message
                )),
                other => self.failed(format!("{}: {}", self.base, with_causes(&other))),
            })?;
        own_segments_after(segments, &self.run, &self.uid, after)
            .map_err(|e| self.failed(e.to_string()))
    }

    /// The run's event stream from after position `after`.
    async fn open(&self, after: i64) -> Result<SseStream<kube::client::Body>, Broken> {
        let request = self
            .get(format!("{}/events?after={after}", self.path))
            .map_err(|e| Broken::Fatal(e.to_string()))?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await;
        let response =
            response.map_err(|e| Broken::Retry(format!("{}: {}", self.base, with_causes(&e))))?;
        let code = response.status();
        if code.is_success() {
            return Ok(SseStream::new(response.into_body()));
        }
        let body = response.into_body().collect_bytes().await;
        let message = body
            .ok()
            .and_then(|b| serde_json::from_slice::<kube::core::Status>(&b).ok())
            .map(|s| s.message)
            .unwrap_or_else(|| "no message".into());
        let why = format!("the server at {} answered {code}: {message}", self.base);
        Err(
            match code.is_server_error() || code == StatusCode::TOO_MANY_REQUESTS {
                true => Broken::Retry(why),
                false => Broken::Fatal(why),
            },
        )
    }

    /// The next segment after `tail` or the run's end; None when the stream closed.
    async fn next(
        &self,
        stream: &mut SseStream<kube::client::Body>,
        tail: i64,
    ) -> Result<Option<Streamed>, Broken> {
        loop {
            let event = match tokio::time::timeout(SILENCE, stream.next()).await {
                Err(_) => return Err(Broken::Retry(format!("silent for {SILENCE:?}"))),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(Broken::Retry(format!("{}: {e}", self.base))),
                Ok(Some(Ok(event))) => event,
            };
            let data = event.data.as_deref().unwrap_or_default();
            match event.event.as_deref() {
                Some("segment") => match segment_of_event(data, &self.run, &self.uid, tail) {
                    Ok(Some(segment)) => return Ok(Some(Streamed::Segment(Box::new(segment)))),
                    Ok(None) => continue,
                    Err(why) => return Err(Broken::Fatal(why)),
                },
                Some("end") => return Ok(Some(Streamed::End)),
                Some("error") => return Err(Broken::Fatal(format!("the server: {data}"))),
                _ => continue,
            }
        }
    }
}

/// The kubeconfig `kubeconfig` pointed at `baton server` (`base`), acting with the token in
/// `token_file` when given, else with the kubeconfig user's bearer credential. Nothing of
/// how to reach the API server is kept: not its CA, proxy or TLS name.
fn server_config(
    base: &str,
    token_file: Option<&Path>,
    kubeconfig: &kube::Config,
) -> Result<kube::Config, String> {
    let url = base
        .parse::<http::Uri>()
        .ok()
        .filter(|u| u.scheme().is_some() && u.host().is_some())
        .ok_or_else(|| format!("--server {base:?} is not a URL (http://host:port)"))?;
    let mut config = kube::Config::new(url);
    config.headers = kubeconfig.headers.clone();
    config.auth_info = match token_file {
        Some(path) => AuthInfo {
            token_file: Some(path.to_string_lossy().into_owned()),
            ..AuthInfo::default()
        },
        None => bearer_of(&kubeconfig.auth_info)?,
    };
    Ok(config)
}

/// The certificates (DER) of the PEM file at `path`: an `https://` server's CA.
fn ca_of(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let named = |e: &dyn std::fmt::Display| format!("--server-ca-file {}: {e}", path.display());
    let certs: Vec<Vec<u8>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| named(&e))?
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| named(&e))?;
    if certs.is_empty() {
        return Err(named(&"no certificate in it"));
    }
    Ok(certs)
}

/// The bearer part of a kubeconfig user. The server acts with a bearer token only: a client
/// certificate or a password cannot be passed on, and an impersonation would be dropped
/// (the read would be made as whoever impersonates), so those are refused by name.
fn bearer_of(user: &AuthInfo) -> Result<AuthInfo, String> {
    if user.impersonate.is_some() || user.impersonate_groups.is_some() {
        return Err(
            "the kubeconfig's user impersonates another (`as`), which baton server \
                    does not pass on: give the token of whom you mean with --token-file"
                .into(),
        );
    }
    let has_bearer = user.token.is_some()
        || user.token_file.is_some()
        || user.exec.is_some()
        || user.auth_provider.is_some();
    if !has_bearer {
        return Err(
            "the kubeconfig's user has no bearer token (token, tokenFile, exec or \
                    auth-provider); baton server acts with a bearer token, not a client \
                    certificate or a password: give one with --token-file"
                .into(),
        );
    }
    Ok(AuthInfo {
        token: user.token.clone(),
        token_file: user.token_file.clone(),
        exec: user.exec.clone(),
        auth_provider: user.auth_provider.clone(),
        ..AuthInfo::default()
    })
}

/// The segment a `segment` event carries if it is the one after `tail`; None for one
/// already printed (a stream opened again replays nothing before its cursor, but a server
/// may); an error for another run's segment or a gap.
fn segment_of_event(
    data: &str,
    run: &str,
    uid: &str,
    tail: i64,
) -> Result<Option<LedgerSegment>, String> {
    let event: SegmentEvent =
        serde_json::from_str(data).map_err(|e| format!("a segment event does not read: {e}"))?;
    if event.spec.run != run || event.uid != uid {
        return Err(format!(
            "the stream of {run} sent a segment of {} (UID {})",
            event.spec.run, event.uid
        ));
    }
    let seq = event.spec.seq;
    if seq <= tail {
        return Ok(None);
    }
    if seq != tail + 1 {
        return Err(format!("the stream skipped from position {tail} to {seq}"));
    }
    let spec = event.spec;
    let mut segment = segment_of_run(run, uid, seq, spec.fence, spec.events);
    segment.spec.format = spec.format;
    Ok(Some(segment))
}

impl Session {
    /// Prints the run's transcript read through the server; with `follow`, until it ends.
    pub(super) async fn transcript_served(
        &self,
        reader: &ServerReader,
        follow: bool,
        out: &mut impl Write,
    ) -> Result<(), CliError> {
        let mut transcript = Transcript::default();
        if !follow {
            for segment in reader.after(0).await? {
                print_lines(out, transcript.segment(&segment))?;
            }
            return print_lines(out, transcript.finish());
        }
        let mut tail = 0;
        let mut failures = 0;
        loop {
            let why = match reader.open(tail).await {
                Ok(mut stream) => loop {
                    match reader.next(&mut stream, tail).await {
                        Ok(Some(Streamed::Segment(segment))) => {
                            tail = segment.spec.seq;
                            failures = 0;
                            print_lines(out, transcript.segment(&segment))?;
                        }
                        Ok(Some(Streamed::End)) => return print_lines(out, transcript.finish()),
                        Ok(None) => break "the stream closed before the run's end".to_string(),
                        Err(Broken::Retry(why)) => break why,
                        Err(Broken::Fatal(why)) => return Err(reader.failed(why)),
                    }
                },
                Err(Broken::Retry(why)) => why,
                Err(Broken::Fatal(why)) => return Err(reader.failed(why)),
            };
            failures += 1;
            if failures > MAX_REOPENS {
                return Err(reader.failed(format!("gave up after {MAX_REOPENS} tries: {why}")));
            }
            eprintln!("baton: {why}; reading on after position {tail}");
            tokio::time::sleep(REOPEN_PAUSE).await;
        }
    }
}

#[cfg(test)]
#[path = "served_tests.rs"]
mod tests;
