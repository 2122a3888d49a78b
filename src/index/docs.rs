//! Document retrieval: the documents that contain an n-gram, or that satisfy a CNF of n-grams
//! (an AND of clauses, each an OR of n-grams), with their tokens, text and metadata.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::index::{Index, IndexError, Result};

/// Knobs of a document search, with the reference engine's defaults.
#[derive(Debug, Clone, Copy)]
pub struct SearchOptions {
    /// Most documents returned.
    pub maxnum: usize,
    /// Most tokens of each document returned, centred on the first match.
    pub max_disp_len: usize,
    /// A clause matching more places than this is subsampled, and the answer flagged `approx`.
    pub max_clause_freq: u64,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            maxnum: 1,
            max_disp_len: 1000,
            max_clause_freq: 50_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Document {
    /// Index of the document over all shards, in build order.
    pub doc_ix: u64,
    /// Tokens in the document (separator excluded).
    pub doc_len: u64,
    /// Tokens returned in `token_ids`.
    pub disp_len: u64,
    /// Where the first match of the first clause starts within `token_ids`.
    pub needle_offset: u64,
    pub metadata: Option<String>,
    pub token_ids: Vec<u32>,
    /// Decoded `token_ids`, when the index has its tokenizer.
    pub text: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchResult {
    /// Number of matching documents (a lower bound when `approx`).
    pub cnt: u64,
    pub approx: bool,
    pub documents: Vec<Document>,
}

/// A place in the corpus: shard and byte offset.
type Place = (usize, u64);

impl Index {
    /// Documents containing `ids` anywhere.
    pub fn search_docs(&self, ids: &[u32], opts: SearchOptions) -> Result<SearchResult> {
        self.search_docs_cnf(&[vec![ids.to_vec()]], opts)
    }

    pub fn search_docs_cnf(
        &self,
        cnf: &[Vec<Vec<u32>>],
        opts: SearchOptions,
    ) -> Result<SearchResult> {
        if cnf.is_empty()
            || cnf
                .iter()
                .any(|clause| clause.is_empty() || clause.iter().any(|ngram| ngram.is_empty()))
        {
            return Err(IndexError::Invalid(
                "a CNF needs at least one clause, each with at least one non-empty n-gram".into(),
            ));
        }
        for ngram in cnf.iter().flatten() {
            self.check_ids(ngram)?;
        }
        let mut approx = false;
        // For each clause: matching document → first place it matches there.
        let mut clauses: Vec<BTreeMap<(usize, u64), Place>> = Vec::with_capacity(cnf.len());
        for clause in cnf {
            let (docs, sampled) = self.clause_documents(clause, opts.max_clause_freq);
            approx |= sampled;
            clauses.push(docs);
        }
        let (first, rest) = clauses
            .split_first()
            .ok_or_else(|| IndexError::Invalid("empty CNF".into()))?;
        let matching: Vec<(&(usize, u64), &Place)> = first
            .iter()
            .filter(|(doc, _)| rest.iter().all(|c| c.contains_key(doc)))
            .collect();
        let documents = matching
            .iter()
            .take(opts.maxnum)
            .map(|&(&(s, d), &place)| self.document(s, d, place, opts.max_disp_len))
            .collect();
        Ok(SearchResult {
            cnt: matching.len() as u64,
            approx,
            documents,
        })
    }

    /// Documents matched by any n-gram of a clause, keyed by (shard, local doc).
    fn clause_documents(
        &self,
        clause: &[Vec<u32>],
        max_freq: u64,
    ) -> (BTreeMap<(usize, u64), Place>, bool) {
        let mut docs = BTreeMap::new();
        let mut sampled = false;
        let matches: Vec<_> = clause
            .iter()
            .map(|ngram| self.locate(self.encode(ngram), None))
            .collect();
        let total: u64 = matches.iter().map(|m| m.count()).sum();
        let stride = if total > max_freq {
            total.div_ceil(max_freq)
        } else {
            1
        };
        for m in &matches {
            for (s, (shard, range)) in self.shards.iter().zip(&m.ranges).enumerate() {
                let mut rank = range.lo;
                while rank < range.hi {
                    let ptr = shard.ptr(rank);
                    let place = (s, ptr);
                    docs.entry((s, shard.doc_of(ptr)))
                        .and_modify(|p: &mut Place| *p = (*p).min(place))
                        .or_insert(place);
                    rank += stride;
                }
                sampled |= stride > 1 && !range.is_empty();
            }
        }
        (docs, sampled)
    }

    fn doc_ix_base(&self, shard: usize) -> u64 {
        self.shards[..shard].iter().map(|s| s.doc_cnt()).sum()
    }

    fn document(&self, s: usize, doc: u64, needle: Place, max_disp_len: usize) -> Document {
        let shard = &self.shards[s];
        let w = self.width().bytes() as u64;
        let (start, end) = (shard.doc_start(doc) + w, shard.doc_end(doc));
        let doc_len = end.saturating_sub(start) / w;
        let needle_tok = (needle.1.saturating_sub(start)) / w;
        let disp_len = doc_len.min(max_disp_len as u64);
        // A window of disp_len tokens that shows the needle with context on both sides.
        let from_tok = needle_tok
            .saturating_sub(disp_len / 2)
            .min(doc_len - disp_len);
        let token_ids =
            shard.tokens_between(start + from_tok * w, start + (from_tok + disp_len) * w);
        let text = self.tokenizer().and_then(|t| t.decode(&token_ids).ok());
        Document {
            doc_ix: self.doc_ix_base(s) + doc,
            doc_len,
            disp_len,
            needle_offset: needle_tok - from_tok,
            metadata: shard.metadata(doc),
            token_ids,
            text,
        }
    }

    /// Document `doc_ix` (over all shards) in full, with metadata and text.
    pub fn get_document(&self, doc_ix: u64) -> Result<Document> {
        let mut local = doc_ix;
        for (s, shard) in self.shards.iter().enumerate() {
            if local < shard.doc_cnt() {
                let start = shard.doc_start(local);
                return Ok(self.document(s, local, (s, start), usize::MAX));
            }
            local -= shard.doc_cnt();
        }
        Err(IndexError::Invalid(format!(
            "document {doc_ix} does not exist (the index has {})",
            self.total_documents()
        )))
    }
}
