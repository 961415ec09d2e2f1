//! The worker's side of the executor protocol (`baton_exec::protocol`): the one connection to
//! the tools container, opened at start and held for the worker's life, so the executor ends
//! with the worker and kills whatever it was running.
//!
//! A command sent and never answered (the executor's side closed first: the tools container
//! died) is [`ExecutorLost`]: its effect is unknown, and the caller records it so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_exec::protocol::{
    FromExecutor, FromWorker, Outcome, PROTOCOL_VERSION, RunRequest, decode, encode,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex as AsyncMutex, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long a cancelled command's `Done` may take: the executor kills the group at once and
/// drains its pipes for 2 s at most.
const CANCEL_ANSWER: Duration = Duration::from_secs(10);
/// Between attempts to connect while the tools container starts.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

/// Why the executor cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error(
        "the {container} container's executor did not listen on {path} within {waited:?} (is the {container} container running? see its logs): {last}"
    )]
    Unreachable {
        container: &'static str,
        path: PathBuf,
        waited: Duration,
        last: std::io::Error,
    },
    #[error(
        "the executor on {path} speaks protocol version {theirs}, this worker {PROTOCOL_VERSION}: the worker and the init container must come from the same baton image"
    )]
    Version { path: PathBuf, theirs: u32 },
    #[error("the executor on {path} did not greet: {0}", .detail)]
    NoGreeting { path: PathBuf, detail: String },
}

/// The executor's connection went away before it answered: the command's effect is unknown.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the tools container's executor went away before the command finished (its container died or was killed)"
)]
pub struct ExecutorLost;

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<Outcome>>>>;

/// The connection to the tools container's executor.
pub struct Executor {
    writer: AsyncMutex<OwnedWriteHalf>,
    waiting: Waiting,
    /// Cancelled once the executor's side has closed.
    closed: CancellationToken,
    next_id: AtomicU64,
    pub workspace: String,
}

impl Executor {
    /// Connects to `path`, retrying for `wait` while the tools container starts.
    pub async fn connect(path: &Path, wait: Duration) -> Result<Self, ExecutorError> {
        Self::connect_to("tools", path, wait).await
    }

    /// Connects to the executor of the container named `container` (for messages) at `path`,
    /// retrying for `wait` while it starts.
    pub async fn connect_to(
        container: &'static str,
        path: &Path,
        wait: Duration,
    ) -> Result<Self, ExecutorError> {
        let stream = connect_with_retry(container, path, wait).await?;
        let (read, writer) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let greeting = lines.next_line().await;
        let no_greeting = |detail: String| ExecutorError::NoGreeting {
            path: path.into(),
            detail,
        };
        let workspace = match greeting {
            Ok(Some(line)) => match decode::<FromExecutor>(&line) {
                Ok(FromExecutor::Ready { version, .. }) if version != PROTOCOL_VERSION => {
                    return Err(ExecutorError::Version {
                        path: path.into(),
                        theirs: version,
                    });
                }
                Ok(FromExecutor::Ready { workspace, .. }) => workspace,
                Ok(other) => return Err(no_greeting(format!("unexpected {other:?}"))),
                Err(e) => return Err(no_greeting(e.to_string())),
            },
            Ok(None) => return Err(no_greeting("the connection closed".into())),
            Err(e) => return Err(no_greeting(e.to_string())),
        };
        info!(socket = %path.display(), %workspace, container, "connected to an executor");
        let waiting: Waiting = Arc::default();
        let closed = CancellationToken::new();
        tokio::spawn(dispatch(lines, waiting.clone(), closed.clone()));
        Ok(Self {
            writer: AsyncMutex::new(writer),
            waiting,
            closed,
            next_id: AtomicU64::new(1),
            workspace,
        })
    }

    /// Runs a command; cancelling `cancel` kills it (its `Done` still comes, `Cancelled`).
    pub async fn run(
        &self,
        command: &str,
        env: &[(String, String)],
        timeout: Duration,
        cap_bytes: usize,
        cancel: &CancellationToken,
    ) -> Result<Outcome, ExecutorLost> {
        let request = RunRequest {
            id: String::new(),
            command: command.into(),
            argv: Vec::new(),
            stderr_tail: false,
            env: env.to_vec(),
            timeout_ms: timeout.as_millis() as u64,
            cap_bytes,
        };
        self.submit(request, cancel).await
    }

    /// Runs `request` (its `id` is given here); cancelling `cancel` kills it.
    pub async fn submit(
        &self,
        mut request: RunRequest,
        cancel: &CancellationToken,
    ) -> Result<Outcome, ExecutorLost> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed).to_string();
        request.id = id.clone();
        let (tx, mut rx) = oneshot::channel();
        lock(&self.waiting).insert(id.clone(), tx);
        self.send(&FromWorker::Run(request)).await?;
        tokio::select! {
            done = &mut rx => return done.map_err(|_| ExecutorLost),
            _ = self.closed.cancelled() => return Err(ExecutorLost),
            _ = cancel.cancelled() => {}
        }
        self.send(&FromWorker::Cancel { id }).await?;
        tokio::select! {
            done = tokio::time::timeout(CANCEL_ANSWER, rx) => match done {
                Ok(Ok(outcome)) => Ok(outcome),
                _ => Err(ExecutorLost),
            },
            _ = self.closed.cancelled() => Err(ExecutorLost),
        }
    }

    async fn send(&self, message: &FromWorker) -> Result<(), ExecutorLost> {
        let mut writer = self.writer.lock().await;
        writer.write_all(&encode(message)).await.map_err(|e| {
            warn!(error = %e, "writing to the executor");
            ExecutorLost
        })
    }
}

async fn connect_with_retry(
    container: &'static str,
    path: &Path,
    wait: Duration,
) -> Result<UnixStream, ExecutorError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match UnixStream::connect(path).await {
            Ok(stream) => return Ok(stream),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(ExecutorError::Unreachable {
                    container,
                    path: path.into(),
                    waited: wait,
                    last: e,
                });
            }
            Err(_) => tokio::time::sleep(CONNECT_RETRY).await,
        }
    }
}

/// Hands each `Done` to its waiter; at the connection's end, drops every waiter (each sees
/// [`ExecutorLost`]) and marks the executor closed.
async fn dispatch(
    mut lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    waiting: Waiting,
    closed: CancellationToken,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        match decode::<FromExecutor>(&line) {
            Ok(FromExecutor::Done(outcome)) => {
                if let Some(tx) = lock(&waiting).remove(&outcome.id) {
                    let _ = tx.send(outcome);
                }
            }
            Ok(other) => warn!(message = ?other, "unexpected message from the executor"),
            Err(e) => warn!(error = %e, "unreadable line from the executor"),
        }
    }
    warn!("the tools container's executor closed its connection");
    closed.cancel();
    lock(&waiting).clear();
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An executor served from a thread of this process on a socket in a fresh directory, for
/// unit tests of what drives it (the real one runs in the tools container).
#[cfg(test)]
pub async fn local_for_tests() -> Executor {
    let dir = std::env::temp_dir().join(format!("baton-exec-test-{}", rand::random::<u64>()));
    let socket = baton_exec::server::serve_in_thread(&dir, Duration::from_secs(60)).unwrap();
    Executor::connect(&socket, Duration::from_secs(10))
        .await
        .expect("connecting to the test executor")
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_exec::protocol::Ending;
    use tokio::net::UnixListener;

    #[tokio::test]
    async fn runs_commands_concurrently_and_cancels_one() {
        let executor = Arc::new(local_for_tests().await);
        let cancel = CancellationToken::new();
        let slow = {
            let (executor, cancel) = (executor.clone(), cancel.clone());
            tokio::spawn(async move {
                executor
                    .run("sleep 30", &[], Duration::from_secs(60), 100, &cancel)
                    .await
            })
        };
        let quick = executor
            .run(
                "echo $X",
                &[("X".into(), "hi".into())],
                Duration::from_secs(10),
                100,
                &CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(
            (quick.ending, quick.stdout.as_str()),
            (Ending::Exited(0), "hi\n")
        );
        cancel.cancel();
        let slow = slow.await.unwrap().unwrap();
        assert_eq!(slow.ending, Ending::Cancelled);
    }

    #[tokio::test]
    async fn an_executor_that_goes_away_mid_command_is_lost_not_an_answer() {
        let dir = std::env::temp_dir().join(format!("baton-exec-gone-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("exec.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        // A peer that greets, reads one request, then dies without answering.
        let peer = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let ready = FromExecutor::Ready {
                version: PROTOCOL_VERSION,
                workspace: "/w".into(),
            };
            write.write_all(&encode(&ready)).await.unwrap();
            let mut lines = BufReader::new(read).lines();
            lines.next_line().await.unwrap();
        });
        let executor = Executor::connect(&socket, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(executor.workspace, "/w");
        let result = executor
            .run(
                "touch /effect",
                &[],
                Duration::from_secs(5),
                100,
                &CancellationToken::new(),
            )
            .await;
        peer.await.unwrap();
        assert!(result.is_err(), "{result:?}");
    }

    #[tokio::test]
    async fn no_executor_is_a_clear_error_naming_the_socket() {
        let socket = std::env::temp_dir().join("baton-exec-nobody-listens.sock");
        let Err(err) = Executor::connect(&socket, Duration::from_millis(300)).await else {
            panic!("connected to nobody");
        };
        assert!(
            err.to_string().contains("baton-exec-nobody-listens.sock"),
            "{err}"
        );
    }
}
