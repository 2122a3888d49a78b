//! Target `compressed_file`: the input is the body of a compressed index's part file (`fm.0`),
//! whose checksum is appended here so that mutations reach the parts behind it; the file is
//! opened and, when it opens, asked every kind of query, for every document and for what
//! follows a match.

use std::path::{Path, PathBuf};

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::docs::SearchOptions;
use infini_sidecar::index::fm::file::with_checksum;
use infini_sidecar::index::fm::suffix::FmSuffixMatch;
use infini_sidecar::index::fm::{part_file, CompressedIndex};
use infini_sidecar::index::{Index, TokenWidth};

use super::tiny;

pub struct Fixture {
    /// Refilled for every input.
    scratch: PathBuf,
}

impl Fixture {
    /// Works in `dir`, which must outlive the fixture.
    pub fn new(dir: &Path) -> Self {
        let scratch = dir.join("compressed-file");
        std::fs::create_dir_all(&scratch).unwrap();
        Fixture { scratch }
    }

    pub fn run(&self, input: &[u8]) {
        let bytes = with_checksum(input[..input.len() / 8 * 8].to_vec());
        std::fs::write(part_file(&self.scratch, 0), bytes).unwrap();
        if let Ok(index) = CompressedIndex::open(&self.scratch) {
            query_everything(&index);
        }
    }
}

/// Every query kind, with n-grams from the first document (so they mostly occur), every
/// document (and one past the last), the match of that document and what follows it.
fn query_everything(index: &CompressedIndex) {
    let doc = index
        .get_document(0)
        .map(|d| d.token_ids)
        .unwrap_or_default();
    let probe = &doc[..doc.len().min(3)];
    let eos = index.eos_token_id();
    let _ = index.count(probe);
    let _ = index.count(&[]);
    let _ = index.find(probe);
    let _ = index.prob(probe, eos);
    let _ = index.prob(&[], eos);
    for support in [None, Some(2)] {
        let _ = index.ntd(probe, support);
        let _ = index.ntd(&[], support);
        let _ = index.infgram_ntd(&doc, support);
    }
    let _ = index.infgram_prob(&doc, eos);
    let _ = index.score(&doc);
    if let Ok(places) = index.positions(probe, 64) {
        places.into_iter().for_each(|p| {
            index.place(p);
        });
    }
    let _ = index.positions(&[], 8);
    let opts = SearchOptions {
        maxnum: 8,
        max_disp_len: 16,
        ..SearchOptions::default()
    };
    let gram = match probe {
        [] => vec![eos],
        some => some.to_vec(),
    };
    let _ = index.search_docs_cnf(&[vec![gram.clone()]], opts);
    let _ = index.search_docs_cnf(&[vec![gram], vec![vec![eos]]], opts);
    for d in 0..=index.total_documents().min(64) {
        let _ = index.get_document(d);
    }
    if let Ok(mut followed) = FmSuffixMatch::of(index, &doc) {
        let _ = followed.continuations(index, 8, 4);
        let _ = followed.infgram_ntd(index, Some(2));
        followed.truncate(index, &doc[..doc.len() / 2]);
        let _ = followed.continuations(index, 8, 0);
    }
    let _ = index.info();
}

/// Compressed files of tiny one-part indexes of every width.
pub fn seeds(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let tokenizer = tiny::tokenizer(dir);
    let seed = |name: &'static str, width, eos, vocab, alphabet: &[u32], with_tokenizer: bool| {
        let spec = tiny::Spec {
            width,
            eos,
            vocab,
            tokenizer: with_tokenizer.then_some(&tokenizer),
            docs: tiny::documents(6, alphabet),
            part_tokens: 1000,
        };
        let path = tiny::build_index(dir, name, &spec);
        let index = Index::open(&path, &Default::default()).unwrap();
        let out = dir.join(format!("{name}-compressed"));
        CompressedIndex::build(
            &index,
            &out,
            (infini_sidecar::index::fm::DEFAULT_SAMPLE_EVERY, 1),
            |_| {},
        )
        .unwrap();
        let mut bytes = std::fs::read(part_file(&out, 0)).unwrap();
        bytes.truncate(bytes.len() - 8);
        (name, bytes)
    };
    vec![
        seed(
            "fm-u16",
            TokenWidth::U16,
            tiny::EOS,
            tiny::VOCAB,
            &tiny::WORDS,
            true,
        ),
        seed("fm-u8", TokenWidth::U8, 0, 250, &[1, 2, 3, 249], false),
        seed(
            "fm-u32",
            TokenWidth::U32,
            7,
            100_000,
            &[65_535, 70_000, 99_999, 5],
            false,
        ),
    ]
}
