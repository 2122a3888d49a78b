//! What the commands print for people: a few lines and aligned tables. The full reports are JSON,
//! printed instead on `--json` or written to the files a command names on its last line. `query`
//! and `tokenize` print JSON only: programs read them.

use std::path::Path;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use infini_sidecar::eval::backoff::BackoffReport;
use infini_sidecar::eval::experiment::{FitSummary, MIN_DOMAIN_TOKENS};
use infini_sidecar::eval::neural::{ScoreReport, Totals};
use infini_sidecar::eval::report::PplReport;
use infini_sidecar::index::build::BuildReport;
use infini_sidecar::index::format::DecontaminationRecord;
use infini_sidecar::index::info::CompressedInfo;
use infini_sidecar::index::{IndexInfo, IndexShape};
use infini_sidecar::mix::{improvement_percent, MixingParams};
use infini_sidecar::model::Generation;

/// How many of the gate's features `eval fit` lists.
const TOP_FEATURES: usize = 5;

/// `--json`: the full report, for programs, in place of the summary.
#[derive(Args)]
pub struct Format {
    /// Print the full report as JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

impl Format {
    /// Prints `report` as JSON with `--json`, else the summary `text` makes of it.
    pub fn print<T: Serialize>(&self, report: &T, text: impl FnOnce() -> String) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// Columns padded to their widest cell: the leading name columns aligned left, the figures right,
/// so that numbers line up on their last digit.
pub struct Table {
    header: Option<Vec<String>>,
    rows: Vec<Vec<String>>,
    left_columns: usize,
}

impl Table {
    /// Rows of figures under `header`, named by their first cell.
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: Some(header.iter().map(|h| h.to_string()).collect()),
            rows: Vec::new(),
            left_columns: 1,
        }
    }

    /// Label and value lines, without a header.
    pub fn fields() -> Self {
        Self {
            header: None,
            rows: Vec::new(),
            left_columns: 2,
        }
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// The table indented by two spaces, a line per row.
    pub fn render(&self) -> String {
        let lines: Vec<&Vec<String>> = self.header.iter().chain(&self.rows).collect();
        let columns = lines.iter().map(|l| l.len()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                lines
                    .iter()
                    .filter_map(|l| l.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for line in lines {
            let mut text = String::new();
            for (c, cell) in line.iter().enumerate() {
                let pad = " ".repeat(widths[c] - cell.chars().count());
                text += "  ";
                if c < self.left_columns {
                    text += &format!("{cell}{pad}");
                } else {
                    text += &format!("{pad}{cell}");
                }
            }
            out += text.trim_end();
            out.push('\n');
        }
        out
    }
}

/// `n` with thousands separated: 14,625,375.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// The last line of a command that wrote files, naming them; nothing when it wrote none.
pub fn wrote(paths: &[impl AsRef<Path>]) -> String {
    if paths.is_empty() {
        return String::new();
    }
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.as_ref().display().to_string())
        .collect();
    format!("wrote {}\n", names.join(", "))
}

/// Enough of a fingerprint to tell two tokenizers apart at a glance.
fn short_fingerprint(fingerprint: &str) -> String {
    const SHOWN: usize = 19; // "sha256:" and 12 hex digits
    match fingerprint.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &fingerprint[..end]),
        None => fingerprint.to_string(),
    }
}

fn decontamination(d: &DecontaminationRecord) -> String {
    format!(
        "dropped {} ({}) with ≥{:.0}% of their {}-grams in {} of evaluation text",
        plural(d.documents_dropped, "document", "documents"),
        plural(d.tokens_dropped, "token", "tokens"),
        d.threshold * 100.0,
        d.ngram,
        plural(d.evaluation_documents, "document", "documents"),
    )
}

/// The rows every kind of index shows first: `[documents, tokens with separators, parts]` and
/// `[vocabulary size, token width, eos id]`.
fn holds_and_vocabulary(fields: &mut Table, shape: &IndexShape) {
    let documents = shape.documents;
    fields.row([
        "holds".into(),
        format!(
            "{}, {} in {}",
            plural(documents, "document", "documents"),
            plural(
                shape.tokens_with_separators.saturating_sub(documents),
                "token",
                "tokens"
            ),
            plural(shape.parts as u64, "part", "parts"),
        ),
    ]);
    fields.row([
        "vocabulary".into(),
        format!(
            "{} ids in {}-byte tokens, eos id {}",
            count(shape.vocab_size),
            shape.token_width,
            shape.eos_token_id
        ),
    ]);
}

/// `index info`.
pub fn index_info(info: &IndexInfo) -> String {
    let mut out = format!("index {}\n", info.dir);
    let mut fields = Table::fields();
    holds_and_vocabulary(&mut fields, &info.shape);
    match &info.tokenizer {
        Some(t) => fields.row([
            "tokenizer".into(),
            format!("{} ({})", t.source, short_fingerprint(&t.fingerprint)),
        ]),
        None if info.manifest => fields.row(["tokenizer", "not recorded"]),
        None => fields.row([
            "manifest",
            "none (an index of the reference indexer): width, eos and vocabulary as given",
        ]),
    }
    fields.row([
        "size".into(),
        format!(
            "{} ({:.2} bytes a token)",
            bytes(info.bytes),
            info.bytes_per_token
        ),
    ]);
    fields.row([
        "next-token table".into(),
        plural(info.next_token_table_prompts, "prompt", "prompts"),
    ]);
    if let Some(d) = &info.decontamination {
        fields.row(["decontamination".into(), decontamination(d)]);
    }
    out += &fields.render();
    if info.by_part.len() > 1 {
        let mut parts = Table::new(&["part", "documents", "tokens", "next-token prompts"]);
        for (i, s) in info.by_part.iter().enumerate() {
            parts.row([
                i.to_string(),
                count(s.documents),
                count(s.tokens_with_separators.saturating_sub(s.documents)),
                count(s.next_token_table_prompts),
            ]);
        }
        out += "by part:\n";
        out += &parts.render();
    }
    out
}

/// `index info` of a compressed index.
pub fn compressed_info(info: &CompressedInfo) -> String {
    let mut out = format!("compressed index {}\n", info.dir);
    let mut fields = Table::fields();
    holds_and_vocabulary(&mut fields, &info.shape);
    fields.row([
        "size".into(),
        format!(
            "{} ({:.3} bytes a token; a suffix-array index of the same text: {:.2})",
            bytes(info.bytes),
            info.bytes_per_token,
            info.suffix_array_bytes_per_token
        ),
    ]);
    for (component, n) in &info.bytes_by_component {
        fields.row([
            format!("  {component}"),
            format!(
                "{} ({:.3} bytes a token)",
                bytes(*n),
                *n as f64 / info.shape.tokens_with_separators.max(1) as f64
            ),
        ]);
    }
    fields.row([
        "sampled".into(),
        format!("every {} tokens' place kept", info.sample_every),
    ]);
    out += &fields.render();
    out
}

/// `index build`.
pub fn build_report(report: &BuildReport) -> String {
    let out = format!(
        "built {}: {}, {} in {}\n",
        report.out,
        plural(report.documents, "document", "documents"),
        plural(report.tokens, "token", "tokens"),
        plural(report.parts as u64, "part", "parts"),
    );
    let mut fields = Table::fields();
    fields.row([
        "on disk".into(),
        format!(
            "{} ({:.2} bytes a token)",
            bytes(report.bytes_on_disk),
            report.bytes_per_token
        ),
    ]);
    fields.row([
        "peak memory".into(),
        format!(
            "{} ({:.2} bytes a token)",
            bytes(report.peak_rss_bytes),
            report.peak_bytes_per_token
        ),
    ]);
    fields.row([
        "time".into(),
        format!(
            "{:.1} s: tokenizing {:.1} s, suffix arrays {:.1} s, next-token tables {:.1} s",
            report.seconds_total,
            report.seconds_tokenize,
            report.seconds_suffix_array,
            report.seconds_next_token_table
        ),
    ]);
    if let Some(d) = &report.decontamination {
        fields.row(["decontamination".into(), decontamination(d)]);
    }
    out + &fields.render()
}

/// `eval fit`: λ1/λ2 per domain, validation perplexities, the default rule and the gate's leading
/// features.
pub fn fit_summary(summary: &FitSummary, params: &MixingParams) -> String {
    let v = &summary.validation;
    let mut out = format!(
        "λ1 (sparse ∞-gram estimates) and λ2 (the rest), fitted on {} of validation text:\n",
        plural(v.tokens as u64, "token", "tokens")
    );
    let mut lambdas = Table::new(&["domain", "tokens", "λ1", "λ2"]);
    for (domain, d) in &summary.by_domain {
        lambdas.row([
            domain.clone(),
            count(d.tokens as u64),
            format!("{:.4}", d.lambda_sparse),
            format!("{:.4}", d.lambda_dense),
        ]);
    }
    lambdas.row([
        "all".into(),
        count(v.tokens as u64),
        format!("{:.4}", summary.lambda_sparse),
        format!("{:.4}", summary.lambda_dense),
    ]);
    out += &lambdas.render();
    if summary.by_domain.is_empty() {
        out += &format!(
            "(no domain had the {MIN_DOMAIN_TOKENS} tokens its own λ1/λ2 need: every domain uses the pair of all)\n"
        );
    }
    let mixed = |name: &str, ppl: f64| {
        format!(
            ", {name} {ppl:.2} (Δ {:.1}%)",
            improvement_percent(ppl, v.neural_perplexity)
        )
    };
    out += &format!(
        "validation perplexity: neural {:.2}{}{}\n",
        v.neural_perplexity,
        mixed("λ1/λ2", v.split_perplexity),
        v.gate_perplexity
            .map_or(String::new(), |g| mixed("gate", g)),
    );
    out += &format!("default rule: {}", params.default_rule.name());
    if let Some(n) = params.decode_max_match {
        out += &format!(" (decoding gives the ∞-gram no weight once its match reaches {n} tokens)");
    }
    out.push('\n');
    if !summary.gate_feature_importances.is_empty() {
        let mut ranked: Vec<&(String, f64)> = summary.gate_feature_importances.iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        out += &format!(
            "gate: the {} most important of its {} features\n",
            TOP_FEATURES.min(ranked.len()),
            ranked.len()
        );
        let mut features = Table::new(&["feature", "importance"]);
        for (name, importance) in ranked.into_iter().take(TOP_FEATURES) {
            features.row([name.clone(), percent(*importance)]);
        }
        out += &features.render();
    }
    out
}

/// `eval ppl`: perplexity per domain, neural and under each mixing rule, with the default rule's
/// improvement (the Markdown report has every column).
pub fn ppl_report(report: &PplReport) -> String {
    let marked = |rule: &str| {
        if rule == report.default_rule {
            format!("{rule}*")
        } else {
            rule.to_string()
        }
    };
    let mut out = format!(
        "perplexity, neural and mixed by rule (* the default; global λ1 {:.4}, λ2 {:.4}):\n",
        report.lambda_sparse, report.lambda_dense
    );
    let mut table = Table::new(&[
        "domain",
        "tokens",
        "neural",
        &marked("split"),
        &marked("domain_split"),
        &marked("gate"),
        &marked("adaptive"),
        "Δ*",
        "helped / hurt*",
        "bits/byte neural → *",
    ]);
    let ppl = |p: f64| format!("{p:.2}");
    for s in report
        .by_domain
        .iter()
        .chain(std::iter::once(&report.total))
    {
        let helped_hurt = s.helped_hurt.get(&s.default_rule).map_or("–".into(), |h| {
            format!("{} / {}", percent(h.helped), percent(h.hurt))
        });
        table.row([
            s.domain.clone(),
            count(s.tokens_scored as u64),
            ppl(s.neural_perplexity),
            ppl(s.split_perplexity),
            ppl(s.domain_split_perplexity),
            s.gate_perplexity.map_or("–".into(), ppl),
            ppl(s.adaptive_perplexity),
            format!("{:.1}%", s.default_improvement),
            helped_hurt,
            format!(
                "{:.3} → {:.3}",
                s.bits_per_byte.get("neural").copied().unwrap_or(f64::NAN),
                s.bits_per_byte
                    .get(&s.default_rule)
                    .copied()
                    .unwrap_or(f64::NAN)
            ),
        ]);
    }
    out += &table.render();
    out += "Δ*: the improvement over neural, 1 − (PPL − 1) / (PPL₀ − 1)\n";
    out += "helped / hurt*: the shares of tokens whose probability mixing raised / lowered by over 1%\n";
    let t = &report.timing;
    out += &format!(
        "time: neural {:.1} s, ∞-gram {:.1} s ({} of neural), {:.1} tokens/s\n",
        t.neural_seconds,
        t.infgram_seconds,
        percent(t.infgram_over_neural),
        t.tokens_per_second
    );
    out
}

/// `model score`.
pub fn score_report(report: &ScoreReport) -> String {
    let mut out = format!(
        "perplexity of {} ({}-token windows, stride {}):\n",
        report.model, report.window, report.stride
    );
    let mut table = Table::new(&["domain", "documents", "tokens", "perplexity", "bits/byte"]);
    let mut row = |name: &str, t: &Totals| {
        table.row([
            name.to_string(),
            count(t.documents as u64),
            count(t.tokens_scored as u64),
            format!("{:.2}", t.perplexity),
            format!("{:.4}", t.bits_per_byte),
        ])
    };
    for (domain, t) in &report.by_domain {
        row(domain, t);
    }
    row("all", &report.total);
    out += &table.render();
    out + &format!(
        "time: {:.1} s, {:.1} tokens/s\n",
        report.seconds, report.tokens_per_second
    )
}

/// `model generate`: the prompt, what followed (free text, lines and all), and how fast.
pub fn generation(
    prompt: &str,
    text: &str,
    generation: &Generation,
    kernels: &str,
    cpu: &str,
) -> String {
    format!(
        "prompt: {prompt}\ncontinuation: {text}\n{} generated: prompt of {} in {:.1} ms, then {:.2} ms a token ({kernels} kernels on {cpu})\n",
        plural(generation.tokens.len() as u64, "token", "tokens"),
        plural(generation.prompt_tokens as u64, "token", "tokens"),
        generation.prompt_ms,
        generation.decode_ms_per_token,
    )
}

/// `eval backoff`: perplexity and bits per byte per k and domain, then the generation.
pub fn backoff_report(report: &BackoffReport) -> String {
    let unit = if report.byte_level { "byte" } else { "token" };
    let mut t = Table::new(&[
        "k",
        "domain",
        "tokens",
        "bytes",
        "perplexity",
        "bits/byte",
        "s",
    ]);
    for r in &report.rows {
        t.row([
            r.levels.clone(),
            r.domain.clone(),
            count(r.tokens as u64),
            count(r.bytes as u64),
            format!("{:.2}", r.perplexity),
            format!("{:.3}", r.bits_per_byte),
            format!("{:.1}", r.seconds),
        ]);
    }
    let mut out = format!(
        "selective back-off, decay {}, {} weighting, floor {:e} (perplexity per {unit})\n{}",
        report.decay,
        report.weighting,
        report.floor,
        t.render()
    );
    if let Some(g) = &report.generation {
        out += &format!(
            "generated {} tokens ({} bytes) with k={} in {:.4} s: {:.0} bytes/s; median suffix length per level {:?}, matches {:?}\n{}\n",
            g.tokens, g.bytes, g.levels, g.seconds, g.bytes_per_second, g.median_suffix_len, g.median_matches, g.text
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_names_left_and_figures_right() {
        let mut t = Table::new(&["domain", "tokens"]);
        t.row(["linux-doc", "12"]);
        t.row(["all", "1,234"]);
        assert_eq!(
            t.render(),
            "  domain     tokens\n  linux-doc      12\n  all         1,234\n"
        );
        let mut f = Table::fields();
        f.row(["time", "1 s"]);
        f.row(["on disk", "2 KiB"]);
        assert_eq!(f.render(), "  time     1 s\n  on disk  2 KiB\n");
    }

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(14_625_375), "14,625,375");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(plural(1, "shard", "shards"), "1 shard");
    }
}
