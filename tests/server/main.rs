//! `baton server` against a real API server, the real controller and real `baton worker`
//! processes; every request made with a ServiceAccount token minted for the test:
//! - `stream`: a run's stream, across a worker's kill -9 and a handoff, equals its ledger, and a
//!   reconnect at every position gets exactly the rest; a client that leaves mid-run and
//!   comes back loses and repeats nothing; many streams of one caller share one hub;
//! - `chunked`: an event stored as chunks is streamed whole, from the start and to a client
//!   that resumes between its chunks;
//! - `api`: who may do what (no token, a token without transcript rights, another
//!   namespace), the answers to stop, inputs and approvals (409s naming why), bad bodies;
//! - `console`: signing in (a token, or `baton console`'s one-time address), what a signed-in
//!   browser is shown and refused, the CSRF header a write by cookie needs;
//! - `own_agent`: a run that brings its own agent on the console page: its model calls (each
//!   API, whole and streamed), its step and its divergence shown;
//! - `bounds`: a long ledger served and replayed a page at a time; a client that reads nothing
//!   is dropped;
//! - `hostile`: no credential, a body over its bound, a head or body withheld: answered or
//!   dropped within seconds, the body unread;
//! - `ledger`: the PostgreSQL ledger served to its writers: a worker's pod-bound token at its
//!   own attempt's fence only, the controller's seal, and every other token refused; a run
//!   kept there, read through the server and deleted with its rows;
//! - `pg_history`: a turn's earlier turns kept in PostgreSQL read through the server in one
//!   request; the read refused, its body unread, without a token or the right to read ledgers;
//! - `ledger_tls`: the same over HTTPS, the controller trusting the server's CA alone and
//!   handing it to the worker pod; writers trusting another CA, the system's roots or plain
//!   HTTP get nothing; `baton transcript --server-ca-file` reads it;
//! - `ledger_outage`: a run kept in PostgreSQL waits out the database's crash, says so, and
//!   loses nothing (`pg_runs`: such runs' controller, server and workers, as the chart sets
//!   them up);
//! - `proxy`: behind an authenticating proxy, the API server decides whom its header may name;
//! - `transcript_cli`: `baton transcript -f --server` with the kubeconfig's own credential
//!   follows a run kept in PostgreSQL across the real server's kill, each line once;
//! - `a2a`: the official `a2a-sdk` client, unchanged, follows a thread's task across its
//!   worker's kill -9 and its own resubscribe after the last event it had, each event once; a
//!   conversation of three turns; a cancel;
//! - `responses`: the stock `openai` SDK, unchanged, follows a background response across its
//!   worker's kill -9 and its own reconnect (`starting_after`), each event once; a
//!   conversation of three turns; a cancel;
//! - `threads`: a turn posted over HTTP streams on the thread's stream, turn after turn, and
//!   `onBusy: Reject` answers 409 `ThreadBusy`.

mod a2a;
mod api;
mod bounds;
mod chunked;
mod clients;
mod console;
mod hostile;
mod ledger;
mod ledger_outage;
mod ledger_tls;
mod own_agent;
mod pg_history;
mod pg_runs;
mod proxy;
mod responses;
mod stream;
mod threads;
mod traces;
mod transcript_cli;
