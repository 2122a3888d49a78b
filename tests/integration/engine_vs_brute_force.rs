//! Every query type against brute-force counting over the documents themselves, on generated corpora
//! with several parts and every token width, including the edge cases: empty prompts, prompts at the
//! very end of the corpus, continuations at a separator, ids outside the vocabulary, queries longer than
//! any document.

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::docs::SearchOptions;
use infini_sidecar::index::fm::suffix::FmSuffixMatch;
use infini_sidecar::index::fm::CompressedIndex;
use infini_sidecar::index::format::NextTableSpec;
use infini_sidecar::index::suffix::SuffixMatch;
use infini_sidecar::index::{Index, IndexError, OpenOptions, TokenWidth};
use proptest::prelude::*;

use crate::common::oracle::Oracle;

impl Oracle {
    /// Matches of a clause in document `d`: every occurrence of each of its n-grams.
    fn clause_matches(&self, d: usize, clause: &[Vec<u32>]) -> u64 {
        clause
            .iter()
            .map(|q| {
                self.occurrences(q)
                    .iter()
                    .filter(|&&(doc, _)| doc == d)
                    .count() as u64
            })
            .sum()
    }

    /// The reference's `cnt` of a CNF: matches (not documents) of its rarest clause in the documents
    /// that match every clause; for a single clause, all its matches.
    fn cnf_cnt(&self, cnf: &[Vec<Vec<u32>>]) -> u64 {
        let total = |clause: &[Vec<u32>]| -> u64 {
            (0..self.docs.len())
                .map(|d| self.clause_matches(d, clause))
                .sum()
        };
        let rarest = cnf.iter().min_by_key(|c| total(c)).unwrap();
        self.docs_matching(cnf)
            .into_iter()
            .map(|d| self.clause_matches(d, rarest))
            .sum()
    }

    fn docs_matching(&self, cnf: &[Vec<Vec<u32>>]) -> Vec<usize> {
        let contains =
            |doc: &[u32], q: &[u32]| q.len() <= doc.len() && doc.windows(q.len()).any(|w| w == q);
        (0..self.docs.len())
            .filter(|&d| {
                cnf.iter()
                    .all(|clause| clause.iter().any(|q| contains(&self.docs[d], q)))
            })
            .collect()
    }
}

struct Built {
    _dir: tempfile::TempDir,
    index: Index,
    oracle: Oracle,
}

/// Maps small generated symbols to ids spread over the width, so byte order differs from numeric order.
fn spread(symbol: u32, width: TokenWidth) -> u32 {
    match width {
        TokenWidth::U8 => symbol * 37 % 251,
        TokenWidth::U16 => (symbol * 0x0101 + 0x00FE) % 65000,
        TokenWidth::U32 => symbol.wrapping_mul(0x0100_0193) % 0xFFFF_0000,
    }
}

fn vocab_for(width: TokenWidth) -> u64 {
    match width {
        TokenWidth::U8 => 251,
        TokenWidth::U16 => 65000,
        TokenWidth::U32 => 0xFFFF_0000,
    }
}

fn build_corpus(symbol_docs: &[Vec<u32>], width: TokenWidth, max_part_tokens: u64) -> Built {
    let docs: Vec<Vec<u32>> = symbol_docs
        .iter()
        .map(|d| d.iter().map(|&s| spread(s, width)).collect())
        .collect();
    let eos = spread(0, width);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("idx");
    let opts = BuildOptions {
        max_part_tokens: Some(max_part_tokens),
        // A next-token table down to prompts seen twice: whole for u8 corpora, cut by its budget to
        // the most frequent prompts for the others, so both ways of answering ntd meet the oracle.
        next_table: Some(NextTableSpec {
            max_prompt_tokens: 3,
            min_count: 2,
            budget_bytes: if width == TokenWidth::U8 {
                1 << 20
            } else {
                2048
            },
        }),
        ..BuildOptions::new(out.clone(), width, eos, vocab_for(width))
    };
    let input = docs.iter().enumerate().map(|(i, d)| {
        Ok(InputDoc {
            content: Content::Tokens(d.clone()),
            metadata: Some(format!("{{\"doc\":{i}}}")),
            input_bytes: 0,
        })
    });
    build(input, &opts).unwrap();
    let index = Index::open(&out, &OpenOptions::default()).unwrap();
    Built {
        _dir: dir,
        index,
        oracle: Oracle { docs, eos },
    }
}

/// The same index opened again with its ranks sampled (`index::read::rank_samples`): the samples only
/// narrow searches, so every answer must stay the oracle's. Small alphabets give many samples
/// whose keys equal a query's, and suffixes at the corpus end shorter than a key.
fn with_rank_samples(b: Built) -> Built {
    let opts = OpenOptions {
        sample_ranks: true,
        ..OpenOptions::default()
    };
    let index = Index::open(&b._dir.path().join("idx"), &opts).unwrap();
    Built { index, ..b }
}

/// Queries worth asking of a corpus: n-grams taken from it (so counts are non-zero), the very end of the
/// corpus, document ends, and random ones (mostly absent).
fn queries(oracle: &Oracle, random: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mut out = vec![vec![]];
    for doc in &oracle.docs {
        for len in [1usize, 2, 3, 5] {
            if doc.len() >= len {
                out.push(doc[doc.len() - len..].to_vec()); // ends at a separator or the corpus end
                out.push(doc[..len].to_vec());
                let mid = doc.len() / 2;
                out.push(doc[mid.saturating_sub(len / 2)..(mid + len).min(doc.len())].to_vec());
            }
        }
        out.push(doc.clone());
        out.push([doc.as_slice(), doc.as_slice()].concat()); // longer than any document that holds it
    }
    out.extend(random.iter().cloned());
    out
}

/// The compressed index of the same corpus answers as the suffix-array index does (its rank
/// ranges aside, which are its own rows) and as the oracle does where the two differ in kind.
fn check_compressed(b: &Built, queries: &[Vec<u32>]) {
    let (index, oracle) = (&b.index, &b.oracle);
    let out = b._dir.path().join(format!("fm-{}", index.num_parts()));
    let _ = std::fs::remove_dir_all(&out);
    let fm = CompressedIndex::build(
        index,
        &out,
        (infini_sidecar::index::fm::DEFAULT_SAMPLE_EVERY, 1),
        |_| {},
    )
    .unwrap();
    let fm_opened = CompressedIndex::open(&out).unwrap();
    let probe = oracle
        .docs
        .iter()
        .flatten()
        .copied()
        .next()
        .unwrap_or(oracle.eos);
    for fm in [&fm, &fm_opened] {
        for q in queries {
            let (want, got) = (index.find(q).unwrap(), fm.find(q).unwrap());
            assert_eq!(want.cnt, got.cnt, "find {q:?}");
            let lengths = |f: &infini_sidecar::index::query::FindResult| -> Vec<u64> {
                f.segment_by_shard.iter().map(|(lo, hi)| hi - lo).collect()
            };
            if !q.is_empty() {
                assert_eq!(lengths(&want), lengths(&got), "find ranges {q:?}");
            }
            assert_eq!(fm.count(q).unwrap(), want.cnt);
            for support in [None, Some(3)] {
                assert_eq!(
                    fm.ntd(q, support).unwrap(),
                    index.ntd(q, support).unwrap(),
                    "ntd {q:?} {support:?}"
                );
                assert_eq!(
                    fm.infgram_ntd(q, support).unwrap(),
                    index.infgram_ntd(q, support).unwrap(),
                    "infgram_ntd {q:?} {support:?}"
                );
            }
            assert_eq!(fm.score(q).unwrap(), index.score(q).unwrap(), "score {q:?}");
            for c in [oracle.eos, probe] {
                assert_eq!(
                    fm.prob(q, c).unwrap(),
                    index.prob(q, c).unwrap(),
                    "prob {q:?} {c}"
                );
                assert_eq!(
                    fm.infgram_prob(q, c).unwrap(),
                    index.infgram_prob(q, c).unwrap(),
                    "infgram_prob {q:?} {c}"
                );
            }
            if q.is_empty() {
                continue;
            }
            // Every match located, in the right document at the right offset.
            let mut places: Vec<(usize, usize)> = fm
                .positions(q, usize::MAX)
                .unwrap()
                .into_iter()
                .map(|p| fm.place(p))
                .map(|(d, at)| (d as usize, at as usize))
                .collect();
            places.sort_unstable();
            assert_eq!(places, oracle.occurrences(q), "positions {q:?}");
            // Document search: one n-gram, an OR, an AND; windows cut short around the match.
            let opts = SearchOptions {
                maxnum: 1 << 20,
                max_disp_len: 5,
                ..SearchOptions::default()
            };
            let probe_gram = vec![probe];
            for cnf in [
                vec![vec![q.clone()]],
                vec![vec![q.clone(), probe_gram.clone()]],
                vec![vec![q.clone()], vec![probe_gram.clone()]],
            ] {
                assert_eq!(
                    fm.search_docs_cnf(&cnf, opts).unwrap(),
                    index.search_docs_cnf(&cnf, opts).unwrap(),
                    "search {cnf:?}"
                );
            }
            // One the suffix array subsamples is refused; so is one over the compressed index's
            // share of the places, which the suffix array answers.
            let sampled = SearchOptions {
                max_clause_freq: 1,
                ..opts
            };
            let cnf = [vec![q.clone()]];
            let want = index.search_docs_cnf(&cnf, sampled).unwrap();
            match want.approx {
                true => {
                    let err = fm.search_docs_cnf(&cnf, sampled).unwrap_err().to_string();
                    assert!(err.contains("suffix-array index"), "{err}");
                }
                false => assert_eq!(fm.search_docs_cnf(&cnf, sampled).unwrap(), want),
            }
            // The compressed index visits at most max_places / 1,024 places: exactly as many as
            // it needs is answered, one fewer refused as unsupported.
            let needed = index.count(q).unwrap().min(opts.max_clause_freq);
            if needed > 0 {
                let enough = SearchOptions {
                    max_places: needed * 1024,
                    ..opts
                };
                assert_eq!(
                    fm.search_docs_cnf(&cnf, enough).unwrap(),
                    index.search_docs_cnf(&cnf, enough).unwrap()
                );
                let short = SearchOptions {
                    max_places: needed * 1024 - 1,
                    ..opts
                };
                assert!(index.search_docs_cnf(&cnf, short).is_ok());
                let err = fm.search_docs_cnf(&cnf, short).unwrap_err();
                assert!(matches!(err, IndexError::Unsupported(_)), "{err}");
                assert!(err.to_string().contains("suffix-array index"), "{err}");
            }
            // What follows every match, cut at document ends (samples enough for all of them).
            let matched = FmSuffixMatch::of(fm, q).unwrap();
            let mut following = if matched.suffix_len() == q.len() {
                matched.continuations(fm, 1 << 20, 4)
            } else {
                Vec::new()
            };
            following.sort();
            let mut expected: Vec<Vec<u32>> = oracle
                .occurrences(q)
                .into_iter()
                .map(|(d, at)| {
                    let doc = &oracle.docs[d];
                    doc[at + q.len()..(at + q.len() + 4).min(doc.len())]
                        .iter()
                        .copied()
                        .take_while(|&t| t != oracle.eos)
                        .collect()
                })
                .collect();
            expected.sort();
            assert_eq!(following, expected, "continuations {q:?}");
        }
        for d in 0..index.total_documents() {
            assert_eq!(fm.get_document(d).unwrap(), index.get_document(d).unwrap());
        }
        assert!(fm.get_document(index.total_documents()).is_err());
        let outside = vocab_for(index.width()) as u32;
        assert!(fm
            .count(&[outside])
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
    }
}

fn check_all(b: &Built, random: &[Vec<u32>]) {
    check_compressed(b, &queries(&b.oracle, random));
    let (index, oracle) = (&b.index, &b.oracle);
    let candidates: Vec<u32> = {
        let mut c: Vec<u32> = oracle.docs.iter().flatten().copied().collect();
        c.push(oracle.eos);
        c.sort_unstable();
        c.dedup();
        c
    };
    for q in queries(oracle, random) {
        assert_eq!(index.count(&q).unwrap(), oracle.count(&q), "count {q:?}");
        assert_eq!(index.find(&q).unwrap().cnt, oracle.count(&q), "find {q:?}");
        let want = oracle.ntd(&q);
        let got = index.ntd(&q, None).unwrap();
        assert_eq!(got.prompt_cnt, oracle.count(&q), "ntd prompt_cnt {q:?}");
        assert_eq!(got.dist, want, "ntd {q:?}");
        assert!(!got.approx);
        for &c in candidates.iter().take(12).chain(q.first()) {
            let p = index.prob(&q, c).unwrap();
            let cont = want.get(&c).copied().unwrap_or(0);
            assert_eq!(
                (p.prompt_cnt, p.cont_cnt),
                (oracle.count(&q), cont),
                "prob {q:?} -> {c}"
            );
            if p.prompt_cnt == 0 {
                assert_eq!(p.prob, -1.0);
            }
        }
        // ∞-gram: the longest suffix that occurs, its distribution, the sparse flag.
        let l = oracle.suffix_len(&q);
        let suffix = &q[q.len() - l..];
        let inf = index.infgram_ntd(&q, None).unwrap();
        assert_eq!(inf.suffix_len, l, "suffix_len {q:?}");
        assert_eq!(inf.ntd.dist, oracle.ntd(suffix), "infgram_ntd {q:?}");
        assert_eq!(inf.sparse, oracle.ntd(suffix).len() == 1, "sparse {q:?}");
        let c = *candidates.last().unwrap();
        let ip = index.infgram_prob(&q, c).unwrap();
        assert_eq!((ip.suffix_len, ip.sparse), (l, inf.sparse));
        assert_eq!(
            ip.prob.cont_cnt,
            oracle.ntd(suffix).get(&c).copied().unwrap_or(0)
        );
        // Subsampled ntd: flagged, and only tokens that really follow.
        let approx = index.ntd(&q, Some(3)).unwrap();
        assert_eq!(approx.approx, oracle.count(&q) > 3);
        assert!(
            approx.dist.keys().all(|t| want.contains_key(t)),
            "approx ntd invents tokens {q:?}"
        );
    }
    // Dense scoring: each position equals infgram_prob of its prefix.
    for seq in oracle.docs.iter().take(4).chain(random.iter().take(4)) {
        let scores = index.score(seq).unwrap();
        for (i, s) in scores.iter().enumerate() {
            let l = oracle.suffix_len(&seq[..i]);
            let suffix = &seq[i - l..i];
            let dist = oracle.ntd(suffix);
            let prompt_cnt = oracle.count(suffix);
            let cont = dist.get(&seq[i]).copied().unwrap_or(0);
            assert_eq!(
                (s.suffix_len, s.prompt_cnt, s.cont_cnt, s.sparse),
                (l, prompt_cnt, cont, dist.len() == 1),
                "score {seq:?} at {i}"
            );
            assert!((s.prob - cont as f64 / prompt_cnt as f64).abs() < 1e-12);
        }
    }
    // Following a sequence: taken in whole, grown a token at a time, cut back anywhere (before
    // the part taken in whole too), the match is always the oracle's longest suffix.
    for seq in oracle.docs.iter().take(4).chain(random.iter().take(4)) {
        let half = seq.len() / 2;
        let mut m = SuffixMatch::of(index, &seq[..half]).unwrap();
        for i in half..seq.len() {
            m.advance(index, &seq[..=i]);
        }
        let check = |m: &SuffixMatch, at: usize| {
            let l = oracle.suffix_len(&seq[..at]);
            assert_eq!(
                (m.suffix_len(), m.prompt_cnt()),
                (l, oracle.count(&seq[at - l..at])),
                "following {seq:?}, cut to {at}"
            );
        };
        check(&m, seq.len());
        for at in (0..seq.len()).rev() {
            m.truncate(index, &seq[..at]);
            check(&m, at);
        }
    }
    // Document search: the documents that satisfy a CNF, with the right text.
    let non_empty: Vec<&Vec<u32>> = oracle.docs.iter().filter(|d| !d.is_empty()).collect();
    for clause_src in non_empty.iter().take(3) {
        let a = clause_src[..clause_src.len().min(2)].to_vec();
        let b2 = non_empty[non_empty.len() - 1][..1].to_vec();
        for cnf in [
            vec![vec![a.clone()]],
            vec![vec![a.clone(), b2.clone()]],
            vec![vec![a.clone()], vec![b2.clone()]],
        ] {
            let want = oracle.docs_matching(&cnf);
            let got = index
                .search_docs_cnf(
                    &cnf,
                    SearchOptions {
                        maxnum: 1000,
                        max_disp_len: 10_000,
                        max_clause_freq: 1 << 40,
                        ..SearchOptions::default()
                    },
                )
                .unwrap();
            assert_eq!(got.doc_cnt, want.len() as u64, "cnf {cnf:?}");
            assert_eq!(got.cnt, oracle.cnf_cnt(&cnf), "cnt of cnf {cnf:?}");
            let got_docs: Vec<usize> = got.documents.iter().map(|d| d.doc_ix as usize).collect();
            assert_eq!(got_docs, want, "cnf docs {cnf:?}");
            for d in &got.documents {
                assert_eq!(d.token_ids, oracle.docs[d.doc_ix as usize]);
                assert_eq!(
                    d.metadata.as_deref(),
                    Some(format!("{{\"doc\":{}}}", d.doc_ix).as_str())
                );
            }
        }
    }
    // Ids outside the vocabulary are refused with a message.
    let outside = (vocab_for(index.width())) as u32;
    let err = index.count(&[outside]).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    assert!(index.score(&[1, outside]).is_err());
}

fn corpus_strategy() -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<Vec<u32>>, u64)> {
    // Small alphabets make long repeats; symbol 0 is eos and may appear inside documents too.
    let doc = prop::collection::vec(0u32..6, 0..40);
    let docs = prop::collection::vec(doc, 1..12);
    let random = prop::collection::vec(prop::collection::vec(0u32..7, 0..8), 0..6);
    (docs, random, 8u64..200)
}

fn run_width(width: TokenWidth) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(&corpus_strategy(), |(docs, random, part_tokens)| {
            let b = build_corpus(
                &docs,
                width,
                part_tokens.max(docs.iter().map(|d| d.len() as u64 + 1).max().unwrap_or(1)),
            );
            let random: Vec<Vec<u32>> = random
                .iter()
                .map(|q| q.iter().map(|&s| spread(s, width)).collect())
                .collect();
            check_all(&b, &random);
            check_all(&with_rank_samples(b), &random);
            Ok(())
        })
        .unwrap();
}

#[test]
fn u8_corpora_match_brute_force() {
    run_width(TokenWidth::U8);
}

#[test]
fn u16_corpora_match_brute_force() {
    run_width(TokenWidth::U16);
}

#[test]
fn u32_corpora_match_brute_force() {
    run_width(TokenWidth::U32);
}

#[test]
fn several_parts_are_built_and_merged() {
    let docs: Vec<Vec<u32>> = (0..30)
        .map(|i| (0..20).map(|j| (i * 7 + j * 3) % 5 + 1).collect())
        .collect();
    let b = build_corpus(&docs, TokenWidth::U16, 50);
    assert!(b.index.num_parts() >= 10, "{} parts", b.index.num_parts());
    assert!(b.index.info().next_token_table_prompts > 0);
    check_all(&b, &[vec![1, 2, 3], vec![9]]);
    check_all(&with_rank_samples(b), &[vec![1, 2, 3], vec![9]]);
}

#[test]
fn document_search_work_is_bounded_before_it_is_done() {
    // 40 documents of 60 tokens: symbol 1 occurs 1200 times, once every other token.
    let docs: Vec<Vec<u32>> = (0..40)
        .map(|i| {
            (0..60)
                .map(|j| if j % 2 == 0 { 1 } else { 2 + (i + j) % 4 })
                .collect()
        })
        .collect();
    let b = build_corpus(&docs, TokenWidth::U16, 1 << 20);
    let one = vec![spread(1, TokenWidth::U16)];
    let opts = SearchOptions::default();
    // Too many clauses: refused by number, before any lookup.
    let many: Vec<Vec<Vec<u32>>> = vec![vec![one.clone()]; opts.max_clauses + 1];
    let err = b
        .index
        .search_docs_cnf(&many, opts)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("limit of {}", opts.max_clauses)),
        "{err}"
    );
    // Too many places: 3 clauses of 1200 matches each against a cap of 2500.
    let capped = SearchOptions {
        max_places: 2500,
        ..opts
    };
    let three = vec![vec![one.clone()]; 3];
    let err = b
        .index
        .search_docs_cnf(&three, capped)
        .unwrap_err()
        .to_string();
    assert!(err.contains("3600 places") && err.contains("2500"), "{err}");
    // ... unless max_clause_freq samples each clause down to what the cap allows.
    let sampled = SearchOptions {
        max_clause_freq: 800,
        ..capped
    };
    let found = b.index.search_docs_cnf(&three, sampled).unwrap();
    assert!(found.approx && found.doc_cnt > 0);
    assert!(b
        .index
        .search_docs_cnf(
            &three,
            SearchOptions {
                max_clause_freq: 0,
                ..opts
            }
        )
        .is_err());

    // A stopped request stops the search, the exact distribution and dense scoring.
    let stop = infini_sidecar::interrupt::StopSignal::new(None);
    stop.cancel();
    let interrupted = |e: infini_sidecar::index::IndexError| {
        matches!(e, infini_sidecar::index::IndexError::Interrupted)
    };
    let search = stop.run(|| b.index.search_docs(&one, opts));
    assert!(interrupted(search.unwrap_err()));
    let score = stop.run(|| b.index.score(&[one[0], one[0]]));
    assert!(interrupted(score.unwrap_err()));
    // The exact distribution after the empty prompt splits the whole array: over 1024 steps only
    // with many distinct tokens, so a corpus of 3000 of them.
    let wide: Vec<Vec<u32>> = vec![(1..3000).collect()];
    let w = build_corpus(&wide, TokenWidth::U16, 1 << 20);
    let ntd = stop.run(|| w.index.ntd(&[], None));
    assert!(interrupted(ntd.unwrap_err()));
    assert_eq!(w.index.ntd(&[], None).unwrap().dist.len(), 3000);
}
