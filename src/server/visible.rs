//! The console's HTML escaper (askama.toml names it for every `.html` template): what the
//! model, its tools and a run's creator wrote is shown, never obeyed. Besides HTML's own
//! escaping, control characters and the Unicode bidirectional marks, embeddings, overrides and
//! isolates (U+202E turns `exe.pdf` into what reads as `fdp.exe`) are written as the visible
//! `\u{..}` escapes the CLI prints (`cli::neutralize`), on every page, the approvals inbox
//! included: an approver reads a command as it runs.

use std::fmt::{self, Write};

use askama::filters::{Escaper, Html};

/// HTML escaping with controls and bidirectional formatting made visible.
#[derive(Debug, Clone, Copy, Default)]
pub struct VisibleHtml;

impl Escaper for VisibleHtml {
    fn write_escaped_str<W: Write>(&self, mut dest: W, string: &str) -> fmt::Result {
        let mut rest = string;
        while let Some((at, c)) = rest
            .char_indices()
            .find(|(_, c)| crate::display::reorders_or_controls(*c))
        {
            Html.write_escaped_str(&mut dest, &rest[..at])?;
            write!(dest, "{}", c.escape_unicode())?;
            rest = &rest[at + c.len_utf8()..];
        }
        Html.write_escaped_str(dest, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        let mut out = String::new();
        VisibleHtml.write_escaped_str(&mut out, text).unwrap();
        out
    }

    #[derive(askama::Template)]
    #[template(source = "<p>{{ text }}</p>", ext = "html")]
    struct Page<'a> {
        text: &'a str,
    }

    #[test]
    fn every_html_template_escapes_with_it() {
        use askama::Template;
        let page = Page {
            text: "approve rm \u{202E}fdp.exe<",
        };
        assert_eq!(
            page.render().unwrap(),
            "<p>approve rm \\u{202e}fdp.exe&#60;</p>"
        );
    }

    #[test]
    fn bidi_and_controls_are_shown_and_html_is_escaped() {
        assert_eq!(shown("rm \u{202E}fdp.exe"), "rm \\u{202e}fdp.exe");
        assert_eq!(
            shown("<b>\u{1b}[2J</b>"),
            "&#60;b&#62;\\u{1b}[2J&#60;/b&#62;"
        );
        assert_eq!(shown("line\nnext\ttab"), "line\nnext\ttab");
        assert_eq!(
            shown("a\u{2066}b\u{2069}\u{200f}"),
            "a\\u{2066}b\\u{2069}\\u{200f}"
        );
    }
}
