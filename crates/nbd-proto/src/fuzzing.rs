//! Entry points for the fuzz targets and the randomized tests: run every
//! decoder over arbitrary bytes. Results are discarded; the point is that
//! nothing panics, and that whatever decodes re-encodes to the same bytes.

use crate::*;

/// Runs every decoder on `data` and checks re-encoding of what decodes.
pub fn decode_everything(data: &[u8]) {
    decode_headers(data);
    decode_option_payloads(data);
    decode_reply_payloads(data);
}

/// The fixed-size headers.
pub fn decode_headers(data: &[u8]) {
    if let Ok(greeting) = Greeting::decode(data) {
        check_prefix(&greeting.encode(), data);
    }
    let _ = ClientFlags::decode(data, consts::FLAG_FIXED_NEWSTYLE | consts::FLAG_NO_ZEROES);
    let _ = ClientFlags::decode(data, 0);
    if let Ok(reply) = ExportNameReply::decode(data) {
        check_prefix(&reply.encode(true), data);
    }
    if let Ok(header) = OptionHeader::decode(data) {
        check_prefix(&header.encode(), data);
    }
    if let Ok(header) = OptionReplyHeader::decode(data) {
        check_prefix(&header.encode(), data);
    }
    if let Ok(header) = RequestHeader::decode(data) {
        check_prefix(&header.encode(), data);
        let _ = header.command();
    }
    if let Ok(header) = SimpleReplyHeader::decode(data) {
        check_prefix(&header.encode(), data);
    }
    if let Ok(header) = StructuredReplyHeader::decode(data) {
        check_prefix(&header.encode(), data);
    }
    let _ = ReplyKind::detect(data);
}

/// Option data and option reply payloads.
pub fn decode_option_payloads(data: &[u8]) {
    if let Ok(name) = decode_export_name(data) {
        check_equal(name.as_bytes(), data);
    }
    if let Ok(entry) = ServerEntry::decode(data) {
        check_equal(&encoded(entry.encode()), data);
    }
    if let Ok(request) = InfoRequest::decode(data) {
        check_equal(&encoded(request.encode()), data);
    }
    if let Ok(reply) = InfoReply::decode(data) {
        check_equal(&encoded(reply.encode()), data);
    }
    if let Ok(request) = MetaContextRequest::decode(data) {
        check_equal(&encoded(request.encode()), data);
    }
    if let Ok(reply) = MetaContextReply::decode(data) {
        check_equal(&encoded(reply.encode()), data);
    }
}

/// Structured reply payloads.
pub fn decode_reply_payloads(data: &[u8]) {
    let _ = decode_offset_data_payload(data);
    let _ = decode_offset_hole_payload(data);
    if let Ok((context_id, descriptors)) = decode_block_status_payload(data) {
        let chunk = encoded(encode_block_status_chunk(0, context_id, &descriptors));
        check_equal(
            chunk
                .get(consts::STRUCTURED_REPLY_HEADER_BYTES..)
                .unwrap_or(&[]),
            data,
        );
    }
    for reply_type in [
        consts::REPLY_TYPE_ERROR,
        consts::REPLY_TYPE_ERROR_OFFSET,
        0xffff,
    ] {
        let _ = ErrorChunk::decode(reply_type, data);
    }
}

fn encoded(result: Result<Vec<u8>, ProtoError>) -> Vec<u8> {
    match result {
        Ok(bytes) => bytes,
        Err(error) => panic!("decoded value failed to re-encode: {error}"),
    }
}

fn check_prefix(encoded: &[u8], data: &[u8]) {
    assert_eq!(
        Some(encoded),
        data.get(..encoded.len()),
        "re-encoding differs"
    );
}

fn check_equal(encoded: &[u8], data: &[u8]) {
    assert_eq!(encoded, data, "re-encoding differs");
}
