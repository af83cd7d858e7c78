//! An NBD client session held open across steps of a test (libnbd's Python
//! binding behind a line protocol), for tests whose point is what one
//! connection sees over time: a standby's reads while its holder writes.
//!
//! Commands (one line each, one reply line each; H names a connection):
//!   open H URI                   -> ok | err MESSAGE
//!   write H OFFSET BYTE LEN FUA  -> ok | err MESSAGE   (BYTE: 0-255 fill)
//!   flush H                      -> ok | err MESSAGE
//!   read H OFFSET LEN            -> fill BYTE | mixed | err MESSAGE
//!   close H                      -> ok

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use super::python_with_nbd;

const SESSION: &str = r#"
import sys, nbd
handles = {}
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "open":
            h = nbd.NBD(); h.connect_uri(w[2]); handles[w[1]] = h; print("ok")
        elif w[0] == "write":
            flags = nbd.CMD_FLAG_FUA if w[5] == "1" else 0
            handles[w[1]].pwrite(bytes([int(w[3])]) * int(w[4]), int(w[2]), flags=flags); print("ok")
        elif w[0] == "flush":
            handles[w[1]].flush(); print("ok")
        elif w[0] == "read":
            b = handles[w[1]].pread(int(w[3]), int(w[2]))
            print("fill %d" % b[0] if b == bytes([b[0]]) * len(b) else "mixed")
        elif w[0] == "close":
            h = handles.pop(w[1], None)
            if h is not None:
                try: h.shutdown()
                except nbd.Error: pass
            print("ok")
        else:
            print("err unknown command " + w[0])
    except nbd.Error as e:
        print("err " + str(e).replace("\n", " "))
    sys.stdout.flush()
"#;

/// A running session (killed on drop).
pub struct NbdSession {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl NbdSession {
    pub fn start() -> NbdSession {
        let mut child = Command::new(python_with_nbd())
            .arg("-c")
            .arg(SESSION)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .env("LIBNBD_DEBUG", "0")
            .spawn()
            .expect("start the python NBD session");
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        NbdSession {
            child,
            input,
            output,
        }
    }

    /// Sends one command; its reply line.
    pub fn cmd(&mut self, line: &str) -> String {
        writeln!(self.input, "{line}").expect("write to the NBD session");
        self.input.flush().expect("flush the NBD session");
        let mut reply = String::new();
        self.output
            .read_line(&mut reply)
            .expect("read from the NBD session");
        assert!(!reply.is_empty(), "the NBD session ended at {line:?}");
        reply.trim().to_string()
    }

    /// `cmd` that must answer `ok`.
    pub fn ok(&mut self, line: &str) {
        let reply = self.cmd(line);
        assert_eq!(reply, "ok", "{line}");
    }

    /// The byte a range reads as (panics if it is not one byte repeated).
    pub fn fill(&mut self, handle: &str, offset: u64, len: u64) -> u8 {
        let reply = self.cmd(&format!("read {handle} {offset} {len}"));
        match reply.strip_prefix("fill ") {
            Some(b) => b.parse().expect("a byte"),
            None => panic!("read {handle} {offset} {len}: {reply}"),
        }
    }
}

impl Drop for NbdSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
