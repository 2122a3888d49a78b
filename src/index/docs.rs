//! Document retrieval: the documents that contain an n-gram, or that satisfy a CNF of n-grams
//! (an AND of clauses, each an OR of n-grams), with their tokens, text and metadata.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::index::ranks::RankRange;
use crate::index::read::part::Part;
use crate::index::{Index, IndexError, Result};
use crate::tokenizer::Tokenizer;

/// An AND of clauses, each an OR of n-grams.
pub type Cnf = Vec<Vec<Vec<u32>>>;

/// Knobs of a document search, with the reference engine's defaults, and the caps that bound its work
/// before any is done.
#[derive(Debug, Clone, Copy)]
pub struct SearchOptions {
    /// Most documents returned.
    pub maxnum: usize,
    /// Most tokens of each document returned, centred on the first match.
    pub max_disp_len: usize,
    /// A clause matching more places than this is subsampled, and the answer flagged `approx`.
    pub max_clause_freq: u64,
    /// Most clauses in a CNF.
    pub max_clauses: usize,
    /// Most places a search may visit: the sum over its clauses of min(matches, `max_clause_freq`),
    /// known from the counts before any place is visited. Bounds the time and memory of one search.
    pub max_places: u64,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            maxnum: 1,
            max_disp_len: 1000,
            max_clause_freq: 50_000,
            max_clauses: 64,
            max_places: 4_000_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Document {
    /// Index of the document over all parts, in build order.
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

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SearchResult {
    /// The reference engine's `cnt`, a number of matches rather than documents: for a single n-gram
    /// its occurrences, for one clause the occurrences of all its n-grams. With several clauses, the
    /// matches of the rarest clause that lie in documents matching every clause (the reference counts
    /// those with the other clauses nearby instead). Estimated from the sample when `approx`.
    pub cnt: u64,
    /// Number of matching documents (a lower bound when `approx`).
    pub doc_cnt: u64,
    pub approx: bool,
    pub documents: Vec<Document>,
}

/// What one index holds of a search visiting every `stride`-th match of each clause.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialSearch {
    /// Documents matching every clause.
    pub doc_cnt: u64,
    /// Per clause: its places visited in those documents.
    pub clause_places: Vec<u64>,
    /// The first `maxnum` of them, in index order.
    pub documents: Vec<Document>,
}

impl PartialSearch {
    /// The answer, given the clauses' match counts and the strides visited: `cnt` as the
    /// reference gives it (see [`SearchResult::cnt`]), the rarest clause deciding with several.
    pub fn result(self, totals: &[u64], strides: &[u64]) -> SearchResult {
        let cnt = match totals {
            [only] => *only,
            _ => {
                let anchor = (0..totals.len())
                    .min_by_key(|&c| totals[c])
                    .unwrap_or_default();
                self.clause_places[anchor] * strides[anchor]
            }
        };
        SearchResult {
            cnt,
            doc_cnt: self.doc_cnt,
            approx: strides.iter().any(|&s| s > 1),
            documents: self.documents,
        }
    }
}

/// Refuses a CNF without clauses, with an empty clause or n-gram, or with over `max_clauses`.
pub fn check_cnf_shape(cnf: &[Vec<Vec<u32>>], max_clauses: usize) -> Result<()> {
    if cnf.is_empty()
        || cnf
            .iter()
            .any(|clause| clause.is_empty() || clause.iter().any(|ngram| ngram.is_empty()))
    {
        return Err(IndexError::Invalid(
            "a CNF needs at least one clause, each with at least one non-empty n-gram".into(),
        ));
    }
    if cnf.len() > max_clauses {
        return Err(IndexError::Invalid(format!(
            "a CNF of {} clauses exceeds the limit of {max_clauses}",
            cnf.len(),
        )));
    }
    Ok(())
}

/// Every clause's stride: 1, or what brings its matches to `max_clause_freq`. Refuses a search
/// that would visit more than `max_places` places, and, as unsupported, one over `max_places` /
/// `place_cost` (`DocumentIndex::PLACE_COST`: what locating one place costs the index).
pub fn search_strides(totals: &[u64], place_cost: u64, opts: SearchOptions) -> Result<Vec<u64>> {
    let places = totals
        .iter()
        .map(|&t| t.min(opts.max_clause_freq))
        .fold(0u64, u64::saturating_add);
    if places > opts.max_places {
        return Err(IndexError::Invalid(format!(
            "this search would visit {places} places (over its clauses, the matches of each up to \
             max_clause_freq {}), beyond the limit of {}: use rarer n-grams or a lower \
             max_clause_freq",
            opts.max_clause_freq, opts.max_places
        )));
    }
    check_locatable(places, place_cost, opts.max_places)?;
    Ok(totals
        .iter()
        .map(|t| t.div_ceil(opts.max_clause_freq).max(1))
        .collect())
}

/// Refuses, as unsupported, a search of `places` places over `max_places` / `place_cost`
/// (`DocumentIndex::PLACE_COST`: a compressed index locates each place at many times a suffix
/// array's cost).
fn check_locatable(places: u64, place_cost: u64, max_places: u64) -> Result<()> {
    let limit = max_places / place_cost;
    match places <= limit {
        true => Ok(()),
        false => Err(IndexError::Unsupported(format!(
            "this search would visit {places} places, and a compressed index locates each at \
             {place_cost} times a suffix array's cost, so it visits at most {limit} (the limit of \
             {max_places} places / {place_cost}): search the suffix-array index, or use rarer \
             n-grams"
        ))),
    }
}

/// What document search reads of one part. Places are where matches start, in the part's own
/// unit (a suffix array's byte offsets, a compressed index's token offsets); documents are the
/// part's own, counted from 0.
pub(crate) trait DocumentPart {
    fn doc_cnt(&self) -> u64;
    /// Where the matches at `ranks` of an n-gram `len` tokens long start, appended to `places`
    /// (asked together: a compressed index walks to them side by side).
    fn places_of(&self, ranks: &[u64], len: usize, places: &mut Vec<u64>);
    /// The document holding a place.
    fn doc_of(&self, place: u64) -> u64;
    /// One past the document's last place.
    fn doc_end(&self, doc: u64) -> u64;
    /// The document's length in tokens, and the token offset of a place inside it.
    fn doc_len_and_offset(&self, doc: u64, place: u64) -> (u64, u64);
    /// The document's tokens `from..to` (token offsets inside it); stops when interrupted.
    fn doc_tokens(&self, doc: u64, from: u64, to: u64) -> Result<Vec<u32>>;
    fn metadata(&self, doc: u64) -> Option<String>;
}

/// What document search reads of an index: its parts and every n-gram's rank range in each.
/// Suffix arrays and compressed indexes both answer it, so one search serves both.
pub(crate) trait DocumentIndex {
    type Part: DocumentPart;
    /// What locating one place costs against a suffix array's pointer read, as measured by
    /// `cargo bench --bench compressed`: it divides the places a search may visit.
    const PLACE_COST: u64;
    /// Whether a clause with too many matches can be subsampled as the reference subsamples it:
    /// every stride-th rank of the suffix array's order.
    const SUFFIX_ORDER: bool;
    fn doc_parts(&self) -> &[Self::Part];
    /// Refuses ids outside the vocabulary.
    fn check_ngram(&self, ids: &[u32]) -> Result<()>;
    /// The n-gram's rank range in every part.
    fn ngram_ranges(&self, ids: &[u32]) -> Vec<RankRange>;
    fn doc_tokenizer(&self) -> Option<&Tokenizer>;
}

/// A place in the corpus: part and place inside it.
type Place = (usize, u64);

/// A document: part and local index.
type DocKey = (usize, u64);

/// What a clause has in one document: its first place there, and how many places were visited.
#[derive(Debug, Clone, Copy)]
struct Seen {
    first: Place,
    places: u64,
}

/// The documents a clause matches, in index order.
type ClauseDocs = BTreeMap<DocKey, Seen>;

/// Each n-gram of a clause: its length and its rank range in every part.
type Located = Vec<(usize, Vec<RankRange>)>;

/// Places found between two checks for an interrupt.
const CHECK_EVERY: u64 = 1024;

/// Documents satisfying a CNF (see [`Corpus::search_docs_cnf`](crate::index::corpus::Corpus::search_docs_cnf)).
pub(crate) fn search_docs_cnf<I: DocumentIndex>(
    index: &I,
    cnf: &[Vec<Vec<u32>>],
    opts: SearchOptions,
) -> Result<SearchResult> {
    check_cnf(index, cnf, opts.max_clauses)?;
    if opts.max_clause_freq == 0 {
        return Err(IndexError::Invalid(
            "max_clause_freq must be a positive integer".into(),
        ));
    }
    // Every n-gram is located first: the counts bound the work before any place is visited.
    let located = locate_cnf(index, cnf);
    let totals: Vec<u64> = located.iter().map(matches_of).collect();
    let strides = search_strides(&totals, I::PLACE_COST, opts)?;
    check_strides::<I>(
        &strides,
        &format!(
            "a clause matches more than max_clause_freq {} places",
            opts.max_clause_freq
        ),
    )?;
    let found = visit_cnf(index, &located, &strides, opts.maxnum, opts.max_disp_len)?;
    Ok(found.result(&totals, &strides))
}

/// Refuses strides over 1 where `I` cannot visit every stride-th match as the reference does
/// (`why` says which clause needs them).
fn check_strides<I: DocumentIndex>(strides: &[u64], why: &str) -> Result<()> {
    match I::SUFFIX_ORDER || strides.iter().all(|&s| s <= 1) {
        true => Ok(()),
        false => Err(IndexError::Unsupported(format!(
            "{why}, and the reference subsamples it in the suffix array's order, which a \
             compressed index does not keep: search the suffix-array index, or use rarer n-grams"
        ))),
    }
}

/// What `index` holds of a search whose strides were chosen from the counts of several indexes
/// (a shard server's part of a router's search). The work is bounded as in
/// [`search_docs_cnf`]: the places the strides visit may not exceed `max_places`.
pub(crate) fn search_strided<I: DocumentIndex>(
    index: &I,
    cnf: &[Vec<Vec<u32>>],
    strides: &[u64],
    opts: SearchOptions,
) -> Result<PartialSearch> {
    check_cnf(index, cnf, opts.max_clauses)?;
    if strides.len() != cnf.len() || strides.contains(&0) {
        return Err(IndexError::Invalid(
            "a strided search needs one positive stride per clause".into(),
        ));
    }
    check_strides::<I>(strides, "the router subsamples a clause of this search")?;
    let located = locate_cnf(index, cnf);
    let places = located
        .iter()
        .zip(strides)
        .map(|(clause, &stride)| matches_of(clause).div_ceil(stride))
        .fold(0u64, u64::saturating_add);
    if places > opts.max_places {
        return Err(IndexError::Invalid(format!(
            "this search would visit {places} places here, beyond the limit of {}",
            opts.max_places
        )));
    }
    check_locatable(places, I::PLACE_COST, opts.max_places)?;
    visit_cnf(index, &located, strides, opts.maxnum, opts.max_disp_len)
}

/// Matches of a clause: of all its n-grams.
fn matches_of(clause: &Located) -> u64 {
    clause
        .iter()
        .flat_map(|(_, ranges)| ranges)
        .map(RankRange::len)
        .sum()
}

fn check_cnf<I: DocumentIndex>(index: &I, cnf: &[Vec<Vec<u32>>], max_clauses: usize) -> Result<()> {
    check_cnf_shape(cnf, max_clauses)?;
    for ngram in cnf.iter().flatten() {
        index.check_ngram(ngram)?;
    }
    Ok(())
}

fn locate_cnf<I: DocumentIndex>(index: &I, cnf: &[Vec<Vec<u32>>]) -> Vec<Located> {
    cnf.iter()
        .map(|clause| {
            clause
                .iter()
                .map(|ngram| (ngram.len(), index.ngram_ranges(ngram)))
                .collect()
        })
        .collect()
}

/// The documents matching every clause, visiting every `strides[c]`-th match of clause c.
fn visit_cnf<I: DocumentIndex>(
    index: &I,
    located: &[Located],
    strides: &[u64],
    maxnum: usize,
    max_disp_len: usize,
) -> Result<PartialSearch> {
    let clauses = located
        .iter()
        .zip(strides)
        .map(|(clause, &stride)| clause_documents(index.doc_parts(), clause, stride))
        .collect::<Result<Vec<ClauseDocs>>>()?;
    let (first, rest) = clauses
        .split_first()
        .ok_or_else(|| IndexError::Invalid("empty CNF".into()))?;
    let matching: Vec<(&DocKey, &Seen)> = first
        .iter()
        .filter(|(doc, _)| rest.iter().all(|c| c.contains_key(doc)))
        .collect();
    let clause_places = clauses
        .iter()
        .map(|c| {
            matching
                .iter()
                .filter_map(|(doc, _)| c.get(doc))
                .map(|seen| seen.places)
                .sum()
        })
        .collect();
    let documents = matching
        .iter()
        .take(maxnum)
        .map(|&(&(s, d), seen)| document(index, s, d, seen.first.1, max_disp_len))
        .collect::<Result<_>>()?;
    Ok(PartialSearch {
        doc_cnt: matching.len() as u64,
        clause_places,
        documents,
    })
}

/// Documents matched by any n-gram of a clause, visiting every `stride`-th place of each range.
/// The places of a range are sorted first: then each document's places lie side by side, and one
/// search per document (not per place) finds where they end (measured in eval/ENGINE.md).
fn clause_documents<S: DocumentPart>(
    parts: &[S],
    clause: &Located,
    stride: u64,
) -> Result<ClauseDocs> {
    let mut docs = ClauseDocs::new();
    let (mut batch, mut places) = (Vec::new(), Vec::new());
    for (len, ranges) in clause {
        for (s, (part, range)) in parts.iter().zip(ranges).enumerate() {
            places.clear();
            let mut ranks = (range.lo..range.hi).step_by(stride as usize);
            loop {
                batch.clear();
                batch.extend(ranks.by_ref().take(CHECK_EVERY as usize));
                if batch.is_empty() {
                    break;
                }
                if crate::interrupt::interrupted() {
                    return Err(IndexError::Interrupted);
                }
                part.places_of(&batch, *len, &mut places);
            }
            places.sort_unstable();
            let mut rest = &places[..];
            while let Some(&first) = rest.first() {
                let doc = part.doc_of(first);
                let end = part.doc_end(doc);
                let here = rest.partition_point(|&p| p < end).max(1) as u64;
                docs.entry((s, doc))
                    .and_modify(|seen| {
                        seen.first = seen.first.min((s, first));
                        seen.places += here;
                    })
                    .or_insert(Seen {
                        first: (s, first),
                        places: here,
                    });
                rest = &rest[here as usize..];
            }
        }
    }
    Ok(docs)
}

fn doc_ix_base<I: DocumentIndex>(index: &I, part: usize) -> u64 {
    index.doc_parts()[..part]
        .iter()
        .map(DocumentPart::doc_cnt)
        .sum()
}

/// Document `doc` of part `s`: at most `max_disp_len` of its tokens, around the place `needle`.
fn document<I: DocumentIndex>(
    index: &I,
    s: usize,
    doc: u64,
    needle: u64,
    max_disp_len: usize,
) -> Result<Document> {
    let part = &index.doc_parts()[s];
    let (doc_len, needle_tok) = part.doc_len_and_offset(doc, needle);
    let needle_tok = needle_tok.min(doc_len);
    let disp_len = doc_len.min(max_disp_len as u64);
    // A window of disp_len tokens that shows the needle with context on both sides.
    let from_tok = needle_tok
        .saturating_sub(disp_len / 2)
        .min(doc_len - disp_len);
    let token_ids = part.doc_tokens(doc, from_tok, from_tok + disp_len)?;
    let text = index
        .doc_tokenizer()
        .and_then(|t| t.decode(&token_ids).ok());
    Ok(Document {
        doc_ix: doc_ix_base(index, s) + doc,
        doc_len,
        disp_len,
        needle_offset: needle_tok - from_tok,
        metadata: part.metadata(doc),
        token_ids,
        text,
    })
}

/// Document `doc_ix` (over all parts) in full, with metadata and text.
pub(crate) fn get_document<I: DocumentIndex>(index: &I, doc_ix: u64) -> Result<Document> {
    let mut local = doc_ix;
    for (s, part) in index.doc_parts().iter().enumerate() {
        if local < part.doc_cnt() {
            return document(index, s, local, 0, usize::MAX);
        }
        local -= part.doc_cnt();
    }
    let total: u64 = index.doc_parts().iter().map(DocumentPart::doc_cnt).sum();
    Err(IndexError::Invalid(format!(
        "document {doc_ix} does not exist (the index has {total})"
    )))
}

impl DocumentPart for Part {
    fn doc_cnt(&self) -> u64 {
        Part::doc_cnt(self)
    }
    fn places_of(&self, ranks: &[u64], _len: usize, places: &mut Vec<u64>) {
        places.extend(ranks.iter().map(|&rank| self.ptr(rank)));
    }
    fn doc_of(&self, place: u64) -> u64 {
        Part::doc_of(self, place)
    }
    fn doc_end(&self, doc: u64) -> u64 {
        Part::doc_end(self, doc)
    }
    fn doc_len_and_offset(&self, doc: u64, place: u64) -> (u64, u64) {
        // The document's first token follows its separator.
        let w = self.width().bytes() as u64;
        let start = self.doc_start(doc) + w;
        (
            self.doc_end(doc).saturating_sub(start) / w,
            place.saturating_sub(start) / w,
        )
    }
    fn doc_tokens(&self, doc: u64, from: u64, to: u64) -> Result<Vec<u32>> {
        let w = self.width().bytes() as u64;
        let start = self.doc_start(doc) + w;
        Ok(self.tokens_between(start + from * w, start + to * w))
    }
    fn metadata(&self, doc: u64) -> Option<String> {
        Part::metadata(self, doc)
    }
}

impl DocumentIndex for Index {
    type Part = Part;
    const PLACE_COST: u64 = 1;
    const SUFFIX_ORDER: bool = true;
    fn doc_parts(&self) -> &[Part] {
        &self.parts
    }
    fn check_ngram(&self, ids: &[u32]) -> Result<()> {
        self.check_ids(ids)
    }
    fn ngram_ranges(&self, ids: &[u32]) -> Vec<RankRange> {
        self.locate(self.encode(ids)).ranges
    }
    fn doc_tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer()
    }
}

impl Index {
    /// Documents containing `ids` anywhere.
    pub fn search_docs(&self, ids: &[u32], opts: SearchOptions) -> Result<SearchResult> {
        search_docs_cnf(self, &[vec![ids.to_vec()]], opts)
    }

    /// Every document's tokens, in order (what compaction reads back to merge live runs).
    pub fn documents(&self) -> impl Iterator<Item = Vec<u32>> + '_ {
        let w = self.width().bytes() as u64;
        self.parts.iter().flat_map(move |part| {
            (0..part.doc_cnt())
                .map(move |doc| part.tokens_between(part.doc_start(doc) + w, part.doc_end(doc)))
        })
    }
}
