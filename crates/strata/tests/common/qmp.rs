//! A QMP client (QEMU's JSON machine protocol on a unix socket) and a QEMU
//! process driven through it, for the live migration tests.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One QMP connection: commands and their replies; events are kept.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    pub events: Vec<Value>,
    path: PathBuf,
}

impl Qmp {
    /// Connects (retrying until QEMU listens, at most `timeout`), reads the
    /// greeting and enters command mode.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, String> {
        let t0 = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if t0.elapsed() < timeout => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("QMP {}: {e}", path.display())),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
            events: Vec::new(),
            path: path.to_path_buf(),
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(format!("not a QMP greeting: {greeting}"));
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| format!("QMP {}: read: {e}", self.path.display()))?;
        if n == 0 {
            return Err(format!(
                "QMP {}: QEMU closed the connection",
                self.path.display()
            ));
        }
        serde_json::from_str(&line).map_err(|e| format!("QMP: bad message {line:?}: {e}"))
    }

    /// Runs a command; its `return` value, or its error's description.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let msg = json!({"execute": command, "arguments": arguments});
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .map_err(|e| format!("QMP {}: send {command}: {e}", self.path.display()))?;
        loop {
            let reply = self.read_message()?;
            if reply.get("event").is_some() {
                self.events.push(reply);
                continue;
            }
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                return Err(format!(
                    "{command}: {}",
                    e["desc"].as_str().unwrap_or("error")
                ));
            }
        }
    }

    /// Whether event `name` came (among those read so far or within
    /// `timeout`, polling with `query-status`, which reads pending events).
    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<Value, String> {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self.events.iter().position(|e| e["event"] == name) {
                return Ok(self.events.remove(i));
            }
            if t0.elapsed() > timeout {
                return Err(format!("no {name} event within {timeout:?}"));
            }
            self.execute("query-status", json!({}))?;
            thread::sleep(Duration::from_millis(50));
        }
    }
}
