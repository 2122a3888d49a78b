//! The caller's neural distribution on the wire (`NeuralTopK`, `NeuralLogits` of
//! `proto/sidecar/v1`), with their protobuf code written here instead of generated (`build.rs` maps
//! the two messages to these types).
//!
//! They carry most of a mixing request's bytes: a `Batch` step's top-64 log-probs for each
//! sequence, or every logit of the vocabulary. prost's generated code read those packed fields an
//! element at a time into vectors it never reserved: for a `Batch` step of 64 top-64 sequences a
//! third of its decoding was the allocator's (eval/SERVICE.md has the figures). They are read and
//! written in one pass here ([`super::packed`]), with prost's own code for anything unusual.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, float, uint32, DecodeContext, WireType};
use prost::DecodeError;

use super::packed::{
    in_field, merge_whole, packed_varints_len, put_packed_fixed, put_packed_varints, read_fixed,
    read_varints,
};

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
        put_packed_fixed(2, &self.logprobs, buf);
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
            1 => merge_whole(
                wire_type,
                &mut self.tokens,
                buf,
                ctx,
                read_varints,
                uint32::merge_repeated,
            )
            .map_err(in_field("NeuralTopK", "tokens")),
            2 => merge_whole(
                wire_type,
                &mut self.logprobs,
                buf,
                ctx,
                read_fixed,
                float::merge_repeated,
            )
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
        packed_varints_len(1, &self.tokens)
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
        put_packed_fixed(1, &self.logits, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => merge_whole(
                wire_type,
                &mut self.logits,
                buf,
                ctx,
                read_fixed,
                float::merge_repeated,
            )
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

#[cfg(test)]
mod tests;
