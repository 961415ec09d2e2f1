//! A run's segments as its streams send them: each chunked event rebuilt whole, in the
//! segment of its last chunk, and the segments that hold its earlier chunks sent without them
//! (their ids still mark their places, so a client's cursor moves as before). No client
//! decodes a chunk, the console among them; the one decoder is [`Unchunker`].
//!
//! A client that resumes just after a segment whose last event is a chunk before the last
//! one would meet the rest of that event without its start: when the first segment the stream
//! sends begins with a later chunk, the stream first takes in the chunks before its cursor
//! ([`chunks_before`], [`WholeSegments::take_in`]) and sends none. A stream whose first
//! segment begins otherwise reads nothing more.

use std::borrow::Cow;

use kube::ResourceExt;

use super::cursor::EventId;
use super::held::Outgoing;
use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment};
use crate::ledger::Unchunker;

/// One stream's segments, in order, as it sends them.
#[derive(Debug, Default)]
pub struct WholeSegments {
    unchunk: Unchunker,
}

impl WholeSegments {
    /// `segment` as an SSE event whose id is its place. Its events are written straight into
    /// the event from the segment (a segment may be a megabyte: no copy of it is made on the
    /// way); only a rebuilt event is new.
    pub fn segment_event(&mut self, segment: &LedgerSegment) -> Outgoing {
        let uid = segment
            .labels()
            .get(crate::crd::RUN_UID_LABEL)
            .map_or("", String::as_str);
        let id = EventId {
            uid: uid.to_string(),
            seq: segment.spec.seq,
        };
        let events = self.whole_events(segment);
        let data = SegmentData {
            run: &segment.spec.run,
            uid,
            seq: segment.spec.seq,
            fence: segment.spec.fence,
            events: &events,
        };
        Outgoing::json("segment", Some(&id.to_string()), &data)
    }

    /// The chunks of `segments`, the positions before a stream's cursor that hold the start
    /// of an event it continues after: taken in, not sent.
    pub fn take_in(&mut self, segments: &[LedgerSegment]) {
        for event in segments.iter().flat_map(|s| &s.spec.events) {
            let _ = self.unchunk.feed(event);
        }
    }

    fn whole_events<'a>(&mut self, segment: &'a LedgerSegment) -> Vec<Cow<'a, LedgerEvent>> {
        let mut events = Vec::with_capacity(segment.spec.events.len());
        for event in &segment.spec.events {
            match self.unchunk.feed(event) {
                Ok(Some(whole)) => events.push(whole),
                Ok(None) => {}
                // Sent as stored: what cannot be rebuilt is shown as it is, never hidden.
                Err(detail) => {
                    tracing::warn!(run = %segment.spec.run, seq = segment.spec.seq, %detail, "a chunked event could not be rebuilt; sent as stored");
                    events.push(Cow::Borrowed(event));
                }
            }
        }
        events
    }
}

/// For a stream whose first segment to send is `first`: when `first` begins with a chunk
/// after an event's first, the `(after, count)` of the ledger page that holds that event's
/// earlier chunks (one per segment, the segments just before `first`).
pub fn chunks_before(first: &LedgerSegment) -> Option<(i64, usize)> {
    match first.spec.events.first() {
        Some(LedgerEvent::Chunk { index, .. }) if *index > 0 && *index < first.spec.seq => {
            let count = usize::try_from(*index).ok()?;
            Some((first.spec.seq - index - 1, count))
        }
        _ => None,
    }
}

/// The `data` of a `segment` event.
#[derive(serde::Serialize)]
struct SegmentData<'a> {
    run: &'a str,
    uid: &'a str,
    seq: i64,
    fence: crate::fence::Fence,
    events: &'a [Cow<'a, LedgerEvent>],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::test_segment;
    use crate::ledger::encode_events;

    fn chunked(text_len: usize) -> (LedgerEvent, Vec<LedgerSegment>) {
        let event = LedgerEvent::Final {
            output: "x".repeat(text_len),
        };
        let groups = encode_events(vec![event.clone()], 1000).unwrap();
        let segments = groups
            .into_iter()
            .enumerate()
            .map(|(i, events)| test_segment(i as i64 + 1, 1, events))
            .collect();
        (event, segments)
    }

    fn sent(whole: &mut WholeSegments, segment: &LedgerSegment) -> serde_json::Value {
        let text = String::from_utf8(whole.segment_event(segment).as_bytes().to_vec()).unwrap();
        let data = text
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("a data line");
        serde_json::from_str(data).unwrap()
    }

    #[test]
    fn a_chunked_event_is_sent_whole_in_the_segment_of_its_last_chunk() {
        let (event, segments) = chunked(3000);
        assert!(segments.len() > 2, "{}", segments.len());
        let mut whole = WholeSegments::default();
        let data: Vec<serde_json::Value> = segments.iter().map(|s| sent(&mut whole, s)).collect();
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["seq"], i as i64 + 1, "every place is sent");
        }
        let (last, earlier) = data.split_last().unwrap();
        assert!(earlier.iter().all(|d| d["events"] == serde_json::json!([])));
        assert_eq!(last["events"], serde_json::json!([event]));
    }

    #[test]
    fn a_stream_resumed_mid_event_takes_in_the_chunks_before_its_cursor() {
        let (event, segments) = chunked(3000);
        let cursor = 2;
        let (after, count) = chunks_before(&segments[cursor]).expect("mid-event");
        assert_eq!((after, count), (0, 2), "the chunks at positions 1 and 2");
        let mut whole = WholeSegments::default();
        whole.take_in(&segments[after as usize..after as usize + count]);
        let data: Vec<serde_json::Value> = segments[cursor..]
            .iter()
            .map(|s| sent(&mut whole, s))
            .collect();
        assert_eq!(data.last().unwrap()["events"], serde_json::json!([event]));
        assert_eq!(chunks_before(&segments[0]), None, "the event starts there");
        let after_it = test_segment(segments.len() as i64 + 1, 1, vec![]);
        assert_eq!(chunks_before(&after_it), None, "nothing to take in");
    }
}
