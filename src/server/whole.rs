//! A run's segments as its streams send them: each chunked event rebuilt whole, in the
//! segment of its last chunk, and the segments that hold its earlier chunks sent without them
//! (their ids still mark their places, so a client's cursor moves as before). No client
//! decodes a chunk, the console among them; the one decoder is [`Unchunker`].
//!
//! A stream keeps nothing of a chunked event while its chunks go by: a thousand followers of
//! a 30 MB answer would hold 30 GB, outside the streams' budget. Only when it meets the last
//! chunk does it read the earlier ones again ([`earlier_chunks`]), a page at a time under a
//! reading place ([`super::held`]), rebuild the event ([`Rebuilt`]) and count it in the budget
//! before it lets the place go: the chunked events being rebuilt at once are as many as the
//! reading places. A stream that resumed between two chunks needs nothing more: it meets the
//! last chunk as any other does. A chunked event whose last chunk never came was never
//! written (its writer lost the run or died mid-event) and is not sent.

use std::borrow::Cow;

use kube::ResourceExt;

use super::cursor::EventId;
use super::held::Outgoing;
use crate::crd::v1alpha1::{LedgerEvent, LedgerSegment};
use crate::ledger::Unchunker;

/// `segment` as an SSE event whose id is its place. Its events are written straight into the
/// event from the segment (a segment may be a megabyte: no copy of it is made on the way);
/// only a rebuilt event is new. `rebuilt` is the chunked event `segment` ends, when it ends
/// one ([`earlier_chunks`]); when it could not be rebuilt, its last chunk is sent as stored:
/// what cannot be rebuilt is shown as it is, never hidden.
pub fn segment_event(
    segment: &LedgerSegment,
    rebuilt: Option<Result<LedgerEvent, String>>,
) -> Outgoing {
    let uid = segment
        .labels()
        .get(crate::crd::RUN_UID_LABEL)
        .map_or("", String::as_str);
    let id = EventId {
        uid: uid.to_string(),
        seq: segment.spec.seq,
    };
    let events = whole_events(segment, rebuilt);
    let data = SegmentData {
        run: &segment.spec.run,
        uid,
        seq: segment.spec.seq,
        fence: segment.spec.fence,
        events: &events,
    };
    Outgoing::json("segment", Some(&id.to_string()), &data)
}

/// The events `segment` shows a reader: its chunked event rebuilt whole (`rebuilt`, when it
/// ends one), the chunks before an event's last left out (part of an event not complete
/// there); a chunked event that could not be rebuilt is shown as stored, never hidden.
pub fn whole_events(
    segment: &LedgerSegment,
    rebuilt: Option<Result<LedgerEvent, String>>,
) -> Vec<Cow<'_, LedgerEvent>> {
    match rebuilt {
        Some(Ok(whole)) => vec![Cow::Owned(whole)],
        Some(Err(detail)) => {
            tracing::warn!(run = %segment.spec.run, seq = segment.spec.seq, %detail, "a chunked event could not be rebuilt; its last chunk is sent as stored");
            segment.spec.events.iter().map(Cow::Borrowed).collect()
        }
        // A chunk before an event's last is part of an event not complete here.
        None => segment
            .spec
            .events
            .iter()
            .filter(|e| !matches!(e, LedgerEvent::Chunk { .. }))
            .map(Cow::Borrowed)
            .collect(),
    }
}

/// When `segment` holds the last chunk of a chunked event: the `(after, count)` of the
/// positions that hold its earlier chunks, the `count` just before it (a writer stores each
/// chunk alone in a segment, at consecutive positions). None for any other segment. A chunk
/// that claims more chunks before it than there are positions is still the last of its
/// event: its rebuild fails, and it is sent as stored.
pub fn earlier_chunks(segment: &LedgerSegment) -> Option<(i64, usize)> {
    match segment.spec.events[..] {
        [LedgerEvent::Chunk { index, total, .. }] if index + 1 == total && index >= 0 => {
            let count = index.min(segment.spec.seq - 1).max(0);
            Some((segment.spec.seq - count - 1, usize::try_from(count).ok()?))
        }
        _ => None,
    }
}

/// The chunked event `last` ends, rebuilt from its `count` earlier chunks after position
/// `after`, read by `read(after, limit)` at most `page` at a time (the caller holds a reading
/// place): Ok(Err(what)) when the ledger holds something else there, Err when it could not
/// be read.
pub async fn rebuild<E, Read, Page>(
    after: i64,
    count: usize,
    last: &LedgerSegment,
    page: usize,
    mut read: Read,
) -> Result<Result<LedgerEvent, String>, E>
where
    Read: FnMut(i64, usize) -> Page,
    Page: Future<Output = Result<Vec<LedgerSegment>, E>>,
{
    let mut rebuilt = Rebuilt::after(after);
    let end = after.saturating_add(i64::try_from(count).unwrap_or(i64::MAX));
    let mut at = after;
    while at < end {
        let limit = usize::try_from(end - at).map_or(page, |n| n.min(page));
        let segments = read(at, limit).await?;
        if let Err(detail) = rebuilt.take_in(&segments) {
            return Ok(Err(detail));
        }
        match segments.last() {
            Some(s) if s.spec.seq > at => at = s.spec.seq,
            _ => return Ok(Err(format!("position {} missing", at + 1))),
        }
    }
    Ok(rebuilt.finish(last))
}

/// A chunked event being rebuilt from its earlier chunks, in order, then its last.
#[derive(Debug, Default)]
struct Rebuilt {
    unchunk: Unchunker,
    /// The position of the next earlier chunk.
    next: i64,
}

impl Rebuilt {
    /// A rebuild of the event whose earlier chunks follow position `after`.
    fn after(after: i64) -> Self {
        Self {
            unchunk: Unchunker::default(),
            next: after + 1,
        }
    }

    /// Takes in `segments`, the next of the earlier chunks; an error at the first that is
    /// not the next chunk at the next position.
    fn take_in(&mut self, segments: &[LedgerSegment]) -> Result<(), String> {
        for segment in segments {
            let seq = segment.spec.seq;
            let [event @ LedgerEvent::Chunk { .. }] = &segment.spec.events[..] else {
                return Err(format!("position {seq} holds no chunk of the event"));
            };
            if seq != self.next {
                return Err(format!("position {} missing", self.next));
            }
            if self.unchunk.feed(event)?.is_some() {
                return Err(format!("the event ended early, at position {seq}"));
            }
            self.next += 1;
        }
        Ok(())
    }

    /// The whole event, from `last`, the segment that holds its last chunk.
    fn finish(mut self, last: &LedgerSegment) -> Result<LedgerEvent, String> {
        if last.spec.seq != self.next {
            return Err(format!("position {} missing", self.next));
        }
        let [chunk] = &last.spec.events[..] else {
            return Err(format!("position {} holds no chunk", last.spec.seq));
        };
        match self.unchunk.feed(chunk)? {
            Some(whole) if matches!(chunk, LedgerEvent::Chunk { .. }) => Ok(whole.into_owned()),
            _ => Err(format!("position {} ends no event", last.spec.seq)),
        }
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

    fn data_of(event: Outgoing) -> serde_json::Value {
        let text = String::from_utf8(event.as_bytes().to_vec()).unwrap();
        let data = text
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("a data line");
        serde_json::from_str(data).unwrap()
    }

    /// As a stream sends `segment`: rebuilt from `ledger`, read two positions at a time, when
    /// it ends a chunked event; and the reads made.
    async fn sent(ledger: &[LedgerSegment], segment: &LedgerSegment) -> (serde_json::Value, usize) {
        let mut reads = 0;
        let rebuilt = match earlier_chunks(segment) {
            Some((after, count)) => {
                let read = |at: i64, limit: usize| {
                    reads += 1;
                    let page: Vec<LedgerSegment> = ledger
                        .iter()
                        .skip(at as usize)
                        .take(limit)
                        .cloned()
                        .collect();
                    std::future::ready(Ok::<_, ()>(page))
                };
                Some(rebuild(after, count, segment, 2, read).await.unwrap())
            }
            None => None,
        };
        (data_of(segment_event(segment, rebuilt)), reads)
    }

    #[tokio::test]
    async fn a_chunked_event_is_sent_whole_in_the_segment_of_its_last_chunk() {
        let (event, segments) = chunked(3000);
        assert!(segments.len() > 4, "{}", segments.len());
        let mut data = Vec::new();
        let mut reads = Vec::new();
        for segment in &segments {
            let (d, r) = sent(&segments, segment).await;
            data.push(d);
            reads.push(r);
        }
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["seq"], i as i64 + 1, "every place is sent");
        }
        let (last, earlier) = data.split_last().unwrap();
        assert!(earlier.iter().all(|d| d["events"] == serde_json::json!([])));
        assert_eq!(last["events"], serde_json::json!([event]));
        // Nothing is read until the last chunk; then its earlier ones, a page at a time.
        let pages = (segments.len() - 1).div_ceil(2);
        assert_eq!(reads.last(), Some(&pages), "{reads:?}");
        assert!(
            reads[..reads.len() - 1].iter().all(|r| *r == 0),
            "{reads:?}"
        );
    }

    #[tokio::test]
    async fn a_last_chunk_whose_earlier_chunks_are_not_there_is_sent_as_stored() {
        let (_, segments) = chunked(3000);
        let last = segments.last().unwrap();
        // One earlier chunk lost (a hostile or broken ledger): the rebuild says which.
        let mut holed = segments.clone();
        holed.remove(1);
        let (data, _) = sent(&holed, last).await;
        assert_eq!(data["events"][0]["type"], "chunk", "{data}");
        // A last chunk that claims more chunks than there are positions before it.
        let LedgerEvent::Chunk { data, .. } = &last.spec.events[0] else {
            panic!("a chunk")
        };
        let bold = LedgerEvent::Chunk {
            index: 99,
            total: 100,
            data: data.clone(),
        };
        let bold = test_segment(3, 1, vec![bold]);
        assert_eq!(earlier_chunks(&bold), Some((0, 2)));
        let (data, reads) = sent(&segments, &bold).await;
        assert_eq!(reads, 1);
        assert_eq!(data["events"][0]["type"], "chunk", "{data}");
        // Unreadable: the stream ends with an error instead (its client reads it again).
        let unreadable =
            |_: i64, _: usize| std::future::ready(Err::<Vec<LedgerSegment>, _>("down"));
        assert_eq!(rebuild(0, 2, &bold, 2, unreadable).await, Err("down"));
    }
}
