//! The one face of every kind of index in this process: a corpus a context can be matched against.
//! A suffix array and a compressed FM-index, over tokens or bytes, answer the same questions
//! through it, so the query protocol, the server's engine calls and the command line are written
//! once. What a kind cannot answer is refused by a provided method with the reason and the kind
//! that can ([`IndexError::Unsupported`]).

use std::path::Path;
use std::sync::Arc;

use crate::index::backoff::{self, Backoff, BackoffGeneration, Draw};
use crate::index::dense::{self, TokenScore};
use crate::index::docs::{Document, SearchOptions, SearchResult};
use crate::index::fm::CompressedIndex;
use crate::index::query::{FindResult, InfgramNtdResult, InfgramProbResult, NtdResult, ProbResult};
use crate::index::suffix;
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

/// What every index kind answers, and the shape it reports.
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
    /// array's; their lengths agree).
    fn find(&self, ids: &[u32]) -> Result<FindResult>;
    fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult>;
    fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult>;
    fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<InfgramProbResult>;
    fn infgram_ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<InfgramNtdResult>;
    /// The dense score of every token of `ids` given all before it.
    fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>>;
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
    fn as_suffix_array(&self) -> Option<&Index> {
        None
    }

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
    fn warm_up(&self) -> u64 {
        0
    }
}

/// Forwards each listed method to the kind's own method of that name.
macro_rules! forward {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $name(&self $(, $arg: $ty)*) -> $ret {
            Self::$name(self $(, $arg)*)
        })*
    };
}

/// The answers every kind gives: natively by the kind's own methods, or by what is written once
/// over what following a match asks of it ([`suffix::Occurrences`]).
macro_rules! native_answers {
    () => {
        forward! {
            dir() -> &Path;
            width() -> TokenWidth;
            num_parts() -> usize;
            total_tokens() -> u64;
            total_documents() -> u64;
            vocab_size() -> u64;
            eos_token_id() -> u32;
            tokenizer() -> Option<&Tokenizer>;
            check_ids(ids: &[u32]) -> Result<()>;
            count(ids: &[u32]) -> Result<u64>;
            find(ids: &[u32]) -> Result<FindResult>;
            prob(prompt: &[u32], cont: u32) -> Result<ProbResult>;
            ntd(prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult>;
            search_docs_cnf(cnf: &[Vec<Vec<u32>>], opts: SearchOptions) -> Result<SearchResult>;
            get_document(doc_ix: u64) -> Result<Document>;
        }
        fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<InfgramProbResult> {
            suffix::infgram_prob(self, prompt, cont)
        }
        fn infgram_ntd(
            &self,
            prompt: &[u32],
            max_support: Option<u64>,
        ) -> Result<InfgramNtdResult> {
            suffix::infgram_ntd(self, prompt, max_support)
        }
        fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
            dense::score(self, ids)
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
    };
}

impl Corpus for Index {
    native_answers!();

    fn as_suffix_array(&self) -> Option<&Index> {
        Some(self)
    }
    fn warm_up(&self) -> u64 {
        Index::warm_up(self)
    }
}

impl Corpus for CompressedIndex {
    native_answers!();
}
