//! What the tests of the messages whose protobuf code is written here share. The oracle is
//! prost's generated code: each message has a twin derived from its fields' proto types, and a
//! test's `reads_as_prost(bytes, split)` reads `bytes`, handed over in two chunks split at `split`,
//! both ways, asserts that they agree (with [`same`]) and says whether they refused.

use std::fmt::Debug;

use prost::DecodeError;
use prost_types::field_descriptor_proto::{Label, Type};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Both read, to the same values, or both refuse, with the same error once each of our names in
/// `twins` is replaced by its twin's; whether they refused.
pub fn same<T: PartialEq + Debug>(
    ours: Result<T, DecodeError>,
    prost: Result<T, DecodeError>,
    twins: &[(&str, &str)],
) -> bool {
    match (ours, prost) {
        (Ok(ours), Ok(prost)) => {
            assert!(ours == prost, "read {ours:?}, prost {prost:?}");
            false
        }
        (Err(ours), Err(prost)) => {
            let ours =
                (twins.iter()).fold(ours.to_string(), |e, (name, twin)| e.replace(name, twin));
            assert_eq!(ours, prost.to_string());
            true
        }
        (ours, prost) => panic!("ours {ours:?}, prost {prost:?}"),
    }
}

/// Up to two bytes of `bytes` overwritten and, half the time, the rest cut short.
pub fn damage(bytes: &mut Vec<u8>, rng: &mut impl Rng) {
    if bytes.is_empty() {
        return;
    }
    for _ in 0..rng.random_range(0..3) {
        let at = rng.random_range(0..bytes.len());
        bytes[at] = rng.random();
    }
    if rng.random_bool(0.5) {
        bytes.truncate(rng.random_range(0..bytes.len()));
    }
}

/// Input handed over in two chunks (which tonic never does, but a `Buf` may), well-formed or not,
/// split at every byte: 40 inputs of `random_input`, each read as prost reads or refuses it.
pub fn reads_at_every_split(
    seed: u64,
    random_input: fn(&mut StdRng) -> Vec<u8>,
    reads_as_prost: fn(&[u8], usize) -> bool,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..40 {
        let bytes = random_input(&mut rng);
        for split in 0..=bytes.len() {
            reads_as_prost(&bytes, split);
        }
    }
}

/// 3,000 inputs of `random_input`, whole: each read or refused as prost reads or refuses it, and
/// more than a tenth refused (so the damage reaches the readers).
pub fn reads_and_refuses_as_prost(
    seed: u64,
    random_input: fn(&mut StdRng) -> Vec<u8>,
    reads_as_prost: fn(&[u8], usize) -> bool,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let refused = (0..3_000)
        .filter(|_| {
            let bytes = random_input(&mut rng);
            reads_as_prost(&bytes, bytes.len())
        })
        .count();
    assert!(refused > 300, "only {refused} inputs were malformed");
}

/// A field of a proto message: its number, name, type and label.
pub type Field = (i32, String, Type, Label);

pub fn field(number: i32, name: &str, kind: Type, label: Label) -> Field {
    (number, name.to_string(), kind, label)
}

/// The fields of `message` of `proto/sidecar/v1` as its descriptor has them. A message whose code
/// is written here checks them against the fields it writes, so that a field added to the proto
/// is not silently left off the wire.
pub fn proto_fields(message: &str) -> Vec<Field> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(crate::server::pb::FILE_DESCRIPTOR_SET)
        .expect("the build wrote a descriptor set");
    let found = (set.file.iter())
        .filter(|f| f.package() == "sidecar.v1")
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == message);
    let fields = found.map(|m| m.field.clone()).unwrap_or_default();
    (fields.iter())
        .map(|f| field(f.number(), f.name(), f.r#type(), f.label()))
        .collect()
}
