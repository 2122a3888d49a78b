//! The oracle is prost's generated code: the same messages derived from their fields' proto types,
//! which these must write byte for byte and read value for value, refusing what it refuses.

use super::*;
use prost::Message;
use rand::{Rng, SeedableRng};

#[derive(Clone, PartialEq, prost::Message)]
struct TopKByProst {
    #[prost(uint32, repeated, tag = "1")]
    tokens: Vec<u32>,
    #[prost(float, repeated, tag = "2")]
    logprobs: Vec<f32>,
    #[prost(double, tag = "3")]
    rest_mass: f64,
}

/// The same fields in the unpacked encoding, which a reader of packed fields must accept too.
#[derive(Clone, PartialEq, prost::Message)]
struct TopKUnpacked {
    #[prost(uint32, repeated, packed = "false", tag = "1")]
    tokens: Vec<u32>,
    #[prost(float, repeated, packed = "false", tag = "2")]
    logprobs: Vec<f32>,
    #[prost(double, tag = "3")]
    rest_mass: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LogitsByProst {
    #[prost(float, repeated, tag = "1")]
    logits: Vec<f32>,
}

/// A message's fields with floats as bits, so that NaNs compare.
fn top_k_bits(tokens: &[u32], logprobs: &[f32], rest_mass: f64) -> (Vec<u32>, Vec<u32>, u64) {
    let bits = logprobs.iter().map(|f| f.to_bits()).collect();
    (tokens.to_vec(), bits, rest_mass.to_bits())
}

fn ours_bits(m: &NeuralTopK) -> (Vec<u32>, Vec<u32>, u64) {
    top_k_bits(&m.tokens, &m.logprobs, m.rest_mass)
}

fn prost_bits(m: &TopKByProst) -> (Vec<u32>, Vec<u32>, u64) {
    top_k_bits(&m.tokens, &m.logprobs, m.rest_mass)
}

/// Token ids of every varint length, floats of any bits (NaNs, infinities, signed zeros), and
/// empty fields.
fn random_top_k(rng: &mut impl Rng) -> NeuralTopK {
    let n = match rng.random_range(0..4) {
        0 => 0,
        1 => rng.random_range(1..4),
        _ => rng.random_range(1..700),
    };
    let token = |rng: &mut dyn rand::RngCore| match rng.random_range(0..4) {
        0 => rng.random_range(0..128),
        1 => rng.random_range(0..49_152),
        _ => rng.random(),
    };
    let tokens = (0..n).map(|_| token(rng)).collect();
    let m = match rng.random_range(0..3) {
        0 => 0,
        1 => n,
        _ => rng.random_range(0..700),
    };
    let logprobs = (0..m)
        .map(|_| match rng.random_range(0..3) {
            0 => f32::from_bits(rng.random()),
            _ => -rng.random::<f32>() * 20.0,
        })
        .collect();
    let rest_mass = match rng.random_range(0..4) {
        0 => 0.0,
        1 => -0.0,
        _ => rng.random(),
    };
    NeuralTopK {
        tokens,
        logprobs,
        rest_mass,
    }
}

fn by_prost(m: &NeuralTopK) -> TopKByProst {
    TopKByProst {
        tokens: m.tokens.clone(),
        logprobs: m.logprobs.clone(),
        rest_mass: m.rest_mass,
    }
}

/// Written byte for byte as prost writes them; each reads what the other wrote, and what prost
/// writes unpacked, to the same values.
#[test]
fn writes_as_prost_does_and_reads_what_prost_writes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(53);
    for _ in 0..500 {
        let ours = random_top_k(&mut rng);
        let theirs = by_prost(&ours);
        let bytes = ours.encode_to_vec();
        assert_eq!(bytes, theirs.encode_to_vec());
        assert_eq!(ours.encoded_len(), theirs.encoded_len());
        // (A rest mass of -0.0 is not sent, as proto3 sends no zero: it reads as 0.)
        let read = ours_bits(&NeuralTopK::decode(&bytes[..]).unwrap());
        assert!(read == prost_bits(&TopKByProst::decode(&bytes[..]).unwrap()));
        let unpacked = TopKUnpacked {
            tokens: ours.tokens.clone(),
            logprobs: ours.logprobs.clone(),
            rest_mass: ours.rest_mass,
        };
        let unpacked = NeuralTopK::decode(&unpacked.encode_to_vec()[..]).unwrap();
        assert!(ours_bits(&unpacked) == read);

        let logits = NeuralLogits {
            logits: ours.logprobs.clone(),
        };
        let theirs = LogitsByProst {
            logits: ours.logprobs.clone(),
        };
        let bytes = logits.encode_to_vec();
        assert_eq!(bytes, theirs.encode_to_vec());
        assert_eq!(logits.encoded_len(), theirs.encoded_len());
        let read = NeuralLogits::decode(&bytes[..]).unwrap();
        assert!(top_k_bits(&[], &read.logits, 0.0) == top_k_bits(&[], &logits.logits, 0.0));
    }
}

/// A field split between two chunks of the buffer (which tonic never hands over, but a `Buf` may)
/// reads as it does whole, at every split.
#[test]
fn a_field_split_across_chunks_reads_as_whole() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(54);
    for _ in 0..20 {
        let bytes = random_top_k(&mut rng).encode_to_vec();
        let whole = ours_bits(&NeuralTopK::decode(&bytes[..]).unwrap());
        for split in 0..=bytes.len() {
            let chained = (&bytes[..split]).chain(&bytes[split..]);
            let read = NeuralTopK::decode(chained).unwrap();
            assert!(ours_bits(&read) == whole, "split at {split}");
        }
    }
}

/// Malformed input (cut anywhere, bytes overwritten, messages concatenated, which merges them)
/// is refused exactly where prost refuses it, with prost's error, and read to prost's values
/// elsewhere.
#[test]
fn reads_and_refuses_whatever_prost_reads_and_refuses() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(55);
    let mut refused = 0;
    for round in 0..3_000 {
        let mut bytes = random_top_k(&mut rng).encode_to_vec();
        if round % 3 == 0 {
            bytes.extend(random_top_k(&mut rng).encode_to_vec());
        }
        if !bytes.is_empty() {
            for _ in 0..rng.random_range(0..3) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
            bytes.truncate(rng.random_range(0..=bytes.len()));
        }
        let ours = NeuralTopK::decode(&bytes[..]);
        let theirs = TopKByProst::decode(&bytes[..]);
        match (ours, theirs) {
            (Ok(ours), Ok(theirs)) => assert_eq!(ours_bits(&ours), prost_bits(&theirs)),
            (Err(ours), Err(theirs)) => {
                refused += 1;
                assert_eq!(
                    ours.to_string().replace("NeuralTopK", "TopKByProst"),
                    theirs.to_string()
                );
            }
            (ours, theirs) => panic!("{bytes:?}: ours {ours:?}, prost {theirs:?}"),
        }
        let logits = NeuralLogits::decode(&bytes[..]).map(|m| top_k_bits(&[], &m.logits, 0.0));
        let theirs = LogitsByProst::decode(&bytes[..]).map(|m| top_k_bits(&[], &m.logits, 0.0));
        assert_eq!(logits.is_ok(), theirs.is_ok(), "{bytes:?}");
        if let (Ok(ours), Ok(theirs)) = (logits, theirs) {
            assert_eq!(ours, theirs);
        }
    }
    assert!(refused > 300, "only {refused} inputs were malformed");
}
