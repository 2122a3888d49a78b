//! A mixing step's answer on the wire (`MixResponse` of `proto/sidecar/v1`), with its protobuf code
//! written here instead of generated (`build.rs` maps it and `TokenProb` to these types).
//!
//! It is most of a `Batch` step's answer: the top tokens of each sequence's mixture, each a nested
//! `TokenProb`. A nested message is measured again at every level it is written from (four times a
//! `TokenProb` in a `Batch` answer); prost's generated code measures and writes each `TokenProb`
//! through the generic message code, a call for every field, reads it through a generic loop over
//! its fields, and reads the packed `gate_features` an element at a time. Here a `TokenProb` is
//! measured by a small function of its three fields and the list is written from a stack buffer; a
//! `TokenProb` in the form writers give it (its fields in order, each at most once, nothing else)
//! and `gate_features` are read in one pass ([`super::packed`]). Anything else goes to prost's own
//! code, so what is accepted, what is refused and the values decoded are prost's. The schema nests
//! no message in itself, so prost's recursion limit (100 levels) is never reached by a `TokenProb`,
//! and its one-pass reader does not check it.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use super::packed::{in_field, merge_whole, put_packed_fixed, read_fixed, STAGED_BYTES};

/// A token and its probability. Its code is prost's, derived as prost-build derives it; it is
/// declared here so that this file needs nothing of the generated module (which re-exports it).
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct TokenProb {
    #[prost(uint32, tag = "1")]
    pub token: u32,
    #[prost(double, tag = "2")]
    pub prob: f64,
    /// Occurrences after the prompt (distributions of the engine), 0 elsewhere.
    #[prost(uint64, tag = "3")]
    pub cont_cnt: u64,
}

/// The mixture's top tokens and how it was made.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct MixResponse {
    pub top: Vec<TokenProb>,
    pub rest_mass: f64,
    pub lambda: f64,
    /// Tokens of the context's longest suffix found in the reference data (bytes over a
    /// byte-level index), and its count.
    pub suffix_len: u32,
    pub prompt_cnt: u64,
    pub sparse: bool,
    /// The gate's input vector, filled when the gate was used.
    pub gate_features: Vec<f64>,
    /// Their names, which never change: in every unary `Mix` answer with features, and in the
    /// first answer with features of each session or `Batch` sequence (later ones leave it empty).
    pub gate_feature_names: Vec<String>,
}

impl prost::Message for MixResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_top(&self.top, buf);
        if self.rest_mass != 0.0 {
            encoding::double::encode(2, &self.rest_mass, buf);
        }
        if self.lambda != 0.0 {
            encoding::double::encode(3, &self.lambda, buf);
        }
        if self.suffix_len != 0 {
            encoding::uint32::encode(4, &self.suffix_len, buf);
        }
        if self.prompt_cnt != 0 {
            encoding::uint64::encode(5, &self.prompt_cnt, buf);
        }
        if self.sparse {
            encoding::bool::encode(6, &self.sparse, buf);
        }
        put_packed_fixed(7, &self.gate_features, buf);
        encoding::string::encode_repeated(8, &self.gate_feature_names, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let field = |name| in_field("MixResponse", name);
        match tag {
            1 => merge_whole(
                wire_type,
                &mut self.top,
                buf,
                ctx,
                read_token_prob,
                encoding::message::merge_repeated,
            )
            .map_err(field("top")),
            2 => encoding::double::merge(wire_type, &mut self.rest_mass, buf, ctx)
                .map_err(field("rest_mass")),
            3 => encoding::double::merge(wire_type, &mut self.lambda, buf, ctx)
                .map_err(field("lambda")),
            4 => encoding::uint32::merge(wire_type, &mut self.suffix_len, buf, ctx)
                .map_err(field("suffix_len")),
            5 => encoding::uint64::merge(wire_type, &mut self.prompt_cnt, buf, ctx)
                .map_err(field("prompt_cnt")),
            6 => encoding::bool::merge(wire_type, &mut self.sparse, buf, ctx)
                .map_err(field("sparse")),
            7 => merge_whole(
                wire_type,
                &mut self.gate_features,
                buf,
                ctx,
                read_fixed,
                encoding::double::merge_repeated,
            )
            .map_err(field("gate_features")),
            8 => {
                encoding::string::merge_repeated(wire_type, &mut self.gate_feature_names, buf, ctx)
                    .map_err(field("gate_feature_names"))
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let top: usize = (self.top.iter())
            .map(|t| {
                let len = token_prob_len(t);
                encoding::key_len(1) + encoding::encoded_len_varint(len as u64) + len
            })
            .sum();
        let scalars = [
            (self.rest_mass != 0.0).then(|| encoding::double::encoded_len(2, &self.rest_mass)),
            (self.lambda != 0.0).then(|| encoding::double::encoded_len(3, &self.lambda)),
            (self.suffix_len != 0).then(|| encoding::uint32::encoded_len(4, &self.suffix_len)),
            (self.prompt_cnt != 0).then(|| encoding::uint64::encoded_len(5, &self.prompt_cnt)),
            (self.sparse).then(|| encoding::bool::encoded_len(6, &self.sparse)),
        ];
        top + scalars.into_iter().flatten().sum::<usize>()
            + encoding::double::encoded_len_packed(7, &self.gate_features)
            + encoding::string::encoded_len_repeated(8, &self.gate_feature_names)
    }

    fn clear(&mut self) {
        self.top.clear();
        self.rest_mass = 0.0;
        self.lambda = 0.0;
        self.suffix_len = 0;
        self.prompt_cnt = 0;
        self.sparse = false;
        self.gate_features.clear();
        self.gate_feature_names.clear();
    }
}

/// Bytes of a `TokenProb`'s fields (proto3: a zero is not written).
fn token_prob_len(t: &TokenProb) -> usize {
    let token = match t.token {
        0 => 0,
        v => 1 + encoding::encoded_len_varint(v as u64),
    };
    let prob = if t.prob != 0.0 { 9 } else { 0 };
    let cont_cnt = match t.cont_cnt {
        0 => 0,
        v => 1 + encoding::encoded_len_varint(v),
    };
    token + prob + cont_cnt
}

/// Most bytes one entry of `top` takes: the key of field 1 and a length of one byte each (a
/// `TokenProb` is at most 26 bytes), then a token (key and 5 bytes), a probability (key and 8) and
/// a count (key and 10).
const MOST_TOKEN_PROB_BYTES: usize = 2 + 6 + 9 + 11;
const _: () = assert!(MOST_TOKEN_PROB_BYTES < 128 + 2 && MOST_TOKEN_PROB_BYTES <= STAGED_BYTES);

/// Field 1, `top`, as `TokenProb` messages, a staging buffer at a time.
fn put_top(entries: &[TokenProb], buf: &mut impl BufMut) {
    let mut staged = [0u8; STAGED_BYTES];
    let mut free = &mut staged[..];
    for t in entries {
        if free.len() < MOST_TOKEN_PROB_BYTES {
            let used = STAGED_BYTES - free.len();
            buf.put_slice(&staged[..used]);
            free = &mut staged[..];
        }
        encoding::encode_key(1, WireType::LengthDelimited, &mut free);
        encoding::encode_varint(token_prob_len(t) as u64, &mut free);
        if t.token != 0 {
            encoding::uint32::encode(1, &t.token, &mut free);
        }
        if t.prob != 0.0 {
            encoding::double::encode(2, &t.prob, &mut free);
        }
        if t.cont_cnt != 0 {
            encoding::uint64::encode(3, &t.cont_cnt, &mut free);
        }
    }
    let used = STAGED_BYTES - free.len();
    buf.put_slice(&staged[..used]);
}

/// A `TokenProb`'s bytes as writers give them: each field at most once, in order, none unknown.
/// False for any other form, which prost's code then reads.
fn read_token_prob(mut body: &[u8], entries: &mut Vec<TokenProb>) -> bool {
    // The keys of fields 1 (varint), 2 (64-bit) and 3 (varint).
    const TOKEN: u8 = 1 << 3;
    const PROB: u8 = 2 << 3 | 1;
    const CONT_CNT: u8 = 3 << 3;
    let (Some(token), Some(prob), Some(cont_cnt)) = (
        varint_field(&mut body, TOKEN),
        fixed64_field(&mut body, PROB),
        varint_field(&mut body, CONT_CNT),
    ) else {
        return false;
    };
    if !body.is_empty() {
        return false;
    }
    entries.push(TokenProb {
        token: token.map_or(0, |v| v as u32),
        prob: prob.map_or(0.0, f64::from_le_bytes),
        cont_cnt: cont_cnt.unwrap_or(0),
    });
    true
}

/// The varint after `key` if `body` starts with it (`Some(None)` if it does not; `None` if the
/// varint is malformed), `body` moved past it.
fn varint_field(body: &mut &[u8], key: u8) -> Option<Option<u64>> {
    match body.split_first() {
        Some((&k, rest)) if k == key => {
            *body = rest;
            encoding::decode_varint(body).ok().map(Some)
        }
        _ => Some(None),
    }
}

/// The 8 bytes after `key` if `body` starts with it (`Some(None)` if it does not; `None` if they
/// are cut short), `body` moved past them.
fn fixed64_field(body: &mut &[u8], key: u8) -> Option<Option<[u8; 8]>> {
    match body.split_first() {
        Some((&k, rest)) if k == key => {
            let (bytes, rest) = rest.split_first_chunk::<8>()?;
            *body = rest;
            Some(Some(*bytes))
        }
        _ => Some(None),
    }
}

#[cfg(test)]
mod tests;
