//! A command's output, bounded (pure): each stream is read to its end but only `cap` bytes are
//! kept, converted lossily (a command may print any bytes), and the two together stay within
//! the cap, stdout first.

/// A stream as read: the text kept and how many bytes were dropped.
pub type Captured = (String, usize);

/// Cuts `bytes` to `cap`, converting lossily; `total` is how many bytes the stream had.
pub fn capped_text(bytes: &[u8], total: usize, cap: usize) -> Captured {
    let kept = &bytes[..bytes.len().min(cap)];
    (
        String::from_utf8_lossy(kept).into_owned(),
        total.saturating_sub(kept.len()),
    )
}

/// The last `cap` bytes of `bytes`, converted lossily; `total` is how many the stream had.
pub fn tail_text(bytes: &[u8], total: usize, cap: usize) -> Captured {
    let kept = &bytes[bytes.len().saturating_sub(cap)..];
    (
        String::from_utf8_lossy(kept).into_owned(),
        total.saturating_sub(kept.len()),
    )
}

/// Both streams within one cap: stdout is kept first, stderr gets the room left (its start,
/// or with `tail` its end). Returns (stdout, stderr, dropped).
pub fn within_cap(out: Captured, err: Captured, cap: usize, tail: bool) -> (String, String, usize) {
    let (stdout, mut dropped) = out;
    let (mut stderr, err_dropped) = err;
    dropped += err_dropped;
    let room = cap.saturating_sub(stdout.len());
    if stderr.len() > room && tail {
        let mut cut = stderr.len() - room;
        while !stderr.is_char_boundary(cut) {
            cut += 1;
        }
        dropped += cut;
        stderr.drain(..cut);
    } else if stderr.len() > room {
        let cut = floor_char_boundary(&stderr, room);
        dropped += stderr.len() - cut;
        stderr.truncate(cut);
    }
    (stdout, stderr, dropped)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_text_is_lossy_and_counts_what_it_dropped() {
        let (text, dropped) = capped_text(b"ab\xffcdef", 6, 4);
        assert_eq!(text, "ab\u{fffd}c");
        assert_eq!(dropped, 2);
    }

    #[test]
    fn stderr_gets_the_room_stdout_left_cut_at_a_character() {
        let (out, err, dropped) = within_cap(("abc".into(), 0), ("déf".into(), 1), 5, false);
        assert_eq!(out, "abc");
        // "dé" is 3 bytes: only "d" fits in the 2 left.
        assert_eq!(err, "d");
        assert_eq!(dropped, 1 + 3);
    }

    #[test]
    fn a_tail_keeps_the_end_cut_at_a_character() {
        let (text, dropped) = tail_text(b"start...Traceback: boom", 23, 15);
        assert_eq!(text, "Traceback: boom");
        assert_eq!(dropped, 8);
        // "éf" is 3 bytes: only "f" fits in the 2 left, at a character.
        let (out, err, dropped) = within_cap(("abc".into(), 0), ("déf".into(), 0), 5, true);
        assert_eq!((out.as_str(), err.as_str()), ("abc", "f"));
        assert_eq!(dropped, 3);
    }
}
