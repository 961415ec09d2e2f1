//! The CLI's I/O: reads and writes against the API server, then hands what it read to
//! `render`. Every kube error is turned into a [`CliError`] that names the run, namespace or
//! server involved.

use std::io::Write;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::describe::{self, Description};
use super::render::{self, Transcript};
use super::{CliError, GetArgs, InputArgs, RunArgs, TranscriptArgs, Verb};
use crate::crd::v1alpha1::{AgentRun, LedgerBackend, LedgerSegment, Verdict};
use crate::kube_util::is_not_found;
use crate::ledger::{LedgerError, Ledgers};
use crate::requests::{RequestError, RunRequests, Stopped};

/// A client plus what error messages and defaults need: the server and the default namespace.
pub struct Session {
    client: Client,
    server: String,
    default_namespace: String,
    kubeconfig: Option<kube::Config>,
}

impl Session {
    pub fn new(client: Client, server: String, default_namespace: String) -> Self {
        Self {
            client,
            server,
            default_namespace,
            kubeconfig: None,
        }
    }

    /// The kubeconfig the client came from, whose user's credential `transcript --server`
    /// sends to `baton server`.
    pub fn with_kubeconfig(self, kubeconfig: kube::Config) -> Self {
        Self {
            kubeconfig: Some(kubeconfig),
            ..self
        }
    }

    /// Runs one verb, writing its output to `out`.
    pub async fn run(&self, verb: Verb, out: &mut impl Write) -> Result<(), CliError> {
        match verb {
            Verb::Get(args) => self.get(args, out).await,
            Verb::Transcript(args) => self.transcript(args, out).await,
            Verb::Stop(args) => self.stop(args, out).await,
            Verb::Input(args) => self.input(args, out).await,
            Verb::Approve(a) => {
                self.decide(&a.target, a.step, Verdict::Approve, a.reason, out)
                    .await
            }
            Verb::Deny(a) => {
                self.decide(&a.target, a.step, Verdict::Deny, Some(a.reason), out)
                    .await
            }
            Verb::Describe(args) => self.describe(args, out).await,
            Verb::Chat(args) => self.chat(args, out).await,
            Verb::Thread(args) => self.thread(args, out).await,
        }
    }

    // === verbs ===

    async fn get(&self, args: GetArgs, out: &mut impl Write) -> Result<(), CliError> {
        let namespace = self.namespace(args.namespace.as_deref());
        let mut runs = match (&args.run, args.all_namespaces) {
            (Some(name), _) => vec![self.read_run(&namespace, name).await?],
            (None, true) => self.list_runs(Api::all(self.client.clone())).await?,
            (None, false) => self.list_runs(self.runs(&namespace)).await?,
        };
        if runs.is_empty() {
            let scope = if args.all_namespaces {
                "any namespace".into()
            } else {
                format!("namespace {namespace}")
            };
            writeln!(out, "No AgentRuns found in {scope}.")?;
        } else {
            runs.sort_by_key(|r| (r.namespace(), r.name_any()));
            let table = render::runs_table(&runs, args.all_namespaces, Timestamp::now());
            write!(out, "{table}")?;
        }
        if args.run.is_none() {
            self.print_threads(&namespace, args.all_namespaces, out)
                .await?;
        }
        Ok(())
    }

    async fn transcript(&self, args: TranscriptArgs, out: &mut impl Write) -> Result<(), CliError> {
        let namespace = self.namespace(args.target.namespace.as_deref());
        let mut run = self.read_run(&namespace, &args.target.run).await?;
        if args.follow && run.status.is_none() {
            run = self.first_status(&run).await?;
        }
        if let Some(server) = args.server.as_deref()
            && LedgerBackend::of(run.status.as_ref()) == LedgerBackend::PostgreSQL
        {
            let kubeconfig = self
                .kubeconfig
                .clone()
                .unwrap_or_else(|| kube::Config::new(self.server.parse().unwrap_or_default()));
            let credentials = served::Credentials {
                token_file: args.token_file.as_deref(),
                ca_file: args.server_ca_file.as_deref(),
                kubeconfig: &kubeconfig,
            };
            let reader = served::ServerReader::new(server, &credentials, &run)?;
            return self.transcript_served(&reader, args.follow, out).await;
        }
        let segments = self.ledger(&run).await?;
        let mut transcript = Transcript::default();
        for segment in &segments {
            print_lines(out, transcript.segment(segment))?;
        }
        if args.follow && !is_finished(&run) {
            self.follow(&run, &mut transcript, out, is_finished).await?;
        }
        print_lines(out, transcript.finish())
    }

    async fn stop(&self, args: RunArgs, out: &mut impl Write) -> Result<(), CliError> {
        let namespace = self.namespace(args.namespace.as_deref());
        let name = &args.run;
        match self.requests(&namespace).stop(name).await {
            Ok(Stopped::AlreadyEnded(phase)) => {
                writeln!(out, "run {name} already ended ({phase}); nothing to stop")?
            }
            Ok(Stopped::Requested(phase)) => writeln!(
                out,
                "run {name} in {namespace}: stop requested (phase was {phase})"
            )?,
            Err(e) => return Err(self.request_error(e)),
        }
        Ok(())
    }

    async fn input(&self, args: InputArgs, out: &mut impl Write) -> Result<(), CliError> {
        let namespace = self.namespace(args.target.namespace.as_deref());
        let name = &args.target.run;
        let sent = self
            .requests(&namespace)
            .input(name, &args.text)
            .await
            .map_err(|e| self.request_error(e))?;
        writeln!(out, "run {name} in {namespace}: input #{sent} sent")?;
        Ok(())
    }

    /// `approve` and `deny`: appends the decision on the call the run waits on, checked
    /// against the run as read (a stale step, a second decision, a run that moved on: refused).
    /// What a human approves is what runs: the call, whole, from the ledger, is printed first.
    async fn decide(
        &self,
        target: &RunArgs,
        step: Option<i64>,
        verdict: Verdict,
        reason: Option<String>,
        out: &mut impl Write,
    ) -> Result<(), CliError> {
        let namespace = self.namespace(target.namespace.as_deref());
        let name = &target.run;
        let requests = self.requests(&namespace);
        let step = match verdict {
            Verdict::Approve => {
                let (step, call) = requests
                    .recorded_call(name, step)
                    .await
                    .map_err(|e| self.request_error(e))?;
                writeln!(
                    out,
                    "step {step} ({}), call {}, as the ledger records it:\n  {}",
                    call.tool, call.call_id, call.arguments
                )?;
                Some(step)
            }
            Verdict::Deny => step,
        };
        let decided = requests
            .decide(name, step, verdict, reason)
            .await
            .map_err(|e| self.request_error(e))?;
        let done = match verdict {
            Verdict::Approve => "approved",
            Verdict::Deny => "denied",
        };
        writeln!(
            out,
            "run {name} in {namespace}: step {} {done}",
            decided.step
        )?;
        Ok(())
    }

    async fn describe(&self, args: RunArgs, out: &mut impl Write) -> Result<(), CliError> {
        let namespace = self.namespace(args.namespace.as_deref());
        let run = self.read_run(&namespace, &args.run).await?;
        let segments = self.ledger(&run).await?;
        let events = self.events_of(&run).await?;
        let text = describe::describe(&Description {
            run: &run,
            segments: &segments,
            events: &events,
            now: Timestamp::now(),
        });
        write!(out, "{text}")?;
        Ok(())
    }

    // === reads ===

    fn namespace(&self, flag: Option<&str>) -> String {
        flag.unwrap_or(&self.default_namespace).to_string()
    }

    fn runs(&self, namespace: &str) -> Api<AgentRun> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn segments(&self, namespace: &str) -> Api<LedgerSegment> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn read_run(&self, namespace: &str, name: &str) -> Result<AgentRun, CliError> {
        self.runs(namespace)
            .get(name)
            .await
            .map_err(|e| self.run_error(e, namespace, name))
    }

    async fn list_runs(&self, api: Api<AgentRun>) -> Result<Vec<AgentRun>, CliError> {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| self.error(e))?;
        Ok(list.items)
    }

    async fn ledger(&self, run: &AgentRun) -> Result<Vec<LedgerSegment>, CliError> {
        let ledger = Ledgers::api_server(self.client.clone()).for_run(run);
        let listed = match ledger {
            Ok(ledger) => ledger.list().await,
            Err(err) => Err(err),
        };
        listed.map_err(|e| match e {
            LedgerError::Kube(e) => self.error(e),
            LedgerError::BackendUnavailable { backend } => CliError::Ledger {
                name: run.name_any(),
                detail: format!(
                    "its ledger is kept in {backend:?}, which only baton server reads for \
                     people: pass --server (its address), or open the run in the server's \
                     console"
                ),
            },
            other => CliError::Ledger {
                name: run.name_any(),
                detail: other.to_string(),
            },
        })
    }

    /// The run's Events from baton's components (core/v1 view, which also shows events.k8s.io
    /// Events), oldest first.
    async fn events_of(&self, run: &AgentRun) -> Result<Vec<Event>, CliError> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &run.id().namespace);
        let selector = format!(
            "involvedObject.name={},involvedObject.kind=AgentRun",
            run.name_any()
        );
        let list = api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| self.error(e))?;
        let uid = run.uid();
        let mut events: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| e.involved_object.uid.is_none() || e.involved_object.uid == uid)
            .filter(from_baton)
            .collect();
        events.sort_by_key(event_time);
        Ok(events)
    }

    fn requests(&self, namespace: &str) -> RunRequests {
        RunRequests::new(self.client.clone(), namespace)
    }

    // === errors ===

    /// A refused request becomes the CLI's error of the same name; a kube error is worded
    /// as every other.
    fn request_error(&self, err: RequestError) -> CliError {
        match err {
            RequestError::NotFound { name, namespace } => CliError::RunNotFound { name, namespace },
            RequestError::NotWaitingForInput { name, phase } => CliError::NotWaitingForInput {
                name,
                phase: phase.to_string(),
            },
            RequestError::Decision(e) => CliError::Decision(e),
            RequestError::CallNotShown { name, step } => CliError::CallNotShown { name, step },
            RequestError::Contended { name } => CliError::Contended { name },
            RequestError::Ledger { name, detail, .. } => CliError::Ledger { name, detail },
            RequestError::Kube(e) => self.error(e),
        }
    }

    fn run_error(&self, err: kube::Error, namespace: &str, name: &str) -> CliError {
        if is_not_found(&err) {
            return CliError::RunNotFound {
                name: name.to_string(),
                namespace: namespace.to_string(),
            };
        }
        self.error(err)
    }

    /// An API answer becomes `Api`; anything else (no answer at all) means unreachable.
    fn error(&self, err: kube::Error) -> CliError {
        let server = self.server.clone();
        match err {
            kube::Error::Api(status) => CliError::Api {
                server,
                detail: status.message.clone(),
            },
            other => CliError::Unreachable {
                server,
                detail: error_chain(&other),
            },
        }
    }
}

/// The error and its sources, `: `-joined (connection errors hide the cause in the chain).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

use crate::requests::phase_of;

fn is_finished(run: &AgentRun) -> bool {
    phase_of(run).is_terminal()
}

/// Whether baton's controller or a worker reported the Event: anyone who may create Events in
/// the namespace can post one about a run, and `describe` shows only baton's. (Which worker
/// posted it the Event cannot tell; the admission webhook does not review Events.)
fn from_baton(e: &Event) -> bool {
    const REPORTERS: [&str; 2] = [
        crate::events::CONTROLLER_NAME,
        crate::events::WORKER_REPORTER,
    ];
    let reporter = e
        .reporting_component
        .as_deref()
        .filter(|c| !c.is_empty())
        .or(e.source.as_ref().and_then(|s| s.component.as_deref()));
    reporter.is_some_and(|r| REPORTERS.contains(&r))
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.event_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn print_lines(out: &mut impl Write, lines: Vec<String>) -> Result<(), CliError> {
    for line in lines {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

#[path = "follow.rs"]
mod follow;
#[path = "served.rs"]
mod served;
#[path = "thread_ops.rs"]
mod thread_ops;

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
