//! Metadata context negotiation: the data of `NBD_OPT_LIST_META_CONTEXT`
//! and `NBD_OPT_SET_META_CONTEXT`, and the `NBD_REP_META_CONTEXT` payload.

use crate::error::ProtoError;
use crate::wire::{string_length, Cursor};

/// Export name and queries (both options share this layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export_name: String,
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let name_length = string_length("export name", &self.export_name)?;
        let count = u32::try_from(self.queries.len()).map_err(|_| ProtoError::TooLong {
            what: "meta context queries",
            length: self.queries.len(),
            max: u32::MAX as usize,
        })?;
        let mut out = Vec::with_capacity(8 + self.export_name.len());
        out.extend_from_slice(&name_length.to_be_bytes());
        out.extend_from_slice(self.export_name.as_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        for query in &self.queries {
            let query_length = string_length("meta context query", query)?;
            out.extend_from_slice(&query_length.to_be_bytes());
            out.extend_from_slice(query.as_bytes());
        }
        Ok(out)
    }

    /// Decodes the whole option data; trailing bytes are an error.
    pub fn decode(data: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("meta context request", data);
        let export_name = cursor.prefixed_string("export name")?.to_owned();
        let count = cursor.u32()?;
        // Each query takes at least its 4-byte length: bound the count by
        // the bytes present before trusting it for an allocation.
        if u64::from(count) * 4 > cursor.remaining_bytes() as u64 {
            return Err(ProtoError::BadLength {
                what: "meta context query count",
                length: u64::from(count),
            });
        }
        let mut queries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            queries.push(cursor.prefixed_string("meta context query")?.to_owned());
        }
        cursor.finish()?;
        Ok(MetaContextRequest {
            export_name,
            queries,
        })
    }
}

/// `NBD_REP_META_CONTEXT` payload: context id and context name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextReply {
    pub context_id: u32,
    pub name: String,
}

impl MetaContextReply {
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        string_length("meta context name", &self.name)?;
        let mut out = Vec::with_capacity(4 + self.name.len());
        out.extend_from_slice(&self.context_id.to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        Ok(out)
    }

    pub fn decode(payload: &[u8]) -> Result<Self, ProtoError> {
        let mut cursor = Cursor::new("NBD_REP_META_CONTEXT", payload);
        let context_id = cursor.u32()?;
        let remaining_bytes = cursor.remaining_bytes();
        let name = cursor
            .string("meta context name", remaining_bytes)?
            .to_owned();
        cursor.finish()?;
        Ok(MetaContextReply { context_id, name })
    }
}
