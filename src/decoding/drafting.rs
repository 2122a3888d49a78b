//! Drafting for a sequence: each source offers a draft continuing it (the reference index, its own
//! tokens, its live namespace, its reference text), calibrated by the source's record, and the best
//! offer (or, for trees, their union) is handed out. The tokens appended next settle every
//! source's record, its offer handed out or not.

use super::Sequence;
use crate::draft::calibration::{Calibrated, Origin};
use crate::draft::{DraftOptions, DraftTree};
use crate::index::Result;

impl Sequence {
    /// A draft continuing the sequence. The tokens appended next tell the sequence how much of it
    /// was accepted.
    /// A draft that fails (the reference data did not answer) leaves the sequence as it was.
    pub fn draft(&mut self, opts: &DraftOptions) -> Result<DraftTree> {
        let before = (self.calibration.clone(), self.last_origin);
        let drafted = self.draft_here(opts);
        if drafted.is_err() {
            (self.calibration, self.last_origin) = before;
        }
        drafted
    }

    fn draft_here(&mut self, opts: &DraftOptions) -> Result<DraftTree> {
        self.calibration.release();
        self.last_origin = None;
        let mut offers = Vec::new();
        // The static index is read last: its reads are the dearest (pages of a large mapped
        // file), and a chain from it is not read at all when even a certain one of its depth
        // would score below the best offer in hand. Such a step leaves its record as it is,
        // where a read that came back empty would have let it drift back. Offers keep
        // `Origin::ALL`'s order, which decides ties.
        let (index_first, others) = Origin::ALL.split_at(1);
        for &origin in others.iter().chain(index_first) {
            if !opts.source.includes(origin) || !self.has(origin) {
                continue;
            }
            // The index's match is known before it is read; the other sources find theirs in
            // the read.
            let known_match = (origin == Origin::Index).then(|| self.matched_tokens());
            let mut nothing_to_read = !self.calibration.may_draft(origin, known_match, opts);
            if let (Some(matched), false) = (known_match, opts.tree) {
                let bound = self.calibration.chain_bound(origin, matched, opts);
                let outscored = |(_, d): &(Origin, Calibrated)| d.tree.score > bound;
                if bound > 0.0 && offers.iter().any(outscored) {
                    continue;
                }
                // A chain that can score nothing is empty for certain: idle, as if read.
                nothing_to_read |= bound <= 0.0;
            }
            let tree = match nothing_to_read {
                true => DraftTree::default(),
                false => self.raw_draft(origin, opts)?,
            };
            let draft = self.calibrate(origin, tree, opts);
            if draft.tree.is_empty() {
                self.calibration.idle(origin);
            }
            let at = offers
                .partition_point(|(o, _): &(Origin, Calibrated)| (*o as usize) < (origin as usize));
            offers.insert(at, (origin, draft));
        }
        let handed_out = if opts.tree && offers.len() > 1 {
            (offers.iter())
                .map(|(_, d)| &d.tree)
                .fold(DraftTree::default(), |u, t| u.union(t))
                .best(opts.tree_budget)
        } else {
            let best = offers.iter().reduce(|a, b| {
                if b.1.tree.score > a.1.tree.score {
                    b
                } else {
                    a
                }
            });
            match best {
                Some((origin, draft)) => {
                    self.last_origin = (!draft.tree.is_empty()).then_some(*origin);
                    draft.tree.clone()
                }
                None => DraftTree::default(),
            }
        };
        // Every offer is followed, not only the one handed out: the tokens appended next show
        // how far each would have gone, so a source that lost (one early miss can sink its record
        // below another source's short certain drafts) is still measured and can win again.
        for (origin, draft) in offers {
            self.calibration.drafted(origin, draft);
        }
        Ok(handed_out)
    }

    /// Where the last draft came from: `None` for a union of several sources, or no draft.
    pub fn last_origin(&self) -> Option<Origin> {
        self.last_origin
    }

    fn has(&self, origin: Origin) -> bool {
        match origin {
            Origin::Index => self.followed.is_some(),
            Origin::Prompt => true,
            Origin::Live => self.live.is_some(),
            Origin::Reference => self.reference.is_some(),
        }
    }

    /// `origin`'s draft before calibration.
    fn raw_draft(&self, origin: Origin, opts: &DraftOptions) -> Result<DraftTree> {
        let (conts, len) = match origin {
            Origin::Index => {
                let Some(followed) = &self.followed else {
                    return Ok(DraftTree::default());
                };
                let len = followed.matched_tokens();
                let depth = opts.depth_for(len);
                let conts = followed.continuations(&self.tokens, opts.index_samples, depth)?;
                (conts, len)
            }
            Origin::Prompt => self.lookup.continuations(&self.tokens, opts.max_tokens),
            Origin::Live => match &self.live {
                Some(link) => link.live.continuations(
                    &link.namespace,
                    &self.tokens,
                    opts.index_samples,
                    opts.max_tokens,
                ),
                None => (Vec::new(), 0),
            },
            Origin::Reference => match &self.reference {
                Some(r) => r
                    .lookup
                    .continuations_in(&r.tokens, &self.tokens, opts.max_tokens),
                None => (Vec::new(), 0),
            },
        };
        Ok(opts.draft_from(&conts, len))
    }

    /// Tokens of the sequence its match in the reference data covers.
    fn matched_tokens(&self) -> usize {
        self.followed.as_ref().map_or(0, |f| f.matched_tokens())
    }

    fn calibrate(&self, origin: Origin, tree: DraftTree, opts: &DraftOptions) -> Calibrated {
        self.calibration.calibrate(origin, tree, opts)
    }
}
