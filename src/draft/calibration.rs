//! How well each draft source has been predicting this sequence, learnt from what the decoding loop
//! appends after a draft. ∞-gram estimates from short or rare suffixes are overconfident (a suffix
//! seen once predicts its one continuation with probability 1), and prompt lookup has no
//! probabilities at all; so each source's per-token probabilities are scaled by the tokens it got
//! accepted per token it expected, among the tokens the target produced after its draft (every
//! source's offer is followed, not only the one handed out: a source that lost is still measured
//! on what the target did there, and can win again). A path's
//! probability is then the product of its calibrated tokens', and drafting stops where that falls
//! below the cost of a verification row: drafts grow with a source's record and shrink to nothing
//! when it keeps missing. A source keeps one record for its drafts after long matches and one for
//! the rest (`DraftOptions::long_match`).

use super::{DraftOptions, DraftTree};

/// A source with no record yet is trusted at 0.7 of its word, with the weight of two checked
/// tokens. Its word is often a single occurrence's continuation, every token at probability 1:
/// taken at that, a new sequence's first draft runs to its full length, and a rejection near its
/// start wastes most of its rows. In the workload replay (eval/RESULTS.md) 0.6–0.9 drafted within
/// 2% of each other, and 1.0 (full trust) about 5% slower on the warm part.
const PRIOR: Record = Record {
    expected: 2.0,
    accepted: 1.4,
};
/// Weight kept by a source's record at each of its settled drafts, so it follows the text.
const DECAY: f64 = 0.9;
/// Weight kept at each draft call where the source drafted nothing, the rest going back to the
/// prior: a source silenced by a bad run is tried again after a while.
const IDLE_DECAY: f64 = 0.99;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Record {
    expected: f64,
    accepted: f64,
}

impl Record {
    fn factor(&self) -> f64 {
        self.accepted / self.expected
    }

    fn add(&mut self, keep: f64, expected: f64, accepted: f64) {
        self.expected = keep * self.expected + expected;
        self.accepted = keep * self.accepted + accepted;
    }
}

/// Which of the drafter's own sources a draft came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Index,
    Prompt,
    Live,
    Reference,
}

impl Origin {
    pub const ALL: [Origin; 4] = [
        Origin::Index,
        Origin::Prompt,
        Origin::Live,
        Origin::Reference,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Origin::Index => "index",
            Origin::Prompt => "prompt",
            Origin::Live => "live",
            Origin::Reference => "reference",
        }
    }
}

/// A draft scaled by its source's record, with each node's unscaled probability given its parent
/// (what the record counts when the draft is settled).
#[derive(Debug, Clone)]
pub struct Calibrated {
    pub tree: DraftTree,
    conditionals: Vec<f64>,
    /// Whether it followed a long match: the record it settles in.
    long: bool,
}

/// A source's draft not yet settled, whether or not it was the one handed out: the path the
/// appended tokens have followed so far.
#[derive(Debug, Clone)]
struct Outstanding {
    origin: Origin,
    draft: Calibrated,
    /// The node the last appended token matched (−1: none yet).
    at: i32,
    accepted: usize,
    /// Unscaled probability that the target accepts one of the nodes it has checked so far.
    expected: f64,
    /// The part of `expected` from the level after the last accepted node, which the target has
    /// checked only if the loop appended its own token there.
    next_level: f64,
}

impl Outstanding {
    /// Adds the chance of the level the target checks next: any child of `at`.
    fn check_level(&mut self) {
        let tree = &self.draft.tree;
        self.next_level = (0..tree.len())
            .filter(|&i| tree.parents[i] == self.at)
            .map(|i| self.draft.conditionals[i])
            .sum::<f64>();
        self.expected += self.next_level;
    }
}

#[derive(Debug, Clone)]
pub struct Calibration {
    /// Each source's records: after short matches, after long ones.
    records: [[Record; 2]; Origin::ALL.len()],
    /// Each source's open draft: every source's offer at the last draft, handed out or not.
    outstanding: Vec<Outstanding>,
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            records: [[PRIOR; 2]; Origin::ALL.len()],
            outstanding: Vec::new(),
        }
    }
}

impl Calibration {
    /// Accepted tokens per expected token of `origin`'s drafts so far, after long matches or
    /// after short ones.
    pub fn factor(&self, origin: Origin, long: bool) -> f64 {
        self.records[origin as usize][long as usize].factor()
    }

    /// Whether `origin` can draft anything worth its row, as far as its records tell before it is
    /// read: after a match of `match_len` tokens where that is known beforehand (the index's,
    /// followed as the sequence grows), else after either kind of match. A source that cannot is
    /// not read (its reads cost more than a drafted token is worth), only nudged back.
    pub fn may_draft(&self, origin: Origin, match_len: Option<usize>, opts: &DraftOptions) -> bool {
        let factor = match match_len {
            Some(len) => self.factor(origin, opts.is_long(len)),
            None if opts.long_match == 0 => self.factor(origin, false),
            None => self.factor(origin, false).max(self.factor(origin, true)),
        };
        factor >= opts.min_path_prob
    }

    /// Scales `tree`'s per-token probabilities by its source's factor for the tree's match (capped
    /// at 1) and keeps the nodes whose path is still at least `opts.min_path_prob` likely: each
    /// kept node is worth more than the verification row it costs. Path probabilities never grow
    /// along a path, so what is kept is still a tree.
    pub fn calibrate(&self, origin: Origin, tree: DraftTree, opts: &DraftOptions) -> Calibrated {
        let long = opts.is_long(tree.match_len);
        let factor = self.factor(origin, long);
        let min_path_prob = opts.min_path_prob;
        let (out, kept) = tree.rebuilt(|i, parent_path| {
            let path = parent_path * (tree.conditional(i) * factor).min(1.0);
            (path >= min_path_prob && path > 0.0).then_some(path)
        });
        Calibrated {
            conditionals: kept.iter().map(|&i| tree.conditional(i)).collect(),
            tree: out,
            long,
        }
    }

    /// The highest score a chain from `origin` after a match of `match_len` tokens can have after
    /// [`Self::calibrate`]: as deep as the options let it be, every token certain. Path
    /// probabilities are multiplied in the same order as there, so the bound holds in floating
    /// point too.
    pub fn chain_bound(&self, origin: Origin, match_len: usize, opts: &DraftOptions) -> f64 {
        let (depth, min_path_prob) = (opts.depth_for(match_len), opts.min_path_prob);
        let step = self.factor(origin, opts.is_long(match_len)).min(1.0);
        let (mut path, mut score) = (1.0f64, 0.0);
        for _ in 0..depth {
            path *= step;
            if !(path >= min_path_prob && path > 0.0) {
                break;
            }
            score += path;
        }
        score
    }

    /// Notes that `origin` had nothing to draft: its records drift back towards the prior.
    pub fn idle(&mut self, origin: Origin) {
        let back = 1.0 - IDLE_DECAY;
        for record in &mut self.records[origin as usize] {
            record.add(IDLE_DECAY, back * PRIOR.expected, back * PRIOR.accepted);
        }
    }

    /// Remembers `origin`'s offer, replacing its previous one (release the previous drafts before
    /// calibrating new ones). An offer that was not handed out is settled on the tokens appended
    /// all the same: they are what the target produced there, so they tell what it would have
    /// accepted of it.
    pub fn drafted(&mut self, origin: Origin, draft: Calibrated) {
        self.outstanding.retain(|o| o.origin != origin);
        if draft.tree.is_empty() {
            return;
        }
        let mut o = Outstanding {
            origin,
            draft,
            at: -1,
            accepted: 0,
            expected: 0.0,
            next_level: 0.0,
        };
        o.check_level();
        self.outstanding.push(o);
    }

    /// Follows the open drafts with an appended token; settles each at the first token off its
    /// paths or past its leaves.
    pub fn appended(&mut self, token: u32) {
        let mut settled = Vec::new();
        self.outstanding.retain_mut(|o| {
            let tree = &o.draft.tree;
            let next =
                (0..tree.len()).find(|&i| tree.parents[i] == o.at && tree.token_ids[i] == token);
            match next {
                Some(i) => {
                    o.at = i as i32;
                    o.accepted += 1;
                    o.check_level();
                    true
                }
                None => {
                    settled.push((o.origin, o.draft.long, o.expected, o.accepted));
                    false
                }
            }
        });
        for (origin, long, expected, accepted) in settled {
            self.settle(origin, long, expected, accepted);
        }
    }

    /// Ends the open drafts before new drafts or a truncation: each settled on the tokens appended
    /// along it, the level after them unchecked (a loop that appends one token per step redrafts
    /// there); forgotten if nothing was appended (the draft was asked for again, or never verified).
    pub fn release(&mut self) {
        for o in std::mem::take(&mut self.outstanding) {
            if o.accepted > 0 {
                self.settle(
                    o.origin,
                    o.draft.long,
                    o.expected - o.next_level,
                    o.accepted,
                );
            }
        }
    }

    /// What a draft's checked tokens were expected to give against what was accepted.
    fn settle(&mut self, origin: Origin, long: bool, expected: f64, accepted: usize) {
        self.records[origin as usize][long as usize].add(DECAY, expected, accepted as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default options with this path bar.
    fn bar_at(min_path_prob: f64) -> DraftOptions {
        DraftOptions {
            min_path_prob,
            ..DraftOptions::default()
        }
    }

    fn chain(tokens: &[u32], probs: &[f64]) -> DraftTree {
        DraftTree {
            token_ids: tokens.to_vec(),
            parents: (0..tokens.len() as i32).map(|i| i - 1).collect(),
            probs: probs.to_vec(),
            score: probs.iter().sum(),
            match_len: 3,
        }
    }

    /// Root children 5 and 7, and 6 under 5, with these path probabilities.
    fn fork(probs: [f64; 3]) -> DraftTree {
        DraftTree {
            token_ids: vec![5, 7, 6],
            parents: vec![-1, -1, 0],
            probs: probs.to_vec(),
            score: probs.iter().sum(),
            match_len: 2,
        }
    }

    #[test]
    fn missed_drafts_shrink_the_source_and_spare_the_other() {
        let mut c = Calibration::default();
        assert_eq!(c.factor(Origin::Index, false), PRIOR.factor());
        // Three chains of certain tokens, each rejected at its first token: one checked token
        // expected (probability 1), none accepted.
        for _ in 0..3 {
            let d = c.calibrate(Origin::Index, chain(&[5, 6], &[1.0, 1.0]), &bar_at(0.0));
            c.drafted(Origin::Index, d);
            c.appended(9);
        }
        let (mut e, mut a) = (PRIOR.expected, PRIOR.accepted);
        for _ in 0..3 {
            (e, a) = (DECAY * e + 1.0, DECAY * a);
        }
        assert!((c.factor(Origin::Index, false) - a / e).abs() < 1e-12);
        assert_eq!(c.factor(Origin::Prompt, false), PRIOR.factor());
        // 1.0 · 0.24 passes a 0.2 bar, the second token's path (0.24 · 0.24) does not.
        let d = c.calibrate(Origin::Index, chain(&[5, 6], &[1.0, 1.0]), &bar_at(0.2));
        assert_eq!(d.tree.token_ids, vec![5]);
        assert!((d.tree.probs[0] - a / e).abs() < 1e-12);
    }

    /// A new sequence's first draft of certain tokens stops where 0.7^k falls under the bar.
    #[test]
    fn a_source_without_a_record_is_not_taken_at_its_word() {
        let c = Calibration::default();
        let d = c.calibrate(
            Origin::Live,
            chain(&[1, 2, 3, 4, 5, 6], &[1.0; 6]),
            &bar_at(0.2),
        );
        // .7, .49, .34, .24 pass; .17 does not.
        assert_eq!(d.tree.token_ids, vec![1, 2, 3, 4]);
    }

    /// The bound is what a chain of certain tokens scores after calibration, and nothing less
    /// certain scores more: for a fresh record, a shrunk one and one above 1 (capped at 1).
    #[test]
    fn no_chain_scores_above_its_bound() {
        // After a short match and a long one: each record as the drafts below settle it.
        let check = |c: &Calibration| {
            let cases = (0..8).flat_map(|d| [0.0, 0.2, 0.5].map(|b| [3, 20].map(|m| (d, b, m))));
            for (depth, bar, match_len) in cases.flatten() {
                // As deep as `depth` whatever the match.
                let opts = DraftOptions {
                    max_tokens: depth,
                    match_len_factor: 0.0,
                    ..bar_at(bar)
                };
                let bound = c.chain_bound(Origin::Live, match_len, &opts);
                let after_match = |probs: &[f64]| DraftTree {
                    match_len,
                    ..chain(&[1; 8][..depth], probs)
                };
                let scored = |t| c.calibrate(Origin::Live, t, &opts).tree.score;
                let certain = after_match(&[1.0; 8][..depth]);
                assert_eq!(
                    scored(certain),
                    bound,
                    "depth {depth} bar {bar} match {match_len}"
                );
                let unsure: Vec<f64> = (1..=depth).map(|k| 0.97f64.powi(k as i32)).collect();
                assert!(scored(after_match(&unsure)) <= bound);
            }
        };
        // Settles one draft of `probs` on tokens 5, 6 after a match of `match_len`, followed by
        // `taken`.
        let settle = |c: &mut Calibration, match_len, probs: &[f64], taken: [u32; 3]| {
            let after_match = DraftTree {
                match_len,
                ..chain(&[5, 6], probs)
            };
            let d = c.calibrate(Origin::Live, after_match, &bar_at(0.0));
            c.drafted(Origin::Live, d);
            for t in taken {
                c.appended(t);
            }
            c.release();
        };
        let mut c = Calibration::default();
        check(&c);
        // The short record shrinks, then the long one.
        settle(&mut c, 3, &[1.0, 1.0], [9, 9, 9]);
        assert!(c.factor(Origin::Live, false) < PRIOR.factor());
        check(&c);
        settle(&mut c, 20, &[1.0, 1.0], [9, 9, 9]);
        assert!(c.factor(Origin::Live, true) < PRIOR.factor());
        check(&c);
        // Unlikely drafts accepted whole, until the long record is above 1, then the short one.
        for long in [true, false] {
            for _ in 0..50 {
                if c.factor(Origin::Live, long) > 1.0 {
                    break;
                }
                settle(&mut c, if long { 20 } else { 3 }, &[0.5, 0.25], [5, 6, 9]);
            }
            check(&c);
        }
        assert!(c.factor(Origin::Live, true) > 1.0);
        assert!(c.factor(Origin::Live, false) > 1.0);
        assert_eq!(c.chain_bound(Origin::Live, 3, &bar_at(0.0)), 3.0);
    }

    /// Drafts of both sources handed out as one union: each is followed and settled on its own.
    #[test]
    fn open_drafts_of_both_sources_settle_on_their_own() {
        let mut c = Calibration::default();
        let index = c.calibrate(Origin::Index, chain(&[5, 6], &[1.0, 1.0]), &bar_at(0.0));
        let prompt = c.calibrate(Origin::Prompt, chain(&[7, 8], &[1.0, 1.0]), &bar_at(0.0));
        c.drafted(Origin::Index, index);
        c.drafted(Origin::Prompt, prompt);
        // The target takes 5 then 6, then its own 9: the index draft is accepted whole, the
        // prompt's first token rejected.
        for t in [5, 6, 9] {
            c.appended(t);
        }
        c.release();
        let missed = (DECAY * PRIOR.accepted) / (DECAY * PRIOR.expected + 1.0);
        assert!((c.factor(Origin::Prompt, false) - missed).abs() < 1e-12);
        let taken = (DECAY * PRIOR.accepted + 2.0) / (DECAY * PRIOR.expected + 2.0);
        assert!((c.factor(Origin::Index, false) - taken).abs() < 1e-12);
    }

    /// Misses after short matches leave the long-match record as it was, and a long match's
    /// accepted draft raises only its own; with `long_match` 0 a source has one record.
    #[test]
    fn long_matches_keep_a_record_of_their_own() {
        let after_long = |tokens: &[u32]| DraftTree {
            match_len: 20,
            ..chain(tokens, &vec![1.0; tokens.len()])
        };
        let miss_three_short = |c: &mut Calibration, opts: &DraftOptions| {
            for _ in 0..3 {
                let d = c.calibrate(Origin::Live, chain(&[5, 6], &[1.0, 1.0]), opts);
                c.drafted(Origin::Live, d);
                c.appended(9);
            }
        };
        let apart = bar_at(0.2);
        assert_eq!(apart.long_match, 12);
        let mut c = Calibration::default();
        miss_three_short(&mut c, &apart);
        assert!(c.factor(Origin::Live, false) < 0.25);
        assert_eq!(c.factor(Origin::Live, true), PRIOR.factor());
        // At a bar above the short record: not read after a short match known beforehand; read
        // where the match is not known, as it may be long.
        let above_short = DraftOptions {
            min_path_prob: 0.3,
            ..apart
        };
        assert!(!c.may_draft(Origin::Live, Some(3), &above_short));
        assert!(c.may_draft(Origin::Live, Some(20), &above_short));
        assert!(c.may_draft(Origin::Live, None, &above_short));
        // A long match's certain chain drafts as a fresh record lets it: .7, .49, .34, .24.
        let d = c.calibrate(Origin::Live, after_long(&[1, 2, 3, 4, 5, 6]), &apart);
        assert_eq!(d.tree.token_ids, vec![1, 2, 3, 4]);
        let short_before = c.factor(Origin::Live, false);
        c.drafted(Origin::Live, d);
        for t in [1, 2, 3, 4, 7] {
            c.appended(t);
        }
        assert!(c.factor(Origin::Live, true) > PRIOR.factor());
        assert_eq!(c.factor(Origin::Live, false), short_before);
        // One record: the short matches' misses cut the long match's draft to one token.
        let one = DraftOptions {
            long_match: 0,
            ..apart
        };
        let mut c = Calibration::default();
        miss_three_short(&mut c, &one);
        let d = c.calibrate(Origin::Live, after_long(&[1, 2, 3, 4, 5, 6]), &one);
        assert_eq!(d.tree.token_ids, vec![1]);
        // With one record a source the bar silences is not read, whatever its match.
        let silenced = DraftOptions {
            min_path_prob: 0.3,
            ..one
        };
        assert!(!c.may_draft(Origin::Live, None, &silenced));
        assert!(!c.may_draft(Origin::Live, Some(20), &silenced));
    }

    #[test]
    fn a_draft_asked_for_again_counts_for_nothing() {
        let mut c = Calibration::default();
        for _ in 0..3 {
            let d = c.calibrate(Origin::Index, chain(&[5, 6], &[1.0, 1.0]), &bar_at(0.0));
            c.drafted(Origin::Index, d);
        }
        c.release();
        assert_eq!(c.factor(Origin::Index, false), PRIOR.factor());
    }

    #[test]
    fn a_redraft_after_accepted_tokens_counts_only_the_checked_levels() {
        let mut c = Calibration::default();
        let d = c.calibrate(
            Origin::Index,
            chain(&[5, 6, 7], &[0.8, 0.4, 0.2]),
            &bar_at(0.0),
        );
        c.drafted(Origin::Index, d);
        c.appended(5);
        c.release();
        // One level checked (.8 expected), one token accepted.
        let want = (DECAY * PRIOR.accepted + 1.0) / (DECAY * PRIOR.expected + 0.8);
        assert!((c.factor(Origin::Index, false) - want).abs() < 1e-12);
    }

    #[test]
    fn a_silenced_source_drifts_back() {
        let mut c = Calibration::default();
        for _ in 0..10 {
            let d = c.calibrate(Origin::Prompt, chain(&[5], &[1.0]), &bar_at(0.0));
            c.drafted(Origin::Prompt, d);
            c.appended(9);
        }
        let low = c.factor(Origin::Prompt, false);
        assert!(low < 0.3, "{low}");
        for _ in 0..300 {
            let d = c.calibrate(Origin::Prompt, chain(&[5], &[1.0]), &bar_at(1.1));
            assert!(d.tree.is_empty());
            c.idle(Origin::Prompt);
        }
        assert!(
            c.factor(Origin::Prompt, false) > 0.5,
            "{}",
            c.factor(Origin::Prompt, false)
        );
    }

    #[test]
    fn accepted_paths_are_followed_through_a_tree() {
        let mut c = Calibration::default();
        // Root children 5 (p .6) and 7 (p .2); 5 → 6 (path .36, so .6 given 5).
        let tree = fork([0.6, 0.2, 0.36]);
        let draft = c.calibrate(Origin::Prompt, tree.clone(), &bar_at(0.0));
        assert_eq!(
            (&draft.tree.token_ids, &draft.tree.parents),
            (&tree.token_ids, &tree.parents)
        );
        c.drafted(Origin::Prompt, draft);
        for t in [5, 6, 8] {
            c.appended(t);
        }
        // Checked: the root's children (.6 + .2), then 5's child (.6); 6 has none. Two accepted.
        let want = (PRIOR.accepted * DECAY + 2.0) / (PRIOR.expected * DECAY + 1.4);
        assert!((c.factor(Origin::Prompt, false) - want).abs() < 1e-12);
        // Scaled by 3.26 / 3.2, capped at 1 per token: 5 → .61, 7 → .20, 6 → .61 · .61 = .37.
        let t = c.calibrate(Origin::Prompt, tree, &bar_at(0.3)).tree;
        assert_eq!(
            (t.token_ids.clone(), t.parents.clone()),
            (vec![5, 6], vec![-1, 0])
        );
        assert!(t.validate(100).is_ok(), "{:?}", t.validate(100));
    }

    #[test]
    fn a_pruned_parent_takes_its_children() {
        let c = Calibration::default();
        let t = c
            .calibrate(Origin::Index, fork([0.2, 0.5, 0.2]), &bar_at(0.3))
            .tree;
        assert_eq!((t.token_ids, t.parents), (vec![7], vec![-1]));
    }
}
