//! The CLI's thread verbs (`chat`, `thread`) and the threads `get` lists: reads and writes
//! against the API server, as the rest of `ops`.

use std::io::Write;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};

use super::{Session, is_finished, phase_of, print_lines};
use crate::cli::render::{self, Transcript};
use crate::cli::{ChatArgs, CliError, ThreadArgs};
use crate::crd::v1alpha1::{AgentRun, AgentThread, Phase};

impl Session {
    /// Creates a turn of the thread with `message` as its input, prints its transcript as its
    /// ledger grows, and says how it ended: Ok once it succeeded, an error naming its phase
    /// and reason otherwise (a turn that waits for input or an approval ends the command too).
    pub(super) async fn chat(&self, args: ChatArgs, out: &mut impl Write) -> Result<(), CliError> {
        let namespace = self.namespace(args.target.namespace.as_deref());
        let thread = self.read_thread(&namespace, &args.target.thread).await?;
        let turn = thread.new_turn(&args.message);
        let created = crate::requests::create_turn(&self.runs(&namespace), &thread, turn)
            .await
            .map_err(|e| self.error(e))?;
        let name = created.name_any();
        writeln!(out, "turn {name} of thread {}", thread.name_any())?;
        let mut transcript = Transcript::default();
        self.follow(&created, &mut transcript, out, settled).await?;
        print_lines(out, transcript.finish())?;
        outcome(&self.read_run(&namespace, &name).await?)
    }

    /// The thread's turns in creation order, each with its transcript.
    pub(super) async fn thread(
        &self,
        args: ThreadArgs,
        out: &mut impl Write,
    ) -> Result<(), CliError> {
        let namespace = self.namespace(args.namespace.as_deref());
        let thread = self.read_thread(&namespace, &args.thread).await?;
        let uid = thread.uid().unwrap_or_default();
        let mut turns: Vec<AgentRun> = self
            .list_runs(self.runs(&namespace))
            .await?
            .into_iter()
            .filter(|r| r.is_turn_of(&args.thread, &uid))
            .collect();
        turns.sort_by_key(AgentRun::turn_order);
        if turns.is_empty() {
            writeln!(out, "Thread {} has no turns yet.", thread.name_any())?;
        }
        for (i, turn) in turns.iter().enumerate() {
            let phase = phase_of(turn);
            writeln!(out, "━━━ turn {}: {} ({phase}) ━━━", i + 1, turn.name_any())?;
            let mut transcript = Transcript::default();
            for segment in &self.ledger(turn).await? {
                print_lines(out, transcript.segment(segment))?;
            }
            print_lines(out, transcript.finish())?;
        }
        Ok(())
    }

    /// The threads of the namespace (or of all), after `get`'s runs; nothing when there are
    /// none.
    pub(super) async fn print_threads(
        &self,
        namespace: &str,
        all_namespaces: bool,
        out: &mut impl Write,
    ) -> Result<(), CliError> {
        let api: Api<AgentThread> = if all_namespaces {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), namespace)
        };
        let mut threads = api
            .list(&Default::default())
            .await
            .map_err(|e| self.error(e))?
            .items;
        if threads.is_empty() {
            return Ok(());
        }
        threads.sort_by_key(|t| (t.namespace(), t.name_any()));
        let table = render::threads_table(&threads, all_namespaces, Timestamp::now());
        write!(out, "\n{table}")?;
        Ok(())
    }

    async fn read_thread(&self, namespace: &str, name: &str) -> Result<AgentThread, CliError> {
        let api: Api<AgentThread> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await.map_err(|e| self.error(e))? {
            Some(thread) => Ok(thread),
            None => Err(CliError::ThreadNotFound {
                name: name.to_string(),
                namespace: namespace.to_string(),
            }),
        }
    }
}

/// A turn of `thread`: its input and its thread, named after the thread by the API server.
/// A turn `chat` stops following: ended, or waiting for a person.
fn settled(run: &AgentRun) -> bool {
    is_finished(run) || matches!(phase_of(run), Phase::WaitingInput | Phase::WaitingApproval)
}

/// How `chat` ends: Ok for a turn that succeeded.
fn outcome(turn: &AgentRun) -> Result<(), CliError> {
    let status = turn.status.clone().unwrap_or_default();
    let name = turn.name_any();
    let message = status.message.clone().unwrap_or_default();
    match status.phase {
        Phase::Succeeded => Ok(()),
        Phase::WaitingInput | Phase::WaitingApproval => Err(CliError::TurnWaits {
            name,
            phase: status.phase.to_string(),
            message,
        }),
        phase => Err(CliError::TurnDidNotSucceed {
            name,
            phase: phase.to_string(),
            reason: status.reason.unwrap_or_default(),
            message,
        }),
    }
}
