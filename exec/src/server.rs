//! The executor's server: one worker connection, for the life of the pod.
//!
//! - It accepts exactly one connection, the worker's, then removes the socket's path, so no
//!   command it runs can connect and drive it (nor pose as it to a second worker).
//! - Commands run concurrently, each in a thread of its own; every one gets exactly one
//!   `Done`.
//! - When the worker's side closes, every command still running is killed and the executor
//!   exits: a worker that died leaves nothing running, and the pod ends with its worker.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::command::{self, Event};
use crate::protocol::{FromExecutor, FromWorker, PROTOCOL_VERSION, RunRequest, decode, encode};

/// The executor's settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    /// The commands' working directory.
    pub workspace: PathBuf,
    /// Exit if no worker connects within this long (the worker container never started).
    pub accept_timeout: Duration,
}

/// Why the executor could not serve.
#[derive(Debug)]
pub enum ServeError {
    Bind(PathBuf, std::io::Error),
    Accept(std::io::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Bind(path, e) => write!(f, "cannot listen on {}: {e}", path.display()),
            ServeError::Accept(e) => write!(f, "accepting the worker's connection: {e}"),
        }
    }
}

/// Commands running now: their id → (cancel channel, what it started once it started).
type Running = Arc<Mutex<HashMap<String, (Sender<Event>, Option<command::Tree>)>>>;

/// Serves one worker until its connection ends.
pub fn serve(config: &Config) -> Result<(), ServeError> {
    let listener = bind(&config.socket)?;
    crate::reaper::start_if_init();
    let connected = Arc::new(AtomicBool::new(false));
    watch_accept_deadline(config.accept_timeout, connected.clone());
    let (stream, _) = listener.accept().map_err(ServeError::Accept)?;
    connected.store(true, Ordering::SeqCst);
    drop(listener);
    let _ = std::fs::remove_file(&config.socket);
    log("the worker connected");
    let writer = Arc::new(Mutex::new(stream.try_clone().map_err(ServeError::Accept)?));
    let ready = FromExecutor::Ready {
        version: PROTOCOL_VERSION,
        workspace: config.workspace.display().to_string(),
    };
    send(&writer, &ready);
    let running: Running = Arc::default();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        match decode::<FromWorker>(&line) {
            Ok(FromWorker::Run(request)) => start(request, &config.workspace, &running, &writer),
            Ok(FromWorker::Cancel { id }) => cancel(&running, &id),
            Err(e) => log(&format!("ignoring a line that is not a message: {e}")),
        }
    }
    let left = kill_all(&running);
    log(&format!(
        "the worker's connection ended; {left} command(s) still running were killed"
    ));
    Ok(())
}

/// Serves from a thread of this process, on `exec.sock` in `dir` (created), with the system
/// temporary directory as the workspace; returns the socket's path. For what runs the worker
/// in-process (the worker benchmark, unit tests); in a pod the executor is its own process.
pub fn serve_in_thread(dir: &Path, accept_timeout: Duration) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let config = Config {
        socket: dir.join("exec.sock"),
        workspace: std::env::temp_dir(),
        accept_timeout,
    };
    let socket = config.socket.clone();
    std::thread::spawn(move || serve(&config));
    Ok(socket)
}

/// Listens on `path`, connectable by the worker's user: the socket's directory is a volume
/// only this pod's two containers mount, so the mode adds no reach beyond the pod.
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|e| ServeError::Bind(path.into(), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| ServeError::Bind(path.into(), e))?;
    Ok(listener)
}

/// A pod whose worker never connects would otherwise keep this container running forever.
fn watch_accept_deadline(timeout: Duration, connected: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        std::thread::sleep(timeout);
        if !connected.load(Ordering::SeqCst) {
            log(&format!(
                "no worker connected in {}s; exiting",
                timeout.as_secs()
            ));
            std::process::exit(2);
        }
    });
}

fn start(
    request: RunRequest,
    workspace: &Path,
    running: &Running,
    writer: &Arc<Mutex<UnixStream>>,
) {
    let (tx, rx) = channel();
    let id = request.id.clone();
    lock(running).insert(id.clone(), (tx.clone(), None));
    let (running, writer, workspace) = (running.clone(), writer.clone(), workspace.to_path_buf());
    std::thread::spawn(move || {
        let outcome = command::run(&request, &workspace, (tx, rx), |tree| {
            if let Some(entry) = lock(&running).get_mut(&id) {
                entry.1 = Some(tree);
            }
        });
        lock(&running).remove(&id);
        send(&writer, &FromExecutor::Done(outcome));
    });
}

fn cancel(running: &Running, id: &str) {
    if let Some((tx, _)) = lock(running).get(id) {
        let _ = tx.send(Event::Cancel);
    }
}

/// Kills everything every running command started; returns how many commands there were.
fn kill_all(running: &Running) -> usize {
    let running = lock(running);
    for tree in running.values().filter_map(|(_, tree)| tree.as_ref()) {
        tree.kill();
    }
    running.len()
}

fn send(writer: &Arc<Mutex<UnixStream>>, message: &FromExecutor) {
    // A failed write means the worker is gone; the read loop sees it and ends.
    let _ = lock(writer).write_all(&encode(message));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn log(message: &str) {
    eprintln!("baton-exec: {message}");
}
