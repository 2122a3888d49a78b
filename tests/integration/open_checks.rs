//! Corrupt or mismatched indexes are refused at open time with a message that names the problem,
//! and the SmolLM2 tokenizer (rebuilt from GGUF metadata) round-trips real text exactly.

use crate::common;

use std::path::Path;

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};

fn small_index(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("idx");
    let docs = (0..5u32).map(|i| {
        Ok(InputDoc {
            content: Content::Tokens((0..50).map(|j| (i * j) % 17 + 1).collect()),
            metadata: None,
            input_bytes: 0,
        })
    });
    let opts = BuildOptions {
        max_shard_tokens: Some(120),
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
    let idx = small_index(tmp.path());
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

#[test]
fn flipped_byte_is_caught_by_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = small_index(tmp.path());
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
    let idx = small_index(tmp.path());
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
