//! Newline-delimited JSON-RPC over a child's pipes: lines read without letting one grow past a bound, and
//! lines written whole, one at a time.

use std::io;
use std::sync::Arc;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::Mutex;

/// The largest message an upstream may send; a longer line ends its session (the same bound rmcp puts on HTTP).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How reading one line ended.
pub enum Line {
    /// A line with its newline.
    Whole(Vec<u8>),
    Oversized,
    Eof,
    Failed(io::Error),
}

/// A child's stdout, read a line at a time.
pub struct Reader {
    stdout: BufReader<ChildStdout>,
    /// The line being read; it survives a cancelled `read_line`, which rmcp polls inside a `select!`.
    line: Vec<u8>,
}

impl Reader {
    /// Reads lines from `stdout`.
    pub fn new(stdout: ChildStdout) -> Self {
        Self {
            stdout: BufReader::new(stdout),
            line: Vec::new(),
        }
    }

    /// Reads up to a newline without letting the line grow past `MAX_MESSAGE_BYTES`; cancel-safe.
    pub async fn read_line(&mut self) -> Line {
        loop {
            let available = match self.stdout.fill_buf().await {
                Ok([]) => return Line::Eof,
                Ok(available) => available,
                Err(error) => return Line::Failed(error),
            };
            let newline = available.iter().position(|byte| *byte == b'\n');
            let take = newline.map_or(available.len(), |index| index + 1);
            if self.line.len() + take > MAX_MESSAGE_BYTES + 1 {
                return Line::Oversized;
            }
            self.line.extend_from_slice(&available[..take]);
            self.stdout.consume(take);
            if newline.is_some() {
                return Line::Whole(std::mem::take(&mut self.line));
            }
        }
    }
}

/// A child's stdin, shared by the transport and the tasks that answer the upstream's requests.
#[derive(Clone)]
pub struct Writer(Arc<Mutex<Option<ChildStdin>>>);

impl Writer {
    /// Writes lines to `stdin`.
    pub fn new(stdin: ChildStdin) -> Self {
        Self(Arc::new(Mutex::new(Some(stdin))))
    }

    /// Writes one line and flushes it, after the line being written, if any.
    pub async fn write(&self, line: Vec<u8>) -> io::Result<()> {
        let mut stdin = self.0.lock().await;
        let pipe = stdin
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the upstream's stdin is closed"))?;
        pipe.write_all(&line).await?;
        pipe.flush().await
    }

    /// Closes the pipe after the line being written, if any: the child reads end of file.
    pub async fn close(&self) {
        drop(self.0.lock().await.take());
    }
}

/// A message as one line, its newline included.
pub fn line(message: &impl Serialize) -> serde_json::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    Ok(line)
}
