//! Corrupt or mismatched indexes are refused at open time with a message that names the problem,
//! and the SmolLM2 tokenizer (rebuilt from GGUF metadata) round-trips real text exactly.

use crate::common;

use std::path::Path;

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::format::NextTableSpec;
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};

/// A small index of several parts, with a next-token table of its prompts seen 3 times or more when
/// asked (a table notices changed tokens under its prompts at open).
fn small_index(dir: &Path, with_table: bool) -> std::path::PathBuf {
    let out = dir.join("idx");
    let docs = (0..5u32).map(|i| {
        Ok(InputDoc {
            content: Content::Tokens((0..50).map(|j| (i * j) % 17 + 1).collect()),
            metadata: None,
            input_bytes: 0,
        })
    });
    let opts = BuildOptions {
        max_part_tokens: Some(120),
        next_table: with_table.then(|| NextTableSpec {
            min_count: 3,
            ..NextTableSpec::default()
        }),
        ..BuildOptions::new(out.clone(), TokenWidth::U16, 0, 100)
    };
    build(docs, &opts).unwrap();
    out
}

fn open_err(dir: &Path, opts: &OpenOptions) -> String {
    match Index::open(dir, opts) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_table_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path(), true);
    let table = idx.join("table.1");
    let len = std::fs::metadata(&table).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&table)
        .unwrap()
        .set_len(len - 2)
        .unwrap();
    let err = open_err(&idx, &OpenOptions::default());
    assert!(err.contains("table.1") && err.contains("manifest"), "{err}");
    // Without the manifest the sizes still have to agree with each other.
    std::fs::remove_file(idx.join(infini_sidecar::index::format::MANIFEST_FILE)).unwrap();
    let err = open_err(
        &idx,
        &OpenOptions {
            eos_token_id: Some(0),
            ..OpenOptions::default()
        },
    );
    assert!(err.contains("pointers"), "{err}");
}

/// A next-token table whose counts no longer add up to its ranges is refused at open, though its size
/// still matches the manifest: ntd would otherwise answer from it.
#[test]
fn next_token_table_that_does_not_add_up_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = small_index(tmp.path(), true);
    let index = Index::open(&out, &OpenOptions::default()).unwrap();
    assert!(index.info().next_token_table_prompts > 0);
    drop(index);
    let path = out.join("nexttok.0");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1; // the high byte of the last pair's count
    bytes[last] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let err = open_err(&out, &OpenOptions::default());
    assert!(err.contains("nexttok.0") && err.contains("add up"), "{err}");

    // A table whose counts add up but whose prompts are no longer where it says (a changed token):
    // refused too, where without a table only `verify` would notice.
    let out = small_index(&tmp.path().join("second"), true);
    let path = out.join("tokenized.0");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let err = open_err(&out, &OpenOptions::default());
    assert!(err.contains("range of a prompt"), "{err}");
}

#[test]
fn flipped_byte_is_caught_by_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path(), false);
    let path = idx.join("tokenized.0");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    assert!(
        Index::open(&idx, &OpenOptions::default()).is_ok(),
        "sizes are intact, a plain open succeeds"
    );
    let err = open_err(
        &idx,
        &OpenOptions {
            verify_checksums: true,
            ..OpenOptions::default()
        },
    );
    assert!(err.contains("checksum"), "{err}");
}

#[test]
fn mismatches_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path(), true);
    let err = open_err(
        &idx,
        &OpenOptions {
            token_width: Some(TokenWidth::U32),
            ..OpenOptions::default()
        },
    );
    assert!(err.contains("token width"), "{err}");
    let err = open_err(
        &idx,
        &OpenOptions {
            eos_token_id: Some(3),
            ..OpenOptions::default()
        },
    );
    assert!(err.contains("eos"), "{err}");
    let err = open_err(
        &idx,
        &OpenOptions {
            tokenizer_fingerprint: Some("sha256:00".into()),
            ..OpenOptions::default()
        },
    );
    assert!(err.contains("no tokenizer"), "{err}");
    // A reference-style index opened with the wrong width: sizes cannot agree.
    std::fs::remove_file(idx.join(infini_sidecar::index::format::MANIFEST_FILE)).unwrap();
    let err = open_err(
        &idx,
        &OpenOptions {
            eos_token_id: Some(0),
            token_width: Some(TokenWidth::U32),
            ..OpenOptions::default()
        },
    );
    assert!(
        err.contains("corrupt") || err.contains("separator"),
        "{err}"
    );
    let err = open_err(&idx, &OpenOptions::default());
    assert!(err.contains("eos"), "{err}");
    let err = open_err(&tmp.path().join("nothing-here"), &OpenOptions::default());
    assert!(err.contains("no such"), "{err}");
}

#[test]
fn smollm2_tokenizer_round_trips_real_text_and_pairs_by_fingerprint() {
    let tokenizer = common::smollm2_tokenizer();
    assert_eq!(tokenizer.vocab_size(), 49152);
    assert_eq!(tokenizer.eos_token_id(), Some(0));
    // Digits are split one by one; no prefix space (ASSETS.md).
    assert_eq!(
        tokenizer.encode("Hello world").unwrap(),
        tokenizer
            .encode("Hello")
            .unwrap()
            .into_iter()
            .chain(tokenizer.encode(" world").unwrap())
            .collect::<Vec<_>>()
    );
    assert_eq!(tokenizer.encode("2024").unwrap().len(), 4);
    for doc in common::minipile_docs("test", 40) {
        let Content::Text(text) = doc.content else {
            unreachable!()
        };
        let ids = tokenizer.encode(&text).unwrap();
        assert_eq!(tokenizer.decode(&ids).unwrap(), text);
    }
    // An index built with it records its fingerprint; pairing with another tokenizer is refused.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("idx");
    let opts = BuildOptions {
        tokenizer: Some(&tokenizer),
        ..BuildOptions::new(out.clone(), TokenWidth::U16, 0, 49152)
    };
    build(
        common::minipile_docs("validation", 5).into_iter().map(Ok),
        &opts,
    )
    .unwrap();
    let paired = OpenOptions {
        tokenizer_fingerprint: Some(tokenizer.fingerprint().to_string()),
        ..OpenOptions::default()
    };
    let index = Index::open(&out, &paired).unwrap();
    let doc = index.get_document(0).unwrap();
    assert_eq!(
        doc.text.as_deref(),
        Some(tokenizer.decode(&doc.token_ids).unwrap().as_str())
    );
    let err = open_err(
        &out,
        &OpenOptions {
            tokenizer_fingerprint: Some("sha256:other".into()),
            ..OpenOptions::default()
        },
    );
    assert!(err.contains("tokenizer"), "{err}");
}

/// One shard of 20 documents with metadata, so offsets in the middle are not the first nor the last.
fn many_documents_index(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("many");
    let docs = (0..20u32).map(|i| {
        Ok(InputDoc {
            content: Content::Tokens((0..10).map(|j| (i + j) % 17 + 1).collect()),
            metadata: Some(format!("{{\"doc\":{i}}}")),
            input_bytes: 0,
        })
    });
    build(
        docs,
        &BuildOptions::new(out.clone(), TokenWidth::U16, 0, 100),
    )
    .unwrap();
    out
}

/// Overwrites entry `i` of a u64 offsets file, keeping its size (so the manifest's sizes still agree).
fn set_entry(path: &Path, i: usize, value: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[i * 8..i * 8 + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_corrupt_offset_anywhere_is_refused_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = many_documents_index(tmp.path());
    let ds_size = std::fs::metadata(idx.join("tokenized.0")).unwrap().len();
    let pristine = std::fs::read(idx.join("offset.0")).unwrap();
    // Far past the end (an abort on a 2 TB allocation once), just past the end (a panic once), odd
    // (inside a token), and out of order.
    for (i, value) in [(10, 1_000_000_000_000), (10, ds_size), (10, 221), (10, 2)] {
        std::fs::write(idx.join("offset.0"), &pristine).unwrap();
        set_entry(&idx.join("offset.0"), i, value);
        let err = open_err(&idx, &OpenOptions::default());
        assert!(
            err.contains("corrupt") && err.contains("offset.0") && err.contains(&value.to_string()),
            "{value}: {err}"
        );
    }
    std::fs::write(idx.join("offset.0"), &pristine).unwrap();
    let index = Index::open(&idx, &OpenOptions::default()).unwrap();
    assert_eq!(index.get_document(9).unwrap().doc_len, 10);
    drop(index);
    // Metadata offsets: none may pass the metadata file or go back.
    let mt_size = std::fs::metadata(idx.join("metadata.0")).unwrap().len();
    for value in [1_000_000_000_000, mt_size + 1, 1] {
        set_entry(&idx.join("metaoff.0"), 10, value);
        let err = open_err(&idx, &OpenOptions::default());
        assert!(err.contains("metaoff.0"), "{value}: {err}");
    }
}

#[test]
fn a_vocabulary_reaching_the_separator_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = || {
        std::iter::once(Ok(InputDoc {
            content: Content::Tokens(vec![1, 2, 3]),
            metadata: None,
            input_bytes: 0,
        }))
    };
    // 65536 ids of 16 bits: id 65535 would be the document separator.
    let opts = BuildOptions::new(tmp.path().join("wide"), TokenWidth::U16, 0, 65536);
    let err = build(docs(), &opts).unwrap_err().to_string();
    assert!(err.contains("separator"), "{err}");
    assert!(!tmp.path().join("wide").exists());
    // The largest vocabulary that fits, and then a manifest that claims one more.
    let idx = tmp.path().join("idx");
    build(
        docs(),
        &BuildOptions::new(idx.clone(), TokenWidth::U16, 0, 65535),
    )
    .unwrap();
    let manifest = idx.join(infini_sidecar::index::format::MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("\"vocab_size\": 65535", "\"vocab_size\": 65536"),
    )
    .unwrap();
    let err = open_err(&idx, &OpenOptions::default());
    assert!(err.contains("separator"), "{err}");
    // Without a manifest the caller's vocabulary is held to the same rule.
    std::fs::remove_file(&manifest).unwrap();
    let opts = OpenOptions {
        eos_token_id: Some(0),
        vocab_size: Some(65536),
        ..OpenOptions::default()
    };
    let err = open_err(&idx, &opts);
    assert!(err.contains("separator"), "{err}");
}

#[test]
fn a_part_cap_too_small_is_named_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = BuildOptions {
        max_part_tokens: Some(1),
        ..BuildOptions::new(tmp.path().join("idx"), TokenWidth::U16, 0, 100)
    };
    let docs = std::iter::once(Ok(InputDoc {
        content: Content::Tokens(vec![1, 2, 3]),
        metadata: None,
        input_bytes: 0,
    }));
    let err = build(docs, &opts).unwrap_err().to_string();
    assert!(
        err.contains("--max-part-tokens") && !err.contains("memory"),
        "{err}"
    );
    // A document larger than the cap names the cap too, not the memory budget.
    let opts = BuildOptions {
        max_part_tokens: Some(3),
        ..opts
    };
    let docs = std::iter::once(Ok(InputDoc {
        content: Content::Tokens(vec![1, 2, 3]),
        metadata: None,
        input_bytes: 0,
    }));
    let err = build(docs, &opts).unwrap_err().to_string();
    assert!(err.contains("raise --max-part-tokens"), "{err}");
}

#[test]
fn long_texts_encode_in_pieces_to_the_ids_of_the_whole() {
    let tokenizer = common::smollm2_tokenizer();
    let whole: tokenizers::Tokenizer = tokenizer.to_json().unwrap().parse().unwrap();
    // Real text with its newlines and runs of spaces, several pieces long.
    let text: String = common::minipile_docs("train", 400)
        .into_iter()
        .filter_map(|d| match d.content {
            Content::Text(t) => Some(t),
            Content::Tokens(_) => None,
        })
        .collect::<Vec<_>>()
        .join("\n\n  ");
    assert!(text.len() > 4 * infini_sidecar::tokenizer::PIECE_BYTES);
    let want = whole.encode_fast(text.as_str(), false).unwrap();
    assert!(tokenizer.encode(&text).unwrap() == want.get_ids());
}
