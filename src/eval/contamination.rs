//! Benchmark contamination reports (infini-gram mini's bulletin): how much of each evaluation item
//! appears verbatim in the reference data, asked before any perplexity on it is trusted.
//!
//! An item's n-grams are judged by the decontamination rule (`index::build::decontam`): it is contaminated
//! when at least `threshold` of its n-grams occur in the index. One left-to-right pass of the
//! ∞-gram's own match gives, at each position j, the longest suffix of `item[..=j]` that occurs,
//! l(j); the n-gram ending at j occurs exactly when l(j) ≥ n, and the longest match is the largest
//! l(j). So the share and the longest match are exact, whatever the item's length, at the cost of
//! one extension per token (and a binary search where the match breaks). The documents of the
//! longest match come from the document search.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use super::documents::EvalDocument;
use super::{EvalError, Result};
use crate::index::corpus::Corpus;
use crate::index::docs::{SearchOptions, SearchResult};
use crate::index::query::MAX_QUERY_TOKENS;
use crate::index::suffix::{Occurrences, SuffixMatch};
use crate::index::IndexError;

/// The decontamination rule's n-gram over an index of text cut into tokens: 13 tokens (the paper's).
pub const TOKEN_NGRAM: usize = crate::index::build::decontam::DEFAULT_NGRAM;
/// About the same span of text over a byte-level index: 13 SmolLM2 tokens of the mini-Pile are
/// about 46 bytes, of English prose about 55 (the byte index's decontamination used 48).
pub const BYTE_NGRAM: usize = 50;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ContaminationOptions {
    /// n-gram length in the index's tokens.
    pub ngram: usize,
    /// Share of an item's n-grams found that makes it contaminated.
    pub threshold: f64,
    /// Documents listed for each item's longest match.
    pub max_documents: usize,
}

/// A document that holds an item's longest match.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Source {
    pub doc_ix: u64,
    pub metadata: Option<String>,
}

/// One evaluation item against the index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ItemReport {
    /// Position in the input.
    pub item: usize,
    pub domain: String,
    pub tokens: usize,
    /// Its n-grams, and how many occur in the index.
    pub ngrams: usize,
    pub found: usize,
    /// found / ngrams (0 for an item shorter than n).
    pub share: f64,
    pub contaminated: bool,
    /// Tokens of its longest span that occurs, where that span starts, and its count.
    pub longest_match: usize,
    pub longest_start: usize,
    pub longest_count: u64,
    /// Text of that span, when the index has its tokenizer.
    pub longest_text: Option<String>,
    pub documents: Vec<Source>,
}

/// Items of a domain (or all of them) together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub domain: String,
    pub items: usize,
    pub contaminated: usize,
    /// contaminated / items.
    pub contaminated_share: f64,
    /// The items' shares, averaged.
    pub mean_share: f64,
    /// All their n-grams, and the share of them found.
    pub ngrams: usize,
    pub ngram_share: f64,
    /// The longest match of any item.
    pub longest_match: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContaminationReport {
    pub index: String,
    /// "tokens" or "bytes": what n and the lengths count.
    pub unit: &'static str,
    pub options: ContaminationOptions,
    /// Per domain, then "all".
    pub summaries: Vec<Summary>,
    pub items: Vec<ItemReport>,
    /// Items not matched, with why (longer than a query may be), each also logged.
    pub skipped: Vec<Skipped>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    pub item: usize,
    pub domain: String,
    pub tokens: usize,
    pub why: String,
}

/// The report of `items` (tokenized as the index is) against `index`, items in parallel.
pub fn report<I: Corpus + Occurrences>(
    index: &I,
    items: &[EvalDocument],
    opts: &ContaminationOptions,
) -> Result<ContaminationReport> {
    crate::index::build::decontam::check_settings(opts.ngram, opts.threshold)?;
    let (items, skipped): (Vec<&EvalDocument>, Vec<&EvalDocument>) = items
        .iter()
        .partition(|d| d.tokens.len() <= MAX_QUERY_TOKENS);
    let skipped: Vec<Skipped> = skipped
        .into_iter()
        .map(|d| {
            let why = format!(
                "{} tokens, more than a query may have ({MAX_QUERY_TOKENS})",
                d.tokens.len()
            );
            tracing::warn!(item = d.index, path = %d.path, "{why}: item skipped");
            Skipped {
                item: d.index,
                domain: d.domain.clone(),
                tokens: d.tokens.len(),
                why,
            }
        })
        .collect();
    let bar = crate::progress::token_bar(
        items.iter().map(|d| d.tokens.len() as u64).sum(),
        "matching",
    );
    let reports = items
        .par_iter()
        .map(|d| {
            let r = item(index, d, opts);
            bar.inc(d.tokens.len() as u64);
            r
        })
        .collect::<Result<Vec<_>>>()?;
    bar.finish_and_clear();
    let mut by_domain: BTreeMap<&str, Vec<&ItemReport>> = BTreeMap::new();
    for r in &reports {
        by_domain.entry(&r.domain).or_default().push(r);
    }
    let mut summaries: Vec<Summary> = by_domain
        .into_iter()
        .map(|(domain, rs)| summarise(domain, &rs))
        .collect();
    summaries.push(summarise("all", &reports.iter().collect::<Vec<_>>()));
    Ok(ContaminationReport {
        index: index.dir().display().to_string(),
        unit: match index.is_byte_level() {
            true => "bytes",
            false => "tokens",
        },
        options: *opts,
        summaries,
        items: reports,
        skipped,
    })
}

/// One item's n-gram share and longest match (module notes), and that match's documents.
pub fn item<I: Corpus + Occurrences>(
    index: &I,
    doc: &EvalDocument,
    opts: &ContaminationOptions,
) -> Result<ItemReport> {
    let tokens = &doc.tokens;
    Corpus::check_ids(index, tokens)
        .map_err(|e| EvalError::Invalid(format!("item {} of {}: {e}", doc.index, doc.path)))?;
    let mut matched = SuffixMatch::new(index);
    let (mut found, mut longest, mut longest_end) = (0, 0, 0);
    for end in 1..=tokens.len() {
        if end % 4096 == 0 && crate::interrupt::interrupted() {
            return Err(IndexError::Interrupted.into());
        }
        matched.advance(index, &tokens[..end]);
        let len = matched.suffix_len();
        if len >= opts.ngram {
            found += 1;
        }
        if len > longest {
            (longest, longest_end) = (len, end);
        }
    }
    let ngrams = (tokens.len() + 1).saturating_sub(opts.ngram);
    let share = match ngrams {
        0 => 0.0,
        n => found as f64 / n as f64,
    };
    let span = &tokens[longest_end - longest..longest_end];
    let (longest_count, documents) = match longest {
        0 => (0, Vec::new()),
        _ => {
            let search = SearchOptions {
                maxnum: opts.max_documents,
                max_disp_len: 0,
                ..SearchOptions::default()
            };
            // A compressed index refuses a search it cannot visit whole: the span's count stands
            // without its documents then.
            let found = match index.search_docs_cnf(&[vec![span.to_vec()]], search) {
                Err(IndexError::Unsupported(why)) => {
                    tracing::warn!(
                        item = doc.index,
                        "{why}: the longest match's documents left out"
                    );
                    SearchResult {
                        cnt: index.count(span)?,
                        ..SearchResult::default()
                    }
                }
                found => found?,
            };
            let sources = found
                .documents
                .into_iter()
                .map(|d| Source {
                    doc_ix: d.doc_ix,
                    metadata: d.metadata,
                })
                .collect();
            (found.cnt, sources)
        }
    };
    Ok(ItemReport {
        item: doc.index,
        domain: doc.domain.clone(),
        tokens: tokens.len(),
        ngrams,
        found,
        share,
        contaminated: ngrams > 0 && share >= opts.threshold,
        longest_match: longest,
        longest_start: longest_end - longest,
        longest_count,
        longest_text: index.tokenizer().and_then(|t| t.decode(span).ok()),
        documents,
    })
}

fn summarise(domain: &str, items: &[&ItemReport]) -> Summary {
    let n = items.len().max(1) as f64;
    let contaminated = items.iter().filter(|r| r.contaminated).count();
    let ngrams: usize = items.iter().map(|r| r.ngrams).sum();
    let found: usize = items.iter().map(|r| r.found).sum();
    Summary {
        domain: domain.to_string(),
        items: items.len(),
        contaminated,
        contaminated_share: contaminated as f64 / n,
        mean_share: items.iter().map(|r| r.share).sum::<f64>() / n,
        ngrams,
        ngram_share: found as f64 / ngrams.max(1) as f64,
        longest_match: items.iter().map(|r| r.longest_match).max().unwrap_or(0),
    }
}

/// The report as Markdown: its rule, a line per domain and overall, then the `worst` items with
/// the largest shares.
pub fn markdown(report: &ContaminationReport, worst: usize) -> String {
    let o = &report.options;
    let mut out = format!(
        "Contamination of the input in `{}`: an item is contaminated when at least {:.0}% of its \
         {}-grams ({}) occur in the index.\n\n\
         | domain | items | contaminated | n-grams found | mean item share | longest match ({}) |\n\
         |---|---|---|---|---|---|\n",
        report.index,
        100.0 * o.threshold,
        o.ngram,
        report.unit,
        report.unit
    );
    for s in &report.summaries {
        out.push_str(&format!(
            "| {} | {} | {} ({:.1}%) | {:.1}% | {:.1}% | {} |\n",
            s.domain,
            s.items,
            s.contaminated,
            100.0 * s.contaminated_share,
            100.0 * s.ngram_share,
            100.0 * s.mean_share,
            s.longest_match
        ));
    }
    for k in &report.skipped {
        out.push_str(&format!(
            "\nItem {} ({}) was skipped: {}.\n",
            k.item, k.domain, k.why
        ));
    }
    let mut items: Vec<&ItemReport> = report.items.iter().collect();
    items.sort_by(|a, b| b.share.total_cmp(&a.share).then(a.item.cmp(&b.item)));
    items.truncate(worst);
    if !items.is_empty() {
        out.push_str(&format!(
            "\nThe {} items with the largest shares:\n\n\
             | item | domain | {} | n-grams found | longest match | its count | documents |\n\
             |---|---|---|---|---|---|---|\n",
            items.len(),
            report.unit
        ));
    }
    for r in items {
        let docs: Vec<String> = r.documents.iter().map(|d| d.doc_ix.to_string()).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} of {} ({:.1}%){} | {} | {} | {} |\n",
            r.item,
            r.domain,
            r.tokens,
            r.found,
            r.ngrams,
            100.0 * r.share,
            if r.contaminated {
                " **contaminated**"
            } else {
                ""
            },
            r.longest_match,
            r.longest_count,
            docs.join(", ")
        ));
    }
    out
}
