//! Target `index_files`: an index folder made from the input (part files mutated from a valid tiny
//! index, a manifest recomputed over them), opened with and without checksums and, when it opens,
//! asked every kind of query and for every document.
//!
//! Input layout, all integers little-endian:
//! - `flags: u8` (see the `NO_*` and `VERIFY` constants), `width: u8` (1, 2 or 4 bytes: `% 3` picks),
//!   `eos: u32`, `vocab: u32`;
//! - then up to `MAX_PARTS` parts, each five files in `PartPaths::all` order (tokenized, table,
//!   offset, metadata, metaoff), each `len: u16` and `len` bytes; a short input gives short files;
//! - then, if bytes are left, each part's next-token table (`nexttok.N`) the same way. (It comes last
//!   so that inputs written before the table existed still mean the same index, unless they held
//!   bytes past their parts, which now become tables.)
//!
//! The manifest records the written files' sizes and checksums and the counts the files imply, so
//! open gets past its size checks to the content; the flags take parts of it away.

use std::path::{Path, PathBuf};

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::docs::SearchOptions;
use infini_sidecar::index::format::{
    FileRecord, Manifest, PartPaths, PartRecord, TokenizerRecord, FORMAT_NAME, FORMAT_VERSION,
    MANIFEST_FILE, TOKENIZER_FILE,
};
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};

use super::tiny;

/// Open with `verify_checksums`.
const VERIFY: u8 = 1;
/// The manifest lists no `table.N` (an index that lost a record, issue 15 item 7).
const NO_TABLE_RECORD: u8 = 2;
/// No manifest: an index of the reference indexer, opened with the header's width, eos and vocab.
const NO_MANIFEST: u8 = 4;
const NO_TOKENIZER: u8 = 8;
/// No `metadata.N` and `metaoff.N` files.
const NO_METADATA: u8 = 16;

const HEADER_BYTES: usize = 10;
const MAX_PARTS: usize = 3;
const WIDTHS: [TokenWidth; 3] = [TokenWidth::U8, TokenWidth::U16, TokenWidth::U32];

pub struct Fixture {
    /// Refilled for every input.
    scratch: PathBuf,
    tokenizer_json: String,
    tokenizer_fingerprint: String,
}

/// An input taken apart.
struct Layout<'a> {
    flags: u8,
    width: TokenWidth,
    eos: u32,
    vocab: u64,
    /// Per part, its five files' bytes, then its next-token table if the input has one.
    parts: Vec<[&'a [u8]; 5]>,
    next_tables: Vec<&'a [u8]>,
}

/// Takes `n` bytes (fewer at the end of the input).
fn take<'a>(input: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, rest) = input.split_at(n.min(input.len()));
    *input = rest;
    head
}

/// Takes one file: `len: u16`, then `len` bytes.
fn take_file<'a>(input: &mut &'a [u8]) -> &'a [u8] {
    let len = take(input, 2);
    let len = u16::from_le_bytes([
        len.first().copied().unwrap_or(0),
        len.get(1).copied().unwrap_or(0),
    ]);
    take(input, len as usize)
}

fn parse(mut input: &[u8]) -> Option<Layout<'_>> {
    if input.len() < HEADER_BYTES {
        return None;
    }
    let header = take(&mut input, HEADER_BYTES);
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
    let mut parts = Vec::new();
    while !input.is_empty() && parts.len() < MAX_PARTS {
        let mut files: [&[u8]; 5] = [&[]; 5];
        for f in &mut files {
            *f = take_file(&mut input);
        }
        parts.push(files);
    }
    let mut next_tables = Vec::new();
    while !input.is_empty() && next_tables.len() < parts.len() {
        next_tables.push(take_file(&mut input));
    }
    Some(Layout {
        flags: header[0],
        width: WIDTHS[header[1] as usize % WIDTHS.len()],
        eos: u32_at(2),
        vocab: u32_at(6) as u64,
        parts,
        next_tables,
    })
}

impl Fixture {
    /// Works in `dir`, which must outlive the fixture.
    pub fn new(dir: &Path) -> Self {
        let tokenizer = tiny::tokenizer(dir);
        let scratch = dir.join("index-files");
        std::fs::create_dir_all(&scratch).unwrap();
        Fixture {
            scratch,
            tokenizer_json: tiny::tokenizer_json(),
            tokenizer_fingerprint: tokenizer.fingerprint().to_string(),
        }
    }

    pub fn run(&self, input: &[u8]) {
        let Some(layout) = parse(input) else { return };
        self.write(&layout);
        for verify_checksums in [false, true] {
            if verify_checksums && layout.flags & VERIFY == 0 {
                continue;
            }
            let opts = OpenOptions {
                verify_checksums,
                ..if layout.flags & NO_MANIFEST != 0 {
                    OpenOptions {
                        token_width: Some(layout.width),
                        eos_token_id: Some(layout.eos),
                        vocab_size: Some(layout.vocab),
                        ..OpenOptions::default()
                    }
                } else {
                    OpenOptions::default()
                }
            };
            if let Ok(index) = Index::open(&self.scratch, &opts) {
                query_everything(&index, &layout);
            }
        }
    }

    /// Writes the input's index into the scratch folder, over the previous input's files (which
    /// keeps their inodes: creating and deleting files was most of the time of a run) and removing
    /// those this input lacks.
    fn write(&self, layout: &Layout) {
        let dir = &self.scratch;
        let mut records = Vec::new();
        for n in 0..MAX_PARTS {
            let paths = PartPaths::new(dir, n);
            let files = layout.parts.get(n);
            let mut written = Vec::new();
            for (i, path) in paths.all().into_iter().enumerate() {
                let is_metadata = *path == paths.metadata || *path == paths.metaoff;
                let bytes = match files {
                    Some(f) if i < f.len() => Some(f[i]),
                    Some(_) => layout.next_tables.get(n).copied(),
                    None => None,
                }
                .filter(|_| !(is_metadata && layout.flags & NO_METADATA != 0));
                put(path, bytes);
                if bytes.is_some() && !(*path == paths.table && layout.flags & NO_TABLE_RECORD != 0)
                {
                    written.push(FileRecord::of(path).unwrap());
                }
            }
            if let Some(files) = files {
                records.push(PartRecord {
                    documents: files[2].len() as u64 / 8,
                    tokens: files[0].len() as u64 / layout.width.bytes() as u64,
                    files: written,
                });
            }
        }
        let with_tokenizer = layout.flags & NO_TOKENIZER == 0;
        put(
            &dir.join(TOKENIZER_FILE),
            with_tokenizer.then_some(self.tokenizer_json.as_bytes()),
        );
        if layout.flags & NO_MANIFEST != 0 {
            put(&dir.join(MANIFEST_FILE), None);
            return;
        }
        let documents = records.iter().map(|r| r.documents).sum::<u64>();
        let manifest = Manifest {
            shard_set: None,
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            token_width: layout.width,
            eos_token_id: layout.eos,
            vocab_size: layout.vocab,
            tokenizer: with_tokenizer.then(|| TokenizerRecord {
                fingerprint: self.tokenizer_fingerprint.clone(),
                source: "fuzz".into(),
            }),
            documents,
            tokens: records
                .iter()
                .map(|r| r.tokens)
                .sum::<u64>()
                .saturating_sub(documents),
            parts: records,
            built_by: "fuzz".into(),
            decontamination: None,
            next_token_table: None,
        };
        manifest.write(dir).unwrap();
    }
}

/// Writes `bytes` to `path`, or removes `path` when `None`.
fn put(path: &Path, bytes: Option<&[u8]>) {
    match bytes {
        Some(bytes) => std::fs::write(path, bytes).unwrap(),
        None => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{}: {e}", path.display()),
            _ => {}
        },
    }
}

/// Every query kind, with n-grams taken from the first document of the input's first part (so
/// they mostly occur), and every document (and one past the last) in full.
fn query_everything(index: &Index, layout: &Layout) {
    let w = index.width().bytes();
    let first_doc: Vec<u32> = layout.parts[0][0]
        .chunks_exact(w)
        .skip(1)
        .take(8)
        .map(|t| index.width().read(t, 0))
        .take_while(|&t| t != index.width().separator())
        .collect();
    let probe = &first_doc[..first_doc.len().min(3)];
    let eos = index.eos_token_id();
    let _ = index.count(probe);
    let _ = index.count(&[]);
    let _ = index.find(probe);
    let _ = index.prob(probe, eos);
    let _ = index.ntd(probe, None);
    let _ = index.ntd(&[], Some(2));
    let _ = index.infgram_prob(probe, eos);
    let _ = index.infgram_ntd(&first_doc, None);
    let sampled = SearchOptions {
        maxnum: 4,
        max_disp_len: 3,
        max_clause_freq: 2,
        ..SearchOptions::default()
    };
    let _ = index.score(&first_doc);
    let _ = index.verify_documents();
    let _ = index.search_docs(probe, sampled);
    let _ = index.search_docs_cnf(
        &[vec![probe.to_vec(), vec![eos]], vec![first_doc.clone()]],
        SearchOptions::default(),
    );
    for doc in 0..=index.total_documents() {
        let _ = index.get_document(doc);
    }
}

/// Whether every part's document offsets increase from 0 and stay on token boundaries inside it.
/// The files of the index at `dir` as an input of this target, with `flags` and `eos`/`vocab` as
/// the header's (they matter only under `NO_MANIFEST`).
pub fn serialize(dir: &Path, flags: u8, width: TokenWidth, eos: u32, vocab: u64) -> Vec<u8> {
    let mut out = vec![
        flags,
        WIDTHS.iter().position(|&x| x == width).unwrap() as u8,
    ];
    out.extend_from_slice(&eos.to_le_bytes());
    out.extend_from_slice(&(vocab as u32).to_le_bytes());
    let parts: Vec<PartPaths> = (0..)
        .map(|n| PartPaths::new(dir, n))
        .take_while(|paths| paths.tokenized.exists())
        .collect();
    let mut put_file = |path: &Path| {
        let bytes = std::fs::read(path).unwrap_or_default();
        out.extend_from_slice(&u16::try_from(bytes.len()).unwrap().to_le_bytes());
        out.extend_from_slice(&bytes);
    };
    for paths in &parts {
        let [tokenized, table, offset, metadata, metaoff, _] = paths.all();
        for path in [tokenized, table, offset, metadata, metaoff] {
            put_file(path);
        }
    }
    for paths in &parts {
        put_file(&paths.next_tokens);
    }
    out
}

/// Valid tiny indexes of every token width, built in `dir`: 16-bit ids with the tiny tokenizer,
/// 8-bit and 32-bit ones (ids above 65535) without, and one without its manifest.
pub fn seeds(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let tokenizer = tiny::tokenizer(dir);
    let seed = |name, flags: u8, width, eos, vocab, alphabet: &[u32]| {
        let spec = tiny::Spec {
            width,
            eos,
            vocab,
            tokenizer: (flags & NO_TOKENIZER == 0).then_some(&tokenizer),
            docs: tiny::documents(6, alphabet),
            part_tokens: 20,
        };
        let path = tiny::build_index(dir, name, &spec);
        (name, serialize(&path, flags, width, eos, vocab))
    };
    vec![
        seed(
            "u16-tokenizer",
            VERIFY,
            TokenWidth::U16,
            tiny::EOS,
            tiny::VOCAB,
            &tiny::WORDS,
        ),
        seed("u8", NO_TOKENIZER, TokenWidth::U8, 0, 250, &[1, 2, 3, 249]),
        seed(
            "u32",
            NO_TOKENIZER | NO_METADATA | VERIFY,
            TokenWidth::U32,
            7,
            100_000,
            &[65_535, 70_000, 99_999, 5],
        ),
        seed(
            "reference",
            NO_MANIFEST | NO_TOKENIZER,
            TokenWidth::U16,
            3,
            400,
            &[1, 2, 3, 399],
        ),
    ]
}
