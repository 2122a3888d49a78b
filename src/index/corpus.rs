//! The one face of every kind of index in this process: a corpus a context can be matched against.
//! A suffix array and a compressed FM-index, over tokens or bytes, answer the same questions
//! through it, so the query protocol, the server's engine calls and the command line are written
//! once. What a kind cannot answer is refused by a provided method with the reason and the kind
//! that can ([`IndexError::Unsupported`]).

use std::path::Path;
use std::sync::Arc;

use crate::index::dense::TokenScore;
use crate::index::docs::{Document, SearchOptions, SearchResult};
use crate::index::fm::CompressedIndex;
use crate::index::query::{FindResult, InfgramNtdResult, InfgramProbResult, NtdResult, ProbResult};
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
    fn num_shards(&self) -> usize;
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

    /// Whether it holds UTF-8 bytes (built with `--bytes`).
    fn is_byte_level(&self) -> bool {
        self.tokenizer().is_some_and(Tokenizer::is_utf8_bytes)
    }

    /// The suffix-array index itself, when this is one.
    fn as_suffix_array(&self) -> Option<&Index> {
        None
    }

    /// The suffix-array index, for what only it answers: training hints
    /// ([`crate::index::hints`]) sample occurrences in its rank order, and back-off generation
    /// ([`crate::index::backoff`]) keeps its levels as its ranges. Another kind refuses, naming
    /// `what` was asked and the index to use instead.
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

/// Forwards the answers every kind gives natively to the kind's own methods.
macro_rules! native_answers {
    () => {
        fn dir(&self) -> &Path {
            Self::dir(self)
        }
        fn width(&self) -> TokenWidth {
            Self::width(self)
        }
        fn num_shards(&self) -> usize {
            Self::num_shards(self)
        }
        fn total_tokens(&self) -> u64 {
            Self::total_tokens(self)
        }
        fn total_documents(&self) -> u64 {
            Self::total_documents(self)
        }
        fn vocab_size(&self) -> u64 {
            Self::vocab_size(self)
        }
        fn eos_token_id(&self) -> u32 {
            Self::eos_token_id(self)
        }
        fn tokenizer(&self) -> Option<&Tokenizer> {
            Self::tokenizer(self)
        }
        fn check_ids(&self, ids: &[u32]) -> Result<()> {
            Self::check_ids(self, ids)
        }
        fn count(&self, ids: &[u32]) -> Result<u64> {
            Self::count(self, ids)
        }
        fn find(&self, ids: &[u32]) -> Result<FindResult> {
            Self::find(self, ids)
        }
        fn prob(&self, prompt: &[u32], cont: u32) -> Result<ProbResult> {
            Self::prob(self, prompt, cont)
        }
        fn ntd(&self, prompt: &[u32], max_support: Option<u64>) -> Result<NtdResult> {
            Self::ntd(self, prompt, max_support)
        }
        fn infgram_prob(&self, prompt: &[u32], cont: u32) -> Result<InfgramProbResult> {
            Self::infgram_prob(self, prompt, cont)
        }
        fn infgram_ntd(
            &self,
            prompt: &[u32],
            max_support: Option<u64>,
        ) -> Result<InfgramNtdResult> {
            Self::infgram_ntd(self, prompt, max_support)
        }
        fn score(&self, ids: &[u32]) -> Result<Vec<TokenScore>> {
            Self::score(self, ids)
        }
        fn search_docs_cnf(
            &self,
            cnf: &[Vec<Vec<u32>>],
            opts: SearchOptions,
        ) -> Result<SearchResult> {
            Self::search_docs_cnf(self, cnf, opts)
        }
        fn get_document(&self, doc_ix: u64) -> Result<Document> {
            Self::get_document(self, doc_ix)
        }
        fn trace(&self, ids: &[u32], opts: TraceOptions) -> Result<Vec<TraceSpan>> {
            trace::trace(self, ids, opts)
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
