//! The loop's NBD client: `scripts/powerloss_client.py` (libnbd's Python
//! binding) run once for the whole loop, so the history of what was
//! acknowledged lives in one place across cycles. This module only speaks
//! its line protocol (documented in the script).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// The client, embedded so the loop runs from any working directory.
const SCRIPT: &str = include_str!("../../scripts/powerloss_client.py");
/// Debian's python3-libnbd lives in the system interpreter.
const PYTHON: &str = "/usr/bin/python3";
/// No answer line takes longer than this (a verify reads the region once).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Client {
    /// Starts the client for a region of `nblocks` 4 KiB blocks; the script
    /// is written into `dir`.
    pub fn start(dir: &Path, nblocks: u64) -> Result<Client, String> {
        let script = dir.join("powerloss_client.py");
        std::fs::write(&script, SCRIPT).map_err(|e| format!("write {}: {e}", script.display()))?;
        let mut child = Command::new(PYTHON)
            .arg(&script)
            .arg(nblocks.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start {PYTHON} (python3-libnbd needed): {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("client: no pipes".into());
        };
        Ok(Client {
            child,
            stdin,
            lines: spawn_reader(stdout),
        })
    }

    pub fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("client: write {line:?}: {e}"))
    }

    /// The next answer line.
    pub fn answer(&mut self) -> Result<String, String> {
        match self.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => {
                Err(format!("client: no answer within {ANSWER_TIMEOUT:?}"))
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait().ok().flatten();
                Err(format!("client: exited ({status:?}); see its stderr above"))
            }
        }
    }

    /// Sends a command and returns its one answer line.
    pub fn ask(&mut self, line: &str) -> Result<String, String> {
        self.send(line)?;
        self.answer()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        std::thread::sleep(Duration::from_millis(50));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_reader(stdout: ChildStdout) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}
