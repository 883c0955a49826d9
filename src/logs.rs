//! Where log lines go: stderr, one line per event, with every control character in the line escaped, so
//! that no value a client or an upstream chose can end a line early, forge one of its own or drive a terminal.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, Write};

/// Stderr as the log's writer (`tracing_subscriber::fmt().with_writer(logs::stderr)`).
pub fn stderr() -> EscapedLines<io::Stderr> {
    EscapedLines(io::stderr())
}

/// Writes each chunk it is given as one line: control characters (C0, DEL, C1) and the Unicode line and
/// paragraph separators become `\n`, `\r`, `\t` or `\uXXXX`, except the newline that ends the chunk. The
/// escapes are JSON's, so a JSON line stays valid JSON.
#[derive(Debug)]
pub struct EscapedLines<W>(pub W);

impl<W: Write> Write for EscapedLines<W> {
    // A chunk is a whole event: tracing-subscriber's fmt layer formats an event into a buffer, newline
    // included, and hands it over with one `write_all`, which this `write` takes whole.
    fn write(&mut self, chunk: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(chunk);
        let (line, end) = match text.strip_suffix('\n') {
            Some(line) => (line, "\n"),
            None => (&*text, ""),
        };
        if matches!(text, Cow::Borrowed(_)) && !line.chars().any(needs_escape) {
            self.0.write_all(chunk)?;
        } else {
            let mut escaped = String::with_capacity(chunk.len() + 16);
            for c in line.chars() {
                push_escaped(&mut escaped, c);
            }
            escaped.push_str(end);
            self.0.write_all(escaped.as_bytes())?;
        }
        Ok(chunk.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Whether `c` could break a line or act on a terminal.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        }
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(chunk: &str) -> String {
        let mut lines = EscapedLines(Vec::new());
        lines.write_all(chunk.as_bytes()).unwrap();
        String::from_utf8(lines.0).unwrap()
    }

    #[test]
    fn a_chunk_is_one_line_ending_in_its_own_newline() {
        assert_eq!(written("call ended\n"), "call ended\n");
        assert_eq!(
            written("a\nINFO forged\r\u{1b}[2K\t\u{0}\u{7f}\u{9b}\u{2028}b\n"),
            "a\\nINFO forged\\r\\u001b[2K\\t\\u0000\\u007f\\u009b\\u2028b\n"
        );
        assert_eq!(written("no newline\n\n"), "no newline\\n\n");
        assert_eq!(written("ünïcode ✓\n"), "ünïcode ✓\n");
    }

    #[test]
    fn json_lines_stay_json() {
        let value = serde_json::json!({"message": "a\u{85}b\u{2029}c\u{7f}"});
        let line = written(&format!("{value}\n"));
        assert!(!line.trim_end().chars().any(needs_escape), "{line:?}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&line).unwrap(), value);
    }
}
