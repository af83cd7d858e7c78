//! Store failures said for people, and whether sending the request again
//! can help.
//!
//! This module owns [`StoreFailure`]: what went wrong between strata and a
//! store, in words a user can act on ("cannot connect to ENDPOINT (bucket
//! B): connection refused; check ..."), with a [`FailureKind`] that decides
//! retrying (`retrying_object_store::is_transient` looks for one in an
//! error's chain: an authentication error is never retried). It also owns
//! reading what object_store's errors carry: the HTTP status and the S3
//! error code of a reply, the transport error kind, the I/O error below.
//!
//! object_store keeps its request error type private, so the status is read
//! from the text that type prints ("Server returned non-2xx status code:
//! 403 Forbidden: <body>"). That text is pinned by the object_store version
//! in Cargo.lock; the tests against a local HTTP listener and MinIO fail if
//! an upgrade changes it.

use std::error::Error as StdError;

use object_store::client::{HttpError, HttpErrorKind};

/// What kind of failure, for retry decisions and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No connection could be made (refused, no route, unknown host).
    Unreachable,
    /// No answer in time.
    TimedOut,
    /// The service answered that it is overloaded or failing (5xx, 429).
    ServerError,
    /// The store does not accept the credentials (unknown key, wrong
    /// secret, expired token), or none could be had.
    Unauthenticated,
    /// The credentials are valid but not allowed to do this.
    Denied,
    /// The bucket does not exist.
    NoSuchBucket,
    /// The store refuses the request as it is (wrong region, bad request).
    Rejected,
    /// The local disk holding the store is full.
    DiskFull,
    /// The local store's directory cannot be written.
    NotWritable,
}

impl FailureKind {
    /// Whether the same request may succeed if sent again soon. A refused
    /// connection, a timeout or a server error may be a restart or a load
    /// peak; credentials, permissions,
    /// a missing bucket or a full disk do not change within a retry.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            FailureKind::Unreachable | FailureKind::TimedOut | FailureKind::ServerError
        )
    }
}

/// A store failure explained: the message says what failed and what to do.
/// `detail` keeps object_store's own text (with the request URL) for debug
/// logs; it is not part of the message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreFailure {
    pub kind: FailureKind,
    pub message: String,
    pub detail: String,
}

impl StoreFailure {
    pub fn new(kind: FailureKind, message: String, detail: String) -> StoreFailure {
        StoreFailure {
            kind,
            message,
            detail,
        }
    }

    /// The first `StoreFailure` in `error`'s chain.
    pub fn find<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a StoreFailure> {
        chain(error).find_map(|e| e.downcast_ref::<StoreFailure>())
    }
}

/// `error` and its sources, outermost first (at most 32: a cycle cannot
/// hang a message).
pub fn chain<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let next = |e: &&'a (dyn StdError + 'static)| -> Option<&'a (dyn StdError + 'static)> {
        let e: &'a (dyn StdError + 'static) = *e;
        e.source()
    };
    std::iter::successors(Some(error), next).take(32)
}

/// An HTTP reply that was not a success, as object_store reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    /// The S3 error code (`<Code>` of the XML body), if any.
    pub code: Option<String>,
    /// The S3 error message (`<Message>`), if any.
    pub message: Option<String>,
}

const STATUS_PREFIXES: [&str; 2] = [
    "Server returned non-2xx status code: ",
    "Server returned error response: ",
];

/// The non-success HTTP reply somewhere in `error`'s chain.
pub fn http_reply(error: &(dyn StdError + 'static)) -> Option<HttpReply> {
    chain(error).find_map(|e| parse_reply(&e.to_string()))
}

fn parse_reply(text: &str) -> Option<HttpReply> {
    let rest = STATUS_PREFIXES.iter().find_map(|p| text.strip_prefix(p))?;
    let status: u16 = rest.get(..3)?.parse().ok()?;
    Some(HttpReply {
        status,
        code: xml_field(rest, "Code"),
        message: xml_field(rest, "Message"),
    })
}

/// The text of the first `<name>...</name>` in `xml`, bounded.
fn xml_field(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{name}>"))? + start;
    let value: String = xml[start..end].chars().take(300).collect();
    Some(value).filter(|v| !v.is_empty())
}

/// The method and URL of the request that failed ("Error performing GET
/// http://... in 3ms - ..."), if object_store said.
pub fn failed_request(error: &(dyn StdError + 'static)) -> Option<(String, String)> {
    chain(error).find_map(|e| {
        let text = e.to_string();
        let rest = text.strip_prefix("Error performing ")?;
        let mut words = rest.split_whitespace();
        let method = words.next()?.to_string();
        let url = words.next()?.to_string();
        Some((method, url))
    })
}

/// The transport error kind (connect, timeout) in `error`'s chain.
///
/// object_store's `HttpError` carries it, but the request error above it
/// is `#[error(transparent)]`, which skips it in the source chain. So the
/// kind is also read from what is below it: the I/O error of the socket
/// (refused, unreachable, timed out), or the texts hyper and reqwest give
/// a failed connection ("client error (Connect)", "dns error") and a
/// timeout ("operation timed out").
pub fn transport_kind(error: &(dyn StdError + 'static)) -> Option<HttpErrorKind> {
    use std::io::ErrorKind;
    if let Some(h) = chain(error).find_map(|e| e.downcast_ref::<HttpError>()) {
        return Some(h.kind());
    }
    match io_kind(error) {
        Some(
            ErrorKind::ConnectionRefused
            | ErrorKind::HostUnreachable
            | ErrorKind::NetworkUnreachable
            | ErrorKind::AddrNotAvailable,
        ) => return Some(HttpErrorKind::Connect),
        Some(ErrorKind::TimedOut) => return Some(HttpErrorKind::Timeout),
        _ => {}
    }
    let says = |marker: &str| chain(error).any(|e| e.to_string().contains(marker));
    if says("client error (Connect)") || says("dns error") {
        return Some(HttpErrorKind::Connect);
    }
    if says("operation timed out") {
        return Some(HttpErrorKind::Timeout);
    }
    None
}

/// The innermost error's text: the one that says what really happened
/// ("Connection refused (os error 111)"), without the layers' wrapping.
pub fn root_cause(error: &(dyn StdError + 'static)) -> String {
    let innermost = chain(error).last().unwrap_or(error);
    if let Some(io) = chain(error).find_map(|e| e.downcast_ref::<std::io::Error>()) {
        return io.to_string();
    }
    innermost.to_string()
}

/// The `std::io::ErrorKind` of the first I/O error in the chain.
pub fn io_kind(error: &(dyn StdError + 'static)) -> Option<std::io::ErrorKind> {
    chain(error).find_map(|e| e.downcast_ref::<std::io::Error>().map(|io| io.kind()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_code_and_message_of_an_s3_reply() {
        let r = parse_reply("Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match</Message></Error>").unwrap();
        assert_eq!(r.status, 403);
        assert_eq!(r.code.as_deref(), Some("SignatureDoesNotMatch"));
        assert!(r.message.unwrap().starts_with("The request signature"));
        let r = parse_reply("Server returned non-2xx status code: 404 Not Found: ").unwrap();
        assert_eq!((r.status, r.code), (404, None));
        assert!(parse_reply("Server returned non-2xx status code: x").is_none());
        assert!(parse_reply("something else").is_none());
    }

    #[test]
    fn only_unreachable_timeouts_and_server_errors_are_transient() {
        use FailureKind::*;
        for k in [Unreachable, TimedOut, ServerError] {
            assert!(k.is_transient(), "{k:?}");
        }
        for k in [
            Unauthenticated,
            Denied,
            NoSuchBucket,
            Rejected,
            DiskFull,
            NotWritable,
        ] {
            assert!(!k.is_transient(), "{k:?}");
        }
    }

    #[test]
    fn finds_a_failure_below_object_store_errors() {
        let failure = StoreFailure::new(FailureKind::Denied, "no".into(), String::new());
        let e = object_store::Error::Generic {
            store: "S3",
            source: Box::new(failure),
        };
        assert_eq!(StoreFailure::find(&e).unwrap().kind, FailureKind::Denied);
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(StoreFailure::find(&io).is_none());
        assert_eq!(io_kind(&io), Some(std::io::ErrorKind::ConnectionRefused));
    }
}
