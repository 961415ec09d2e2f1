//! A Server-Sent Events reader for the providers' streamed responses.

use std::collections::VecDeque;

use super::ModelError;
use super::body::BodyReader;

/// One Server-Sent Event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Incremental SSE parser: bytes in, complete events out. Lines are cut on raw bytes, so a
/// UTF-8 character split across network chunks is decoded whole.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseParser {
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&bytes[..end]);
            let line = std::mem::take(&mut self.line);
            self.on_line(&line, out);
            bytes = &bytes[end + 1..];
        }
        self.line.extend_from_slice(bytes);
    }

    /// The stream ended: an event without its closing blank line still counts.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.on_line(&line, out);
        }
        self.on_line(b"", out);
    }

    fn on_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        let line = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line));
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(SseEvent {
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            // Comments (":" keep-alives), `id` and `retry` mean nothing to a one-shot stream.
            _ => {}
        }
    }
}

/// Reads the events of a streamed response, within the call's bounds.
#[derive(Debug)]
pub struct SseReader {
    body: BodyReader,
    parser: SseParser,
    queue: VecDeque<SseEvent>,
    ended: bool,
    /// Events read so far (what an error says came).
    events: usize,
}

impl SseReader {
    pub fn new(body: BodyReader) -> Self {
        Self {
            body,
            parser: SseParser::default(),
            queue: VecDeque::new(),
            ended: false,
            events: 0,
        }
    }

    /// The next event; `None` once the server closed the stream. A connection that breaks
    /// off or falls silent is retryable: the model call is made again. Every event but a
    /// `ping` restarts the idle bound (a server that only pings is silent).
    pub async fn next(&mut self) -> Result<Option<SseEvent>, ModelError> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                self.events += 1;
                if event.event.as_deref() != Some("ping") {
                    self.body.moved();
                }
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            self.read().await?;
        }
    }

    async fn read(&mut self) -> Result<(), ModelError> {
        let mut events = Vec::new();
        match self.body.chunk().await? {
            Some(bytes) => self.parser.feed(&bytes, &mut events),
            None => {
                self.ended = true;
                self.parser.finish(&mut events);
            }
        }
        self.queue.extend(events);
        Ok(())
    }

    /// The stream closed before the provider said the turn was complete (`end`: what says
    /// so). Retryable: a proxy may have cut it. When no event came at all, what did is shown.
    pub fn ended_early(&self, end: &str) -> ModelError {
        let came = match self.events {
            0 => format!("no event came; the body began: {}", self.body.shown()),
            n => format!("{n} events came"),
        };
        ModelError::Retryable {
            message: self.body.target().error_text(&format!(
                "the model's stream ended before the turn was complete (no {end}): {came}"
            )),
            retry_after: None,
        }
    }
}

/// The JSON payload of an event; a malformed one is retryable (a stream cut mid-event).
pub fn json_data(data: &str) -> Result<serde_json::Value, ModelError> {
    serde_json::from_str(data).map_err(|e| ModelError::Retryable {
        message: format!("the model's stream sent a malformed event: {e}"),
        retry_after: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out);
        }
        parser.finish(&mut out);
        out
    }

    #[test]
    fn events_split_anywhere_are_reassembled() {
        let events = parse(&[
            b"event: a\r\nda",
            b"ta: {\"x\":",
            b"1}\r\n\r\n: ping\n\ndata: h\xc3",
            b"\xa9\n\n",
        ]);
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: Some("a".into()),
                    data: r#"{"x":1}"#.into()
                },
                SseEvent {
                    event: None,
                    data: "hé".into()
                },
            ]
        );
    }

    #[test]
    fn multi_line_data_and_a_missing_final_blank_line() {
        let events = parse(&[b"data: one\ndata:two\n\nevent: x\n\ndata: [DONE]"]);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].data, "one\ntwo");
        assert_eq!(events[1].data, "[DONE]");
        assert_eq!(
            events[1].event, None,
            "an event without data is dropped with its name"
        );
    }

    #[test]
    fn a_malformed_event_is_retryable_and_a_good_one_parses() {
        assert_eq!(json_data(r#"{"a":1}"#).unwrap()["a"], 1);
        let err = json_data(r#"{"a":"#).unwrap_err();
        assert!(
            matches!(&err, ModelError::Retryable { message, .. } if message.contains("malformed event")),
            "{err:?}"
        );
    }
}
