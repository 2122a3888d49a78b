//! The compressed index on real text: mini-Pile documents in SmolLM2's tokens, compressed by the
//! command line, answering test-split queries as the suffix-array index does; `index info`
//! showing both sizes; a damaged file refused when it is opened; a sidecar serving it.

use std::process::Command;

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::fm::file::with_checksum;
use infini_sidecar::index::fm::{part_file, CompressedIndex};
use infini_sidecar::index::Index;
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb;

use crate::common;
use crate::common::server::{open_session, own_mix, scores, start, step, with_model};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
}

#[test]
fn compressed_minipile_answers_as_the_suffix_array_does() {
    let tmp = tempfile::tempdir().unwrap();
    let texts = common::minipile_texts("train", 60, "");
    let index = common::smollm2_index_of(tmp.path(), &texts);
    let out = tmp.path().join("fm");
    let run = bin()
        .args(["index", "compress", "--threads", "1", "--index"])
        .arg(index.dir())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let fm = CompressedIndex::open(&out).unwrap();

    // Queries from the test split: contexts the train text mostly lacks at full length.
    let tokenizer = common::smollm2_tokenizer();
    let test: Vec<Vec<u32>> = common::minipile_texts("test", 20, "")
        .iter()
        .map(|t| tokenizer.encode(t).unwrap())
        .collect();
    let mut checked_long = 0;
    for doc in &test {
        for at in (0..doc.len().saturating_sub(40)).step_by(97).take(12) {
            let context = &doc[at..at + 40];
            let want = index.infgram_ntd(context, None).unwrap();
            assert_eq!(fm.infgram_ntd(context, None).unwrap(), want, "{context:?}");
            checked_long += usize::from(want.suffix_len >= 3);
            let next = doc[at + 40];
            assert_eq!(
                fm.infgram_prob(context, next).unwrap(),
                index.infgram_prob(context, next).unwrap()
            );
            for n in [1, 2, 4] {
                let gram = &context[40 - n..];
                assert_eq!(fm.count(gram).unwrap(), index.count(gram).unwrap());
            }
        }
    }
    assert!(
        checked_long > 20,
        "too few long matches to mean anything: {checked_long}"
    );
    // Every document comes back whole, with its metadata.
    for d in (0..index.total_documents()).step_by(7) {
        assert_eq!(fm.get_document(d).unwrap(), index.get_document(d).unwrap());
    }

    // `index info` shows both sizes: its own files', and what the suffix-array index takes (a
    // corpus this small is all per-symbol overhead: the size targets are measured on mini-Pile).
    let info = bin()
        .args(["index", "info", "--json", "--index"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(info.status.success());
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let (fm_bpt, sa_bpt) = (
        info["bytes_per_token"].as_f64().unwrap(),
        info["suffix_array_bytes_per_token"].as_f64().unwrap(),
    );
    let files: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("fm."))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let tokens = index.total_tokens() as f64;
    assert!((fm_bpt - files as f64 / tokens).abs() < 1e-9, "{fm_bpt}");
    assert!(
        (sa_bpt - index.info().bytes_per_token).abs() < 1e-9,
        "{sa_bpt}"
    );
    assert_eq!(info["documents"], index.total_documents());

    // A damaged byte anywhere is caught at open time, with the file named.
    let path = part_file(&out, 0);
    let whole = std::fs::read(&path).unwrap();
    let mut bytes = whole.clone();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let err = CompressedIndex::open(&out).err().unwrap().to_string();
    assert!(err.contains("checksum") && err.contains("fm.0"), "{err}");
    // So is a file whose pieces disagree though its checksum is right: the part's token count
    // (the header's eighth word) one more than its transform holds.
    let mut bytes = whole.clone();
    let n = u64::from_le_bytes(bytes[56..64].try_into().unwrap());
    assert_eq!(n, index.total_tokens());
    bytes[56..64].copy_from_slice(&(n + 1).to_le_bytes());
    bytes.truncate(bytes.len() - 8);
    std::fs::write(&path, with_checksum(bytes)).unwrap();
    let err = CompressedIndex::open(&out).err().unwrap().to_string();
    assert!(err.contains("corrupt") && err.contains("size"), "{err}");
    // A part file missing is a folder that is not whole: a last part followed by another, or
    // a part that is not the last with none after it.
    std::fs::write(&path, &whole).unwrap();
    std::fs::copy(&path, part_file(&out, 1)).unwrap();
    let err = CompressedIndex::open(&out).err().unwrap().to_string();
    assert!(err.contains("one is missing"), "{err}");
    let mut not_last = whole.clone();
    not_last[24..32].copy_from_slice(&0u64.to_le_bytes());
    not_last.truncate(not_last.len() - 8);
    std::fs::write(&path, with_checksum(not_last)).unwrap();
    std::fs::remove_file(part_file(&out, 1)).unwrap();
    let err = CompressedIndex::open(&out).err().unwrap().to_string();
    assert!(err.contains("one is missing"), "{err}");
    std::fs::write(&path, &whole).unwrap();
    assert!(CompressedIndex::open(&out).is_ok());
    // And the command refuses to write over a folder that exists.
    let again = bin()
        .args(["index", "compress", "--index"])
        .arg(index.dir())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

/// The children of the context in a draft tree: first tokens and their probabilities, which
/// come from the same samples over both kinds of index (deeper tokens are other occurrences').
fn draft_roots(r: &pb::DraftResponse) -> Vec<(u32, f64)> {
    let mut roots: Vec<(u32, f64)> = r
        .parents
        .iter()
        .zip(r.token_ids.iter().zip(&r.probs))
        .filter(|(&p, _)| p == -1)
        .map(|(_, (&t, &p))| (t, p))
        .collect();
    roots.sort_by_key(|a| a.0);
    roots
}

/// A sidecar over a compressed index, with the real SmolLM2, answers `Mix` (every λ rule, the
/// gate's features included), `Score`, a `Session`, `Draft`, `Count` and distributions as one
/// over the suffix-array index it was compressed from; calls it cannot answer are refused with
/// the index that can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_over_a_compressed_index_answers_as_over_the_suffix_array() {
    let tmp = tempfile::tempdir().unwrap();
    let sa_config = with_model(tmp.path());
    let sa_index = Index::open(&sa_config.index, &Default::default()).unwrap();
    let fm_dir = tmp.path().join("fm");
    CompressedIndex::build(
        &sa_index,
        &fm_dir,
        (infini_sidecar::index::fm::DEFAULT_SAMPLE_EVERY, 1),
        |_| {},
    )
    .unwrap();
    let fm_config = ServeConfig {
        index: fm_dir,
        ..sa_config.clone()
    };
    let mut sa = start(sa_config).await;
    let mut fm = start(fm_config).await;

    let tokenizer = common::smollm2_tokenizer();
    let docs: Vec<Vec<u32>> = common::minipile_texts("test", 40, "")
        .iter()
        .map(|t| tokenizer.encode(t).unwrap())
        .filter(|d| d.len() > 40)
        .take(2)
        .map(|d| d[..d.len().min(160)].to_vec())
        .collect();
    use pb::mix_request::Lambda as L;
    for doc in &docs {
        let context = &doc[..doc.len() / 2];
        for lambda in [
            None,
            Some(L::Split(true)),
            Some(L::Adaptive(true)),
            Some(L::FixedLambda(0.3)),
            Some(L::Gate(true)),
        ] {
            let r = own_mix(context, lambda);
            assert_eq!(
                fm.client.mix(r.clone()).await.unwrap().into_inner(),
                sa.client.mix(r).await.unwrap().into_inner(),
                "mix {lambda:?}"
            );
        }
        let count = pb::CountRequest {
            ids: context[context.len() - 2..].to_vec(),
            ..Default::default()
        };
        assert_eq!(
            fm.client.count(count.clone()).await.unwrap().into_inner(),
            sa.client.count(count).await.unwrap().into_inner()
        );
        for (infinite, max_support) in [(true, 0), (true, 16), (false, 0)] {
            let ntd = pb::NextTokenDistributionRequest {
                prompt: context[context.len() - 1..].to_vec(),
                infinite,
                max_support,
                ..Default::default()
            };
            assert_eq!(
                fm.client
                    .next_token_distribution(ntd.clone())
                    .await
                    .unwrap()
                    .into_inner(),
                sa.client
                    .next_token_distribution(ntd)
                    .await
                    .unwrap()
                    .into_inner()
            );
        }
        let draft = pb::DraftRequest {
            target: Some(pb::draft_request::Target::Context(pb::TokenIds {
                ids: context.to_vec(),
            })),
            options: Some(pb::DraftOptions {
                tree_budget: 32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let (got, want) = (
            fm.client.draft(draft.clone()).await.unwrap().into_inner(),
            sa.client.draft(draft).await.unwrap().into_inner(),
        );
        assert_eq!(got.match_len, want.match_len);
        assert_eq!(draft_roots(&got), draft_roots(&want));
    }
    use pb::score_request::Lambda as S;
    for lambda in [None, Some(S::Split(true)), Some(S::Gate(true))] {
        assert_eq!(
            scores(&mut fm.client, &docs, lambda).await,
            scores(&mut sa.client, &docs, lambda).await,
            "score {lambda:?}"
        );
    }

    // A session: start, mix, append, mix, take back, mix.
    let doc = &docs[0];
    let half = doc.len() / 2;
    let (tx_f, mut rx_f) = open_session(&mut fm.client).await;
    let (tx_s, mut rx_s) = open_session(&mut sa.client).await;
    use pb::session_request::Step;
    let mix_step = |lambda| {
        Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::OwnModel(true)),
            lambda,
            top_k: 8,
            ..Default::default()
        })
    };
    let steps = vec![
        Step::Start(pb::SessionStart {
            context: doc[..half].to_vec(),
            use_model: true,
            ..Default::default()
        }),
        mix_step(None),
        Step::Append(pb::SessionAppend {
            tokens: doc[half..half + 3].to_vec(),
        }),
        mix_step(Some(pb::session_mix::Lambda::Gate(true))),
        Step::Truncate(pb::SessionTruncate {
            length: half as u64 + 1,
        }),
        mix_step(None),
    ];
    for s in steps {
        let mut got = step(&tx_f, &mut rx_f, s.clone()).await;
        let mut want = step(&tx_s, &mut rx_s, s).await;
        assert!(
            !matches!(got.result, Some(pb::session_response::Result::Error(_))),
            "{got:?}"
        );
        got.state.as_mut().unwrap().session_id = 0;
        want.state.as_mut().unwrap().session_id = 0;
        assert_eq!(got, want);
    }

    // Document search: the same documents, counts and windows, for an n-gram visited whole and
    // a two-clause CNF; a search the suffix array would subsample is refused, naming it.
    let search = |cnf: Vec<Vec<Vec<u32>>>, max_clause_freq| pb::SearchDocumentsRequest {
        cnf: cnf
            .into_iter()
            .map(|ngrams| pb::Clause {
                ngrams: ngrams.into_iter().map(|ids| pb::NGram { ids }).collect(),
            })
            .collect(),
        maxnum: 3,
        max_disp_len: 40,
        max_clause_freq,
        ..Default::default()
    };
    let (gram, other) = (doc[half..half + 3].to_vec(), doc[..2].to_vec());
    for cnf in [
        vec![vec![gram.clone()]],
        vec![vec![gram.clone()], vec![other.clone()]],
    ] {
        let r = search(cnf, 0);
        let want = sa
            .client
            .search_documents(r.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(want.doc_cnt > 0 && !want.approx, "{want:?}");
        assert_eq!(
            fm.client.search_documents(r).await.unwrap().into_inner(),
            want
        );
    }
    let broad = search(vec![vec![other]], 1);
    let want = sa
        .client
        .search_documents(broad.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(want.approx, "{want:?}");
    refused_naming_the_suffix_array(fm.client.search_documents(broad).await.unwrap_err());
    // What only a suffix array answers is refused, naming it.
    let hints = pb::HintsRequest {
        sequences: vec![pb::TokenIds { ids: gram }],
        ..Default::default()
    };
    refused_naming_the_suffix_array(fm.client.hints(hints).await.unwrap_err());
    let info = fm
        .client
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.index_tokens, sa_index.total_tokens());
    for running in [sa, fm] {
        let _ = running.stop.send(());
        running.task.await.unwrap().unwrap();
    }
}

fn refused_naming_the_suffix_array(err: tonic::Status) {
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("suffix-array index"),
        "{}",
        err.message()
    );
}
