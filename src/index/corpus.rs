//! The one face of every kind of index in this process: a corpus a context can be matched against.
//! A suffix array and a compressed FM-index, over tokens or bytes, answer the same questions
//! through it, so the query protocol, the server's engine calls and the command line are written
//! once. What a kind cannot answer is refused by a provided method with the reason and the kind
//! that can ([`IndexError::Unsupported`]). A kind supplies only its shape and its matching
//! primitives (`IndexKind`); every answer is written once over them.

use std::path::Path;
use std::sync::Arc;

use crate::index::backoff::{self, Backoff, BackoffGeneration, Draw};
use crate::index::dense::{self, TokenScore};
use crate::index::docs::{self, Document, DocumentIndex, SearchOptions, SearchResult};
use crate::index::fm::CompressedIndex;
use crate::index::query::{FindResult, InfgramNtdResult, InfgramProbResult, NtdResult, ProbResult};
use crate::index::suffix::{self, Counted, Occurrences};
use crate::index::trace::{self, TraceOptions, TraceSpan};
use crate::index::{Index, IndexError, OpenOptions, Result, TokenWidth};
use crate::tokenizer::Tokenizer;

/// Opens the index in `dir`, of whichever kind it is. `opts` say what the caller expects of a
/// suffix-array index; a compressed one records all of it (its checksums are always verified).
pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Arc<dyn Corpus>> {
    Ok(match crate::index::fm::is_compressed(dir) {
        true => Arc::new(CompressedIndex::open(dir)?),
        false => Arc::new(Index::open(dir, opts)?),
    })
}

/// What every index kind answers, and the shape it reports: the one face of an index, implemented
/// once for every kind (over `IndexKind`).
pub trait Corpus: Send + Sync {
    fn dir(&self) -> &Path;
    fn width(&self) -> TokenWidth;
    fn num_parts(&self) -> usize;
    fn total_tokens(&self) -> u64;
    fn total_documents(&self) -> u64;
    fn vocab_size(&self) -> u64;
    fn eos_token_id(&self) -> u32;
    fn tokenizer(&self) -> Option<&Tokenizer>;

    /// Refuses ids outside the vocabulary and queries beyond the engine's length limit.
    fn check_ids(&self, ids: &[u32]) -> Result<()>;
    fn count(&self, ids: &[u32]) -> Result<u64>;
    /// Rank ranges are the index's own rows (a compressed index's differ from the suffix
    /// array's; their lengths agree, but for the empty query, whose ranges in a compressed index
    /// also hold each part's end).
    fn find(&self, ids: &[u32]) -> Result<FindResult>;
    fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult>;
    fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult>;
    fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<InfgramProbResult>;
    fn infgram_ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<InfgramNtdResult>;
    /// The dense score of every token of `ids` given all before it.
    fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>>;
    /// Documents satisfying a CNF. A clause with more than `max_clause_freq` matches is
    /// subsampled in the suffix array's order, which a compressed index does not keep: it refuses
    /// such a search instead.
    fn search_docs_cnf(&self, cnf: &[Vec<Vec<u32>>], opts: SearchOptions) -> Result<SearchResult>;
    fn get_document(&self, doc_ix: u64) -> Result<Document>;
    /// The maximal spans of `ids` that occur ([`crate::index::trace`]).
    fn trace(&self, ids: &[u32], opts: TraceOptions) -> Result<Vec<TraceSpan>>;
    /// The back-off model's probability of every token of `seq` ([`crate::index::backoff`]).
    fn backoff_score(&self, seq: &[u32], spec: &Backoff) -> Result<Vec<f64>>;
    /// Tokens drawn from the back-off model after `prompt` ([`crate::index::backoff`]).
    fn backoff_generate(
        &self,
        prompt: &[u32],
        spec: &Backoff,
        draw: Draw,
    ) -> Result<BackoffGeneration>;

    /// Whether it holds UTF-8 bytes (built with `--bytes`).
    fn is_byte_level(&self) -> bool {
        self.tokenizer().is_some_and(Tokenizer::is_utf8_bytes)
    }

    /// The suffix-array index itself, when this is one.
    fn as_suffix_array(&self) -> Option<&Index>;

    /// The suffix-array index, for what only it answers: training hints
    /// ([`crate::index::hints`]) sample occurrences in its rank order. Another kind refuses,
    /// naming `what` was asked and the index to use instead.
    fn suffix_array(&self, what: &str) -> Result<&Index> {
        self.as_suffix_array().ok_or_else(|| {
            IndexError::Unsupported(format!(
                "{what} needs a suffix-array index, and {} is a compressed one: use the index it \
                 was compressed from",
                self.dir().display()
            ))
        })
    }

    /// Touches every page, so the first queries are not slower than the rest; the bytes read.
    fn warm_up(&self) -> u64;
}

/// What a kind of index supplies itself: its shape, the matching primitives ([`Occurrences`]) and
/// where its n-grams' occurrences lie for document search ([`DocumentIndex`]). Every answer of
/// [`Corpus`] is written once over these, for every kind; a kind may answer `count` its own
/// faster way.
pub(crate) trait IndexKind: Occurrences + DocumentIndex + Send + Sync {
    fn dir(&self) -> &Path;
    fn width(&self) -> TokenWidth;
    fn num_parts(&self) -> usize;
    fn total_tokens(&self) -> u64;
    fn total_documents(&self) -> u64;

    fn count(&self, ids: &[u32]) -> Result<u64> {
        self.check_query(ids)?;
        Ok(self.matches_of(ids).count())
    }
    fn as_suffix_array(&self) -> Option<&Index> {
        None
    }
    fn warm_up(&self) -> u64 {
        0
    }
}

impl<K: IndexKind> Corpus for K {
    fn dir(&self) -> &Path {
        IndexKind::dir(self)
    }
    fn width(&self) -> TokenWidth {
        IndexKind::width(self)
    }
    fn num_parts(&self) -> usize {
        IndexKind::num_parts(self)
    }
    fn total_tokens(&self) -> u64 {
        IndexKind::total_tokens(self)
    }
    fn total_documents(&self) -> u64 {
        IndexKind::total_documents(self)
    }
    fn vocab_size(&self) -> u64 {
        Occurrences::vocab_size(self)
    }
    fn eos_token_id(&self) -> u32 {
        Occurrences::eos_token_id(self)
    }
    fn tokenizer(&self) -> Option<&Tokenizer> {
        self.doc_tokenizer()
    }
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        self.check_query(ids)
    }
    fn count(&self, ids: &[u32]) -> Result<u64> {
        IndexKind::count(self, ids)
    }
    fn find(&self, ids: &[u32]) -> Result<FindResult> {
        self.check_query(ids)?;
        let m = self.matches_of(ids);
        Ok(FindResult {
            cnt: m.count(),
            segment_by_shard: m.rank_ranges().iter().map(|r| (r.lo, r.hi)).collect(),
        })
    }
    fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
        self.check_query(prompt)?;
        self.check_query(&[cont])?;
        let m = self.matches_of(prompt);
        Ok(ProbResult::of_counts(m.count(), self.cont_count(&m, cont)))
    }
    fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult> {
        self.check_query(prompt)?;
        self.ntd_given(&self.matches_of(prompt), max_support)
    }
    fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<InfgramProbResult> {
        suffix::infgram_prob(self, prompt, cont)
    }
    fn infgram_ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<InfgramNtdResult> {
        suffix::infgram_ntd(self, prompt, max_support)
    }
    fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
        dense::score(self, ids)
    }
    fn search_docs_cnf(&self, cnf: &[Vec<Vec<u32>>], opts: SearchOptions) -> Result<SearchResult> {
        docs::search_docs_cnf(self, cnf, opts)
    }
    fn get_document(&self, doc_ix: u64) -> Result<Document> {
        docs::get_document(self, doc_ix)
    }
    fn trace(&self, ids: &[u32], opts: TraceOptions) -> Result<Vec<TraceSpan>> {
        trace::trace(self, ids, opts)
    }
    fn backoff_score(&self, seq: &[u32], spec: &Backoff) -> Result<Vec<f64>> {
        backoff::score(self, seq, spec)
    }
    fn backoff_generate(
        &self,
        prompt: &[u32],
        spec: &Backoff,
        draw: Draw,
    ) -> Result<BackoffGeneration> {
        backoff::generate(self, prompt, spec, draw)
    }
    fn as_suffix_array(&self) -> Option<&Index> {
        IndexKind::as_suffix_array(self)
    }
    fn warm_up(&self) -> u64 {
        IndexKind::warm_up(self)
    }
}

impl IndexKind for Index {
    fn dir(&self) -> &Path {
        Index::dir(self)
    }
    fn width(&self) -> TokenWidth {
        Index::width(self)
    }
    fn num_parts(&self) -> usize {
        Index::num_parts(self)
    }
    fn total_tokens(&self) -> u64 {
        Index::total_tokens(self)
    }
    fn total_documents(&self) -> u64 {
        Index::total_documents(self)
    }
    /// Short n-grams' counts are kept ([`Index::count`]).
    fn count(&self, ids: &[u32]) -> Result<u64> {
        Index::count(self, ids)
    }
    fn as_suffix_array(&self) -> Option<&Index> {
        Some(self)
    }
    fn warm_up(&self) -> u64 {
        Index::warm_up(self)
    }
}

impl IndexKind for CompressedIndex {
    fn dir(&self) -> &Path {
        CompressedIndex::dir(self)
    }
    fn width(&self) -> TokenWidth {
        CompressedIndex::width(self)
    }
    fn num_parts(&self) -> usize {
        CompressedIndex::num_parts(self)
    }
    fn total_tokens(&self) -> u64 {
        CompressedIndex::total_tokens(self)
    }
    fn total_documents(&self) -> u64 {
        CompressedIndex::total_documents(self)
    }
}
