//! Building one shard of a set: `index build --shard K/N` takes a contiguous run of the input's
//! documents, so every shard of the set can be built by its own command (a Kubernetes Indexed Job)
//! and the documents keep their global numbers across the set (shard k's first document is the one
//! after shard k−1's last). A survey of the whole input first counts its documents and fingerprints
//! their content: every command of the set computes the same split and the same set id, and a
//! router refuses shards whose ids differ.

use std::ops::Range;

use xxhash_rust::xxh3::Xxh3;

use crate::corpus::{Content, InputDoc};
use crate::index::build::BuildOptions;
use crate::index::format::ShardSetRecord;
use crate::index::{IndexError, Result};

/// Shard `shard` of a set of `shards`, as `K/N` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSplit {
    pub shard: u32,
    pub shards: u32,
}

impl std::str::FromStr for ShardSplit {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad =
            || format!("{s:?} is not K/N with 0 ≤ K < N (e.g. 0/3 for the first of three shards)");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (shard, shards): (u32, u32) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if shard >= shards {
            return Err(bad());
        }
        Ok(Self { shard, shards })
    }
}

impl ShardSplit {
    /// The documents of this shard among `documents` in input order: ⌊kD/N⌋ up to ⌊(k+1)D/N⌋.
    pub fn documents(&self, documents: u64) -> Range<u64> {
        let at = |k: u32| (documents as u128 * k as u128 / self.shards as u128) as u64;
        at(self.shard)..at(self.shard + 1)
    }

    /// Refuses a split with more shards than the input has documents (a shard would be empty).
    pub fn check(&self, survey: &CorpusSurvey) -> Result<()> {
        if survey.documents < self.shards as u64 {
            return Err(IndexError::Invalid(format!(
                "--shard {}/{}: the input has {} documents, fewer than the shards",
                self.shard, self.shards, survey.documents
            )));
        }
        Ok(())
    }

    /// This shard's documents of `docs` (the whole input, in order).
    pub fn take<T>(
        &self,
        survey: &CorpusSurvey,
        docs: impl Iterator<Item = T>,
    ) -> impl Iterator<Item = T> {
        let range = self.documents(survey.documents);
        docs.skip(range.start as usize)
            .take((range.end - range.start) as usize)
    }
}

/// What every shard's build must agree on: how many documents the input has and what they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorpusSurvey {
    pub documents: u64,
    /// xxh3-128 of every document's content and metadata, in order.
    pub content_hash: u128,
}

/// Reads every document once (nothing is tokenized): the first bad one fails the build here.
pub fn survey(docs: impl Iterator<Item = Result<InputDoc>>) -> Result<CorpusSurvey> {
    let mut hasher = Xxh3::new();
    let mut documents = 0u64;
    for doc in docs {
        let doc = doc?;
        if crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted);
        }
        match &doc.content {
            Content::Text(text) => {
                hasher.update(b"T");
                hasher.update(&(text.len() as u64).to_le_bytes());
                hasher.update(text.as_bytes());
            }
            Content::Tokens(ids) => {
                hasher.update(b"I");
                hasher.update(&(ids.len() as u64).to_le_bytes());
                for id in ids {
                    hasher.update(&id.to_le_bytes());
                }
            }
        }
        let metadata = doc.metadata.as_deref().unwrap_or("");
        hasher.update(&(metadata.len() as u64).to_le_bytes());
        hasher.update(metadata.as_bytes());
        documents += 1;
    }
    Ok(CorpusSurvey {
        documents,
        content_hash: hasher.digest128(),
    })
}

/// The manifest's record of shard `split` of a build with `opts`, whose input `survey` read.
pub fn set_record(split: ShardSplit, survey: &CorpusSurvey, opts: &BuildOptions) -> ShardSetRecord {
    let settings = serde_json::json!({
        "tokenizer": opts.tokenizer.map(|t| t.fingerprint().to_string()),
        "token_width": opts.width.bytes(),
        "eos": opts.eos_token_id,
        "vocab": opts.vocab_size,
        "decontamination": opts.decontaminate.map(|d| d.record()),
    });
    ShardSetRecord::new(split, survey, &settings.to_string())
}

impl ShardSetRecord {
    /// `settings` are the build's choices that change the shards' content beyond the input
    /// (tokenizer fingerprint, token width, eos, vocabulary, decontamination), in a stable text form.
    pub fn new(split: ShardSplit, survey: &CorpusSurvey, settings: &str) -> Self {
        let mut hasher = Xxh3::new();
        hasher.update(&survey.content_hash.to_le_bytes());
        hasher.update(&survey.documents.to_le_bytes());
        hasher.update(&split.shards.to_le_bytes());
        hasher.update(settings.as_bytes());
        Self {
            set_id: format!("{:032x}", hasher.digest128()),
            shard: split.shard,
            shards: split.shards,
            corpus_documents: survey.documents,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shards_of_a_split_cover_every_document_once_in_order() {
        for documents in [0u64, 1, 2, 7, 100, 101] {
            for shards in 1..=9u32 {
                let mut next = 0;
                for shard in 0..shards {
                    let r = ShardSplit { shard, shards }.documents(documents);
                    assert_eq!(r.start, next, "D={documents} N={shards} k={shard}");
                    let len = r.end - r.start;
                    // Balanced: sizes differ by at most one.
                    assert!(
                        len == documents / shards as u64
                            || len == documents.div_ceil(shards as u64)
                    );
                    next = r.end;
                }
                assert_eq!(next, documents);
            }
        }
    }

    #[test]
    fn k_of_n_parses_and_refuses_what_is_not_a_shard() {
        assert_eq!(
            "2/3".parse::<ShardSplit>(),
            Ok(ShardSplit {
                shard: 2,
                shards: 3
            })
        );
        for bad in ["3/3", "1", "a/3", "0/0", "-1/3", "1/3/4"] {
            assert!(bad.parse::<ShardSplit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_set_id_changes_with_the_content_the_shard_count_and_the_settings() {
        let doc = |t: &str| {
            Ok(InputDoc {
                content: Content::Text(t.into()),
                metadata: None,
                input_bytes: 0,
            })
        };
        let a = survey([doc("ab"), doc("c")].into_iter()).unwrap();
        let b = survey([doc("a"), doc("bc")].into_iter()).unwrap();
        assert_eq!(a.documents, 2);
        assert_ne!(a.content_hash, b.content_hash, "document boundaries count");
        let split = ShardSplit {
            shard: 0,
            shards: 2,
        };
        let id = |s: &CorpusSurvey, split, settings| ShardSetRecord::new(split, s, settings).set_id;
        assert_eq!(
            id(&a, split, "x"),
            id(
                &a,
                ShardSplit {
                    shard: 1,
                    shards: 2
                },
                "x"
            )
        );
        assert_ne!(id(&a, split, "x"), id(&b, split, "x"));
        assert_ne!(
            id(&a, split, "x"),
            id(
                &a,
                ShardSplit {
                    shard: 0,
                    shards: 3
                },
                "x"
            )
        );
        assert_ne!(id(&a, split, "x"), id(&a, split, "y"));
    }
}
