//! Round trips and malformed inputs for every encoder/decoder pair.

use crate::consts::*;
use crate::*;

#[test]
fn greeting_round_trip_and_layout() {
    let greeting = Greeting {
        handshake_flags: FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES,
    };
    let bytes = greeting.encode();
    assert_eq!(&bytes[..8], b"NBDMAGIC");
    assert_eq!(&bytes[8..16], b"IHAVEOPT");
    assert_eq!(&bytes[16..], &[0, 3]);
    assert_eq!(Greeting::decode(&bytes), Ok(greeting));
}

#[test]
fn greeting_malformed() {
    let bytes = Greeting { handshake_flags: 1 }.encode();
    for length in 0..bytes.len() {
        assert!(matches!(
            Greeting::decode(&bytes[..length]),
            Err(ProtoError::Truncated { .. } | ProtoError::BadMagic { .. })
        ));
    }
    let mut bad = bytes;
    bad[0] ^= 1;
    assert!(matches!(
        Greeting::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
    let mut bad = bytes;
    bad[15] ^= 1;
    assert!(matches!(
        Greeting::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
}

#[test]
fn client_flags_checked_against_offer() {
    let both = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
    let flags = ClientFlags {
        fixed_newstyle: true,
        no_zeroes: true,
    };
    assert_eq!(ClientFlags::decode(&flags.encode(), both), Ok(flags));
    assert!(matches!(
        ClientFlags::decode(&flags.encode(), FLAG_FIXED_NEWSTYLE),
        Err(ProtoError::UnknownFlags { flags: 2, .. })
    ));
    assert!(matches!(
        ClientFlags::decode(&[0, 0, 0, 4], both),
        Err(ProtoError::UnknownFlags { flags: 4, .. })
    ));
    assert!(matches!(
        ClientFlags::decode(&[0x80, 0, 0, 1], both),
        Err(ProtoError::UnknownFlags { .. })
    ));
    assert_eq!(
        ClientFlags::decode(&[0, 0, 0, 0], both),
        Ok(ClientFlags::default())
    );
    assert!(matches!(
        ClientFlags::decode(&[0, 0, 1], both),
        Err(ProtoError::Truncated { .. })
    ));
}

#[test]
fn export_name_reply_with_and_without_zeroes() {
    let reply = ExportNameReply {
        size_bytes: 1 << 40,
        transmission_flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
    };
    let long = reply.encode(false);
    assert_eq!(long.len(), 134);
    assert!(long[10..].iter().all(|&b| b == 0));
    let short = reply.encode(true);
    assert_eq!(short.len(), 10);
    assert_eq!(ExportNameReply::decode(&short), Ok(reply));
    assert_eq!(ExportNameReply::decode(&long), Ok(reply));
    assert!(ExportNameReply::decode(&short[..9]).is_err());
}

#[test]
fn option_header_round_trip_and_malformed() {
    let header = OptionHeader {
        option: OPT_GO,
        length_bytes: 77,
    };
    let bytes = header.encode();
    assert_eq!(OptionHeader::decode(&bytes), Ok(header));
    assert!(matches!(
        OptionHeader::decode(&bytes[..15]),
        Err(ProtoError::Truncated { .. })
    ));
    let mut bad = bytes;
    bad[3] = 0;
    assert!(matches!(
        OptionHeader::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
}

#[test]
fn option_reply_round_trip() {
    let mut out = Vec::new();
    encode_option_reply_into(&mut out, OPT_LIST, REP_ACK, &[]).unwrap();
    encode_option_reply_into(&mut out, OPT_LIST, REP_SERVER, b"abc").unwrap();
    let first = OptionReplyHeader::decode(&out).unwrap();
    assert_eq!(
        first,
        OptionReplyHeader {
            option: OPT_LIST,
            reply_type: REP_ACK,
            length_bytes: 0
        }
    );
    assert!(!first.is_error());
    let second = OptionReplyHeader::decode(&out[20..]).unwrap();
    assert_eq!(second.length_bytes, 3);
    assert_eq!(&out[40..], b"abc");
    let mut bad = out.clone();
    bad[0] = 0xff;
    assert!(OptionReplyHeader::decode(&bad).is_err());
    assert!(OptionReplyHeader::decode(&out[..19]).is_err());
}

#[test]
fn option_error_reply_truncates_message() {
    let mut out = Vec::new();
    let message = "é".repeat(3000); // 6000 bytes
    encode_option_error_into(&mut out, OPT_GO, REP_ERR_UNKNOWN, &message);
    let header = OptionReplyHeader::decode(&out).unwrap();
    assert!(header.is_error());
    assert_eq!(header.length_bytes, 4096);
    assert!(std::str::from_utf8(&out[20..]).is_ok());
    let mut out = Vec::new();
    encode_option_error_into(&mut out, OPT_GO, REP_ERR_UNKNOWN, "a\0b");
    assert_eq!(&out[20..], b"a");
}

#[test]
fn export_name_decoding() {
    assert_eq!(decode_export_name(b""), Ok(String::new()));
    assert_eq!(decode_export_name("dísk".as_bytes()), Ok("dísk".into()));
    assert!(matches!(
        decode_export_name(&[0xff, 0xfe]),
        Err(ProtoError::InvalidUtf8 { .. })
    ));
    assert!(matches!(
        decode_export_name(b"a\0"),
        Err(ProtoError::ContainsNul { .. })
    ));
    assert!(matches!(
        decode_export_name(&[b'a'; 4097]),
        Err(ProtoError::TooLong { .. })
    ));
}

#[test]
fn server_entry_round_trip_and_malformed() {
    let entry = ServerEntry {
        name: "vol1".into(),
        description: "first volume".into(),
    };
    let bytes = entry.encode().unwrap();
    assert_eq!(ServerEntry::decode(&bytes), Ok(entry));
    assert!(ServerEntry::decode(&[0, 0, 0, 5, b'a']).is_err());
    assert!(ServerEntry::decode(&[0, 0]).is_err());
    assert!(ServerEntry::decode(&[0xff, 0xff, 0xff, 0xff]).is_err());
    let too_long = ServerEntry {
        name: "x".repeat(5000),
        description: String::new(),
    };
    assert!(too_long.encode().is_err());
    let nul = ServerEntry {
        name: "a\0".into(),
        description: String::new(),
    };
    assert!(nul.encode().is_err());
}

#[test]
fn info_request_round_trip() {
    let request = InfoRequest {
        export_name: "disk".into(),
        info_types: vec![INFO_BLOCK_SIZE, INFO_NAME],
    };
    let bytes = request.encode().unwrap();
    assert_eq!(bytes.len(), 4 + 4 + 2 + 4);
    assert_eq!(InfoRequest::decode(&bytes), Ok(request));
    let empty = InfoRequest {
        export_name: String::new(),
        info_types: vec![],
    };
    assert_eq!(InfoRequest::decode(&empty.encode().unwrap()), Ok(empty));
}

#[test]
fn info_request_malformed() {
    let request = InfoRequest {
        export_name: "disk".into(),
        info_types: vec![INFO_BLOCK_SIZE],
    };
    let bytes = request.encode().unwrap();
    for length in 0..bytes.len() {
        assert!(InfoRequest::decode(&bytes[..length]).is_err(), "{length}");
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(InfoRequest::decode(&trailing).is_err());
    // Name length pointing past the end.
    let mut bad = bytes.clone();
    bad[3] = 200;
    assert!(matches!(
        InfoRequest::decode(&bad),
        Err(ProtoError::BadLength { .. })
    ));
    // Count larger than the data present.
    let mut bad = bytes.clone();
    bad[9] = 9;
    assert!(InfoRequest::decode(&bad).is_err());
    // Name length > 4096.
    let mut bad = vec![0, 0, 0x20, 0];
    bad.extend(std::iter::repeat_n(b'a', 0x2000));
    bad.extend([0, 0]);
    assert!(matches!(
        InfoRequest::decode(&bad),
        Err(ProtoError::TooLong { .. })
    ));
}

#[test]
fn info_reply_round_trips() {
    let replies = [
        InfoReply::Export {
            size_bytes: 12345,
            transmission_flags: 0x0d6d,
        },
        InfoReply::Name("n".into()),
        InfoReply::Description(String::new()),
        InfoReply::BlockSize {
            minimum_bytes: 1,
            preferred_bytes: 4096,
            maximum_bytes: 1 << 25,
        },
        InfoReply::Unknown {
            info_type: 99,
            data: vec![1, 2, 3],
        },
    ];
    for reply in replies {
        let bytes = reply.encode().unwrap();
        assert_eq!(InfoReply::decode(&bytes), Ok(reply));
    }
    let export = InfoReply::Export {
        size_bytes: 1,
        transmission_flags: 1,
    }
    .encode()
    .unwrap();
    assert_eq!(export.len(), 12);
    assert!(InfoReply::decode(&export[..11]).is_err());
    let mut trailing = export.clone();
    trailing.push(0);
    assert!(InfoReply::decode(&trailing).is_err());
    assert!(InfoReply::decode(&[0]).is_err());
    assert!(InfoReply::decode(&[0, 1, 0xff]).is_err());
}

#[test]
fn meta_context_request_round_trip_and_malformed() {
    let request = MetaContextRequest {
        export_name: "disk".into(),
        queries: vec!["base:allocation".into(), "qemu:".into()],
    };
    let bytes = request.encode().unwrap();
    assert_eq!(MetaContextRequest::decode(&bytes), Ok(request));
    for length in 0..bytes.len() {
        assert!(MetaContextRequest::decode(&bytes[..length]).is_err());
    }
    let mut trailing = bytes.clone();
    trailing.push(1);
    assert!(MetaContextRequest::decode(&trailing).is_err());
    // A huge query count must not allocate or panic.
    let huge = [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
    assert!(matches!(
        MetaContextRequest::decode(&huge),
        Err(ProtoError::BadLength { .. })
    ));
    // A query length past the end.
    let bad = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, b'a'];
    assert!(MetaContextRequest::decode(&bad).is_err());
    let none = MetaContextRequest {
        export_name: String::new(),
        queries: vec![],
    };
    assert_eq!(
        MetaContextRequest::decode(&none.encode().unwrap()),
        Ok(none)
    );
}

#[test]
fn meta_context_reply_round_trip() {
    let reply = MetaContextReply {
        context_id: 7,
        name: CONTEXT_BASE_ALLOCATION.into(),
    };
    let bytes = reply.encode().unwrap();
    assert_eq!(MetaContextReply::decode(&bytes), Ok(reply));
    assert!(MetaContextReply::decode(&bytes[..3]).is_err());
    assert!(MetaContextReply::decode(&[0, 0, 0, 1, 0xc3]).is_err());
}

#[test]
fn request_header_round_trip_and_layout() {
    let header = RequestHeader {
        flags: CMD_FLAG_FUA,
        command_type: CMD_WRITE,
        handle: 0x0102_0304_0506_0708,
        offset_bytes: 4096,
        length_bytes: 512,
    };
    let bytes = header.encode();
    assert_eq!(&bytes[..4], &[0x25, 0x60, 0x95, 0x13]);
    assert_eq!(RequestHeader::decode(&bytes), Ok(header));
    assert_eq!(header.command(), Some(Command::Write));
    for length in 0..bytes.len() {
        assert!(RequestHeader::decode(&bytes[..length]).is_err());
    }
    let mut bad = bytes;
    bad[0] = 0;
    assert!(matches!(
        RequestHeader::decode(&bad),
        Err(ProtoError::BadMagic { .. })
    ));
}

#[test]
fn commands_map_both_ways() {
    for command_type in 0..=8u16 {
        match Command::from_wire(command_type) {
            Some(command) => assert_eq!(command.to_wire(), command_type),
            None => assert_eq!(command_type, 8),
        }
    }
    assert_eq!(Command::from_wire(0xffff), None);
    assert_eq!(
        Command::WriteZeroes.documented_flags(),
        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO
    );
}

#[test]
fn simple_reply_round_trip() {
    let header = SimpleReplyHeader {
        error: EINVAL,
        handle: 42,
    };
    let bytes = header.encode();
    assert_eq!(SimpleReplyHeader::decode(&bytes), Ok(header));
    assert_eq!(ReplyKind::detect(&bytes), Ok(ReplyKind::Simple));
    let mut buffer = vec![0xaa; 20];
    header.encode_into(&mut buffer).unwrap();
    assert_eq!(&buffer[..16], &bytes);
    assert_eq!(&buffer[16..], &[0xaa; 4]);
    assert!(header.encode_into(&mut [0u8; 15]).is_err());
    assert!(SimpleReplyHeader::decode(&bytes[..15]).is_err());
    assert!(SimpleReplyHeader::decode(&[0u8; 16]).is_err());
}

#[test]
fn structured_header_round_trip() {
    let header = StructuredReplyHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_ERROR,
        handle: 9,
        length_bytes: 6,
    };
    let bytes = header.encode();
    let decoded = StructuredReplyHeader::decode(&bytes).unwrap();
    assert_eq!(decoded, header);
    assert!(decoded.is_done() && decoded.is_error());
    assert_eq!(ReplyKind::detect(&bytes), Ok(ReplyKind::Structured));
    assert!(ReplyKind::detect(&[1, 2, 3, 4]).is_err());
    assert!(ReplyKind::detect(&[1, 2, 3]).is_err());
    assert!(StructuredReplyHeader::decode(&bytes[..19]).is_err());
}

#[test]
fn offset_data_header_in_place() {
    let mut buffer = vec![0u8; OFFSET_DATA_HEADER_BYTES + 3];
    encode_offset_data_header_into(&mut buffer, 5, 1000, 3).unwrap();
    buffer[OFFSET_DATA_HEADER_BYTES..].copy_from_slice(b"xyz");
    let header = StructuredReplyHeader::decode(&buffer).unwrap();
    assert_eq!(header.reply_type, REPLY_TYPE_OFFSET_DATA);
    assert_eq!(header.length_bytes, 11);
    assert!(header.is_done());
    let (offset, data) = decode_offset_data_payload(&buffer[20..]).unwrap();
    assert_eq!((offset, data), (1000, &b"xyz"[..]));
    assert!(encode_offset_data_header_into(&mut buffer, 5, 0, 0).is_err());
    assert!(encode_offset_data_header_into(&mut buffer, 5, 0, u32::MAX).is_err());
    assert!(encode_offset_data_header_into(&mut [0u8; 27], 5, 0, 1).is_err());
    assert!(decode_offset_data_payload(&[0; 8]).is_err());
    assert!(decode_offset_data_payload(&[0; 7]).is_err());
}

#[test]
fn offset_hole_payload() {
    let mut payload = 77u64.to_be_bytes().to_vec();
    payload.extend(512u32.to_be_bytes());
    assert_eq!(decode_offset_hole_payload(&payload), Ok((77, 512)));
    assert!(decode_offset_hole_payload(&payload[..11]).is_err());
    payload.push(0);
    assert!(decode_offset_hole_payload(&payload).is_err());
    assert!(decode_offset_hole_payload(&[0; 12]).is_err());
}

#[test]
fn none_and_error_chunks() {
    let none = encode_none_chunk(3);
    let header = StructuredReplyHeader::decode(&none).unwrap();
    assert_eq!(
        (header.reply_type, header.length_bytes),
        (REPLY_TYPE_NONE, 0)
    );
    assert!(header.is_done());

    let chunk = encode_error_chunk(4, EIO, "disk on fire");
    let header = StructuredReplyHeader::decode(&chunk).unwrap();
    assert_eq!(header.reply_type, REPLY_TYPE_ERROR);
    assert_eq!(header.length_bytes as usize, chunk.len() - 20);
    let error = ErrorChunk::decode(header.reply_type, &chunk[20..]).unwrap();
    assert_eq!(error.error, EIO);
    assert_eq!(error.message, "disk on fire");
    assert_eq!(error.offset_bytes, None);

    let long = encode_error_chunk(4, EIO, &"x".repeat(70_000));
    let header = StructuredReplyHeader::decode(&long).unwrap();
    assert_eq!(header.length_bytes, 6 + 4096);
}

#[test]
fn error_chunk_malformed() {
    let mut payload = EIO.to_be_bytes().to_vec();
    payload.extend(3u16.to_be_bytes());
    payload.extend(b"abc");
    assert!(ErrorChunk::decode(REPLY_TYPE_ERROR, &payload).is_ok());
    assert!(ErrorChunk::decode(REPLY_TYPE_ERROR, &payload[..8]).is_err());
    assert!(ErrorChunk::decode(REPLY_TYPE_ERROR_OFFSET, &payload).is_err());
    let mut with_offset = payload.clone();
    with_offset.extend(9u64.to_be_bytes());
    let error = ErrorChunk::decode(REPLY_TYPE_ERROR_OFFSET, &with_offset).unwrap();
    assert_eq!(error.offset_bytes, Some(9));
    assert!(ErrorChunk::decode(REPLY_TYPE_ERROR, &with_offset).is_err());
    assert!(ErrorChunk::decode(0x8123, &with_offset).is_ok());
    let mut zero = payload.clone();
    zero[3] = 0;
    assert!(ErrorChunk::decode(REPLY_TYPE_ERROR, &zero).is_err());
}

#[test]
fn block_status_round_trip_and_malformed() {
    let descriptors = [
        BlockDescriptor {
            length_bytes: 4096,
            status_flags: 0,
        },
        BlockDescriptor {
            length_bytes: 512,
            status_flags: STATE_HOLE | STATE_ZERO,
        },
    ];
    let chunk = encode_block_status_chunk(8, 1, &descriptors).unwrap();
    let header = StructuredReplyHeader::decode(&chunk).unwrap();
    assert_eq!(header.length_bytes, 4 + 16);
    assert_eq!(
        decode_block_status_payload(&chunk[20..]),
        Ok((1, descriptors.to_vec()))
    );
    assert!(encode_block_status_chunk(8, 1, &[]).is_err());
    let zero = [BlockDescriptor {
        length_bytes: 0,
        status_flags: 0,
    }];
    assert!(encode_block_status_chunk(8, 1, &zero).is_err());
    assert!(decode_block_status_payload(&chunk[20..27]).is_err());
    assert!(decode_block_status_payload(&chunk[20..24]).is_err());
    assert!(decode_block_status_payload(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
}

#[test]
fn errors_display() {
    let error = RequestHeader::decode(&[0; 3]).unwrap_err();
    assert!(error.to_string().contains("request header"));
}
