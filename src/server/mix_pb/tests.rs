//! The oracle is prost's generated code: the same message derived from its fields' proto types,
//! which this one must write byte for byte and read value for value, refusing what it refuses.

use super::*;
use crate::server::packed::oracle;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, PartialEq, prost::Message)]
struct MixByProst {
    #[prost(message, repeated, tag = "1")]
    top: Vec<TokenProb>,
    #[prost(double, tag = "2")]
    rest_mass: f64,
    #[prost(double, tag = "3")]
    lambda: f64,
    #[prost(uint32, tag = "4")]
    suffix_len: u32,
    #[prost(uint64, tag = "5")]
    prompt_cnt: u64,
    #[prost(bool, tag = "6")]
    sparse: bool,
    #[prost(double, repeated, tag = "7")]
    gate_features: Vec<f64>,
    #[prost(string, repeated, tag = "8")]
    gate_feature_names: Vec<String>,
}

/// The features in the unpacked encoding, which a reader of packed fields must accept too.
#[derive(Clone, PartialEq, prost::Message)]
struct FeaturesUnpacked {
    #[prost(double, repeated, packed = "false", tag = "7")]
    gate_features: Vec<f64>,
}

/// The message nested in another, with a field after it: as a client reads it in a
/// `SequenceResult`, where the buffer goes on past its end.
#[derive(Clone, PartialEq, prost::Message)]
struct Nested {
    #[prost(message, optional, tag = "3")]
    mix: Option<MixResponse>,
    #[prost(uint64, tag = "4")]
    after: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NestedByProst {
    #[prost(message, optional, tag = "3")]
    mix: Option<MixByProst>,
    #[prost(uint64, tag = "4")]
    after: u64,
}

/// The fields of either message, floats as bits so that NaNs compare.
type MixBits = (Vec<(u32, u64, u64)>, [u64; 4], bool, Vec<u64>, Vec<String>);

fn bits(m: &MixResponse) -> MixBits {
    (
        (m.top.iter())
            .map(|t| (t.token, t.prob.to_bits(), t.cont_cnt))
            .collect(),
        [
            m.rest_mass.to_bits(),
            m.lambda.to_bits(),
            m.suffix_len as u64,
            m.prompt_cnt,
        ],
        m.sparse,
        m.gate_features.iter().map(|f| f.to_bits()).collect(),
        m.gate_feature_names.clone(),
    )
}

/// A float of any bits now and then (NaNs, infinities, signed zeros), zero often (not written).
fn random_f64(rng: &mut impl Rng) -> f64 {
    match rng.random_range(0..5) {
        0 => f64::from_bits(rng.random()),
        1 => 0.0,
        2 => -0.0,
        _ => rng.random(),
    }
}

/// A value that is zero a quarter of the time and of every varint length otherwise.
fn random_varint(rng: &mut impl Rng, bits: u32) -> u64 {
    match rng.random_range(0..4) {
        0 => 0,
        1 => rng.random_range(1..128),
        _ => rng.random::<u64>() >> rng.random_range(64 - bits..64),
    }
}

fn random_mix(rng: &mut impl Rng) -> MixResponse {
    let n = match rng.random_range(0..3) {
        0 => 0,
        1 => rng.random_range(1..4),
        _ => rng.random_range(1..70),
    };
    let top = (0..n)
        .map(|_| TokenProb {
            token: random_varint(rng, 32) as u32,
            prob: random_f64(rng),
            cont_cnt: random_varint(rng, 64),
        })
        .collect();
    let features = match rng.random_range(0..3) {
        0 => 0,
        _ => rng.random_range(1..40),
    };
    let names = match rng.random_range(0..3) {
        0 => 1 + rng.random_range(0..17),
        _ => 0,
    };
    MixResponse {
        top,
        rest_mass: random_f64(rng),
        lambda: random_f64(rng),
        suffix_len: random_varint(rng, 32) as u32,
        prompt_cnt: random_varint(rng, 64),
        sparse: rng.random(),
        gate_features: (0..features).map(|_| random_f64(rng)).collect(),
        gate_feature_names: (0..names).map(|i| format!("feature {i} ∞")).collect(),
    }
}

/// The twin's fields in this type.
fn from_prost(m: MixByProst) -> MixResponse {
    MixResponse {
        top: m.top,
        rest_mass: m.rest_mass,
        lambda: m.lambda,
        suffix_len: m.suffix_len,
        prompt_cnt: m.prompt_cnt,
        sparse: m.sparse,
        gate_features: m.gate_features,
        gate_feature_names: m.gate_feature_names,
    }
}

fn by_prost(m: &MixResponse) -> MixByProst {
    MixByProst {
        top: m.top.clone(),
        rest_mass: m.rest_mass,
        lambda: m.lambda,
        suffix_len: m.suffix_len,
        prompt_cnt: m.prompt_cnt,
        sparse: m.sparse,
        gate_features: m.gate_features.clone(),
        gate_feature_names: m.gate_feature_names.clone(),
    }
}

/// A `TokenProb`'s bytes in a form no writer gives (prost writes fields in order, once): its
/// fields last to first, a field twice, an unknown field, a two-byte key, a wrong wire type, a key
/// with nothing after it. Whether prost reads or refuses it, the one-pass reader leaves it to prost.
fn unusual_token_prob(rng: &mut impl Rng) -> Vec<u8> {
    let mut body = Vec::new();
    let token = random_varint(rng, 32) as u32;
    match rng.random_range(0..6) {
        0 => {
            encoding::uint64::encode(3, &(1 + random_varint(rng, 64)), &mut body);
            encoding::double::encode(2, &0.5, &mut body);
            encoding::uint32::encode(1, &token, &mut body);
        }
        1 => {
            encoding::uint32::encode(1, &token, &mut body);
            encoding::uint32::encode(1, &(token ^ 1), &mut body);
        }
        2 => {
            encoding::uint32::encode(1, &token, &mut body);
            match rng.random_bool(0.5) {
                true => encoding::uint64::encode(4, &7, &mut body),
                false => encoding::string::encode(9, &"?".to_string(), &mut body),
            }
        }
        3 => body.extend([0x88, 0x00, 0x05]),
        4 => body.extend([0x09, 1, 2, 3, 4, 5, 6, 7, 8]),
        _ => body.push(0x11),
    }
    body
}

/// An entry of `top` in a form other than the writers', or the features unpacked, as encoded
/// bytes to append to a message.
fn unusual_field(rng: &mut impl Rng) -> Vec<u8> {
    let mut bytes = Vec::new();
    if rng.random_bool(0.5) {
        let body = unusual_token_prob(rng);
        encoding::encode_key(1, WireType::LengthDelimited, &mut bytes);
        encoding::encode_varint(body.len() as u64, &mut bytes);
        bytes.extend(body);
    } else {
        let features = (0..rng.random_range(1..20)).map(|_| random_f64(rng));
        FeaturesUnpacked {
            gate_features: features.collect(),
        }
        .encode(&mut bytes)
        .expect("a Vec grows");
    }
    bytes
}

/// A valid encoding, perhaps followed by another message or an unusual field (which merge into
/// it), half the time nested in a [`Nested`]; then up to two bytes overwritten and, half the time,
/// cut short: whole and untouched a sixth of the time.
fn random_input(rng: &mut StdRng) -> Vec<u8> {
    let mut bytes = random_mix(rng).encode_to_vec();
    match rng.random_range(0..6) {
        0 => bytes.extend(random_mix(rng).encode_to_vec()),
        1 => bytes.extend(unusual_field(rng)),
        _ => {}
    }
    if rng.random_bool(0.5) {
        let mut nested = Vec::new();
        encoding::encode_key(3, WireType::LengthDelimited, &mut nested);
        encoding::encode_varint(bytes.len() as u64, &mut nested);
        nested.extend(bytes);
        encoding::uint64::encode(4, &(1 + random_varint(rng, 64)), &mut nested);
        bytes = nested;
    }
    oracle::damage(&mut bytes, rng);
    bytes
}

/// Reads `bytes` handed over in two chunks, split at `split`, as the message and as its twin
/// generated by prost, and as each nested in a [`Nested`]: the same values or the same refusal.
/// Whether the message was refused, read alone or nested (whichever `bytes` is).
fn reads_as_prost(bytes: &[u8], split: usize) -> bool {
    let chunks = || (&bytes[..split]).chain(&bytes[split..]);
    let twins = [("MixResponse", "MixByProst"), ("Nested", "NestedByProst")];
    let alone = oracle::same(
        MixResponse::decode(chunks()).map(|m| bits(&m)),
        MixByProst::decode(chunks()).map(|m| bits(&from_prost(m))),
        &twins,
    );
    let nested = oracle::same(
        Nested::decode(chunks()).map(|n| (n.mix.as_ref().map(bits), n.after)),
        NestedByProst::decode(chunks()).map(|n| (n.mix.map(|m| bits(&from_prost(m))), n.after)),
        &twins,
    );
    alone && nested
}

/// Written byte for byte as prost writes it, with prost's length; what prost writes reads to the
/// values prost reads, and so do fields in forms no writer gives.
#[test]
fn writes_as_prost_does_and_reads_what_prost_writes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(56);
    for _ in 0..1_000 {
        let ours = random_mix(&mut rng);
        let bytes = ours.encode_to_vec();
        assert_eq!(bytes, by_prost(&ours).encode_to_vec());
        assert_eq!(ours.encoded_len(), bytes.len());
        assert!(!reads_as_prost(&bytes, bytes.len()));
        // (Some unusual forms are malformed: prost refuses them, and so must this.)
        let mut unusual = bytes.clone();
        unusual.extend(unusual_field(&mut rng));
        reads_as_prost(&unusual, unusual.len());
    }
}

/// Input handed over in two chunks, split at every byte: read or refused as prost reads or
/// refuses it.
#[test]
fn input_split_across_chunks_reads_as_prost_reads_it() {
    oracle::reads_at_every_split(57, random_input, reads_as_prost);
}

/// Malformed input (cut anywhere, bytes overwritten, messages concatenated, which merges them) is
/// refused exactly where prost refuses it, with prost's error, and read to prost's values
/// elsewhere.
#[test]
fn reads_and_refuses_whatever_prost_reads_and_refuses() {
    oracle::reads_and_refuses_as_prost(58, random_input, reads_as_prost);
}

/// The one-pass reader takes every `TokenProb` a writer gives, to prost's values (so the fast path
/// is the one taken), and leaves every other form to prost's code.
#[test]
fn token_probs_in_the_writers_form_are_read_in_one_pass_and_no_others() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(59);
    for _ in 0..2_000 {
        let t = TokenProb {
            token: random_varint(&mut rng, 32) as u32,
            prob: random_f64(&mut rng),
            cont_cnt: random_varint(&mut rng, 64),
        };
        let body = t.encode_to_vec();
        let mut read = Vec::new();
        assert!(read_token_prob(&body, &mut read), "{t:?}");
        let prost = TokenProb::decode(&body[..]).unwrap();
        assert_eq!(
            (read[0].token, read[0].prob.to_bits(), read[0].cont_cnt),
            (prost.token, prost.prob.to_bits(), prost.cont_cnt)
        );
        let unusual = unusual_token_prob(&mut rng);
        assert!(!read_token_prob(&unusual, &mut read), "{unusual:?}");
        assert_eq!(read.len(), 1);
    }
    // Forms a writer may give that prost reads the same way: an explicit zero, an overlong
    // varint, a token past 32 bits (cut, as prost cuts it), nothing at all.
    for (body, token) in [
        (vec![0x08, 0x00], 0),
        (vec![0x08, 0x80, 0x00], 0),
        (vec![0x08, 0xff, 0xff, 0xff, 0xff, 0x1f], u32::MAX),
        (vec![], 0),
    ] {
        let mut read = Vec::new();
        assert!(read_token_prob(&body, &mut read));
        assert_eq!(read[0].token, token);
        assert_eq!(TokenProb::decode(&body[..]).unwrap().token, token);
    }
}

/// The proto's `MixResponse` has the fields this type writes and reads, no more.
#[test]
fn the_proto_has_the_fields_written_here() {
    use oracle::{field, proto_fields};
    use prost_types::field_descriptor_proto::{Label, Type};
    let (one, many) = (Label::Optional, Label::Repeated);
    assert_eq!(
        proto_fields("MixResponse"),
        [
            field(1, "top", Type::Message, many),
            field(2, "rest_mass", Type::Double, one),
            field(3, "lambda", Type::Double, one),
            field(4, "suffix_len", Type::Uint32, one),
            field(5, "prompt_cnt", Type::Uint64, one),
            field(6, "sparse", Type::Bool, one),
            field(7, "gate_features", Type::Double, many),
            field(8, "gate_feature_names", Type::String, many),
        ]
    );
    assert_eq!(
        proto_fields("TokenProb"),
        [
            field(1, "token", Type::Uint32, one),
            field(2, "prob", Type::Double, one),
            field(3, "cont_cnt", Type::Uint64, one),
        ]
    );
}
