//! One writer per volume: a local lock, a lease object held through a
//! host's liveness, and an epoch.
//!
//! This folder owns the right to write a volume, and nothing else: it never
//! touches volume data, the journal or the caches. Design and safety
//! argument: `docs/design/ownership.md`.
//!
//! A host (one `strata serve` and its data directory) proves it is alive
//! with one object, `.hosts/<id>`, renewed every TTL/3 (`host_liveness.rs`).
//! Opening a volume takes, in order:
//!
//! 1. an exclusive `flock` on `<data-dir>/journals/<volume>-<uuid>.lock`
//!    (never unlinked while anyone may hold it): a second process on the same
//!    data directory is refused at once, and holding it proves that an older
//!    lease with *our* holder id belongs to a process that is gone;
//! 2. the lease object `<volume>/lease`, written with a conditional PUT
//!    (If-None-Match when absent, If-Match on the version read otherwise),
//!    naming this host and its incarnation. It is refused while its holder's
//!    host is alive; taken when it is ours, released, held by a host that
//!    stopped or by an incarnation that is over, or by a host that did not
//!    renew within its TTL, once that host is *declared expired* (a
//!    conditional write of its record, which its next renewal then fails);
//! 3. an epoch bump in the manifest (also If-Match), by `take_ownership.rs`.
//!    Every later manifest write is conditional on the version we wrote, so a
//!    writer whose volume was taken over fails its next manifest write.
//!
//! The lease is written again only when ownership changes (close,
//! handover, takeover) or when the host, declared expired, starts a new
//! incarnation: then each open volume re-claims its lease (If-Match on the
//! version it wrote) before writing, and one that was taken over is
//! *fenced*. An idle volume sends nothing. Writes and uploads are allowed
//! only while the host's last renewal was *sent* less than TTL - margin ago
//! (monotonic clock) and the lease stands under the current incarnation.
//! A clean close writes a released lease, so another host opens the volume
//! at once; a close at a standby's request writes it naming the standby's
//! host (`lease_transfer.rs`), which then opens without taking it.
//!
//! Safety rests on hosts' wall clocks agreeing to well within the margin
//! (the expiry test reads the host's `renewed_unix_ms`): run NTP. Segment
//! objects are written with If-None-Match, so even a writer paused past its
//! liveness cannot overwrite a segment of the new holder.
//!
//! Files: `local_lock.rs` (the flock and the holder id), `host_liveness.rs`
//! (the host record's protocol), `lease.rs` (the lease object's protocol),
//! `lease_transfer.rs` (a lease handed straight to a standby's host),
//! `request_watch.rs` (requests looked for often while a standby exists),
//! `take_ownership.rs` (opening: all three steps), `manifest_writer.rs`
//! (every later manifest write, fenced by epoch), and `right_to_write.rs`
//! (`Ownership`: the right to write while a volume is open). Layouts:
//! `format/lease.rs`, `format/host_record.rs`.

mod host_liveness;
mod lease;
mod lease_transfer;
mod local_lock;
mod manifest_writer;
mod request_watch;
mod right_to_write;
mod take_ownership;

pub(crate) use host_liveness::{push_request, read_host_record, send_request_through_store};
pub use host_liveness::{request_handover_through_store, HostLiveness, HostStats};
pub(crate) use lease::RenewError;
pub use lease::{live_holder, read_lease, standing, Standing};
pub use lease_transfer::Successor;
pub(crate) use lease_transfer::{release_transferred, successor_of};
pub use local_lock::{holder_id, hostname};
pub(crate) use manifest_writer::ManifestWriter;
pub use request_watch::RequestWatch;
pub use right_to_write::{LeaseState, LeaseStats};
pub(crate) use right_to_write::{Ownership, WriteRefused};
pub(crate) use take_ownership::{take_ownership, take_transferred_ownership};
