//! A raw NBD client speaking bytes by hand (with nbd-proto encoders), for
//! protocol edge cases real clients never produce.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use nbd_proto::consts::*;
use nbd_proto::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};

pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

pub struct RawClient {
    pub stream: Pin<Box<dyn Stream>>,
}

/// One reply as read off the wire.
#[derive(Debug)]
pub enum RawReply {
    Simple {
        error: u32,
        handle: u64,
        data: Vec<u8>,
    },
    Chunk {
        header: StructuredReplyHeader,
        payload: Vec<u8>,
    },
}

impl RawReply {
    pub fn handle(&self) -> u64 {
        match self {
            RawReply::Simple { handle, .. } => *handle,
            RawReply::Chunk { header, .. } => header.handle,
        }
    }

    /// The errno of a simple reply or of an error chunk (0 for success).
    pub fn error(&self) -> u32 {
        match self {
            RawReply::Simple { error, .. } => *error,
            RawReply::Chunk { header, payload } if header.is_error() => {
                ErrorChunk::decode(header.reply_type, payload)
                    .unwrap()
                    .error
            }
            RawReply::Chunk { .. } => 0,
        }
    }
}

impl RawClient {
    pub async fn unix(path: &Path) -> RawClient {
        RawClient {
            stream: Box::pin(UnixStream::connect(path).await.unwrap()),
        }
    }

    pub async fn tcp(addr: SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        RawClient {
            stream: Box::pin(stream),
        }
    }

    /// A unix client and a watch on its socket.
    pub async fn unix_watched(path: &Path) -> (RawClient, HangUpWatch) {
        let stream = UnixStream::connect(path).await.unwrap().into_std().unwrap();
        let watch = UnixStream::from_std(stream.try_clone().unwrap()).unwrap();
        let client = RawClient {
            stream: Box::pin(UnixStream::from_std(stream).unwrap()),
        };
        (client, HangUpWatch::Unix(watch))
    }

    /// A TCP client and a watch on its socket.
    pub async fn tcp_watched(addr: SocketAddr) -> (RawClient, HangUpWatch) {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let stream = stream.into_std().unwrap();
        let watch = TcpStream::from_std(stream.try_clone().unwrap()).unwrap();
        let client = RawClient {
            stream: Box::pin(TcpStream::from_std(stream).unwrap()),
        };
        (client, HangUpWatch::Tcp(watch))
    }

    /// Runs the TLS handshake (after STARTTLS was acknowledged), trusting
    /// the CA in `ca_pem`, optionally presenting a client certificate;
    /// the rest of the connection runs inside TLS.
    pub async fn upgrade_tls(
        &mut self,
        ca_pem: &Path,
        client: Option<(&Path, &Path)>,
    ) -> std::io::Result<()> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_pem).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect();
                let key = PrivateKeyDer::from_pem_file(key).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        };
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let name = ServerName::try_from("localhost").unwrap();
        let plain = std::mem::replace(&mut self.stream, Box::pin(tokio::io::duplex(1).0));
        let mut tls = connector.connect(name, plain).await?;
        // TLS 1.3 reports a refused client certificate only on the first
        // read after the handshake; callers see it on their next read.
        tls.flush().await?;
        self.stream = Box::pin(tls);
        Ok(())
    }

    /// Reads the greeting and answers with fixed newstyle + no zeroes.
    pub async fn greet(&mut self) {
        let mut greeting = [0u8; GREETING_BYTES];
        self.stream.read_exact(&mut greeting).await.unwrap();
        let greeting = Greeting::decode(&greeting).unwrap();
        assert_eq!(
            greeting.handshake_flags,
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
        let flags = ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        };
        self.stream.write_all(&flags.encode()).await.unwrap();
    }

    pub async fn send_option(&mut self, option: u32, data: &[u8]) {
        let header = OptionHeader {
            option,
            length_bytes: data.len() as u32,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(data);
        self.stream.write_all(&bytes).await.unwrap();
    }

    pub async fn read_option_reply(&mut self) -> (OptionReplyHeader, Vec<u8>) {
        let mut header = [0u8; OPTION_REPLY_HEADER_BYTES];
        self.stream.read_exact(&mut header).await.unwrap();
        let header = OptionReplyHeader::decode(&header).unwrap();
        let mut payload = vec![0u8; header.length_bytes as usize];
        self.stream.read_exact(&mut payload).await.unwrap();
        (header, payload)
    }

    /// Option replies up to and including the final ACK or error.
    pub async fn read_option_replies(&mut self) -> Vec<(OptionReplyHeader, Vec<u8>)> {
        let mut replies = Vec::new();
        loop {
            let reply = self.read_option_reply().await;
            let last = reply.0.reply_type == REP_ACK || reply.0.is_error();
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    /// Full handshake into transmission with NBD_OPT_GO. Returns size and
    /// transmission flags.
    pub async fn go(
        &mut self,
        export: &str,
        structured: bool,
        base_allocation: bool,
    ) -> (u64, u16) {
        self.greet().await;
        self.go_greeted(export, structured, base_allocation).await
    }

    /// `go` on a connection past the greeting (inside TLS, say).
    pub async fn go_greeted(
        &mut self,
        export: &str,
        structured: bool,
        base_allocation: bool,
    ) -> (u64, u16) {
        if structured {
            self.send_option(OPT_STRUCTURED_REPLY, &[]).await;
            assert_eq!(self.read_option_reply().await.0.reply_type, REP_ACK);
        }
        if base_allocation {
            let request = MetaContextRequest {
                export_name: export.into(),
                queries: vec![CONTEXT_BASE_ALLOCATION.into()],
            };
            self.send_option(OPT_SET_META_CONTEXT, &request.encode().unwrap())
                .await;
            let replies = self.read_option_replies().await;
            assert_eq!(replies.len(), 2, "{replies:?}");
            assert_eq!(replies[0].0.reply_type, REP_META_CONTEXT);
        }
        let request = InfoRequest {
            export_name: export.into(),
            info_types: vec![INFO_BLOCK_SIZE],
        };
        self.send_option(OPT_GO, &request.encode().unwrap()).await;
        let mut export_info = None;
        for (header, payload) in self.read_option_replies().await {
            assert!(
                !header.is_error(),
                "GO failed: {header:?} {}",
                String::from_utf8_lossy(&payload)
            );
            if let Ok(InfoReply::Export {
                size_bytes,
                transmission_flags,
            }) = InfoReply::decode(&payload)
            {
                export_info = Some((size_bytes, transmission_flags));
            }
        }
        export_info.expect("no NBD_INFO_EXPORT")
    }

    pub async fn send_request(
        &mut self,
        flags: u16,
        command_type: u16,
        handle: u64,
        offset_bytes: u64,
        length_bytes: u32,
    ) {
        let header = RequestHeader {
            flags,
            command_type,
            handle,
            offset_bytes,
            length_bytes,
        };
        self.stream.write_all(&header.encode()).await.unwrap();
    }

    pub async fn send_write(&mut self, handle: u64, offset_bytes: u64, data: &[u8]) {
        let header = RequestHeader {
            flags: 0,
            command_type: CMD_WRITE,
            handle,
            offset_bytes,
            length_bytes: data.len() as u32,
        };
        let mut bytes = header.encode().to_vec();
        bytes.extend_from_slice(data);
        self.stream.write_all(&bytes).await.unwrap();
    }

    /// Reads one reply. A successful simple reply carries `read_length`
    /// bytes of data (0 for anything but READ).
    pub async fn read_reply(&mut self, read_length: usize) -> RawReply {
        self.read_reply_with(|_| read_length).await
    }

    /// Like `read_reply`, with the data length of a simple reply chosen by handle.
    pub async fn read_reply_with(&mut self, read_length: impl Fn(u64) -> usize) -> RawReply {
        read_reply_from(&mut self.stream, read_length).await
    }

    /// Reads until end of stream; true if the server closed the connection.
    pub async fn closed_by_server(&mut self) -> bool {
        let mut buffer = [0u8; 1024];
        loop {
            match self.stream.read(&mut buffer).await {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(_) => return true,
            }
        }
    }
}

/// Reads one reply from `stream` (e.g. the read half of a split client);
/// a successful simple reply carries `read_length(handle)` bytes of data.
pub async fn read_reply_from<R: AsyncRead + Unpin + ?Sized>(
    stream: &mut R,
    read_length: impl Fn(u64) -> usize,
) -> RawReply {
    let mut magic = [0u8; 4];
    stream.read_exact(&mut magic).await.unwrap();
    match ReplyKind::detect(&magic).unwrap() {
        ReplyKind::Simple => {
            let mut rest = [0u8; SIMPLE_REPLY_HEADER_BYTES];
            rest[..4].copy_from_slice(&magic);
            stream.read_exact(&mut rest[4..]).await.unwrap();
            let header = SimpleReplyHeader::decode(&rest).unwrap();
            let mut data = vec![
                0u8;
                if header.error == 0 {
                    read_length(header.handle)
                } else {
                    0
                }
            ];
            stream.read_exact(&mut data).await.unwrap();
            RawReply::Simple {
                error: header.error,
                handle: header.handle,
                data,
            }
        }
        ReplyKind::Structured => {
            let mut rest = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
            rest[..4].copy_from_slice(&magic);
            stream.read_exact(&mut rest[4..]).await.unwrap();
            let header = StructuredReplyHeader::decode(&rest).unwrap();
            let mut payload = vec![0u8; header.length_bytes as usize];
            stream.read_exact(&mut payload).await.unwrap();
            RawReply::Chunk { header, payload }
        }
    }
}

/// A second handle on a client's socket that tells whether the server has
/// closed the connection, without reading from it (a client that reads
/// its replies is not one that stopped reading them).
pub enum HangUpWatch {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl HangUpWatch {
    /// Whether the server has closed the connection by now.
    pub async fn is_closed(&self) -> bool {
        let ready = async {
            match self {
                HangUpWatch::Unix(stream) => stream.ready(Interest::READABLE).await,
                HangUpWatch::Tcp(stream) => stream.ready(Interest::READABLE).await,
            }
        };
        match tokio::time::timeout(Duration::from_millis(1), ready).await {
            Ok(ready) => ready.unwrap().is_read_closed(),
            Err(_) => false,
        }
    }

    /// Waits until the server has closed the connection.
    pub async fn closed(&self) {
        while !self.is_closed().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
