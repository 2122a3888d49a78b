//! What a router checks of a shard server's answer before any merge reads it. A shard is trusted
//! for what it knows (its counts), never for the shape of what it says: an answer that breaks the
//! protocol's invariants — token ids outside the vocabulary, a match longer than the prompt,
//! counts that cannot add up, arrays of another length than asked, documents outside the shard —
//! would merge into nonsense (probabilities above 1, wrapped counts, ids no tokenizer knows), so it
//! is refused as [`Malformed`] and the router treats the replica as down (`server::router`).
//!
//! One [`ShardAnswer::validate`] per answer message, against the request that asked it and the
//! shard's description (`set::ShardIdentity`, from the set's layout). The invariants are those of
//! `server::shard` over [`crate::cluster::partial`]; each check names the one it enforces.

use crate::cluster::set::ShardIdentity;
use crate::index::query::Spread;
use crate::server::shard_pb as spb;

/// Why a shard's answer cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("{what}: token id {id} is outside the vocabulary (size {vocab})")]
    Token {
        what: &'static str,
        id: u32,
        vocab: u64,
    },
    #[error("{what}: {got} entries where the request makes {want}")]
    Length {
        what: &'static str,
        got: usize,
        want: usize,
    },
    #[error("{what} is {value}, more than its bound {bound}")]
    Bound {
        what: &'static str,
        value: u64,
        bound: u64,
    },
    #[error("{what} {value} is outside 0..{end}")]
    Outside {
        what: &'static str,
        value: u64,
        end: u64,
    },
    #[error("{what} add up past 2^64")]
    Overflow { what: &'static str },
    #[error("unknown spread {0}")]
    Spread(i32),
    #[error("{0}")]
    Inconsistent(&'static str),
}

type Result<T = ()> = std::result::Result<T, Malformed>;

/// A shard's answer to a request of type `Q`.
pub trait ShardAnswer<Q> {
    /// Whether this answer to `ask` can come from `shard` (whose description the set checked).
    fn validate(&self, ask: &Q, shard: &ShardIdentity) -> Result;
}

/// Most occurrences anything has in a shard: one per token slot (separators included), with room.
fn positions(shard: &ShardIdentity) -> u64 {
    shard.tokens.saturating_add(shard.documents)
}

fn at_most(what: &'static str, value: u64, bound: u64) -> Result {
    match value <= bound {
        true => Ok(()),
        false => Err(Malformed::Bound { what, value, bound }),
    }
}

fn count(what: &'static str, value: u64, shard: &ShardIdentity) -> Result {
    at_most(what, value, positions(shard))
}

fn length(what: &'static str, got: usize, want: usize) -> Result {
    match got == want {
        true => Ok(()),
        false => Err(Malformed::Length { what, got, want }),
    }
}

/// Continuations of at most `depth` tokens each, every one an id of the vocabulary.
fn continuations(found: &[spb::Continuation], depth: u32, shard: &ShardIdentity) -> Result {
    for c in found {
        let len = c.tokens.len() as u64;
        at_most("a continuation's length", len, u64::from(depth))?;
        tokens("a continuation's tokens", &c.tokens, shard)?;
    }
    Ok(())
}

fn tokens(what: &'static str, ids: &[u32], shard: &ShardIdentity) -> Result {
    match ids.iter().find(|&&id| id as u64 >= shard.vocab_size) {
        None => Ok(()),
        Some(&id) => Err(Malformed::Token {
            what,
            id,
            vocab: shard.vocab_size,
        }),
    }
}

fn sum(what: &'static str, values: impl IntoIterator<Item = u64>) -> Result<u64> {
    values
        .into_iter()
        .try_fold(0u64, |acc, n| acc.checked_add(n))
        .ok_or(Malformed::Overflow { what })
}

fn check(holds: bool, why: &'static str) -> Result {
    match holds {
        true => Ok(()),
        false => Err(Malformed::Inconsistent(why)),
    }
}

/// A spread the wire can say, its single token in the vocabulary.
fn spread(kind: i32, single: u32, shard: &ShardIdentity) -> Result<Spread> {
    match spb::Spread::try_from(kind) {
        Ok(spb::Spread::None) => Ok(Spread::None),
        Ok(spb::Spread::Several) => Ok(Spread::Several),
        Ok(spb::Spread::Single) => {
            tokens("the spread's single token", &[single], shard)?;
            Ok(Spread::Single(single))
        }
        Err(_) => Err(Malformed::Spread(kind)),
    }
}

/// What followed a match found here, by whom it was asked: the ∞-gram's suffix (asked `infinite`)
/// occurs, and only an empty shard has no position at all.
fn occurrences(prompt_cnt: u64, infinite: bool, shard: &ShardIdentity) -> Result {
    count("prompt_cnt", prompt_cnt, shard)?;
    check(
        !(infinite && prompt_cnt == 0 && shard.tokens > 0),
        "an ∞-gram's suffix found here must occur here",
    )
}

/// Every suffix array's fine samples under `cap` of a match with `prompt_cnt` occurrences: one
/// sample per suffix array, each `min(cap, matches)` picks of in-vocabulary tokens, the matches
/// adding up to the count.
fn samples(
    samples: &[spb::LocalSample],
    cap: u64,
    prompt_cnt: u64,
    shard: &ShardIdentity,
) -> Result {
    length("samples", samples.len(), shard.local_parts as usize)?;
    for sample in samples {
        count("a sample's matches", sample.matches, shard)?;
        let ids: Vec<u32> = sample.runs.iter().map(|r| r.token).collect();
        tokens("a sample's tokens", &ids, shard)?;
        check(
            sample.runs.iter().all(|r| r.count > 0),
            "a sample's run is empty",
        )?;
        let picked = sum("a sample's runs", sample.runs.iter().map(|r| r.count))?;
        check(
            picked == sample.matches.min(cap),
            "a sample's runs are not min(cap, matches) picks",
        )?;
    }
    let matches = sum("the samples' matches", samples.iter().map(|s| s.matches))?;
    check(
        matches == prompt_cnt,
        "the samples' matches do not add up to prompt_cnt",
    )
}

/// The counts of a match's last k tokens for the asked `lengths` up to `matched`: one per such
/// length, shrinking as k grows (a longer suffix occurs only where a shorter one does), none below
/// the match's own count.
fn suffix_counts(
    counts: &[u64],
    lengths: &[u32],
    matched: usize,
    prompt_cnt: u64,
    shard: &ShardIdentity,
) -> Result {
    let want = lengths.iter().filter(|&&k| k as usize <= matched).count();
    length("suffix_counts", counts.len(), want)?;
    for &n in counts {
        count("a suffix count", n, shard)?;
    }
    check(
        counts.windows(2).all(|w| w[0] >= w[1]),
        "suffix counts grow with the suffix",
    )?;
    check(
        counts.iter().all(|&n| n >= prompt_cnt),
        "a suffix of the match occurs less often than the match",
    )
}

impl ShardAnswer<spb::CountRequest> for spb::CountAnswer {
    fn validate(&self, ask: &spb::CountRequest, shard: &ShardIdentity) -> Result {
        length("counts", self.counts.len(), ask.ngrams.len())?;
        for &n in &self.counts {
            count("a count", n, shard)?;
        }
        Ok(())
    }
}

impl ShardAnswer<spb::SpanLengthsRequest> for spb::SpanLengthsAnswer {
    fn validate(&self, ask: &spb::SpanLengthsRequest, _shard: &ShardIdentity) -> Result {
        length("span lengths", self.lengths.len(), ask.ids.len())?;
        // The span from start i ends within the text.
        check(
            (self.lengths.iter().enumerate()).all(|(i, &n)| i + n as usize <= ask.ids.len()),
            "a span runs past the end of the text",
        )
    }
}

impl ShardAnswer<spb::ContinuationsRequest> for spb::ContinuationsAnswer {
    fn validate(&self, ask: &spb::ContinuationsRequest, shard: &ShardIdentity) -> Result {
        let prompt_len = ask.prompt.len();
        at_most("suffix_len", self.suffix_len as u64, prompt_len as u64)?;
        let matched = self.suffix_len as usize;
        check(
            ask.infinite || matched == prompt_len,
            "an n-gram's answer must match the whole prompt",
        )?;
        if ask.depth > 0 {
            return drafts(self, ask, shard);
        }
        check(self.drafts.is_empty(), "drafts that were not asked")?;
        occurrences(self.prompt_cnt, ask.infinite, shard)?;
        let spread = spread(self.spread, self.single, shard)?;
        check(
            (self.prompt_cnt == 0) == (spread == Spread::None),
            "the spread disagrees with prompt_cnt",
        )?;
        length(
            "dist_counts",
            self.dist_counts.len(),
            self.dist_tokens.len(),
        )?;
        tokens("the distribution's tokens", &self.dist_tokens, shard)?;
        match ask.max_support {
            0 => {
                check(self.samples.is_empty(), "samples that were not asked")?;
                check(
                    self.dist_tokens.windows(2).all(|w| w[0] < w[1]),
                    "the distribution's tokens do not ascend",
                )?;
                check(
                    self.dist_counts.iter().all(|&n| n > 0),
                    "the distribution has a token that never followed",
                )?;
                let total = sum(
                    "the distribution's counts",
                    self.dist_counts.iter().copied(),
                )?;
                at_most("the distribution's counts", total, self.prompt_cnt)?;
                let dist_spread = match self.dist_tokens.as_slice() {
                    [] => Spread::None,
                    [only] => Spread::Single(*only),
                    _ => Spread::Several,
                };
                check(
                    spread == dist_spread,
                    "the spread disagrees with the distribution",
                )?;
            }
            cap => {
                check(
                    self.dist_tokens.is_empty(),
                    "an exact distribution where samples were asked",
                )?;
                samples(&self.samples, cap, self.prompt_cnt, shard)?;
            }
        }
        suffix_counts(
            &self.suffix_counts,
            &ask.count_lengths,
            matched,
            self.prompt_cnt,
            shard,
        )
    }
}

/// A `Continuations` answer for drafts (asked with a depth): every suffix array's fine samples of
/// the longest suffix found, each with at most `depth` in-vocabulary tokens, and nothing else.
fn drafts(
    a: &spb::ContinuationsAnswer,
    ask: &spb::ContinuationsRequest,
    shard: &ShardIdentity,
) -> Result {
    let nothing_else = a.prompt_cnt == 0
        && a.spread == spb::Spread::None as i32
        && a.single == 0
        && a.dist_tokens.is_empty()
        && a.dist_counts.is_empty()
        && a.samples.is_empty()
        && a.suffix_counts.is_empty();
    check(
        nothing_else,
        "an answer for drafts carries more than drafts",
    )?;
    length("drafts", a.drafts.len(), shard.local_parts as usize)?;
    for array in &a.drafts {
        count("a suffix array's matches", array.matches, shard)?;
        let fine = match a.suffix_len {
            0 => 0,
            _ => array.matches.min(ask.max_support),
        };
        length(
            "a suffix array's continuations",
            array.fine.len(),
            usize::try_from(fine).unwrap_or(usize::MAX),
        )?;
        continuations(&array.fine, ask.depth, shard)?;
    }
    let matches = sum("the drafts' matches", a.drafts.iter().map(|d| d.matches))?;
    check(
        a.suffix_len == 0 || matches > 0,
        "an ∞-gram's suffix found here must occur here",
    )
}

impl ShardAnswer<spb::ScoreTokensRequest> for spb::ScoreTokensAnswer {
    fn validate(&self, ask: &spb::ScoreTokensRequest, shard: &ShardIdentity) -> Result {
        length("tokens", self.tokens.len(), ask.ids.len())?;
        for (i, t) in self.tokens.iter().enumerate() {
            // Position i's match is a suffix of the i tokens before it.
            at_most("a position's suffix_len", t.suffix_len as u64, i as u64)?;
            occurrences(t.prompt_cnt, true, shard)?;
            at_most("cont_cnt", t.cont_cnt, t.prompt_cnt)?;
            let spread = spread(t.spread, t.single, shard)?;
            check(
                (t.prompt_cnt == 0) == (spread == Spread::None),
                "the spread disagrees with prompt_cnt",
            )?;
            match ask.support_samples {
                0 => check(t.support.is_empty(), "support that was not asked")?,
                cap => samples(&t.support, cap, t.prompt_cnt, shard)?,
            }
            suffix_counts(
                &t.suffix_counts,
                &ask.count_lengths,
                t.suffix_len as usize,
                t.prompt_cnt,
                shard,
            )?;
        }
        Ok(())
    }
}

impl ShardAnswer<spb::SearchRequest> for spb::SearchAnswer {
    fn validate(&self, ask: &spb::SearchRequest, shard: &ShardIdentity) -> Result {
        length("clause_places", self.clause_places.len(), ask.cnf.len())?;
        at_most("doc_cnt", self.doc_cnt, shard.documents)?;
        for &places in &self.clause_places {
            count("a clause's places", places, shard)?;
            // Every matching document holds a place of every clause.
            check(
                places >= self.doc_cnt,
                "a clause has fewer places than documents",
            )?;
        }
        at_most(
            "documents",
            self.documents.len() as u64,
            self.doc_cnt.min(ask.maxnum as u64),
        )?;
        for d in &self.documents {
            // Numbered within the shard: the router adds the documents of the shards before it.
            if d.doc_ix >= shard.documents {
                return Err(Malformed::Outside {
                    what: "doc_ix",
                    value: d.doc_ix,
                    end: shard.documents,
                });
            }
            count("doc_len", d.doc_len, shard)?;
            check(
                d.disp_len == d.doc_len.min(ask.max_disp_len as u64),
                "disp_len is not min(doc_len, max_disp_len)",
            )?;
            length(
                "a document's tokens",
                d.token_ids.len(),
                usize::try_from(d.disp_len).unwrap_or(usize::MAX),
            )?;
            at_most("needle_offset", d.needle_offset, d.disp_len)?;
            tokens("a document's tokens", &d.token_ids, shard)?;
        }
        check(
            self.documents.windows(2).all(|w| w[0].doc_ix < w[1].doc_ix),
            "documents out of order",
        )
    }
}

impl ShardAnswer<spb::LiveAppendRequest> for spb::LiveAppendAnswer {
    fn validate(&self, _: &spb::LiveAppendRequest, _: &ShardIdentity) -> Result {
        Ok(())
    }
}

impl ShardAnswer<spb::LiveContinuationsRequest> for spb::LiveContinuationsAnswer {
    fn validate(&self, ask: &spb::LiveContinuationsRequest, shard: &ShardIdentity) -> Result {
        at_most("match_len", self.match_len as u64, ask.pattern.len() as u64)?;
        continuations(&self.continuations, ask.depth, shard)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Hand-made answers of a shard with a vocabulary of 100 and 1000 token slots in two suffix
    //! arrays: each good one passes, and each corruption of the probe's fake shard
    //! (`fake_shard.py`: wrapped counts, ids past the vocabulary, matches longer than the prompt,
    //! documents outside the shard) is refused as what it breaks.

    use super::*;
    use crate::server::pb;

    const BIG: u32 = 4_000_000_000;

    fn shard() -> ShardIdentity {
        ShardIdentity {
            set_id: "s".into(),
            shard: 0,
            shards: 1,
            documents: 10,
            tokens: 1000,
            local_parts: 2,
            token_width: 2,
            eos_token_id: 0,
            vocab_size: 100,
            tokenizer_fingerprint: "t".into(),
            content_id: "c".into(),
        }
    }

    /// A corruption of an answer, by name, and the refusal it must meet.
    type Mode<A> = (&'static str, fn(&mut A), fn(&Malformed) -> bool);

    /// `good` passes; each mode's corruption of it fails as the mode says.
    fn refuses<Q, A: ShardAnswer<Q> + Clone>(ask: &Q, good: &A, modes: &[Mode<A>]) {
        assert_eq!(good.validate(ask, &shard()), Ok(()));
        for (mode, corrupt, refusal) in modes {
            let mut bad = good.clone();
            corrupt(&mut bad);
            match bad.validate(ask, &shard()) {
                Err(why) => assert!(refusal(&why), "{mode}: refused for another reason: {why}"),
                Ok(()) => panic!("{mode}: passed"),
            }
        }
    }

    fn token(m: &Malformed) -> bool {
        matches!(m, Malformed::Token { id: BIG, .. })
    }

    fn bound(m: &Malformed) -> bool {
        matches!(m, Malformed::Bound { .. })
    }

    fn length(m: &Malformed) -> bool {
        matches!(m, Malformed::Length { .. })
    }

    fn inconsistent(m: &Malformed) -> bool {
        matches!(m, Malformed::Inconsistent(_))
    }

    #[test]
    fn counts_must_be_one_per_ngram_and_within_the_shard() {
        let ask = spb::CountRequest {
            ngrams: vec![spb::NGram { ids: vec![1] }, spb::NGram { ids: vec![1, 2] }],
        };
        let good = spb::CountAnswer { counts: vec![5, 0] };
        refuses(
            &ask,
            &good,
            &[
                ("count_max", |a| a.counts = vec![u64::MAX; 2], bound),
                ("count_short", |a| a.counts.clear(), length),
                ("count_long", |a| a.counts.push(1), length),
            ],
        );
    }

    fn exact_ask() -> spb::ContinuationsRequest {
        spb::ContinuationsRequest {
            prompt: vec![1, 2, 3],
            infinite: true,
            count_lengths: vec![1, 2, 4],
            ..Default::default()
        }
    }

    fn exact() -> spb::ContinuationsAnswer {
        spb::ContinuationsAnswer {
            suffix_len: 2,
            prompt_cnt: 7,
            dist_tokens: vec![4, 9],
            dist_counts: vec![5, 2],
            spread: spb::Spread::Several as i32,
            // Lengths 1 and 2: the match's own count last.
            suffix_counts: vec![20, 7],
            ..Default::default()
        }
    }

    #[test]
    fn distributions_must_add_up_within_the_vocabulary_and_the_prompt() {
        refuses(
            &exact_ask(),
            &exact(),
            &[
                (
                    "oov_dist",
                    |a| {
                        a.dist_tokens.push(BIG);
                        a.dist_counts.push(5);
                        a.prompt_cnt += 5;
                    },
                    token,
                ),
                (
                    "oov_single",
                    |a| {
                        a.spread = spb::Spread::Single as i32;
                        a.single = BIG;
                    },
                    token,
                ),
                ("zero_cnt", |a| a.prompt_cnt = 0, inconsistent),
                ("huge_len", |a| a.suffix_len = BIG, bound),
                (
                    "cnt_max",
                    |a| {
                        a.prompt_cnt = u64::MAX;
                        a.dist_counts[0] = u64::MAX;
                    },
                    bound,
                ),
                ("counts_past_prompt_cnt", |a| a.dist_counts[0] = 6, bound),
                (
                    "counts_wrap",
                    |a| a.dist_counts = vec![u64::MAX, 2],
                    |m| matches!(m, Malformed::Overflow { .. }),
                ),
                ("unpaired", |a| a.dist_counts.truncate(1), length),
                ("unordered", |a| a.dist_tokens = vec![9, 4], inconsistent),
                (
                    "unknown_spread",
                    |a| a.spread = 7,
                    |m| *m == Malformed::Spread(7),
                ),
                (
                    "spread_of_another_distribution",
                    |a| {
                        a.spread = spb::Spread::Single as i32;
                        a.single = 4;
                    },
                    inconsistent,
                ),
                (
                    "suffix_counts_short",
                    |a| a.suffix_counts.truncate(1),
                    length,
                ),
                (
                    "suffix_count_below_match",
                    |a| a.suffix_counts[1] = 6,
                    inconsistent,
                ),
                (
                    "samples_unasked",
                    |a| a.samples.push(Default::default()),
                    inconsistent,
                ),
            ],
        );
        // An n-gram (not ∞-gram) answer matches the whole prompt, which may not occur.
        let ngram = spb::ContinuationsRequest {
            infinite: false,
            count_lengths: vec![],
            ..exact_ask()
        };
        let unseen = spb::ContinuationsAnswer {
            suffix_len: 3,
            ..Default::default()
        };
        assert_eq!(unseen.validate(&ngram, &shard()), Ok(()));
        let shorter = spb::ContinuationsAnswer {
            suffix_len: 2,
            ..unseen
        };
        assert!(matches!(
            shorter.validate(&ngram, &shard()),
            Err(Malformed::Inconsistent(_))
        ));
    }

    #[test]
    fn samples_must_be_one_per_suffix_array_and_add_up_to_the_count() {
        let ask = spb::ContinuationsRequest {
            max_support: 4,
            ..exact_ask()
        };
        let run = |token, count| spb::TokenRun { token, count };
        let good = spb::ContinuationsAnswer {
            dist_tokens: vec![],
            dist_counts: vec![],
            samples: vec![
                // 5 matches, 4 picks; 2 matches, both.
                spb::LocalSample {
                    matches: 5,
                    runs: vec![run(4, 3), run(9, 1)],
                },
                spb::LocalSample {
                    matches: 2,
                    runs: vec![run(4, 2)],
                },
            ],
            ..exact()
        };
        refuses(
            &ask,
            &good,
            &[
                ("oov_run", |a| a.samples[0].runs[1].token = BIG, token),
                ("one_array", |a| a.samples.truncate(1), length),
                ("picks", |a| a.samples[1].runs[0].count = 1, inconsistent),
                ("matches", |a| a.samples[1].matches = 3, inconsistent),
                (
                    "exact_too",
                    |a| {
                        a.dist_tokens = vec![4];
                        a.dist_counts = vec![1];
                    },
                    inconsistent,
                ),
            ],
        );
    }

    fn cont(tokens: &[u32]) -> spb::Continuation {
        spb::Continuation {
            tokens: tokens.to_vec(),
        }
    }

    #[test]
    fn drafts_must_be_as_deep_as_asked_and_within_the_vocabulary() {
        let ask = spb::ContinuationsRequest {
            prompt: vec![1, 2, 3],
            infinite: true,
            max_support: 2,
            depth: 3,
            ..Default::default()
        };
        let good = spb::ContinuationsAnswer {
            suffix_len: 2,
            drafts: vec![
                spb::LocalContinuations {
                    matches: 5,
                    fine: vec![cont(&[4, 5, 6]), cont(&[9])],
                },
                spb::LocalContinuations {
                    matches: 1,
                    fine: vec![cont(&[4])],
                },
            ],
            ..Default::default()
        };
        refuses(
            &ask,
            &good,
            &[
                (
                    "oov_draft",
                    |a| {
                        for d in &mut a.drafts {
                            for c in &mut d.fine {
                                c.tokens = vec![BIG; c.tokens.len().max(1)];
                            }
                        }
                    },
                    token,
                ),
                ("huge_len", |a| a.suffix_len = BIG, bound),
                (
                    "too_deep",
                    |a| a.drafts[1].fine[0].tokens = vec![1; 4],
                    bound,
                ),
                ("too_many", |a| a.drafts[1].fine.push(cont(&[4])), length),
                ("one_array", |a| a.drafts.truncate(1), length),
                (
                    "oov_dist_beside",
                    |a| {
                        a.dist_tokens.push(BIG);
                        a.dist_counts.push(5);
                    },
                    inconsistent,
                ),
                ("cnt_max_beside", |a| a.prompt_cnt = u64::MAX, inconsistent),
                (
                    "matches_wrap",
                    |a| {
                        a.drafts[0].matches = u64::MAX;
                        a.drafts[1].matches = u64::MAX;
                    },
                    bound,
                ),
            ],
        );
    }

    fn evidence(suffix_len: u32, prompt_cnt: u64, cont_cnt: u64) -> spb::TokenEvidence {
        spb::TokenEvidence {
            suffix_len,
            prompt_cnt,
            cont_cnt,
            spread: spb::Spread::Several as i32,
            // Asked for length 1, counted up to the match.
            suffix_counts: match suffix_len {
                0 => vec![],
                _ => vec![prompt_cnt.max(40)],
            },
            ..Default::default()
        }
    }

    #[test]
    fn evidence_must_be_one_per_token_within_what_precedes_it() {
        let ask = spb::ScoreTokensRequest {
            ids: vec![4, 9, 4],
            support_samples: 0,
            count_lengths: vec![1],
        };
        let good = spb::ScoreTokensAnswer {
            tokens: vec![
                evidence(0, 1000, 50),
                evidence(1, 50, 20),
                evidence(2, 20, 20),
            ],
        };
        refuses(
            &ask,
            &good,
            &[
                ("score_short", |a| a.tokens.truncate(1), length),
                (
                    "score_long",
                    |a| a.tokens.extend(vec![evidence(1, 1, 1); 5]),
                    length,
                ),
                (
                    "score_badlen",
                    |a| {
                        for t in &mut a.tokens {
                            t.suffix_len = BIG;
                        }
                    },
                    bound,
                ),
                ("cont_past_prompt", |a| a.tokens[1].cont_cnt = 51, bound),
                ("zero_cnt", |a| a.tokens[0].prompt_cnt = 0, inconsistent),
                ("cnt_max", |a| a.tokens[2].prompt_cnt = u64::MAX, bound),
                (
                    "support_unasked",
                    |a| a.tokens[0].support.push(Default::default()),
                    inconsistent,
                ),
            ],
        );
    }

    /// A document shown under `max_disp_len` 5.
    fn doc(doc_ix: u64, doc_len: u64, needle_offset: u64) -> pb::Document {
        let disp_len = doc_len.min(5);
        pb::Document {
            doc_ix,
            doc_len,
            disp_len,
            needle_offset,
            metadata: String::new(),
            token_ids: vec![4; disp_len as usize],
            text: String::new(),
        }
    }

    #[test]
    fn documents_must_lie_in_the_shard_and_show_what_was_asked() {
        let ask = spb::SearchRequest {
            cnf: vec![spb::Clause {
                ngrams: vec![spb::NGram { ids: vec![4] }],
            }],
            strides: vec![1],
            maxnum: 2,
            max_disp_len: 5,
        };
        let good = spb::SearchAnswer {
            doc_cnt: 3,
            clause_places: vec![4],
            documents: vec![doc(1, 8, 2), doc(7, 3, 0)],
        };
        refuses(
            &ask,
            &good,
            &[
                (
                    "search_bad",
                    |a| {
                        for d in &mut a.documents {
                            d.doc_ix = u64::MAX;
                            d.needle_offset = 1 << 63;
                        }
                    },
                    |m| matches!(m, Malformed::Outside { what: "doc_ix", .. }),
                ),
                ("needle", |a| a.documents[0].needle_offset = 6, bound),
                ("oov", |a| a.documents[1].token_ids[0] = BIG, token),
                ("unordered", |a| a.documents.reverse(), inconsistent),
                ("too_many", |a| a.documents.push(doc(8, 1, 0)), bound),
                ("clauses", |a| a.clause_places.push(4), length),
                ("doc_cnt", |a| a.doc_cnt = 11, bound),
                ("places", |a| a.clause_places[0] = 2, inconsistent),
                ("cut", |a| a.documents[0].token_ids.truncate(4), length),
                ("disp_len", |a| a.documents[0].disp_len = 4, inconsistent),
            ],
        );
    }

    #[test]
    fn live_drafts_must_be_as_deep_as_asked_and_within_the_vocabulary() {
        let ask = spb::LiveContinuationsRequest {
            namespace: "n".into(),
            pattern: vec![1, 2, 3],
            samples: 4,
            depth: 3,
        };
        let good = spb::LiveContinuationsAnswer {
            match_len: 2,
            continuations: vec![spb::Continuation { tokens: vec![4, 5] }],
        };
        refuses(
            &ask,
            &good,
            &[
                ("oov", |a| a.continuations[0].tokens[1] = BIG, token),
                ("match_len", |a| a.match_len = BIG, bound),
                (
                    "too_deep",
                    |a| a.continuations[0].tokens = vec![4; 4],
                    bound,
                ),
            ],
        );
    }
}
