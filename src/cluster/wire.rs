//! Shard answers (`sidecar.shard.v1`) read as the merge's partial answers
//! ([`crate::cluster::partial`] and friends), and a shard server's description as its identity.
//! Only answers that passed [`super::validate`] are read: these conversions trust the invariants
//! it checked.

use super::set::ShardIdentity;
use crate::cluster::partial::{
    LocalContinuations, LocalSample, PartialContinuations, PartialDrafts,
};
use crate::index::dense::TokenEvidence;
use crate::index::docs::{Document, PartialSearch};
use crate::index::query::Spread;
use crate::server::shard_pb as spb;

/// What a shard server says of itself, less its tokenizer.
impl From<&spb::ShardDescription> for ShardIdentity {
    fn from(d: &spb::ShardDescription) -> Self {
        Self {
            set_id: d.set_id.clone(),
            shard: d.shard,
            shards: d.shards,
            documents: d.documents,
            tokens: d.tokens,
            local_parts: d.local_shards,
            token_width: d.token_width,
            eos_token_id: d.eos_token_id,
            vocab_size: d.vocab_size,
            tokenizer_fingerprint: d.tokenizer_fingerprint.clone(),
            content_id: d.content_id.clone(),
        }
    }
}

/// The spread the wire says (an unknown kind reads as none; validation refuses it first).
pub fn spread_of(kind: i32, single: u32) -> Spread {
    match spb::Spread::try_from(kind) {
        Ok(spb::Spread::Single) => Spread::Single(single),
        Ok(spb::Spread::Several) => Spread::Several,
        _ => Spread::None,
    }
}

fn samples_of(samples: Vec<spb::LocalSample>) -> Vec<LocalSample> {
    samples
        .into_iter()
        .map(|l| LocalSample {
            matches: l.matches,
            runs: l.runs.into_iter().map(|r| (r.token, r.count)).collect(),
        })
        .collect()
}

pub fn continuations_of(a: spb::ContinuationsAnswer) -> PartialContinuations {
    PartialContinuations {
        suffix_len: a.suffix_len as usize,
        prompt_cnt: a.prompt_cnt,
        dist: a.dist_tokens.into_iter().zip(a.dist_counts).collect(),
        samples: samples_of(a.samples),
        spread: spread_of(a.spread, a.single),
    }
}

pub fn drafts_of(a: spb::ContinuationsAnswer) -> PartialDrafts {
    PartialDrafts {
        suffix_len: a.suffix_len as usize,
        suffix_arrays: a
            .drafts
            .into_iter()
            .map(|l| LocalContinuations {
                matches: l.matches,
                fine: l.fine.into_iter().map(|c| c.tokens).collect(),
            })
            .collect(),
    }
}

pub fn evidence_of(t: &spb::TokenEvidence) -> TokenEvidence {
    TokenEvidence {
        suffix_len: t.suffix_len as usize,
        prompt_cnt: t.prompt_cnt,
        cont_cnt: t.cont_cnt,
        spread: spread_of(t.spread, t.single),
    }
}

/// A position's support sample, taken out of the shard's evidence of it.
pub fn support_of(t: &mut spb::TokenEvidence) -> PartialContinuations {
    PartialContinuations {
        suffix_len: t.suffix_len as usize,
        prompt_cnt: t.prompt_cnt,
        dist: Default::default(),
        samples: samples_of(std::mem::take(&mut t.support)),
        spread: spread_of(t.spread, t.single),
    }
}

/// A shard's documents, numbered within it and without text (the router decodes the few it
/// answers with, after the merge).
pub fn search_of(a: spb::SearchAnswer) -> PartialSearch {
    PartialSearch {
        doc_cnt: a.doc_cnt,
        clause_places: a.clause_places,
        documents: a
            .documents
            .into_iter()
            .map(|d| Document {
                doc_ix: d.doc_ix,
                doc_len: d.doc_len,
                disp_len: d.disp_len,
                needle_offset: d.needle_offset,
                metadata: Some(d.metadata),
                token_ids: d.token_ids,
                text: None,
            })
            .collect(),
    }
}
