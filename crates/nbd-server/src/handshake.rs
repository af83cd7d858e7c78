//! The fixed-newstyle handshake: greeting, client flags, and option
//! haggling (EXPORT_NAME, ABORT, LIST, INFO, GO, STRUCTURED_REPLY,
//! LIST_META_CONTEXT, SET_META_CONTEXT, STARTTLS; anything else gets
//! NBD_REP_ERR_UNSUP) until the client enters transmission or leaves.
//!
//! STARTTLS ends this stream's haggling (`Outcome::StartTls`): the caller
//! runs the TLS handshake and haggles again inside TLS, from scratch (the
//! protocol says what was negotiated before TLS is forgotten). Where TLS
//! is required, every option but STARTTLS and ABORT before it gets
//! NBD_REP_ERR_TLS_REQD, and EXPORT_NAME (which cannot be refused) closes
//! the connection: nothing is served in plaintext.
//!
//! Errors are `io::Error`s whose kind says what happened: `UnexpectedEof`
//! (client went away), `InvalidData` (protocol violation, connection
//! dropped), `NotFound` (unknown export via NBD_OPT_EXPORT_NAME, which
//! cannot be answered with an error).

use std::io;
use std::sync::Arc;

use nbd_proto::consts::*;
use nbd_proto::{
    decode_export_name, encode_option_error_into, encode_option_reply_into, ClientFlags,
    ExportNameReply, Greeting, InfoReply, InfoRequest, MetaContextReply, MetaContextRequest,
    OptionHeader, ServerEntry,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::ServerConfig;
use crate::device::ExportProvider;
use crate::export::{Export, ExportParams};
use crate::tls::TlsMode;

/// Longest option data accepted; longer options drop the connection.
pub(crate) const MAX_OPTION_DATA_BYTES: u32 = 64 * 1024;
/// Handshake flags we offer.
const HANDSHAKE_FLAGS: u16 = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
/// Context id we give `base:allocation`.
const BASE_ALLOCATION_ID: u32 = 1;

/// How a successful handshake ends.
pub(crate) enum Outcome<D> {
    Transmission(Export<D>),
    /// The client sent NBD_OPT_ABORT.
    Aborted,
    /// NBD_OPT_STARTTLS was acknowledged: the TLS handshake comes next.
    StartTls(ClientFlags),
}

/// Where a connection stands on TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Security {
    /// The server has no TLS.
    NoTls,
    /// Plaintext so far; TLS offered under this policy.
    Offered(TlsMode),
    /// Inside TLS.
    Encrypted,
}

/// Time a handshake spends in the provider's `open` (a strata standby
/// registering with its holder through the store takes seconds): the
/// handshake timeout bounds the client, not the provider, which bounds
/// its own work (`connection.rs` extends the deadline by it).
#[derive(Debug, Default)]
pub(crate) struct HandshakeClock {
    provider_ms: std::sync::atomic::AtomicU64,
    in_provider: std::sync::atomic::AtomicBool,
}

impl HandshakeClock {
    /// Milliseconds spent in finished provider calls.
    pub(crate) fn provider_ms(&self) -> u64 {
        self.provider_ms.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a provider call is under way now.
    pub(crate) fn in_provider(&self) -> bool {
        self.in_provider.load(std::sync::atomic::Ordering::Acquire)
    }

    async fn time<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering;
        let started = std::time::Instant::now();
        self.in_provider.store(true, Ordering::Release);
        let out = call.await;
        let ms = started.elapsed().as_millis() as u64;
        self.provider_ms.fetch_add(ms, Ordering::AcqRel);
        self.in_provider.store(false, Ordering::Release);
        out
    }
}

/// Runs the handshake on `stream` until transmission, abort, or STARTTLS.
pub(crate) async fn negotiate<S, P>(
    stream: &mut S,
    provider: &P,
    config: &ServerConfig,
    security: Security,
    clock: &HandshakeClock,
) -> io::Result<Outcome<P::Device>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    P: ExportProvider,
{
    let greeting = Greeting {
        handshake_flags: HANDSHAKE_FLAGS,
    };
    stream.write_all(&greeting.encode()).await?;
    let mut flag_bytes = [0u8; CLIENT_FLAGS_BYTES];
    stream.read_exact(&mut flag_bytes).await?;
    let client_flags = ClientFlags::decode(&flag_bytes, HANDSHAKE_FLAGS).map_err(invalid_data)?;
    if security == Security::Offered(TlsMode::Require) && !client_flags.fixed_newstyle {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "TLS is required and the client does not speak fixed newstyle (needed for STARTTLS)",
        ));
    }
    haggle(stream, provider, config, client_flags, security, clock).await
}

/// Haggles options on `stream` until transmission, abort, or STARTTLS
/// (after the greeting; again from scratch inside TLS).
pub(crate) async fn haggle<S, P>(
    stream: &mut S,
    provider: &P,
    config: &ServerConfig,
    client_flags: ClientFlags,
    security: Security,
    clock: &HandshakeClock,
) -> io::Result<Outcome<P::Device>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    P: ExportProvider,
{
    let mut haggle = Haggle::new(provider, config, client_flags, security, clock);
    loop {
        let (option, data) = read_option(stream).await?;
        let mut out = Vec::new();
        let step = haggle.handle(option, &data, &mut out).await;
        // Flushed: inside TLS, written bytes may wait in the session.
        let written = match stream.write_all(&out).await {
            Ok(()) => stream.flush().await,
            Err(e) => Err(e),
        };
        match step {
            Step::Continue => written?,
            Step::Finish(Outcome::Aborted) => return Ok(Outcome::Aborted),
            Step::Finish(outcome) => {
                written?;
                stream.flush().await?;
                return Ok(outcome);
            }
            Step::Close(error) => return Err(error),
        }
    }
}

async fn read_option<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<(u32, Vec<u8>)> {
    let mut header_bytes = [0u8; OPTION_HEADER_BYTES];
    stream.read_exact(&mut header_bytes).await?;
    let header = OptionHeader::decode(&header_bytes).map_err(invalid_data)?;
    if header.length_bytes > MAX_OPTION_DATA_BYTES {
        return Err(invalid_data(format!(
            "option {} has {} bytes of data, more than the {} allowed",
            header.option, header.length_bytes, MAX_OPTION_DATA_BYTES
        )));
    }
    let mut data = vec![0u8; header.length_bytes as usize];
    stream.read_exact(&mut data).await?;
    Ok((header.option, data))
}

fn invalid_data(error: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}

enum Step<D> {
    Continue,
    Finish(Outcome<D>),
    Close(io::Error),
}

/// The last NBD_OPT_SET_META_CONTEXT.
struct MetaSelection {
    export_name: String,
    base_allocation: bool,
}

/// Option haggling state of one connection.
struct Haggle<'a, P: ExportProvider> {
    provider: &'a P,
    config: &'a ServerConfig,
    client_flags: ClientFlags,
    structured_replies: bool,
    meta: Option<MetaSelection>,
    /// The export opened by INFO/GO, kept so GO after INFO opens it once.
    opened: Option<(String, Arc<P::Device>)>,
    security: Security,
    told_tls_required: bool,
    clock: &'a HandshakeClock,
}

impl<'a, P: ExportProvider> Haggle<'a, P> {
    fn new(
        provider: &'a P,
        config: &'a ServerConfig,
        client_flags: ClientFlags,
        security: Security,
        clock: &'a HandshakeClock,
    ) -> Self {
        Haggle {
            clock,
            provider,
            config,
            client_flags,
            structured_replies: false,
            meta: None,
            opened: None,
            security,
            told_tls_required: false,
        }
    }

    async fn handle(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Step<P::Device> {
        if option == OPT_STARTTLS {
            return self.starttls(data, out);
        }
        if self.security == Security::Offered(TlsMode::Require) && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                let message = "NBD_OPT_EXPORT_NAME before TLS, which this server requires";
                return Step::Close(io::Error::new(io::ErrorKind::PermissionDenied, message));
            }
            let message = "this server requires TLS: negotiate NBD_OPT_STARTTLS first";
            encode_option_error_into(out, option, REP_ERR_TLS_REQD, message);
            if !self.told_tls_required {
                // Once per connection: why a plaintext client gets nothing.
                self.told_tls_required = true;
                tracing::warn!(
                    option,
                    "plaintext client refused: TLS is required (use an nbds:// URI or tls-creds)"
                );
            }
            return Step::Continue;
        }
        match option {
            OPT_EXPORT_NAME => return self.export_name(data, out).await,
            OPT_ABORT => {
                reply(out, option, REP_ACK, &[]);
                return Step::Finish(Outcome::Aborted);
            }
            OPT_INFO | OPT_GO => return self.info_or_go(option, data, out).await,
            OPT_LIST => self.list(data, out).await,
            OPT_STRUCTURED_REPLY => self.structured_reply(data, out),
            OPT_LIST_META_CONTEXT => self.list_meta_context(data, out),
            OPT_SET_META_CONTEXT => self.set_meta_context(data, out),
            _ => encode_option_error_into(out, option, REP_ERR_UNSUP, "option not supported"),
        }
        Step::Continue
    }

    fn starttls(&self, data: &[u8], out: &mut Vec<u8>) -> Step<P::Device> {
        let refusal = match self.security {
            _ if !data.is_empty() => Some((REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")),
            Security::NoTls => Some((REP_ERR_UNSUP, "this server does not offer TLS")),
            Security::Encrypted => Some((REP_ERR_INVALID, "TLS is already negotiated")),
            Security::Offered(_) => None,
        };
        if let Some((error, message)) = refusal {
            encode_option_error_into(out, OPT_STARTTLS, error, message);
            return Step::Continue;
        }
        reply(out, OPT_STARTTLS, REP_ACK, &[]);
        Step::Finish(Outcome::StartTls(self.client_flags))
    }

    async fn export_name(&mut self, data: &[u8], out: &mut Vec<u8>) -> Step<P::Device> {
        let name = match decode_export_name(data) {
            Ok(name) => name,
            Err(error) => return Step::Close(invalid_data(error)),
        };
        let device = match self.open(&name).await {
            Ok(device) => device,
            Err(message) => {
                let message = format!("NBD_OPT_EXPORT_NAME {name:?}: {message}");
                return Step::Close(io::Error::new(io::ErrorKind::NotFound, message));
            }
        };
        let params = ExportParams::of(&*device, self.config);
        let reply = ExportNameReply {
            size_bytes: params.size_bytes,
            transmission_flags: params.transmission_flags,
        };
        out.extend_from_slice(&reply.encode(self.client_flags.no_zeroes));
        Step::Finish(Outcome::Transmission(self.export(name, device, params)))
    }

    async fn info_or_go(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Step<P::Device> {
        let request = match InfoRequest::decode(data) {
            Ok(request) => request,
            Err(error) => {
                encode_option_error_into(out, option, REP_ERR_INVALID, &error.to_string());
                return Step::Continue;
            }
        };
        let device = match self.open(&request.export_name).await {
            Ok(device) => device,
            Err(message) => {
                encode_option_error_into(out, option, REP_ERR_UNKNOWN, &message);
                return Step::Continue;
            }
        };
        let params = ExportParams::of(&*device, self.config);
        for info in self.info_replies(&request, &params).await {
            match info.encode() {
                Ok(payload) => reply(out, option, REP_INFO, &payload),
                Err(error) => tracing::warn!(%error, "cannot encode export information"),
            }
        }
        reply(out, option, REP_ACK, &[]);
        if option == OPT_INFO {
            return Step::Continue;
        }
        let export = self.export(request.export_name, device, params);
        Step::Finish(Outcome::Transmission(export))
    }

    /// NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE always; name and
    /// description when asked for.
    async fn info_replies(&self, request: &InfoRequest, params: &ExportParams) -> Vec<InfoReply> {
        let sizes = params.block_sizes;
        let mut infos = vec![
            InfoReply::Export {
                size_bytes: params.size_bytes,
                transmission_flags: params.transmission_flags,
            },
            InfoReply::BlockSize {
                minimum_bytes: sizes.minimum_bytes,
                preferred_bytes: sizes.preferred_bytes,
                maximum_bytes: sizes.maximum_bytes,
            },
        ];
        if request.info_types.contains(&INFO_NAME) {
            infos.push(InfoReply::Name(request.export_name.clone()));
        }
        if request.info_types.contains(&INFO_DESCRIPTION) {
            if let Some(description) = self.description(&request.export_name).await {
                infos.push(InfoReply::Description(description));
            }
        }
        infos
    }

    async fn description(&self, name: &str) -> Option<String> {
        let exports = self.provider.list().await.ok()?;
        let export = exports.into_iter().find(|export| export.name == name)?;
        Some(export.description).filter(|text| !text.is_empty())
    }

    /// Opens `name` (once per connection); the error is the reply text.
    async fn open(&mut self, name: &str) -> Result<Arc<P::Device>, String> {
        if let Some((opened_name, device)) = &self.opened {
            if opened_name == name {
                return Ok(Arc::clone(device));
            }
        }
        match self.clock.time(self.provider.open(name)).await {
            Ok(device) => {
                self.opened = Some((name.to_owned(), Arc::clone(&device)));
                Ok(device)
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                Err(format!("unknown export {name:?}"))
            }
            Err(error) => {
                tracing::warn!(export = %name, %error, "cannot open export");
                Err(error.to_string())
            }
        }
    }

    fn export(
        &self,
        name: String,
        device: Arc<P::Device>,
        params: ExportParams,
    ) -> Export<P::Device> {
        let base_allocation = self.structured_replies
            && self
                .meta
                .as_ref()
                .is_some_and(|meta| meta.base_allocation && meta.export_name == name);
        Export {
            name,
            device,
            params,
            structured_replies: self.structured_replies,
            base_allocation_id: base_allocation.then_some(BASE_ALLOCATION_ID),
        }
    }

    async fn list(&self, data: &[u8], out: &mut Vec<u8>) {
        if !data.is_empty() {
            encode_option_error_into(out, OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
            return;
        }
        let exports = match self.provider.list().await {
            Ok(exports) => exports,
            Err(error) => {
                tracing::warn!(%error, "cannot list exports");
                encode_option_error_into(out, OPT_LIST, REP_ERR_POLICY, &error.to_string());
                return;
            }
        };
        for export in exports {
            let entry = ServerEntry {
                name: export.name,
                description: export.description,
            };
            match entry.encode() {
                Ok(payload) => reply(out, OPT_LIST, REP_SERVER, &payload),
                Err(error) => tracing::warn!(name = %entry.name, %error, "cannot list export"),
            }
        }
        reply(out, OPT_LIST, REP_ACK, &[]);
    }

    fn structured_reply(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if !data.is_empty() {
            let message = "NBD_OPT_STRUCTURED_REPLY takes no data";
            encode_option_error_into(out, OPT_STRUCTURED_REPLY, REP_ERR_INVALID, message);
            return;
        }
        self.structured_replies = true;
        reply(out, OPT_STRUCTURED_REPLY, REP_ACK, &[]);
    }

    fn list_meta_context(&self, data: &[u8], out: &mut Vec<u8>) {
        let Some(request) = self.meta_request(OPT_LIST_META_CONTEXT, data, out) else {
            return;
        };
        let listed = request.queries.is_empty()
            || request
                .queries
                .iter()
                .any(|query| query == "base:" || query == CONTEXT_BASE_ALLOCATION);
        if listed {
            meta_context_reply(out, OPT_LIST_META_CONTEXT, 0);
        }
        reply(out, OPT_LIST_META_CONTEXT, REP_ACK, &[]);
    }

    fn set_meta_context(&mut self, data: &[u8], out: &mut Vec<u8>) {
        // The selection is replaced even when the option fails.
        self.meta = None;
        let Some(request) = self.meta_request(OPT_SET_META_CONTEXT, data, out) else {
            return;
        };
        let base_allocation = request
            .queries
            .iter()
            .any(|query| query == CONTEXT_BASE_ALLOCATION);
        if base_allocation {
            meta_context_reply(out, OPT_SET_META_CONTEXT, BASE_ALLOCATION_ID);
        }
        reply(out, OPT_SET_META_CONTEXT, REP_ACK, &[]);
        self.meta = Some(MetaSelection {
            export_name: request.export_name,
            base_allocation,
        });
    }

    /// Decodes LIST/SET_META_CONTEXT data; replies the error itself.
    fn meta_request(
        &self,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<MetaContextRequest> {
        if !self.structured_replies {
            let message = "structured replies must be negotiated first";
            encode_option_error_into(out, option, REP_ERR_INVALID, message);
            return None;
        }
        match MetaContextRequest::decode(data) {
            Ok(request) => Some(request),
            Err(error) => {
                encode_option_error_into(out, option, REP_ERR_INVALID, &error.to_string());
                None
            }
        }
    }
}

fn meta_context_reply(out: &mut Vec<u8>, option: u32, context_id: u32) {
    let context = MetaContextReply {
        context_id,
        name: CONTEXT_BASE_ALLOCATION.to_owned(),
    };
    match context.encode() {
        Ok(payload) => reply(out, option, REP_META_CONTEXT, &payload),
        Err(error) => encode_option_error_into(out, option, REP_ERR_TOO_BIG, &error.to_string()),
    }
}

/// Appends a reply; payloads we build always fit, but stay total anyway.
fn reply(out: &mut Vec<u8>, option: u32, reply_type: u32, payload: &[u8]) {
    if let Err(error) = encode_option_reply_into(out, option, reply_type, payload) {
        encode_option_error_into(out, option, REP_ERR_TOO_BIG, &error.to_string());
    }
}
