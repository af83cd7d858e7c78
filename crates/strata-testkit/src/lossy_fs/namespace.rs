//! Directory trees and the namespace operations that change them.
//!
//! A [`Namespace`] is one state of every directory's entries (name -> inode),
//! with each inode's link count and each directory's parent. The model keeps
//! two: the current one (what lookups see) and the durable one (what survives
//! a power cut), and one global, ordered log of the [`NsOp`]s applied to the
//! current one but not yet to the durable one. The durable namespace is
//! always the initial one plus a prefix of everything ever logged, so any
//! longer prefix of the log applied to it is a state the tree really was in:
//! that is what lets `fsyncdir` and the Subset cut make a prefix durable
//! without ever producing an inconsistent tree (a file in a directory that
//! never existed, a name in two places).
//!
//! Ops are checked against the current namespace before they are logged
//! (see `model.rs`); applying one here never fails, and replaying a valid
//! history onto the durable namespace stays valid by construction.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};

/// An inode number, as FUSE sees it.
pub(crate) type Ino = u64;

/// The root directory's inode number (FUSE's fixed `FUSE_ROOT_ID`).
pub(crate) const ROOT: Ino = 1;

/// A name in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) dir: Ino,
    pub(crate) name: OsString,
}

impl Entry {
    pub(crate) fn new(dir: Ino, name: &OsStr) -> Entry {
        Entry {
            dir,
            name: name.to_owned(),
        }
    }
}

/// One namespace change, as logged (names, plus the inodes involved so the
/// model knows which inodes a pending op may still bring back).
#[derive(Debug, Clone)]
pub(crate) enum NsOp {
    /// create / mknod / mkdir (`new_dir`) / link: `at` now names `ino`.
    Link { at: Entry, ino: Ino, new_dir: bool },
    /// unlink / rmdir: `at` (which named `ino`) is gone.
    Unlink { at: Entry, ino: Ino },
    /// rename: `to` now names what `from` named (`ino`); `replaced` is what
    /// `to` named before, if anything.
    Rename {
        from: Entry,
        to: Entry,
        ino: Ino,
        replaced: Option<Ino>,
    },
    /// rename with `RENAME_EXCHANGE`: `a` and `b` swap inodes.
    Exchange {
        a: Entry,
        b: Entry,
        a_ino: Ino,
        b_ino: Ino,
    },
}

impl NsOp {
    /// Whether this op changes directory `dir`'s entries.
    pub(crate) fn touches(&self, dir: Ino) -> bool {
        match self {
            NsOp::Link { at, .. } | NsOp::Unlink { at, .. } => at.dir == dir,
            NsOp::Rename { from, to, .. } => from.dir == dir || to.dir == dir,
            NsOp::Exchange { a, b, .. } => a.dir == dir || b.dir == dir,
        }
    }

    /// The inodes this op links, unlinks or moves.
    pub(crate) fn inos(&self) -> Vec<Ino> {
        match self {
            NsOp::Link { ino, .. } | NsOp::Unlink { ino, .. } => vec![*ino],
            NsOp::Rename { ino, replaced, .. } => std::iter::once(*ino).chain(*replaced).collect(),
            NsOp::Exchange { a_ino, b_ino, .. } => vec![*a_ino, *b_ino],
        }
    }
}

/// One state of the whole tree.
#[derive(Debug, Clone)]
pub(crate) struct Namespace {
    dirs: HashMap<Ino, BTreeMap<OsString, Ino>>,
    parents: HashMap<Ino, Ino>,
    links: HashMap<Ino, u32>,
}

impl Namespace {
    /// Just an empty root directory.
    pub(crate) fn with_root() -> Namespace {
        Namespace {
            dirs: HashMap::from([(ROOT, BTreeMap::new())]),
            parents: HashMap::from([(ROOT, ROOT)]),
            links: HashMap::new(),
        }
    }

    pub(crate) fn is_dir(&self, ino: Ino) -> bool {
        self.dirs.contains_key(&ino)
    }

    /// The entries of directory `dir`, if it exists here.
    pub(crate) fn entries(&self, dir: Ino) -> Option<&BTreeMap<OsString, Ino>> {
        self.dirs.get(&dir)
    }

    pub(crate) fn get(&self, dir: Ino, name: &OsStr) -> Option<Ino> {
        self.dirs.get(&dir)?.get(name).copied()
    }

    /// How many names `ino` has here.
    pub(crate) fn links(&self, ino: Ino) -> u32 {
        self.links.get(&ino).copied().unwrap_or(0)
    }

    /// Whether `ino` is reachable here (the root always is).
    pub(crate) fn contains(&self, ino: Ino) -> bool {
        ino == ROOT || self.links(ino) > 0
    }

    pub(crate) fn parent(&self, dir: Ino) -> Option<Ino> {
        self.parents.get(&dir).copied()
    }

    /// Number of subdirectories of `dir` (for its `nlink`).
    pub(crate) fn subdirs(&self, dir: Ino) -> usize {
        self.dirs
            .get(&dir)
            .map_or(0, |e| e.values().filter(|i| self.is_dir(**i)).count())
    }

    /// Whether directory `ancestor` is `dir` or one of its ancestors.
    pub(crate) fn is_ancestor(&self, ancestor: Ino, dir: Ino) -> bool {
        let mut at = dir;
        loop {
            if at == ancestor {
                return true;
            }
            match self.parent(at) {
                Some(p) if p != at => at = p,
                _ => return false,
            }
        }
    }

    /// A path of `ino` relative to the root ("a/b/c"), if it has a name.
    pub(crate) fn path_of(&self, ino: Ino) -> Option<String> {
        let mut parts = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let (dir, name) = self.name_of(at)?;
            parts.push(name.to_string_lossy().into_owned());
            at = dir;
        }
        parts.reverse();
        Some(parts.join("/"))
    }

    /// Some (directory, name) naming `ino`.
    fn name_of(&self, ino: Ino) -> Option<(Ino, &OsString)> {
        if let Some(dir) = self.parent(ino) {
            let entries = self.dirs.get(&dir)?;
            return entries
                .iter()
                .find(|(_, i)| **i == ino)
                .map(|(n, _)| (dir, n));
        }
        let mut dirs: Vec<_> = self.dirs.iter().collect();
        dirs.sort_by_key(|(d, _)| **d);
        dirs.into_iter().find_map(|(dir, entries)| {
            entries
                .iter()
                .find(|(_, i)| **i == ino)
                .map(|(n, _)| (*dir, n))
        })
    }

    /// Every inode reachable here, the root included.
    #[cfg(test)]
    pub(crate) fn reachable(&self) -> impl Iterator<Item = Ino> + '_ {
        std::iter::once(ROOT).chain(self.links.keys().copied())
    }

    /// Applies `op` (already checked valid for this state).
    pub(crate) fn apply(&mut self, op: &NsOp) {
        match op {
            NsOp::Link { at, ino, new_dir } => {
                if *new_dir {
                    self.dirs.entry(*ino).or_default();
                }
                self.insert(at, *ino);
            }
            NsOp::Unlink { at, .. } => {
                if let Some(ino) = self.dirs.get_mut(&at.dir).and_then(|e| e.remove(&at.name)) {
                    self.drop_link(ino);
                }
            }
            NsOp::Rename { from, to, .. } => self.rename(from, to),
            NsOp::Exchange { a, b, .. } => self.exchange(a, b),
        }
    }

    /// `at` names `ino`; whatever it named before loses that name.
    fn insert(&mut self, at: &Entry, ino: Ino) {
        let Some(entries) = self.dirs.get_mut(&at.dir) else {
            return;
        };
        let old = entries.insert(at.name.clone(), ino);
        *self.links.entry(ino).or_insert(0) += 1;
        if self.is_dir(ino) {
            self.parents.insert(ino, at.dir);
        }
        if let Some(old) = old {
            self.drop_link(old);
        }
    }

    fn rename(&mut self, from: &Entry, to: &Entry) {
        let Some(ino) = self
            .dirs
            .get_mut(&from.dir)
            .and_then(|e| e.remove(&from.name))
        else {
            return;
        };
        // Moved, not relinked: the count stays, `insert` adds one back.
        if let Some(n) = self.links.get_mut(&ino) {
            *n -= 1;
        }
        self.insert(to, ino);
    }

    fn exchange(&mut self, a: &Entry, b: &Entry) {
        let (Some(a_ino), Some(b_ino)) = (self.get(a.dir, &a.name), self.get(b.dir, &b.name))
        else {
            return;
        };
        for (at, ino) in [(a, b_ino), (b, a_ino)] {
            if let Some(entries) = self.dirs.get_mut(&at.dir) {
                entries.insert(at.name.clone(), ino);
            }
            if self.is_dir(ino) {
                self.parents.insert(ino, at.dir);
            }
        }
    }

    /// `ino` lost a name; at zero it is gone from this tree (a directory
    /// is then empty: every op emptying it came before).
    fn drop_link(&mut self, ino: Ino) {
        let Some(n) = self.links.get_mut(&ino) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.links.remove(&ino);
            self.dirs.remove(&ino);
            self.parents.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(dir: Ino, name: &str) -> Entry {
        Entry::new(dir, OsStr::new(name))
    }

    #[test]
    fn link_rename_exchange_unlink() {
        let mut ns = Namespace::with_root();
        ns.apply(&NsOp::Link {
            at: e(ROOT, "d"),
            ino: 2,
            new_dir: true,
        });
        ns.apply(&NsOp::Link {
            at: e(2, "f"),
            ino: 3,
            new_dir: false,
        });
        ns.apply(&NsOp::Link {
            at: e(ROOT, "g"),
            ino: 3,
            new_dir: false,
        });
        assert_eq!(ns.links(3), 2);
        assert_eq!(ns.path_of(2).as_deref(), Some("d"));
        assert_eq!(ns.path_of(3).as_deref(), Some("g"));
        ns.apply(&NsOp::Link {
            at: e(ROOT, "h"),
            ino: 4,
            new_dir: false,
        });
        ns.apply(&NsOp::Rename {
            from: e(ROOT, "h"),
            to: e(ROOT, "g"),
            ino: 4,
            replaced: Some(3),
        });
        assert_eq!(ns.links(3), 1);
        assert_eq!(ns.links(4), 1);
        assert_eq!(ns.get(ROOT, OsStr::new("h")), None);
        ns.apply(&NsOp::Exchange {
            a: e(ROOT, "g"),
            b: e(2, "f"),
            a_ino: 4,
            b_ino: 3,
        });
        assert_eq!(ns.get(2, OsStr::new("f")), Some(4));
        assert!(ns.is_ancestor(ROOT, 2) && !ns.is_ancestor(2, ROOT));
        ns.apply(&NsOp::Unlink {
            at: e(2, "f"),
            ino: 4,
        });
        ns.apply(&NsOp::Unlink {
            at: e(ROOT, "d"),
            ino: 2,
        });
        assert!(!ns.contains(2) && !ns.contains(4) && ns.contains(3));
        assert_eq!(ns.reachable().count(), 2);
    }
}
