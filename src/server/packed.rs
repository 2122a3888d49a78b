//! Repeated fields read and written in one pass, for the messages whose protobuf code is written
//! here (`neural_pb`, `mix_pb`). prost's generated code reads a repeated field one element at a
//! time, each through its own call, into a `Vec` it never reserves, and writes it one element at a
//! time. Here a length-delimited field that lies whole in the buffer's current chunk (always, for
//! tonic's) is read by a function of the field's own, and a field is written from a stack buffer
//! of its bytes. Anything else (a field split across chunks, the unpacked encoding, a malformed or
//! unusual field) goes to prost's own code, so what is accepted, what is refused and the values
//! decoded are prost's.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

/// Adds the field a decoding error was in, as prost's generated code reports it.
pub(super) fn in_field(
    message: &'static str,
    field: &'static str,
) -> impl Fn(DecodeError) -> DecodeError {
    move |mut e| {
        e.push(message, field);
        e
    }
}

/// prost's reader of a repeated field of `T`s (`encoding::uint32::merge_repeated`, ...).
pub(super) type ProstRead<T, B> =
    fn(WireType, &mut Vec<T>, &mut B, DecodeContext) -> Result<(), DecodeError>;

/// Appends a repeated field's values: a length-delimited field that lies whole in `buf`'s current
/// chunk is read by `read` (false: not its form, or malformed), the rest by prost's `prost_read`.
pub(super) fn merge_whole<T, B: Buf>(
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
pub(super) fn read_varints(mut body: &[u8], values: &mut Vec<u32>) -> bool {
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

/// A fixed-width scalar of protobuf (`float`, `double`): `N` little-endian bytes.
pub(super) trait Fixed<const N: usize>: Copy {
    fn from_le(bytes: [u8; N]) -> Self;
    fn to_le(self) -> [u8; N];
}

impl Fixed<4> for f32 {
    fn from_le(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
}

impl Fixed<8> for f64 {
    fn from_le(bytes: [u8; 8]) -> Self {
        f64::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 8] {
        self.to_le_bytes()
    }
}

/// Packed fixed-width values; false unless the bytes are whole values.
pub(super) fn read_fixed<const N: usize, T: Fixed<N>>(body: &[u8], values: &mut Vec<T>) -> bool {
    let (whole, rest) = body.as_chunks::<N>();
    if !rest.is_empty() {
        return false;
    }
    values.extend(whole.iter().map(|b| T::from_le(*b)));
    true
}

/// Bytes written at a time: a stack buffer, so a field of any length costs one copy into `buf`
/// per this many bytes, not one call per element.
pub(super) const STAGED_BYTES: usize = 1024;

/// Field `tag` as packed fixed-width values, a staging buffer at a time (none when empty, as
/// proto3 writes it).
pub(super) fn put_packed_fixed<const N: usize, T: Fixed<N>>(
    tag: u32,
    values: &[T],
    buf: &mut impl BufMut,
) {
    if values.is_empty() {
        return;
    }
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint((N * values.len()) as u64, buf);
    let mut staged = [0u8; STAGED_BYTES];
    for group in values.chunks(STAGED_BYTES / N) {
        for (out, v) in staged.as_chunks_mut::<N>().0.iter_mut().zip(group) {
            *out = v.to_le();
        }
        buf.put_slice(&staged[..N * group.len()]);
    }
}

/// Bytes of `values` as varints: one each, and one more for every 7 bits past the first 7. Counted
/// with comparisons the compiler can vectorize, where prost computes each value's length in turn;
/// a message is measured once for every message it is nested in (four times a step's top-64
/// tokens).
fn varints_len(values: &[u32]) -> usize {
    let longer = |v: u32, bits: u32| (v >> bits != 0) as usize;
    (values.iter())
        .map(|&v| 1 + longer(v, 7) + longer(v, 14) + longer(v, 21) + longer(v, 28))
        .sum()
}

/// Bytes of a packed `uint32` field with its key and length (none when empty, as proto3 writes
/// it): prost's `encoding::uint32::encoded_len_packed`.
pub(super) fn packed_varints_len(tag: u32, values: &[u32]) -> usize {
    if values.is_empty() {
        return 0;
    }
    let len = varints_len(values);
    encoding::key_len(tag) + encoding::encoded_len_varint(len as u64) + len
}

/// Field `tag` as packed varints, a staging buffer at a time (none when empty).
pub(super) fn put_packed_varints(tag: u32, values: &[u32], buf: &mut impl BufMut) {
    if values.is_empty() {
        return;
    }
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(varints_len(values) as u64, buf);
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
pub(super) mod oracle;

#[cfg(test)]
mod tests {
    use super::*;

    /// prost's length at every varint length's edges, and over many values at once.
    #[test]
    fn varints_measure_as_prost_measures_them() {
        let edges: Vec<u32> = (0..32)
            .flat_map(|k| [(1u32 << k) - 1, 1u32 << k])
            .chain([u32::MAX, u32::MAX - 1])
            .collect();
        for &v in &edges {
            assert_eq!(
                packed_varints_len(1, &[v]),
                encoding::uint32::encoded_len_packed(1, &[v]),
                "{v}"
            );
        }
        assert_eq!(
            packed_varints_len(7, &edges),
            encoding::uint32::encoded_len_packed(7, &edges)
        );
        assert_eq!(packed_varints_len(1, &[]), 0);
    }

    /// Whole values are read; a length that is not a multiple of the width goes to prost's code.
    #[test]
    fn fixed_values_are_read_whole_or_not_at_all() {
        let mut values: Vec<f64> = Vec::new();
        assert!(read_fixed(&[0u8; 16], &mut values));
        assert_eq!(values, [0.0, 0.0]);
        assert!(!read_fixed(&[0u8; 12], &mut values));
        let mut floats: Vec<f32> = Vec::new();
        assert!(!read_fixed(&[0u8; 6], &mut floats));
    }
}
