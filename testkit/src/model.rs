//! A tiny HTTP/1.1 server for the provider tests, on 127.0.0.1:0. It answers each request
//! with the next scripted reply (streamed chunk by chunk, or cut off mid-stream) and records
//! what it received. Raw TCP, so a test controls exactly where a stream breaks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::ledger::{ReplayedMessage, ToolCallRecord};
use baton::worker::model::ModelTurn;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How a reply's body is sent.
pub enum Body {
    /// All at once, with a Content-Length.
    Full(String),
    /// Chunked, each piece flushed on its own, then properly ended.
    Stream(Vec<String>),
    /// Chunked, then the connection is dropped without the final chunk.
    Cut(Vec<String>),
    /// Chunked, then nothing more, the connection held open (a server that stalls).
    Stall(Vec<String>),
    /// No answer at all: the request is read and the connection held open.
    Silent,
    /// Chunked, the same piece again and again, as fast as the client takes it, until the
    /// client goes away (a server that never stops).
    Endless(String),
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Reply {
    /// A 200 event stream sent in `pieces`.
    pub fn sse(pieces: Vec<String>) -> Self {
        Self::new(200, "text/event-stream", Body::Stream(pieces))
    }

    /// A 200 event stream whose connection breaks after `pieces`.
    pub fn cut(pieces: Vec<String>) -> Self {
        Self::new(200, "text/event-stream", Body::Cut(pieces))
    }

    pub fn json(status: u16, body: &str) -> Self {
        Self::new(status, "application/json", Body::Full(body.to_string()))
    }

    /// A whole body of any content type.
    pub fn page(status: u16, content_type: &str, body: &str) -> Self {
        Self::new(status, content_type, Body::Full(body.to_string()))
    }

    /// A 200 with no content type at all.
    pub fn untyped(body: &str) -> Self {
        let mut reply = Self::new(200, "", Body::Full(body.to_string()));
        reply.headers.clear();
        reply
    }

    /// A 200 event stream that sends `pieces`, then stalls.
    pub fn stall(pieces: Vec<String>) -> Self {
        Self::new(200, "text/event-stream", Body::Stall(pieces))
    }

    /// No answer: the server reads the request and says nothing.
    pub fn silent() -> Self {
        Self::new(200, "text/event-stream", Body::Silent)
    }

    /// A 200 event stream of `piece` repeated without end.
    pub fn endless(piece: &str) -> Self {
        Self::new(200, "text/event-stream", Body::Endless(piece.to_string()))
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn new(status: u16, content_type: &str, body: Body) -> Self {
        let headers = vec![("content-type".to_string(), content_type.to_string())];
        Self {
            status,
            headers,
            body,
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
    /// When its head had arrived whole (for the start-time figures).
    pub at: std::time::Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, v)| v.as_str())
    }
}

pub struct Server {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Server {
    /// Serves `replies` in order; once they run out, every request gets a 500.
    pub async fn start(replies: Vec<Reply>) -> Server {
        Self::start_on("127.0.0.1", replies).await
    }

    /// [`Server::start`] on another loopback address (another host, as a client sees it).
    pub async fn start_on(ip: &str, replies: Vec<Reply>) -> Server {
        Self::serve(TcpListener::bind((ip, 0)).await.unwrap(), replies)
    }

    /// [`Server::start`] on `ip` inside the network namespace `netns` (a path such as
    /// /run/netns/baton-node), where the node's pods reach it. A socket keeps the namespace it
    /// was made in, so it is bound on a thread that joined the namespace and served from here.
    pub async fn start_in_netns(netns: &str, ip: &str, replies: Vec<Reply>) -> Server {
        let (netns, ip) = (netns.to_string(), ip.to_string());
        let listener = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(&netns).unwrap_or_else(|e| panic!("{netns}: {e}"));
            // SAFETY: setns takes a valid descriptor and changes this short-lived thread only.
            let joined = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            let err = std::io::Error::last_os_error();
            assert_eq!(joined, 0, "joining the network namespace {netns}: {err}");
            let listener = std::net::TcpListener::bind((ip.as_str(), 0)).unwrap();
            listener.set_nonblocking(true).unwrap();
            listener
        });
        let listener = listener.join().expect("binding in the namespace");
        Self::serve(TcpListener::from_std(listener).unwrap(), replies)
    }

    fn serve(listener: TcpListener, replies: Vec<Reply>) -> Server {
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let log = received.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(handle(socket, replies.clone(), log.clone()));
            }
        });
        Server { url, received }
    }

    /// The run's model spec for this server, as an OpenAI-compatible endpoint (`/v1`).
    pub fn openai_model(&self) -> baton::crd::v1alpha1::ModelSpec {
        baton::crd::v1alpha1::ModelSpec {
            provider: baton::crd::v1alpha1::Provider::Openai,
            name: Some("local-model".into()),
            endpoint: Some(format!("{}/v1", self.url)),
            ..Default::default()
        }
    }

    /// Asserts it received `count` requests, all on `path`: an agent's each call once.
    pub fn assert_received(&self, count: usize, path: &str) {
        let requests = self.received();
        assert_eq!(
            requests.len(),
            count,
            "each call reached the server once: {requests:?}"
        );
        assert!(requests.iter().all(|r| r.path == path), "{requests:?}");
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

async fn handle(
    socket: TcpStream,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    log: Arc<Mutex<Vec<Received>>>,
) {
    let mut socket = BufReader::new(socket);
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    log.lock().unwrap().push(request);
    let reply = replies.lock().unwrap().pop_front();
    let reply = reply.unwrap_or_else(|| Reply::json(500, r#"{"error":"no more replies"}"#));
    let _ = write_reply(socket.get_mut(), reply).await;
}

async fn read_request(socket: &mut BufReader<TcpStream>) -> Option<Received> {
    let mut line = String::new();
    socket.read_line(&mut line).await.ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        socket.read_line(&mut line).await.ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_lowercase(), value.trim().to_string()));
    }
    let at = std::time::Instant::now();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    socket.read_exact(&mut body).await.ok()?;
    let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    Some(Received {
        method,
        path,
        headers,
        body,
        at,
    })
}

async fn write_reply(socket: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} X\r\nconnection: close\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match reply.body {
        Body::Full(body) => {
            head.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
            socket.write_all(head.as_bytes()).await?;
        }
        Body::Stream(pieces) => {
            write_chunks(socket, head, &pieces).await?;
            socket.write_all(b"0\r\n\r\n").await?;
        }
        Body::Cut(pieces) => write_chunks(socket, head, &pieces).await?,
        Body::Stall(pieces) => {
            write_chunks(socket, head, &pieces).await?;
            held_open().await;
        }
        Body::Silent => held_open().await,
        Body::Endless(piece) => {
            write_chunks(socket, head, &[]).await?;
            let frame = format!("{:x}\r\n{piece}\r\n", piece.len()).repeat(64);
            loop {
                socket.write_all(frame.as_bytes()).await?;
            }
        }
    }
    socket.flush().await?;
    socket.shutdown().await
}

/// A connection held open for longer than any test waits.
async fn held_open() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

async fn write_chunks(
    socket: &mut TcpStream,
    mut head: String,
    pieces: &[String],
) -> std::io::Result<()> {
    head.push_str("transfer-encoding: chunked\r\n\r\n");
    socket.write_all(head.as_bytes()).await?;
    for piece in pieces {
        let frame = format!("{:x}\r\n{piece}\r\n", piece.len());
        socket.write_all(frame.as_bytes()).await?;
        socket.flush().await?;
        // Separate reads on the client side, so the parsers see real fragments.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// `text` cut into pieces of `size` characters, to split events anywhere.
pub fn split_every(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// Each tool call of `turn` as (call id, tool, arguments).
pub fn calls_of(turn: &ModelTurn) -> Vec<(&str, &str, &str)> {
    turn.tool_calls
        .iter()
        .map(|c| (c.call_id.as_str(), c.tool.as_str(), c.arguments.as_str()))
        .collect()
}

/// What the agent loop does with a turn's tool calls: records them (steps 1, 2, ...) in the
/// conversation, then each one's result, `out <i>`, the second one an error.
pub fn answer_tool_calls(conversation: &mut Vec<ReplayedMessage>, turn: &ModelTurn) {
    let records = turn
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| ToolCallRecord {
            step: i as i64 + 1,
            call_id: c.call_id.clone(),
            tool: c.tool.clone(),
            input: c.arguments.clone(),
        });
    conversation.push(ReplayedMessage::Assistant {
        text: turn.text.clone(),
        tool_calls: records.collect(),
    });
    for (i, c) in turn.tool_calls.iter().enumerate() {
        conversation.push(ReplayedMessage::ToolResult {
            step: i as i64 + 1,
            call_id: c.call_id.clone(),
            tool: c.tool.clone(),
            content: format!("out {i}"),
            is_error: i == 1,
        });
    }
}
