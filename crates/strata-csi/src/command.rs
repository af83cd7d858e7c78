//! Running the node's tools (mount, losetup, mkfs, blkid, nbdfuse...):
//! bounded in time, their stderr in the error, never through a shell.

use std::time::Duration;

use tokio::process::Command;

/// How long a tool may run (mkfs of a large volume, a mount replaying a
/// journal) before the call fails; the sidecars call again.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(300);

/// What a tool printed, and its exit code.
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program args...` and returns its output, whatever its exit code;
/// an error if it cannot be started or runs past `TOOL_TIMEOUT`.
pub async fn output(program: &str, args: &[&str]) -> Result<Output, String> {
    let mut cmd = Command::new(program);
    cmd.args(args).kill_on_drop(true);
    let run = cmd.output();
    let out = match tokio::time::timeout(TOOL_TIMEOUT, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{program} is not installed on this node (the node plugin's image needs it)"
            ))
        }
        Ok(Err(e)) => return Err(format!("cannot run {program}: {e}")),
        Err(_) => {
            return Err(format!(
                "{program} {} ran for more than {} s",
                args.join(" "),
                TOOL_TIMEOUT.as_secs()
            ))
        }
    };
    Ok(Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `program args...`; its stdout if it exits 0, else an error with
/// the command and its stderr.
pub async fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = output(program, args).await?;
    if out.code == Some(0) {
        return Ok(out.stdout);
    }
    Err(format!(
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        match out.code {
            Some(c) => format!("exit {c}"),
            None => "killed".to_string(),
        },
        out.stderr.trim()
    ))
}
