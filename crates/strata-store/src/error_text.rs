//! Errors as people read them: one line, each cause once, outermost first.
//!
//! This module owns [`error_text`] (and [`ErrorText`], the same as a
//! `Display` for log fields): the one place that turns an error and its
//! chain of sources into text for the CLI's final message and the server's
//! log lines.
//!
//! Error types in the chain often print their source inside their own text
//! (`"list: {source}"`), so printing every level, as `{:#}` does, repeats
//! each cause once per layer above it. Here a cause whose text is already
//! in the line is left out, object_store's wrapper texts ("Generic S3
//! error: ...", and the variant text around an explained [`StoreFailure`])
//! are left out in favour of what they wrap, and an I/O error that says
//! nothing of what to do (a full disk, a read-only file system, no
//! permission) gets a hint, unless a [`StoreFailure`] already says it.

use std::error::Error as StdError;
use std::fmt;

use crate::store_failure::{chain, io_kind, StoreFailure};

/// `error` for people (see the module doc).
pub fn error_text(error: &(dyn StdError + 'static)) -> String {
    let mut line = String::new();
    for e in chain(error) {
        let text = own_text(e);
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    if StoreFailure::find(error).is_none() {
        if let Some(hint) = io_kind(error).and_then(io_hint) {
            if !line.contains(hint) {
                line.push_str("; ");
                line.push_str(hint);
            }
        }
    }
    one_line(&line)
}

/// [`error_text`] as a `Display`, for `tracing` fields: `error = %ErrorText(&e)`.
pub struct ErrorText<'a>(pub &'a (dyn StdError + 'static));

impl fmt::Display for ErrorText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&error_text(self.0))
    }
}

/// What one level of the chain adds ("" when it only wraps its source).
fn own_text(e: &(dyn StdError + 'static)) -> String {
    // A `#[source] Box<object_store::Error>` field is a chain level of
    // type `Box<...>`, not `object_store::Error`.
    let os = e
        .downcast_ref::<object_store::Error>()
        .or_else(|| e.downcast_ref::<Box<object_store::Error>>().map(|b| &**b));
    if let Some(os) = os {
        let wraps_failure = os
            .source()
            .is_some_and(|s| s.downcast_ref::<StoreFailure>().is_some());
        if wraps_failure || matches!(os, object_store::Error::Generic { .. }) {
            return String::new();
        }
    }
    e.to_string()
}

fn io_hint(kind: std::io::ErrorKind) -> Option<&'static str> {
    use std::io::ErrorKind;
    match kind {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
            Some("the disk is full: free space on it")
        }
        ErrorKind::ReadOnlyFilesystem => {
            Some("the file system is read-only: choose a writable directory")
        }
        ErrorKind::PermissionDenied => {
            Some("this user may not write there: fix the permissions or choose another directory")
        }
        _ => None,
    }
}

/// Newlines (an S3 message, a multi-line source) would break the one line.
fn one_line(text: &str) -> String {
    if !text.contains(['\n', '\r']) {
        return text.to_string();
    }
    text.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store_failure::FailureKind;

    /// An error that prints its source inside its own text, as many do.
    #[derive(Debug)]
    struct Wraps {
        what: &'static str,
        source: Box<dyn StdError + Send + Sync>,
    }

    impl fmt::Display for Wraps {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}: {}", self.what, self.source)
        }
    }

    impl StdError for Wraps {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self.source.as_ref())
        }
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let inner = Wraps {
            what: "error sending request",
            source: Box::new(io),
        };
        let outer = Wraps {
            what: "error sending request for url",
            source: Box::new(inner),
        };
        let e = anyhow::Error::new(outer).context("cannot list volumes");
        let text = error_text(e.as_ref());
        assert_eq!(
            text,
            "cannot list volumes: error sending request for url: error sending request: connection refused"
        );
        assert_eq!(text.matches("connection refused").count(), 1, "{text}");
        let alt = format!("{e:#}");
        assert!(
            alt.matches("connection refused").count() > 1,
            "{{:#}} repeats causes (what this module fixes): {alt}"
        );
    }

    #[test]
    fn object_store_wrappers_give_way_to_what_they_wrap() {
        let failure = StoreFailure::new(
            FailureKind::Unreachable,
            "cannot connect to http://h:9 (bucket \"b\"): refused".into(),
            "Generic S3 error: ...".into(),
        );
        let e = object_store::Error::Generic {
            store: "S3",
            source: Box::new(failure),
        };
        let e = anyhow::Error::new(e).context("cannot open the store");
        assert_eq!(
            error_text(e.as_ref()),
            "cannot open the store: cannot connect to http://h:9 (bucket \"b\"): refused"
        );
        let denied = object_store::Error::PermissionDenied {
            path: "v/manifest".into(),
            source: Box::new(StoreFailure::new(
                FailureKind::Denied,
                "denied".into(),
                String::new(),
            )),
        };
        assert_eq!(error_text(&denied), "denied");
    }

    #[test]
    fn io_errors_get_a_hint_and_lines_stay_one() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let e = anyhow::Error::new(full).context("journal /d/v: write");
        let text = error_text(e.as_ref());
        assert!(text.ends_with("free space on it"), "{text}");
        let multi = anyhow::anyhow!("first\nsecond\r\n");
        assert_eq!(error_text(multi.as_ref()), "first second");
    }
}
