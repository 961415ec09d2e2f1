//! What the CLI prints comes from the model, its tools and the run's creator: a terminal must
//! show it, not obey it. Control characters (an escape sequence can clear the screen, move the
//! cursor or rewrite a line already printed) and bidirectional formatting characters (which
//! reorder what a reader sees, so a command reads other than it runs) are printed as visible
//! `\u{..}` escapes. Newlines and tabs stay.

use std::borrow::Cow;
use std::io::{self, Write};

/// True for a character a terminal would act on or that reorders text: C0 and C1 controls
/// but newline and tab, DEL, and the Unicode bidirectional marks, embeddings, overrides and
/// isolates. The console's pages show the same characters as the same escapes
/// (`server::visible`).
pub fn reorders_or_controls(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every such character written as its `\u{..}` escape.
pub fn neutralize(text: &str) -> Cow<'_, str> {
    if !text.chars().any(reorders_or_controls) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if reorders_or_controls(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A writer that neutralizes what passes through it. `write!` hands it whole `&str` pieces;
/// bytes that are not UTF-8 are shown as replacement characters.
pub struct Neutral<W: Write>(pub W);

impl<W: Write> Write for Neutral<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(neutralize(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_bidi_marks_are_shown_not_obeyed() {
        assert_eq!(neutralize("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(neutralize("\u{1b}[2Jcleared"), "\\u{1b}[2Jcleared");
        assert_eq!(neutralize("line\rover"), "line\\u{d}over");
        assert_eq!(neutralize("rm \u{202E}fdp.exe"), "rm \\u{202e}fdp.exe");
        assert_eq!(neutralize("a\u{2066}b\u{2069}"), "a\\u{2066}b\\u{2069}");
        assert_eq!(neutralize("bell\u{7}\u{9b}31m"), "bell\\u{7}\\u{9b}31m");
        assert!(matches!(neutralize("nothing to do"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_writer_neutralizes_what_is_written_through_it() {
        let mut out = Neutral(Vec::new());
        let title = "\u{1b}]0;title\u{7}";
        write!(out, "ok {title}").unwrap();
        writeln!(out).unwrap();
        assert_eq!(
            String::from_utf8(out.0).unwrap(),
            "ok \\u{1b}]0;title\\u{7}\n"
        );
    }
}
