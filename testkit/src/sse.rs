//! A small Server-Sent Events reader for the tests that follow `baton server`'s streams (on
//! the API-server bed and on the node).

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

/// The longest a test waits for the next event (heartbeats come every 15 s).
const NEXT: Duration = Duration::from_secs(60);

/// A plain HTTP client (the server speaks HTTP; no TLS provider needed).
pub fn http() -> reqwest::Client {
    reqwest::Client::builder().build().expect("an HTTP client")
}

/// One Server-Sent Event: its name, id (if any) and data as JSON.
#[derive(Debug, Clone)]
pub struct Sse {
    pub event: String,
    pub id: Option<String>,
    pub data: Value,
}

/// A stream being read.
pub struct SseReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buffer: String,
    pub heartbeats: usize,
}

impl SseReader {
    /// Opens `url` with `token`, and `last_event_id` if given; panics unless it is a 200
    /// event stream.
    pub async fn open(url: &str, token: &str, last_event_id: Option<&str>) -> Self {
        match Self::try_open(url, token, last_event_id).await {
            Ok(reader) => reader,
            Err(err) => panic!("{err}"),
        }
    }

    /// [`SseReader::open`], with a failure to connect or a non-200 answer as an error.
    pub async fn try_open(
        url: &str,
        token: &str,
        last_event_id: Option<&str>,
    ) -> Result<Self, String> {
        let mut request = http().get(url).bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = response.status();
        if status != 200 {
            let body = response.text().await.unwrap_or_default();
            return Err(format!("{url}: {status}: {body}"));
        }
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{url}"
        );
        assert_eq!(response.headers()["x-accel-buffering"], "no");
        Ok(Self {
            body: response
                .bytes_stream()
                .map(|r| r.map(|b| b.to_vec()))
                .boxed(),
            buffer: String::new(),
            heartbeats: 0,
        })
    }

    /// The next event, or None when the stream ended (closed by the server, or cut).
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = self.parse(&block) {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout(NEXT, self.body.next())
                .await
                .expect("an event within a minute")?
                .ok()?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    fn parse(&mut self, block: &str) -> Option<Sse> {
        let (mut event, mut id, mut data) = (String::from("message"), None, String::new());
        for line in block.lines() {
            if line.starts_with(':') {
                self.heartbeats += 1;
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = v.into();
            } else if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if data.is_empty() {
            return None;
        }
        let data = serde_json::from_str(&data).expect("an event's data is JSON");
        Some(Sse { event, id, data })
    }

    /// Events until (and with) the first one named `end`.
    pub async fn until_end(&mut self) -> Vec<Sse> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            let end = e.event == "end";
            out.push(e);
            if end {
                break;
            }
        }
        out
    }
}

/// The segment events of `events`, in order.
pub fn segments(events: &[Sse]) -> Vec<&Sse> {
    events.iter().filter(|e| e.event == "segment").collect()
}

/// How a whole ledger was read: how often its stream ended before the ledger did (a cut, an
/// `error` event) and the reader reconnected with its cursor, as an `EventSource` does, and why.
#[derive(Debug, Default)]
pub struct WholeRead {
    pub reconnects: usize,
    pub why: Vec<String>,
}

/// Connections in a row that may end without bringing a segment before a whole read fails,
/// and the pause before the next (an `EventSource` waits its `retry` so): a server may end a
/// stream on a failure a moment long, but one that ends it again and again without progress
/// gives no read.
pub const EMPTY_CONNECTIONS: usize = 3;
pub const RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// Reads a run's stream from its start until it has `segments` of them, reconnecting with
/// `Last-Event-ID` when the stream ends first; Ok if they came once each, in order. Only the
/// event ids (and `error` events' data) are looked at. Err, saying why, on a refused
/// connection, a segment out of order, 300 s without a byte, or [`EMPTY_CONNECTIONS`] in a
/// row that brought nothing new.
pub async fn reads_in_order(
    url: String,
    token: String,
    segments: i64,
) -> Result<WholeRead, String> {
    let mut read = WholeRead::default();
    let mut cursor = Cursor::default();
    let mut empty = 0;
    loop {
        let before = cursor.expected;
        let why = cursor.read(&url, &token, segments).await?;
        if cursor.expected > segments {
            return Ok(read);
        }
        empty = if cursor.expected == before {
            empty + 1
        } else {
            0
        };
        read.why.push(why);
        if empty == EMPTY_CONNECTIONS {
            return Err(format!(
                "{empty} connections in a row ended before they brought segment {before}: {:?}",
                read.why
            ));
        }
        read.reconnects += 1;
        if empty > 0 {
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
    }
}

/// Where a whole read stands: the next position due and the last event id.
struct Cursor {
    expected: i64,
    last_id: Option<String>,
}

impl Default for Cursor {
    fn default() -> Self {
        Self {
            expected: 1,
            last_id: None,
        }
    }
}

impl Cursor {
    /// One connection: reads until the ledger is whole (Ok, empty) or the stream ends (Ok,
    /// why it ended).
    async fn read(&mut self, url: &str, token: &str, segments: i64) -> Result<String, String> {
        let mut request = reqwest::Client::new().get(url).bearer_auth(token);
        if let Some(id) = &self.last_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        if response.status() != 200 {
            let status = response.status();
            return Err(format!(
                "{status}: {}",
                response.text().await.unwrap_or_default()
            ));
        }
        let mut body = response.bytes_stream();
        let mut pending: Vec<u8> = Vec::new();
        let mut event = String::new();
        let mut errors = Vec::new();
        while self.expected <= segments {
            let chunk = match tokio::time::timeout(Duration::from_secs(300), body.next()).await {
                Err(_) => {
                    return Err(format!(
                        "nothing for 300 s before segment {}",
                        self.expected
                    ));
                }
                Ok(None) => return Ok(format!("the stream ended; errors: {errors:?}")),
                Ok(Some(Err(e))) => {
                    return Ok(format!("the connection ended ({e}); errors: {errors:?}"));
                }
                Ok(Some(Ok(chunk))) => chunk,
            };
            pending.extend_from_slice(&chunk);
            // Fields are on lines of their own; keep the last partial line for the next chunk.
            let cut = pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            for line in pending[..cut].split(|b| *b == b'\n') {
                let line = String::from_utf8_lossy(line);
                if let Some(name) = line.strip_prefix("event: ") {
                    event = name.to_string();
                } else if let Some(data) = line.strip_prefix("data: ") {
                    if event == "error" {
                        errors.push(data.to_string());
                    }
                } else if let Some(id) = line.strip_prefix("id: ") {
                    self.segment(id)?;
                }
            }
            pending.drain(..cut);
        }
        Ok(String::new())
    }

    fn segment(&mut self, id: &str) -> Result<(), String> {
        let seq: i64 = id
            .rsplit_once(':')
            .and_then(|(_, s)| s.parse().ok())
            .unwrap_or(-1);
        if seq != self.expected {
            return Err(format!(
                "event {id} came where segment {} was due",
                self.expected
            ));
        }
        self.expected += 1;
        self.last_id = Some(id.to_string());
        Ok(())
    }
}

/// The value of gauge `name` in the server's `/metrics` text (NaN when it has none).
pub fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}
