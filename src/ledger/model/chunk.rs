//! Packing events into segments that stay well under the API server's request limit, and
//! splitting an event too large for one segment into `chunk` events; and [`Unchunker`], the
//! one decoder every reader rebuilds them with (the fold, the CLI's transcript, the server's
//! streams, and through those the console).

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use crate::crd::v1alpha1::LedgerEvent;

/// Serialized events per segment, at most. The API server refuses requests over ~1.5 MiB;
/// this leaves room for metadata and JSON escaping.
pub const SEGMENT_BUDGET_BYTES: usize = 1_000_000;

/// Room for a chunk event's own fields (`type`, `index`, `total`) around its data.
const CHUNK_ENVELOPE_BYTES: usize = 256;

/// Why events could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("serializing a ledger event: {0}")]
    Json(#[from] serde_json::Error),
}

/// Serialized size of an event as it is stored.
pub fn event_bytes(event: &LedgerEvent) -> Result<usize, EncodeError> {
    Ok(serde_json::to_vec(event)?.len())
}

/// Packs `events` into segment-sized groups, in order. An event larger than the budget is
/// split into `chunk` events, one per group.
pub fn encode_events(
    events: Vec<LedgerEvent>,
    budget: usize,
) -> Result<Vec<Vec<LedgerEvent>>, EncodeError> {
    let mut groups: Vec<Vec<LedgerEvent>> = Vec::new();
    let mut current: Vec<LedgerEvent> = Vec::new();
    let mut current_bytes = 0usize;
    for event in events {
        let bytes = serde_json::to_vec(&event)?;
        if bytes.len() > budget {
            flush(&mut groups, &mut current, &mut current_bytes);
            groups.extend(split(&bytes, budget).into_iter().map(|chunk| vec![chunk]));
            continue;
        }
        if current_bytes + bytes.len() > budget {
            flush(&mut groups, &mut current, &mut current_bytes);
        }
        current_bytes += bytes.len();
        current.push(event);
    }
    flush(&mut groups, &mut current, &mut current_bytes);
    Ok(groups)
}

fn flush(groups: &mut Vec<Vec<LedgerEvent>>, current: &mut Vec<LedgerEvent>, bytes: &mut usize) {
    if !current.is_empty() {
        groups.push(std::mem::take(current));
    }
    *bytes = 0;
}

/// Splits one serialized event into chunk events that each fit the budget.
fn split(bytes: &[u8], budget: usize) -> Vec<LedgerEvent> {
    // base64 makes the data 4/3 larger; the envelope must fit beside it.
    let raw = (budget.saturating_sub(CHUNK_ENVELOPE_BYTES) / 4 * 3).max(1);
    let pieces: Vec<&[u8]> = bytes.chunks(raw).collect();
    let total = pieces.len() as i64;
    pieces
        .into_iter()
        .enumerate()
        .map(|(index, piece)| LedgerEvent::Chunk {
            index: index as i64,
            total,
            data: B64.encode(piece),
        })
        .collect()
}

/// A ledger's events as its readers see them, taken in order: chunked events rebuilt whole.
/// One writer writes a chunked event's chunks at consecutive positions with nothing between
/// them, and its append is acknowledged only after the last. Anything else met before the
/// last chunk (a seal, a new owner's first event, another chunked event starting) means that
/// writer lost the run or died mid-event: the event was never written as far as anyone knows,
/// and it is dropped (counted in [`Unchunker::abandoned`]).
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Unchunker {
    chunks: ChunkAssembler,
    abandoned: usize,
}

impl Unchunker {
    /// `event` as a reader sees it: itself; for a chunk, nothing until the last chunk of its
    /// event, then the whole event. An error names what could not be rebuilt.
    pub fn feed<'a>(
        &mut self,
        event: &'a LedgerEvent,
    ) -> Result<Option<Cow<'a, LedgerEvent>>, String> {
        let starts_anew = !matches!(event, LedgerEvent::Chunk { index, .. } if *index > 0);
        if starts_anew && self.chunks.abandon() {
            self.abandoned += 1;
        }
        match event {
            LedgerEvent::Chunk { index, total, data } => {
                let whole = self.chunks.feed(*index, *total, data);
                if whole.is_err() {
                    self.chunks.abandon();
                }
                Ok(whole?.map(Cow::Owned))
            }
            other => Ok(Some(Cow::Borrowed(other))),
        }
    }

    /// True while a chunked event is incomplete.
    pub fn in_progress(&self) -> bool {
        self.chunks.in_progress()
    }

    /// Chunked events whose writer stopped before their last chunk.
    pub fn abandoned(&self) -> usize {
        self.abandoned
    }
}

/// Collects chunk events until an event is complete.
#[derive(Default, Debug, Clone, PartialEq)]
pub(super) struct ChunkAssembler {
    expected_total: i64,
    data: Vec<u8>,
    received: i64,
}

impl ChunkAssembler {
    /// Feeds one chunk; returns the rebuilt event once the last chunk arrived.
    pub(super) fn feed(
        &mut self,
        index: i64,
        total: i64,
        data: &str,
    ) -> Result<Option<LedgerEvent>, String> {
        if index != self.received || (self.received > 0 && total != self.expected_total) {
            return Err(format!(
                "chunk {index}/{total} out of order (expected {})",
                self.received
            ));
        }
        self.expected_total = total;
        self.data
            .extend(B64.decode(data).map_err(|e| e.to_string())?);
        self.received += 1;
        if self.received < total {
            return Ok(None);
        }
        let event = serde_json::from_slice(&self.data).map_err(|e| e.to_string())?;
        *self = ChunkAssembler::default();
        Ok(Some(event))
    }

    /// True while a chunked event is incomplete.
    pub(super) fn in_progress(&self) -> bool {
        self.received > 0
    }

    /// Drops an incomplete chunked event; true if there was one.
    pub(super) fn abandon(&mut self) -> bool {
        let had = self.in_progress();
        *self = ChunkAssembler::default();
        had
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> LedgerEvent {
        LedgerEvent::ModelDelta {
            text: "x".repeat(n),
        }
    }

    #[test]
    fn small_events_share_a_segment() {
        let groups = encode_events(vec![text(10), text(10), text(10)], 1000).unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].len(), 3);
    }

    #[test]
    fn events_over_the_budget_start_a_new_segment() {
        let groups = encode_events(vec![text(600), text(600)], 1000).unwrap();
        assert_eq!(groups.len(), 2);
    }

    #[test]
    fn a_huge_event_is_split_and_rebuilt() {
        let big = text(10_000);
        let groups = encode_events(vec![text(5), big.clone(), text(5)], 1000).unwrap();
        assert!(groups.len() > 3, "split into chunks: {}", groups.len());
        for g in &groups {
            let size: usize = g.iter().map(|e| event_bytes(e).unwrap()).sum();
            assert!(size <= 1000, "group of {size} bytes over budget");
        }
        let mut asm = ChunkAssembler::default();
        let mut rebuilt = None;
        for g in &groups[1..groups.len() - 1] {
            let LedgerEvent::Chunk { index, total, data } = &g[0] else {
                panic!("not a chunk")
            };
            rebuilt = asm.feed(*index, *total, data).unwrap();
        }
        assert_eq!(rebuilt, Some(big));
        assert!(!asm.in_progress());
    }

    #[test]
    fn the_unchunker_rebuilds_whole_events_and_drops_an_abandoned_one() {
        let big = text(3000);
        let groups = encode_events(vec![big.clone()], 1000).unwrap();
        let chunks: Vec<LedgerEvent> = groups.into_iter().flatten().collect();
        assert!(chunks.len() > 2, "{}", chunks.len());
        let mut reader = Unchunker::default();
        let small = text(3);
        let mut seen = Vec::new();
        // A writer that died after its first chunk, then the next attempt's events.
        for event in [&chunks[0], &small].into_iter().chain(chunks.iter()) {
            if let Some(whole) = reader.feed(event).unwrap() {
                seen.push(whole.into_owned());
            }
        }
        assert_eq!(seen, vec![small, big]);
        assert_eq!(reader.abandoned(), 1);
        assert!(!reader.in_progress());
        let LedgerEvent::Chunk { total, .. } = &chunks[1] else {
            panic!("not a chunk")
        };
        let stray = LedgerEvent::Chunk {
            index: 1,
            total: *total,
            data: "not base64!".into(),
        };
        assert!(Unchunker::default().feed(&stray).is_err(), "out of order");
    }

    #[test]
    fn out_of_order_chunks_are_refused() {
        let mut asm = ChunkAssembler::default();
        assert!(asm.feed(1, 3, "").is_err());
    }
}
