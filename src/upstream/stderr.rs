//! A stdio server's stderr, read as it is written and logged line by line under the server's name, so that
//! nothing it writes reaches the gateway's own stderr unlabelled or unescaped.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// The longest line logged; the rest of a longer line is dropped and the logged part marked `truncated`.
const MAX_LINE_BYTES: usize = 8 * 1024;

/// Whether a logged line is all of what the server wrote on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extent {
    Whole,
    /// Cut at `MAX_LINE_BYTES`; the rest was dropped.
    Truncated,
}

/// Logs each line `stderr` carries until it closes, on a task of its own that keeps reading, so the server
/// never blocks on a full pipe.
pub fn follow(server: &str, stderr: impl AsyncRead + Unpin + Send + 'static) {
    let server = server.to_owned();
    tokio::spawn(async move { log_lines(&server, stderr).await });
}

/// Reads lines until end of stream (or a read error) and logs each one.
async fn log_lines(server: &str, stderr: impl AsyncRead + Unpin) {
    let mut reader = BufReader::new(stderr);
    let mut lines = Lines::default();
    let mut emit = |line: &[u8], extent| log(server, line, extent);
    loop {
        let available = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(available) => available,
        };
        let taken = lines.feed(available, &mut emit);
        reader.consume(taken);
    }
    lines.finish(&mut emit);
}

/// Cuts a byte stream into lines of at most `MAX_LINE_BYTES`, keeping no more than one such line.
#[derive(Debug, Default)]
struct Lines {
    line: Vec<u8>,
    /// Within a line already emitted truncated: its rest is dropped up to the next newline.
    dropping: bool,
}

impl Lines {
    /// Takes `chunk` up to and including its first newline, emits the line that ends or overflows there
    /// (with its extent), and returns how many bytes it took.
    fn feed(&mut self, chunk: &[u8], emit: &mut impl FnMut(&[u8], Extent)) -> usize {
        let newline = chunk.iter().position(|byte| *byte == b'\n');
        let part = &chunk[..newline.unwrap_or(chunk.len())];
        if !self.dropping {
            let room = MAX_LINE_BYTES - self.line.len();
            if part.len() > room {
                self.line.extend_from_slice(&part[..room]);
                emit(&self.line, Extent::Truncated);
                self.line.clear();
                self.dropping = true;
            } else {
                self.line.extend_from_slice(part);
            }
        }
        let Some(newline) = newline else {
            return chunk.len();
        };
        if !self.dropping {
            emit(&self.line, Extent::Whole);
        }
        self.line.clear();
        self.dropping = false;
        newline + 1
    }

    /// Emits a last line the stream ended without a newline.
    fn finish(&mut self, emit: &mut impl FnMut(&[u8], Extent)) {
        if !self.dropping && !self.line.is_empty() {
            emit(&self.line, Extent::Whole);
        }
        self.line.clear();
    }
}

/// Logs one line at `info`: stderr is the only log a stdio server has, so a line on it is not a fault by
/// itself. Blank lines are skipped.
fn log(server: &str, line: &[u8], extent: Extent) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let text = printable(line);
    match extent {
        Extent::Truncated => tracing::info!(server = %server, truncated = true, "{text}"),
        Extent::Whole => tracing::info!(server = %server, "{text}"),
    }
}

/// The line as UTF-8 (invalid bytes replaced) with control characters and bidirectional overrides escaped
/// (`\u{1b}`), so that a server cannot colour, rewrite or forge lines of the gateway's log. Tabs stay.
fn printable(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut printable = String::with_capacity(text.len());
    for character in text.chars() {
        let hazardous = (character.is_control() && character != '\t')
            || matches!(character, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
        if hazardous {
            printable.extend(character.escape_default());
        } else {
            printable.push(character);
        }
    }
    printable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_bidirectional_overrides_are_escaped() {
        assert_eq!(
            printable(b"\x1b[31mred\x1b[0m\r\x07 \xe2\x80\xae!\tok \xff"),
            "\\u{1b}[31mred\\u{1b}[0m\\r\\u{7} \\u{202e}!\tok \u{fffd}"
        );
        assert_eq!(printable("déjà vu".as_bytes()), "déjà vu");
    }

    /// Feeds the chunks as reads would return them, and returns every line emitted.
    fn cut(chunks: &[&[u8]]) -> Vec<(String, Extent)> {
        let mut lines = Lines::default();
        let mut emitted = Vec::new();
        let mut emit = |line: &[u8], extent| emitted.push((String::from_utf8_lossy(line).into_owned(), extent));
        for chunk in chunks {
            let mut chunk = *chunk;
            while !chunk.is_empty() {
                let taken = lines.feed(chunk, &mut emit);
                chunk = &chunk[taken..];
            }
        }
        lines.finish(&mut emit);
        emitted
    }

    #[test]
    fn lines_are_cut_at_newlines_across_reads() {
        let whole = |text: &str| (text.to_owned(), Extent::Whole);
        assert_eq!(
            cut(&[b"one\ntw", b"o\n\nthr", b"ee"]),
            [whole("one"), whole("two"), whole(""), whole("three")]
        );
    }

    #[test]
    fn a_long_line_is_emitted_once_cut_and_its_rest_dropped() {
        let long = vec![b'x'; 3 * MAX_LINE_BYTES];
        let emitted = cut(&[b"before\n", &long[..MAX_LINE_BYTES - 1], &long, b"\nafter\n"]);
        assert_eq!(
            emitted.len(),
            3,
            "{:?}",
            emitted.iter().map(|(l, t)| (l.len(), t)).collect::<Vec<_>>()
        );
        assert_eq!(emitted[0], ("before".to_owned(), Extent::Whole));
        assert_eq!((emitted[1].0.len(), emitted[1].1), (MAX_LINE_BYTES, Extent::Truncated));
        assert_eq!(emitted[2], ("after".to_owned(), Extent::Whole));
        // Exactly the bound is not cut.
        let exact = cut(&[&long[..MAX_LINE_BYTES], b"\n"]);
        assert_eq!(
            (exact.len(), exact[0].0.len(), exact[0].1),
            (1, MAX_LINE_BYTES, Extent::Whole)
        );
    }
}
