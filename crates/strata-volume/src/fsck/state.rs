//! What a check has found so far: problems, counts, objects found gone.

use super::collected::Gone;
use super::findings::Findings;
use super::report::Checked;

#[derive(Default)]
pub(crate) struct State {
    pub findings: Findings,
    pub checked: Checked,
    /// Objects found gone, for `collected.rs` to judge.
    pub gone: Vec<Gone>,
}
