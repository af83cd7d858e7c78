//! One writer per volume: a local lock, a lease object, and an epoch.
//!
//! This folder owns the right to write a volume, and nothing else: it never
//! touches volume data, the journal or the caches. Opening takes, in order:
//!
//! 1. an exclusive `flock` on `<data-dir>/journals/<volume>-<uuid>.lock`
//!    (never unlinked while anyone may hold it): a second process on the same
//!    data directory is refused at once, and holding it proves that an older
//!    lease with *our* holder id belongs to a process that is gone;
//! 2. the lease object `<volume>/lease`, written with a conditional PUT
//!    (If-None-Match when absent, If-Match on the version read otherwise), so
//!    two hosts racing for an expired lease cannot both win. It is refused
//!    while another holder renewed it within its TTL; taken when it is ours
//!    (a crash of this data directory's previous server), released or expired;
//! 3. an epoch bump in the manifest (also If-Match), by `take_ownership.rs`.
//!    Every later manifest write is conditional on the version we wrote, so a
//!    writer whose volume was taken over fails its next manifest write.
//!
//! While open, the lease is renewed every TTL/3 with If-Match on the version
//! we wrote. Writes and uploads are allowed only while the last successful
//! renewal was *sent* less than TTL - margin ago (monotonic clock): past
//! that, another host may take the lease, so writers wait. A renewal that
//! finds someone else's lease means we were taken over: the volume is
//! *fenced* and stops serving. A clean close writes a released lease, so
//! another host opens the volume at once.
//!
//! Safety rests on hosts' wall clocks agreeing to well within the margin
//! (the expiry test reads the holder's `renewed_unix_ms`): run NTP. Segment
//! objects are written with If-None-Match, so even a writer paused past its
//! lease cannot overwrite a segment of the new holder.
//!
//! Files: `local_lock.rs` (the flock and the holder id), `lease.rs` (the
//! lease object's protocol), `take_ownership.rs` (opening: all three steps),
//! `manifest_writer.rs` (every later manifest write, fenced by epoch), and
//! `right_to_write.rs` (`Ownership`: the right to write while a volume is
//! open). The lease's
//! byte layout is `format/lease.rs`.

mod lease;
mod local_lock;
mod manifest_writer;
mod right_to_write;
mod take_ownership;

pub use lease::read_lease;
pub(crate) use lease::RenewError;
pub(crate) use manifest_writer::ManifestWriter;
pub use right_to_write::{LeaseState, LeaseStats};
pub(crate) use right_to_write::{Ownership, WriteRefused};
pub(crate) use take_ownership::take_ownership;
