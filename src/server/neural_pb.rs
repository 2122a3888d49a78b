//! The caller's neural distribution on the wire (`NeuralTopK`, `NeuralLogits` of
//! `proto/sidecar/v1`), with their protobuf code written here instead of generated (`build.rs` maps
//! the two messages to these types).
//!
//! They carry most of a mixing request's bytes: a `Batch` step's top-64 log-probs for each
//! sequence, or every logit of the vocabulary. prost's generated code decodes a packed field one
//! element at a time, each through its own call, into a `Vec` it never reserves, and encodes it one
//! element at a time: for a `Batch` step of 64 top-64 sequences those fields are most of the
//! request, and a third of its decoding was the allocator's (eval/SERVICE.md has the figures). Here a
//! packed field that lies whole in the buffer's current chunk (always, for tonic's) is read in one
//! pass into a vector of the right size, and written from a buffer of its bytes. Anything else (a
//! field split across chunks, the unpacked encoding, a malformed field) goes to prost's own code,
//! so what is accepted, what is refused and the values decoded are prost's.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

/// The caller's top tokens and their log-probs.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct NeuralTopK {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Probability of all other tokens together.
    pub rest_mass: f64,
}

/// The caller's own neural next-token distribution: every logit of the vocabulary.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct NeuralLogits {
    pub logits: Vec<f32>,
}

impl prost::Message for NeuralTopK {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_packed_varints(1, &self.tokens, buf);
        put_packed_floats(2, &self.logprobs, buf);
        if self.rest_mass != 0.0 {
            encoding::double::encode(3, &self.rest_mass, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_varints(wire_type, &mut self.tokens, buf, ctx)
                .map_err(in_field("NeuralTopK", "tokens")),
            2 => merge_floats(wire_type, &mut self.logprobs, buf, ctx)
                .map_err(in_field("NeuralTopK", "logprobs")),
            3 => encoding::double::merge(wire_type, &mut self.rest_mass, buf, ctx)
                .map_err(in_field("NeuralTopK", "rest_mass")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let rest_mass = if self.rest_mass != 0.0 {
            encoding::double::encoded_len(3, &self.rest_mass)
        } else {
            0
        };
        encoding::uint32::encoded_len_packed(1, &self.tokens)
            + encoding::float::encoded_len_packed(2, &self.logprobs)
            + rest_mass
    }

    fn clear(&mut self) {
        self.tokens.clear();
        self.logprobs.clear();
        self.rest_mass = 0.0;
    }
}

impl prost::Message for NeuralLogits {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_packed_floats(1, &self.logits, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_floats(wire_type, &mut self.logits, buf, ctx)
                .map_err(in_field("NeuralLogits", "logits")),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::float::encoded_len_packed(1, &self.logits)
    }

    fn clear(&mut self) {
        self.logits.clear();
    }
}

/// Adds the field a decoding error was in, as prost's generated code reports it.
fn in_field(message: &'static str, field: &'static str) -> impl Fn(DecodeError) -> DecodeError {
    move |mut e| {
        e.push(message, field);
        e
    }
}

/// Appends a `repeated uint32` field's values.
fn merge_varints(
    wire_type: WireType,
    values: &mut Vec<u32>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let prost_read = encoding::uint32::merge_repeated;
    merge_packed(wire_type, values, buf, ctx, read_varints, prost_read)
}

/// Appends a `repeated float` field's values.
fn merge_floats(
    wire_type: WireType,
    values: &mut Vec<f32>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let prost_read = encoding::float::merge_repeated;
    merge_packed(wire_type, values, buf, ctx, read_floats, prost_read)
}

/// prost's reader of a repeated field of `T`s (`encoding::uint32::merge_repeated`, ...).
type ProstRead<T, B> = fn(WireType, &mut Vec<T>, &mut B, DecodeContext) -> Result<(), DecodeError>;

/// Appends a repeated field's values: a packed field that lies whole in `buf`'s current chunk is
/// read by `read` (false: malformed), the rest by prost's `prost_read`.
fn merge_packed<T, B: Buf>(
    wire_type: WireType,
    values: &mut Vec<T>,
    buf: &mut B,
    ctx: DecodeContext,
    read: fn(&[u8], &mut Vec<T>) -> bool,
    prost_read: ProstRead<T, B>,
) -> Result<(), DecodeError> {
    if wire_type == WireType::LengthDelimited {
        let chunk = buf.chunk();
        let mut body = chunk;
        let whole = encoding::decode_varint(&mut body)
            .ok()
            .and_then(|len| usize::try_from(len).ok())
            .filter(|&len| len <= body.len());
        if let Some(len) = whole {
            let header = chunk.len() - body.len();
            let before = values.len();
            if read(&body[..len], values) {
                buf.advance(header + len);
                return Ok(());
            }
            values.truncate(before);
        }
    }
    prost_read(wire_type, values, buf, ctx)
}

/// Packed varints, each cut to 32 bits as prost's `uint32` does; false if one is malformed.
fn read_varints(mut body: &[u8], values: &mut Vec<u32>) -> bool {
    // Every varint ends in the one byte of it below 0x80.
    values.reserve(body.iter().filter(|&&b| b < 0x80).count());
    while !body.is_empty() {
        match encoding::decode_varint(&mut body) {
            Ok(v) => values.push(v as u32),
            Err(_) => return false,
        }
    }
    true
}

/// Packed little-endian floats; false unless the bytes are whole floats.
fn read_floats(body: &[u8], values: &mut Vec<f32>) -> bool {
    let (floats, rest) = body.as_chunks::<4>();
    if !rest.is_empty() {
        return false;
    }
    values.extend(floats.iter().map(|b| f32::from_le_bytes(*b)));
    true
}

/// Bytes written at a time: a stack buffer, so a field of any length costs one copy into `buf`
/// per this many bytes, not one call per element.
const STAGED_BYTES: usize = 1024;

/// Field `tag` as packed little-endian floats, a staging buffer at a time (none when empty, as
/// proto3 writes it).
fn put_packed_floats(tag: u32, values: &[f32], buf: &mut impl BufMut) {
    if values.is_empty() {
        return;
    }
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(4 * values.len() as u64, buf);
    let mut staged = [0u8; STAGED_BYTES];
    for group in values.chunks(STAGED_BYTES / 4) {
        for (out, v) in staged.as_chunks_mut::<4>().0.iter_mut().zip(group) {
            *out = v.to_le_bytes();
        }
        buf.put_slice(&staged[..4 * group.len()]);
    }
}

/// Field `tag` as packed varints, a staging buffer at a time (none when empty).
fn put_packed_varints(tag: u32, values: &[u32], buf: &mut impl BufMut) {
    if values.is_empty() {
        return;
    }
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    let len: usize = values
        .iter()
        .map(|&v| encoding::encoded_len_varint(v as u64))
        .sum();
    encoding::encode_varint(len as u64, buf);
    let mut staged = [0u8; STAGED_BYTES];
    // A u32's varint is at most 5 bytes.
    for group in values.chunks(STAGED_BYTES / 5) {
        let mut free = &mut staged[..];
        for &v in group {
            encoding::encode_varint(v as u64, &mut free);
        }
        let used = STAGED_BYTES - free.len();
        buf.put_slice(&staged[..used]);
    }
}

#[cfg(test)]
mod tests;
