//! Target `shard_answers`: what a router does with a shard server's answers, whatever they are.
//! Arbitrary bytes are decoded as a request and as every shard's answer to it (each answer message
//! of `sidecar.shard.v1`), checked as the router checks them (`cluster::validate`) against a set of
//! three shards, and those that pass are read (`cluster::wire`) and merged (`cluster::merge`) as
//! the router merges them. Nothing may panic, and what passed must merge into sane values: ids
//! inside the vocabulary, matches no longer than the prompt, counts within the set, probabilities
//! in [0, 1], no more documents, drafts or samples than asked.
//!
//! The input's first byte picks the answer type (`% KINDS`); the rest is a series of frames, each
//! `len: u16` (little-endian) and `len` bytes: the request's protobuf encoding, then shard 0's
//! answer, shard 1's, shard 2's (a missing frame is an empty message).

use std::path::Path;

use infini_sidecar::cluster::merge;
use infini_sidecar::cluster::set::ShardIdentity;
use infini_sidecar::cluster::validate::ShardAnswer;
use infini_sidecar::cluster::wire;
use infini_sidecar::server::pb;
use infini_sidecar::server::shard_pb as spb;
use prost::Message;

/// Answer types in the order the selector byte picks them (new ones go last).
const KINDS: [&str; 5] = [
    "Count",
    "Continuations",
    "ScoreTokens",
    "SearchDocuments",
    "LiveContinuations",
];
const SHARDS: usize = 3;
const VOCAB: u64 = 64;

pub struct Fixture {
    /// The set's shards, in order: their documents, tokens and suffix arrays differ.
    shards: Vec<ShardIdentity>,
}

fn shard(k: u32) -> ShardIdentity {
    ShardIdentity {
        set_id: "fuzz".into(),
        shard: k,
        shards: SHARDS as u32,
        documents: 3 + 4 * k as u64,
        tokens: 100 << (2 * k),
        local_parts: 1 + k,
        token_width: 2,
        eos_token_id: 0,
        vocab_size: VOCAB,
        tokenizer_fingerprint: "fuzz".into(),
        content_id: format!("fuzz-{k}"),
    }
}

/// The frames of `bytes`: `len: u16` LE then `len` bytes each (the last may be cut short).
fn frames(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while bytes.len() >= 2 {
        let len = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
        let end = (2 + len).min(bytes.len());
        out.push(&bytes[2..end]);
        bytes = &bytes[end..];
    }
    out
}

/// `bytes` framed as [`frames`] reads them.
pub fn frame(messages: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        out.extend_from_slice(&(m.len() as u16).to_le_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// The request and each shard's answer that decodes and passes validation (with its shard).
fn decoded<Q: Message + Default, A: Message + Default + ShardAnswer<Q>>(
    frames: &[&[u8]],
    shards: &[ShardIdentity],
) -> Option<(Q, Vec<(usize, A)>)> {
    let ask = Q::decode(*frames.first()?).ok()?;
    let passed = (0..shards.len())
        .filter_map(|k| {
            let answer = A::decode(frames.get(1 + k).copied().unwrap_or_default()).ok()?;
            answer
                .validate(&ask, &shards[k])
                .is_ok()
                .then_some((k, answer))
        })
        .collect();
    Some((ask, passed))
}

fn in_vocab(ids: &[u32]) -> bool {
    ids.iter().all(|&t| (t as u64) < VOCAB)
}

impl Fixture {
    pub fn new(_dir: &Path) -> Self {
        Self {
            shards: (0..SHARDS as u32).map(shard).collect(),
        }
    }

    fn positions(&self) -> u64 {
        self.shards.iter().map(|s| s.tokens + s.documents).sum()
    }

    fn arrays(&self) -> u64 {
        self.shards.iter().map(|s| s.local_parts as u64).sum()
    }

    pub fn run(&self, input: &[u8]) {
        self.check(input);
    }

    /// Runs `input`: which shards' answers passed validation (none when the request does not
    /// decode).
    pub fn check(&self, input: &[u8]) -> Vec<usize> {
        let Some((&selector, rest)) = input.split_first() else {
            return Vec::new();
        };
        let frames = frames(rest);
        match KINDS[selector as usize % KINDS.len()] {
            "Count" => self.merged(&frames, SHARDS, Self::count),
            "Continuations" => self.merged(&frames, SHARDS, Self::continuations),
            "ScoreTokens" => self.merged(&frames, SHARDS, Self::score_tokens),
            "SearchDocuments" => self.merged(&frames, SHARDS, Self::search),
            // One owner per namespace: shard 0's answer alone.
            _ => self.merged(&frames, 1, Self::live),
        }
    }

    /// The request of `frames` and the answers of the first `shards` shards to it, those that
    /// pass validation merged by `merge`: which passed.
    fn merged<Q, A>(
        &self,
        frames: &[&[u8]],
        shards: usize,
        merge: fn(&Self, Q, Vec<(usize, A)>),
    ) -> Vec<usize>
    where
        Q: Message + Default,
        A: Message + Default + ShardAnswer<Q>,
    {
        let frames = &frames[..frames.len().min(1 + shards)];
        let Some((ask, parts)) = decoded::<Q, A>(frames, &self.shards[..shards]) else {
            return Vec::new();
        };
        let passed = parts.iter().map(|(k, _)| *k).collect();
        merge(self, ask, parts);
        passed
    }

    fn count(&self, ask: spb::CountRequest, parts: Vec<(usize, spb::CountAnswer)>) {
        for i in 0..ask.ngrams.len() {
            let total = merge::sum(parts.iter().map(|(_, a)| a.counts[i])).unwrap();
            assert!(total <= self.positions());
        }
    }

    fn continuations(
        &self,
        ask: spb::ContinuationsRequest,
        parts: Vec<(usize, spb::ContinuationsAnswer)>,
    ) {
        if ask.depth > 0 {
            let drafts: Vec<_> = parts.into_iter().map(|(_, a)| wire::drafts_of(a)).collect();
            let found = merge::drafts(&drafts, ask.max_support).unwrap();
            // Each suffix array's share of the samples rounds up.
            assert!(found.len() as u64 <= ask.max_support.saturating_add(self.arrays()));
            for d in &found {
                assert!(in_vocab(d) && d.len() <= ask.depth as usize, "{d:?}");
            }
            return;
        }
        let counts: Vec<(usize, Vec<u64>)> = parts
            .iter()
            .map(|(_, a)| (a.suffix_len as usize, a.suffix_counts.clone()))
            .collect();
        let counts: Vec<(usize, &[u64])> = counts.iter().map(|(l, c)| (*l, c.as_slice())).collect();
        let lengths: Vec<usize> = ask.count_lengths.iter().map(|&k| k as usize).collect();
        for n in merge::suffix_counts(&counts, &lengths).unwrap() {
            assert!(n <= self.positions());
        }
        let parts: Vec<_> = parts
            .into_iter()
            .map(|(_, a)| wire::continuations_of(a))
            .collect();
        let cap = (ask.max_support > 0).then_some(ask.max_support);
        let merged = merge::continuations(&parts, cap).unwrap();
        assert!(merged.suffix_len <= ask.prompt.len());
        let ntd = &merged.ntd;
        assert!(ntd.prompt_cnt <= self.positions());
        assert!(ntd.dist.keys().all(|&t| (t as u64) < VOCAB), "{ntd:?}");
        let picked = merge::sum(ntd.dist.values().copied()).unwrap();
        match ntd.approx {
            // Every match, or the exact distribution: a token's probability is count / prompt_cnt.
            false => assert!(picked <= ntd.prompt_cnt, "{ntd:?}"),
            true => assert!(picked <= ask.max_support.saturating_add(self.arrays())),
        }
        for &n in ntd.dist.values() {
            assert!((0.0..=1.0).contains(&(n as f64 / picked as f64)));
        }
    }

    fn score_tokens(
        &self,
        ask: spb::ScoreTokensRequest,
        mut parts: Vec<(usize, spb::ScoreTokensAnswer)>,
    ) {
        let evidence: Vec<Vec<_>> = parts
            .iter()
            .map(|(_, a)| a.tokens.iter().map(wire::evidence_of).collect())
            .collect();
        let scores = merge::token_scores(&evidence).unwrap();
        for (i, s) in scores.iter().enumerate() {
            assert!(s.suffix_len <= i && s.prompt_cnt <= self.positions());
            assert!((0.0..=1.0).contains(&s.prob), "{s:?}");
        }
        let cap = (ask.support_samples > 0).then_some(ask.support_samples);
        for i in 0..scores.len() {
            let support: Vec<_> = parts
                .iter_mut()
                .map(|(_, a)| wire::support_of(&mut a.tokens[i]))
                .collect();
            let merged = merge::continuations(&support, cap).unwrap();
            assert!(merged.ntd.dist.keys().all(|&t| (t as u64) < VOCAB));
        }
    }

    fn search(&self, ask: spb::SearchRequest, parts: Vec<(usize, spb::SearchAnswer)>) {
        // A router asks with at least one clause, each with its stride.
        if ask.cnf.is_empty() {
            return;
        }
        let strides: Vec<u64> = (0..ask.cnf.len())
            .map(|c| ask.strides.get(c).copied().unwrap_or(1).max(1))
            .collect();
        let bases: Vec<u64> = self
            .shards
            .iter()
            .scan(0, |base, s| {
                let this = *base;
                *base += s.documents;
                Some(this)
            })
            .collect();
        let documents: u64 = self.shards.iter().map(|s| s.documents).sum();
        let (bases, parts): (Vec<u64>, Vec<_>) = parts
            .into_iter()
            .map(|(k, a)| (bases[k], wire::search_of(a)))
            .unzip();
        let totals: Vec<u64> = (0..ask.cnf.len())
            .map(|c| parts.iter().map(|p| p.clause_places[c]).sum())
            .collect();
        let Ok(found) = merge::search(parts, &bases, &totals, &strides, ask.maxnum as usize) else {
            // Only a stride past what a router picks (2^64 / places) overflows the estimate.
            assert!(strides.iter().any(|&s| s > u64::MAX / self.positions()));
            return;
        };
        assert!(found.doc_cnt <= documents);
        assert!(found.documents.len() <= ask.maxnum as usize);
        for d in &found.documents {
            assert!(d.doc_ix < documents && in_vocab(&d.token_ids), "{d:?}");
            assert!(d.needle_offset <= d.disp_len && d.disp_len <= d.doc_len);
        }
    }

    fn live(
        &self,
        ask: spb::LiveContinuationsRequest,
        parts: Vec<(usize, spb::LiveContinuationsAnswer)>,
    ) {
        for (_, a) in parts {
            assert!(a.match_len as usize <= ask.pattern.len());
            for c in &a.continuations {
                assert!(in_vocab(&c.tokens) && c.tokens.len() <= ask.depth as usize);
            }
        }
    }
}

fn input<A: Message>(kind: &str, ask: impl Message, answers: &[A]) -> Vec<u8> {
    let selector = KINDS.iter().position(|&k| k == kind).unwrap() as u8;
    let mut messages = vec![ask.encode_to_vec()];
    messages.extend(answers.iter().map(Message::encode_to_vec));
    let mut out = vec![selector];
    out.extend(frame(&messages));
    out
}

fn exact_ask() -> spb::ContinuationsRequest {
    spb::ContinuationsRequest {
        prompt: vec![1, 2, 3],
        infinite: true,
        count_lengths: vec![1, 2, 4],
        ..Default::default()
    }
}

/// An exact ∞-gram answer of `prompt_cnt` occurrences after a match of 2 tokens.
fn exact(prompt_cnt: u64) -> spb::ContinuationsAnswer {
    spb::ContinuationsAnswer {
        suffix_len: 2,
        prompt_cnt,
        dist_tokens: vec![4, 9],
        dist_counts: vec![prompt_cnt - 2, 2],
        spread: spb::Spread::Several as i32,
        suffix_counts: vec![prompt_cnt + 10, prompt_cnt],
        ..Default::default()
    }
}

fn draft_answer(arrays: usize) -> spb::ContinuationsAnswer {
    spb::ContinuationsAnswer {
        suffix_len: 2,
        drafts: (0..arrays)
            .map(|a| spb::LocalContinuations {
                matches: 1 + a as u64,
                // min(matches, max_support = 2) fine samples.
                fine: (0..(1 + a).min(2))
                    .map(|i| spb::Continuation {
                        tokens: vec![4 + i as u32, 5],
                    })
                    .collect(),
            })
            .collect(),
        ..Default::default()
    }
}

fn search_ask() -> spb::SearchRequest {
    spb::SearchRequest {
        cnf: vec![spb::Clause {
            ngrams: vec![spb::NGram { ids: vec![4] }],
        }],
        strides: vec![1],
        maxnum: 2,
        max_disp_len: 5,
    }
}

fn search_answer() -> spb::SearchAnswer {
    spb::SearchAnswer {
        doc_cnt: 1,
        clause_places: vec![2],
        documents: vec![pb::Document {
            doc_ix: 2,
            doc_len: 8,
            disp_len: 5,
            needle_offset: 2,
            metadata: String::new(),
            token_ids: vec![4; 5],
            text: String::new(),
        }],
    }
}

fn count_ask() -> spb::CountRequest {
    spb::CountRequest {
        ngrams: vec![spb::NGram { ids: vec![1, 2] }],
    }
}

fn counts(n: u64) -> spb::CountAnswer {
    spb::CountAnswer { counts: vec![n] }
}

fn draft_ask() -> spb::ContinuationsRequest {
    spb::ContinuationsRequest {
        prompt: vec![1, 2, 3],
        infinite: true,
        max_support: 2,
        depth: 3,
        ..Default::default()
    }
}

/// Answers that pass, of every kind, from all three shards: what the kept corpus starts from.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let evidence = spb::ScoreTokensAnswer {
        tokens: vec![
            spb::TokenEvidence {
                suffix_len: 0,
                prompt_cnt: 90,
                cont_cnt: 9,
                spread: spb::Spread::Several as i32,
                ..Default::default()
            },
            spb::TokenEvidence {
                suffix_len: 1,
                prompt_cnt: 9,
                cont_cnt: 9,
                spread: spb::Spread::Single as i32,
                single: 5,
                suffix_counts: vec![9],
                ..Default::default()
            },
        ],
    };
    let score_ask = spb::ScoreTokensRequest {
        ids: vec![4, 5],
        support_samples: 0,
        count_lengths: vec![1],
    };
    let live_ask = spb::LiveContinuationsRequest {
        namespace: "n".into(),
        pattern: vec![1, 2, 3],
        samples: 4,
        depth: 3,
    };
    let live = spb::LiveContinuationsAnswer {
        match_len: 2,
        continuations: vec![spb::Continuation { tokens: vec![4, 5] }],
    };
    vec![
        (
            "count",
            input("Count", count_ask(), &[counts(5), counts(0), counts(70)]),
        ),
        (
            "ntd",
            input(
                "Continuations",
                exact_ask(),
                &[exact(7), exact(3), exact(40)],
            ),
        ),
        (
            "drafts",
            input("Continuations", draft_ask(), &[1, 2, 3].map(draft_answer)),
        ),
        (
            "score",
            input(
                "ScoreTokens",
                score_ask,
                &[evidence.clone(), evidence.clone(), evidence],
            ),
        ),
        (
            "search",
            input(
                "SearchDocuments",
                search_ask(),
                &[search_answer(), search_answer(), search_answer()],
            ),
        ),
        ("live", input("LiveContinuations", live_ask, &[live])),
    ]
}

/// The corruptions of the probe's fake shard (`fake_shard.py`), each in shard 1's answer beside
/// honest ones: validation must refuse them, or their merge would break the sanity checks above
/// (kept in `fuzz/regressions/shard_answers`).
pub fn corruptions() -> Vec<(&'static str, Vec<u8>)> {
    const BIG: u32 = 4_000_000_000;
    let ntd = |corrupt: fn(&mut spb::ContinuationsAnswer)| {
        let mut bad = exact(7);
        corrupt(&mut bad);
        input("Continuations", exact_ask(), &[exact(7), bad, exact(7)])
    };
    let count_of = |counts: Vec<u64>| spb::CountAnswer { counts };
    let mut oov_draft = draft_answer(2);
    for c in oov_draft.drafts.iter_mut().flat_map(|d| &mut d.fine) {
        c.tokens = vec![BIG; c.tokens.len()];
    }
    let mut search_bad = search_answer();
    for d in &mut search_bad.documents {
        d.doc_ix = u64::MAX;
        d.needle_offset = 1 << 63;
    }
    vec![
        (
            "count_max",
            input(
                "Count",
                count_ask(),
                &[counts(5), counts(u64::MAX), counts(1)],
            ),
        ),
        (
            "count_short",
            input(
                "Count",
                count_ask(),
                &[counts(5), count_of(vec![]), counts(1)],
            ),
        ),
        (
            "oov_dist",
            ntd(|a| {
                a.dist_tokens.push(BIG);
                a.dist_counts.push(5);
                a.prompt_cnt += 5;
            }),
        ),
        (
            "oov_single",
            ntd(|a| {
                a.spread = spb::Spread::Single as i32;
                a.single = BIG;
            }),
        ),
        ("zero_cnt", ntd(|a| a.prompt_cnt = 0)),
        ("huge_len", ntd(|a| a.suffix_len = BIG)),
        (
            "cnt_max",
            ntd(|a| {
                a.prompt_cnt = u64::MAX;
                a.dist_counts[0] = u64::MAX;
            }),
        ),
        (
            "oov_draft",
            input(
                "Continuations",
                draft_ask(),
                &[draft_answer(1), oov_draft, draft_answer(3)],
            ),
        ),
        (
            "search_bad",
            input(
                "SearchDocuments",
                search_ask(),
                &[search_answer(), search_bad, search_answer()],
            ),
        ),
    ]
}
