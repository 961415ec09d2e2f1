//! The stream's cursor (pure): an event's SSE id is `<run UID>:<ledger position>`, so the
//! ledger itself is the replay buffer. A client that reconnects with `Last-Event-ID` gets the
//! segments after that position, read again from the ledger: nothing lost, nothing twice,
//! whoever served it before. The UID makes an id of a deleted run never match its namesake.

use std::fmt;

/// Why a cursor was refused (a 400 naming where it came from).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("{source_name}: {value:?} is not an event id of the form <run UID>:<position>")]
    Malformed {
        source_name: &'static str,
        value: String,
    },
    #[error("after: {0} is not a ledger position (an integer, 0 or more)")]
    BadAfter(String),
}

/// One event's place: the run (by UID) and the ledger position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventId {
    pub uid: String,
    pub seq: i64,
}

impl EventId {
    /// Parses `<uid>:<seq>`; `source_name` names the header or parameter in the error.
    pub fn parse(value: &str, source_name: &'static str) -> Result<Self, CursorError> {
        let malformed = || CursorError::Malformed {
            source_name,
            value: value.chars().take(100).collect(),
        };
        let (uid, seq) = value.rsplit_once(':').ok_or_else(malformed)?;
        let seq: i64 = seq.parse().map_err(|_| malformed())?;
        if uid.is_empty() || seq < 0 {
            return Err(malformed());
        }
        Ok(Self {
            uid: uid.to_string(),
            seq,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.uid, self.seq)
    }
}

/// Where a client asked to start: after an event id (the `Last-Event-ID` header a browser
/// sends on reconnect, or `?lastEventId=`), or after a bare position (`?after=`, for curl).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Resume {
    /// From the first segment.
    #[default]
    Start,
    /// After this event.
    After(EventId),
    /// After this position of whatever run the name now denotes.
    AfterPosition(i64),
}

impl Resume {
    /// The header wins: a browser's EventSource sends it on every reconnect, while the URL
    /// (and so any query) stays the one the page first opened.
    pub fn from_request(
        last_event_id: Option<&str>,
        after: Option<&str>,
    ) -> Result<Self, CursorError> {
        if let Some(id) = last_event_id.filter(|v| !v.is_empty()) {
            return EventId::parse(id, "Last-Event-ID").map(Resume::After);
        }
        match after.filter(|v| !v.is_empty()) {
            None => Ok(Resume::Start),
            Some(v) => match v.parse::<i64>() {
                Ok(n) if n >= 0 => Ok(Resume::AfterPosition(n)),
                _ => EventId::parse(v, "after")
                    .map(Resume::After)
                    .map_err(|_| CursorError::BadAfter(v.chars().take(100).collect())),
            },
        }
    }

    /// The position to stream after, in the run with UID `uid`. An id of another run (a
    /// deleted run of the same name) means this run is new to the client: all of it.
    pub fn position_in(&self, uid: &str) -> i64 {
        match self {
            Resume::Start => 0,
            Resume::After(id) if id.uid == uid => id.seq,
            Resume::After(_) => 0,
            Resume::AfterPosition(n) => *n,
        }
    }
}

#[cfg(test)]
#[path = "cursor_tests.rs"]
mod tests;
