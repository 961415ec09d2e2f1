//! Cutting text at a byte bound without splitting a character: what the status's output, a
//! pending call's arguments and a span's content all need. (`str::floor_char_boundary` does
//! this, but is newer than the Rust version baton builds with.)

/// Pure: the largest index of `text` at most `max` that falls on a character's boundary.
pub(crate) fn char_floor(text: &str, max: usize) -> usize {
    if max >= text.len() {
        return text.len();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::char_floor;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(char_floor("abc", 10), 3);
        assert_eq!(char_floor("abc", 2), 2);
        assert_eq!(char_floor("é", 1), 0); // two bytes
        assert_eq!(char_floor("aé", 2), 1);
    }
}
