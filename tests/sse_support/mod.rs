//! A small Server-Sent Events reader for the tests that follow `baton server`'s streams (on
//! the API-server bed and on the node).

#![allow(dead_code)]

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
