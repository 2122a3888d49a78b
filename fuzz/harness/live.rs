//! Target `live`: the live index driven by a program the input spells (appends of several pieces
//! with and without request ids, retractions, lookups, compaction rounds, a close and reopen of its
//! data folder), checked after every step against a plain model of what was acknowledged: the index
//! holds exactly the tokens acknowledged and not taken back, a refused append changes nothing, a
//! repeated request id adds nothing, and every continuation a lookup offers follows its match in a
//! document that was appended. The budget is large enough that nothing is evicted.
//!
//! Each step is an opcode byte followed by its operands, read from the input until it runs out.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use infini_sidecar::index::TokenWidth;
use infini_sidecar::live::{
    Appended, Durability, LiveConfig, LiveError, LiveIndex, LiveStore, Piece, Vocabulary,
};

const VOCAB: Vocabulary = Vocabulary {
    width: TokenWidth::U16,
    eos_token_id: 0,
    vocab_size: 200,
};
const NAMESPACES: [&str; 3] = ["a", "b", "c"];

pub struct Fixture {
    dir: PathBuf,
}

/// The input, read a byte at a time (zeros once it runs out).
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }

    /// Up to `most` tokens, every one inside the vocabulary unless `bad`.
    fn tokens(&mut self, most: usize, bad: bool) -> Vec<u32> {
        let n = self.byte() as usize % (most + 1);
        (0..n)
            .map(|_| match bad {
                true => 150 + self.byte() as u32,
                false => 1 + self.byte() as u32 % 40,
            })
            .collect()
    }
}

/// What was acknowledged: each namespace's documents by id, and the request ids seen since the
/// last open.
#[derive(Default)]
struct Model {
    docs: HashMap<&'static str, HashMap<u64, Vec<u32>>>,
    ids: HashSet<(&'static str, String)>,
    /// Ids known before a reopen: the journal carries most across it, not all (an id of an append
    /// that added nothing to a namespace not yet made, a namespace reclaimed empty), so either is
    /// right until the id is seen again.
    maybe_ids: HashSet<(&'static str, String)>,
}

impl Model {
    fn tokens(&self) -> u64 {
        self.docs
            .values()
            .flat_map(|d| d.values())
            .map(|d| d.len() as u64)
            .sum()
    }

    /// Whether `needle` stands in one of the namespace's documents.
    fn holds(&self, ns: &str, needle: &[u32]) -> bool {
        self.docs.get(ns).is_some_and(|docs| {
            docs.values()
                .any(|d| needle.is_empty() || d.windows(needle.len()).any(|w| w == needle))
        })
    }
}

fn config(dir: &Path) -> LiveConfig {
    LiveConfig {
        data_dir: Some(dir.to_path_buf()),
        budget_tokens: 1 << 20,
        freeze_tokens: 64,
        merge_fanout: 2,
        background: false,
        ..LiveConfig::default()
    }
}

impl Fixture {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn run(&self, input: &[u8]) {
        let data = tempfile::tempdir_in(&self.dir).expect("a folder for the live index");
        let mut live = LiveIndex::open(config(data.path()), VOCAB).expect("the live index opens");
        let mut model = Model::default();
        let mut r = Reader(input);
        while !r.done() {
            let ns = NAMESPACES[r.byte() as usize % NAMESPACES.len()];
            match r.byte() % 6 {
                op @ (0 | 1) => append(&live, &mut model, &mut r, ns, op == 1),
                2 => {
                    let (doc, n) = (r.byte() as u64 % 4, r.byte() as usize % 8);
                    if live.retract(ns, doc, n) {
                        let d = model.docs.entry(ns).or_default().entry(doc).or_default();
                        assert!(d.len() >= n, "retracted more than document {doc} held");
                        d.truncate(d.len() - n);
                    }
                }
                3 => {
                    let pattern = r.tokens(12, false);
                    let (conts, len) = live.continuations(ns, &pattern, 16, 4);
                    assert!(len <= pattern.len());
                    for c in conts {
                        let mut span = pattern[pattern.len() - len..].to_vec();
                        span.extend_from_slice(&c);
                        assert!(
                            model.holds(ns, &span),
                            "{span:?} was never appended to {ns}"
                        );
                    }
                }
                4 => live.compact(),
                _ => {
                    drop(live);
                    live = LiveIndex::open(config(data.path()), VOCAB).expect("it opens again");
                    // Request ids may be remembered across a restart (their journal's); document
                    // ids start again, so the model's documents go on under fresh ids.
                    let known: Vec<_> = model.ids.drain().collect();
                    model.maybe_ids.extend(known);
                    for docs in model.docs.values_mut() {
                        let old = std::mem::take(docs);
                        docs.extend(
                            old.into_values()
                                .enumerate()
                                .map(|(i, d)| (100 + i as u64, d)),
                        );
                    }
                }
            }
            assert_eq!(
                live.stats().tokens,
                model.tokens(),
                "the index holds other than what was acknowledged"
            );
        }
    }
}

/// One request of up to three pieces (of documents 0–3), some with ids outside the vocabulary
/// when `bad`, with one of four request ids or none.
fn append(live: &LiveIndex, model: &mut Model, r: &mut Reader, ns: &'static str, bad: bool) {
    let mut pieces: Vec<(u64, Vec<u32>)> = Vec::new();
    for _ in 0..1 + r.byte() % 3 {
        let doc = r.byte() as u64 % 4;
        let bad_here = bad && r.byte().is_multiple_of(2);
        pieces.push((doc, r.tokens(120, bad_here)));
    }
    let id = match r.byte() % 5 {
        0 => String::new(),
        k => format!("r{k}"),
    };
    let refs: Vec<Piece> = pieces
        .iter()
        .map(|(doc, tokens)| Piece { doc: *doc, tokens })
        .collect();
    let outcome = live.append_pieces(ns, &refs, &id, Durability::Written);
    let any_bad = pieces
        .iter()
        .flat_map(|(_, t)| t)
        .any(|&t| t as u64 >= VOCAB.vocab_size);
    match outcome {
        Ok(Appended::Repeated) => {
            let key = (ns, id);
            assert!(
                model.ids.contains(&key) || model.maybe_ids.contains(&key),
                "a new id was taken for a repeat"
            );
            model.maybe_ids.remove(&key);
            model.ids.insert(key);
        }
        Ok(Appended::Added) => {
            assert!(!any_bad, "ids outside the vocabulary were taken");
            assert!(
                id.is_empty() || !model.ids.contains(&(ns, id.clone())),
                "a repeat was added again"
            );
            for (doc, tokens) in pieces {
                let d = model.docs.entry(ns).or_default().entry(doc).or_default();
                d.extend(tokens);
            }
            if !id.is_empty() {
                model.maybe_ids.remove(&(ns, id.clone()));
                model.ids.insert((ns, id));
            }
        }
        Err(LiveError::Invalid(_) | LiveError::Full(_)) => {}
        Err(e) => panic!("an append failed other than by refusal: {e}"),
    }
}

/// A few programs: appends and lookups, a retraction, a repeated id, a reopen.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let programs = vec![
        vec![
            0, 0, 1, 0, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            1, 0, 3, 3, 1, 2, 3,
        ],
        vec![
            1, 0, 0, 1, 5, 9, 9, 9, 9, 9, 2, 1, 0, 2, 1, 3, 1, 2, 3, 9, 9, 9,
        ],
        vec![
            2, 0, 1, 2, 4, 1, 2, 3, 4, 3, 5, 0, 2, 0, 1, 2, 4, 1, 2, 3, 4, 3, 4, 2, 5, 2, 3, 2, 1,
            2,
        ],
    ];
    ["lookup", "retract", "reopen"]
        .into_iter()
        .zip(programs)
        .collect()
}
