//! What a power cut loses: [`LossMode`], the four modes of
//! [`super::LossyFs::power_cut`].

use std::fmt;
use std::str::FromStr;

/// What a power cut loses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossMode {
    /// Everything unsynced is lost (LazyFS clear-cache).
    DropAll,
    /// Each unsynced data write/truncate/punch survives or not independently
    /// (p = 1/2), applied in their original order among those kept (so a
    /// later write may survive while an earlier one is lost; overlapping
    /// survivors end as the later one wrote); namespace changes survive as a
    /// random prefix of their global order (journaling file systems commit
    /// metadata in order).
    Subset,
    /// Everything unsynced survives except that the most recent unsynced
    /// data write (globally) is torn: only a prefix of it survives, cut at a
    /// random 512-byte or 4 KiB boundary (relative to the file offset)
    /// strictly inside it (for a write that crosses no boundary, nothing of
    /// it survives). (LazyFS torn-op.)
    Torn,
    /// Everything unsynced survives (LazyFS checkpoint).
    KeepAll,
}

/// Every mode, in the order of their names in [`LossMode::from_str`].
pub const LOSS_MODES: [LossMode; 4] = [
    LossMode::DropAll,
    LossMode::Subset,
    LossMode::Torn,
    LossMode::KeepAll,
];

impl LossMode {
    fn word(self) -> &'static str {
        match self {
            LossMode::DropAll => "drop",
            LossMode::Subset => "subset",
            LossMode::Torn => "torn",
            LossMode::KeepAll => "all",
        }
    }
}

impl fmt::Display for LossMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

impl FromStr for LossMode {
    type Err = String;

    /// `drop`, `subset`, `torn` or `all`.
    fn from_str(s: &str) -> Result<LossMode, String> {
        LOSS_MODES
            .into_iter()
            .find(|m| m.word() == s)
            .ok_or_else(|| {
                format!("unknown loss mode {s:?}: expected one of drop, subset, torn, all")
            })
    }
}
