//! `infini-sidecar eval`: fitting the mixture, the perplexity report and speculative decoding, over
//! a model and an index built with its tokenizer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use infini_sidecar::decoding::spec;
use infini_sidecar::draft::DraftOptions;
use infini_sidecar::eval::backoff::{self as eval_backoff, BackoffEvalOptions};
use infini_sidecar::eval::contamination::{self, ContaminationOptions, ContaminationReport};
use infini_sidecar::eval::documents::{
    load_documents, load_documents_with, EvalDocument, TokenBudget,
};
use infini_sidecar::eval::experiment::{self, EvalInputs, FitSummary, Pairing};
use infini_sidecar::eval::generation::{self, GenerationEvalOptions, Sampler};
use infini_sidecar::eval::per_token::write_per_token;
use infini_sidecar::eval::report as eval_report;
use infini_sidecar::eval::spec::{self as eval_spec, SpecEvalOptions};
use infini_sidecar::eval::workload;
use infini_sidecar::evidence::{byte_source, EvidenceIndex, EvidenceSource};
use infini_sidecar::index::backoff::{Backoff, Weighting};
use infini_sidecar::index::build::decontam;
use infini_sidecar::index::corpus::{self, Corpus};
use infini_sidecar::index::fm::{self, CompressedIndex};
use infini_sidecar::index::suffix::Occurrences;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::mix::{GateOptions, LambdaRule, MixingParams};
use infini_sidecar::model::{Model, ModelError, WindowOptions};
use infini_sidecar::tokenizer::Tokenizer;

use crate::cli::text;
use crate::{load_model, open_writer, ModelArgs};

#[derive(Subcommand)]
pub enum EvalCommand {
    /// Fit λ1/λ2 and the random-forest gate on validation text; writes a mixing file.
    Fit(FitArgs),
    /// Neural vs mixed perplexity per domain (a summary; JSON and Markdown files), per-token output
    /// on request.
    Ppl(PplArgs),
    /// Speculative greedy decoding with ∞-gram drafts vs plain greedy decoding, per domain and draft
    /// source: acceptance, drafter cost, speed-up.
    Spec(SpecArgs),
    /// Samples continuations of test prompts from the model alone and with each mixing rule (same
    /// seeds): verbatim copying from the reference data, distinct n-grams, the model's perplexity.
    Generate(GenerateArgs),
    /// Replays a workload file (chat requests with namespaces) in order through the decoding loop,
    /// with live indexes learning as it goes: speed-up cold vs warm, acceptance by source.
    Workload(WorkloadArgs),
    /// The ∞-gram alone as a language model (selective back-off): perplexity and bits per byte of
    /// documents for each k, and its generation speed.
    Backoff(BackoffEvalArgs),
    /// How much of each benchmark item appears verbatim in an index: the share of its n-grams found
    /// (contaminated past a threshold), its longest match and the documents that hold it, per item,
    /// per domain and overall.
    Contamination(ContaminationArgs),
}

pub fn run(command: EvalCommand) -> Result<()> {
    match command {
        EvalCommand::Fit(args) => run_fit(args),
        EvalCommand::Ppl(args) => run_ppl(args),
        EvalCommand::Spec(args) => run_spec(args),
        EvalCommand::Generate(args) => run_generate(args),
        EvalCommand::Workload(args) => run_workload(args),
        EvalCommand::Backoff(args) => run_backoff(args),
        EvalCommand::Contamination(args) => run_contamination(args),
    }
}

/// A model, an index built with its tokenizer (or, for fit and ppl, a byte-level one), and
/// evaluation text.
#[derive(Args)]
struct PairingArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The reference index: built with the model's tokenizer, or byte-level (`index build
    /// --bytes`) for eval fit and eval ppl.
    #[arg(long)]
    index: PathBuf,
    /// Pile-style JSON lines (`text`, `meta.pile_set_name`), text files or folders.
    #[arg(long = "input", num_args = 1.., required = true)]
    inputs: Vec<PathBuf>,
}

/// How drafts are made: `eval spec`'s and `eval workload`'s settings.
#[derive(Args)]
pub struct DraftArgs {
    /// Longest draft (at most 31: one pass verifies the pending token and the draft; 0 drafts
    /// nothing). Default: 8 for `eval spec`, 31 for `eval workload`.
    #[arg(long)]
    max_draft: Option<usize>,
    #[arg(long, default_value_t = DraftOptions::default().min_token_prob)]
    min_token_prob: f64,
    /// Draft a node only if its path's calibrated acceptance probability reaches this.
    #[arg(long, default_value_t = DraftOptions::default().min_path_prob)]
    min_path_prob: f64,
    /// Draft at most this many tokens per matched context token (0: fixed length).
    #[arg(long, default_value_t = DraftOptions::default().match_len_factor)]
    match_len_factor: f64,
    /// Calibrate drafts after matches of at least this many tokens apart from the rest (0: one
    /// record a source).
    #[arg(long, default_value_t = DraftOptions::default().long_match)]
    long_match: usize,
    /// Draft trees (verified a tree per pass) rather than chains.
    #[arg(long)]
    tree: bool,
    /// Most nodes of a draft tree.
    #[arg(long, default_value_t = DraftOptions::default().tree_budget)]
    tree_budget: usize,
}

impl DraftArgs {
    /// These settings over `base` (whose longest draft is the default).
    fn options(&self, base: DraftOptions) -> Result<DraftOptions> {
        let max_tokens = self.max_draft.unwrap_or(base.max_tokens);
        if max_tokens >= spec::MAX_VERIFY_ROWS {
            bail!(
                "--max-draft {max_tokens}: at most {}",
                spec::MAX_VERIFY_ROWS - 1
            );
        }
        if self.tree && self.tree_budget == 0 {
            bail!("--tree with --tree-budget 0 would draft nothing");
        }
        let options = DraftOptions {
            max_tokens,
            min_token_prob: self.min_token_prob,
            min_path_prob: self.min_path_prob,
            match_len_factor: self.match_len_factor,
            long_match: self.long_match,
            tree: self.tree,
            tree_budget: self.tree_budget,
            ..base
        };
        options.check().map_err(anyhow::Error::msg)?;
        Ok(options)
    }
}

#[derive(Args)]
pub struct SpecArgs {
    #[command(flatten)]
    pairing: PairingArgs,
    #[arg(long, default_value_t = 4)]
    prompts_per_domain: usize,
    /// Tokens of each document given as the prompt.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens generated after each prompt.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    #[command(flatten)]
    draft: DraftArgs,
    /// Folder for spec.json and spec.md (default: print the Markdown).
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

#[derive(Args)]
struct EvalArgs {
    #[command(flatten)]
    pairing: PairingArgs,
    /// Score only the first N tokens of each domain.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Score at most N tokens of any one document (spreads --max-tokens over more documents).
    #[arg(long)]
    max_doc_tokens: Option<usize>,
    /// Leave out this domain's documents (repeatable): a fit for a domain it never saw.
    #[arg(long = "exclude-domain")]
    exclude_domains: Vec<String>,
    #[arg(long, default_value_t = 1024)]
    window: usize,
    #[arg(long, default_value_t = 512)]
    stride: usize,
    /// Save each finished domain's token records here; a rerun with the same inputs reuses them.
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct FitArgs {
    #[command(flatten)]
    eval: EvalArgs,
    /// The mixing file to write.
    #[arg(long)]
    out: PathBuf,
    /// Fit only λ1/λ2, no gate.
    #[arg(long)]
    no_gate: bool,
    #[arg(long, default_value_t = GateOptions::default().trees)]
    gate_trees: usize,
    #[arg(long, default_value_t = GateOptions::default().max_depth)]
    gate_max_depth: u16,
    #[arg(long, default_value_t = GateOptions::default().min_samples_leaf)]
    gate_min_samples_leaf: usize,
    #[command(flatten)]
    format: text::Format,
}

#[derive(Args)]
pub struct PplArgs {
    #[command(flatten)]
    eval: EvalArgs,
    /// The mixing file written by `eval fit`.
    #[arg(long)]
    mixing: PathBuf,
    /// Folder for report.json and report.md.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Also write every token's neural, ∞-gram and mixed log-probs (JSON lines) here.
    #[arg(long)]
    per_token: Option<PathBuf>,
    #[command(flatten)]
    format: text::Format,
}

/// An index of either kind: the evaluations read it through its one face.
fn open_evidence(path: &Path, opts: &OpenOptions) -> Result<Arc<dyn EvidenceIndex>> {
    Ok(match fm::is_compressed(path) {
        true => Arc::new(CompressedIndex::open(path)?),
        false => Arc::new(Index::open(path, opts)?),
    })
}

/// The model and the index of an evaluation (checked to belong together by its [`Pairing`]).
fn open_pairing(args: &PairingArgs) -> Result<(Model, Arc<dyn EvidenceIndex>)> {
    let model = load_model(&args.model)?;
    let index = open_evidence(&args.index, &OpenOptions::default())?;
    Ok((model, index))
}

/// An index of either kind as `model`'s decoding reads it (a byte-level suffix array through the
/// model's tokens), checked to belong with it.
fn decoding_source(path: &Path, model: &Model) -> Result<Arc<dyn EvidenceSource>> {
    Ok(match fm::is_compressed(path) {
        true => {
            let index = CompressedIndex::open(path)?;
            Pairing::new(model, &index)?;
            Arc::new(index)
        }
        false => {
            let index = Index::open(path, &OpenOptions::default())?;
            Pairing::new(model, &index)?;
            byte_source::for_model(Arc::new(index), model.tokenizer())
        }
    })
}

/// `eval fit` and `eval ppl` read an index of either kind.
fn eval_setup(args: &EvalArgs) -> Result<(Model, Arc<dyn EvidenceIndex>, EvalInputs)> {
    let (model, index) = open_pairing(&args.pairing)?;
    let inputs = EvalInputs {
        inputs: args.pairing.inputs.clone(),
        max_tokens_per_domain: args.max_tokens,
        max_doc_tokens: args.max_doc_tokens,
        exclude_domains: args.exclude_domains.clone(),
        window: WindowOptions {
            window: args.window,
            stride: args.stride,
        },
        work_dir: args.work_dir.clone(),
    };
    Ok((model, index, inputs))
}

fn run_fit(args: FitArgs) -> Result<()> {
    let (model, index, inputs) = eval_setup(&args.eval)?;
    let gate = (!args.no_gate).then_some(GateOptions {
        trees: args.gate_trees,
        max_depth: args.gate_max_depth,
        min_samples_leaf: args.gate_min_samples_leaf,
        ..GateOptions::default()
    });
    let params = experiment::fit(&Pairing::new(&model, &*index)?, &inputs, gate)?;
    params.save(&args.out)?;
    let summary = FitSummary::new(&args.out, &params)?;
    args.format.print(&summary, || {
        text::fit_summary(&summary, &params) + &text::wrote(&[&args.out])
    })
}

fn run_ppl(args: PplArgs) -> Result<()> {
    let (model, index, inputs) = eval_setup(&args.eval)?;
    let params = MixingParams::load(&args.mixing)?;
    let (report, domains) = experiment::ppl(&Pairing::new(&model, &*index)?, &inputs, &params)?;
    let mut written = Vec::new();
    if let Some(path) = &args.per_token {
        write_per_token(
            &mut open_writer(&path.display().to_string())?,
            &domains,
            &params,
        )?;
        written.push(path.clone());
    }
    if let Some(dir) = &args.out_dir {
        let md = eval_report::markdown(&report);
        written.extend(write_results(dir, "report", &report, &md)?);
    }
    args.format.print(&report, || {
        text::ppl_report(&report) + &text::wrote(&written)
    })
}

fn run_spec(args: SpecArgs) -> Result<()> {
    let draft = args.draft.options(DraftOptions::default())?;
    let model = load_model(&args.pairing.model)?;
    let source = decoding_source(&args.pairing.index, &model)?;
    let docs = load_documents(
        &args.pairing.inputs,
        &model,
        TokenBudget::All,
        Some(args.prompt_tokens + args.new_tokens),
    )?;
    let opts = SpecEvalOptions {
        prompts_per_domain: args.prompts_per_domain,
        prompt_tokens: args.prompt_tokens,
        new_tokens: args.new_tokens,
        draft,
    };
    let rows = eval_spec::run(&model, &source, &docs, &opts)?;
    let md = eval_spec::markdown(&rows);
    let written = match &args.out_dir {
        Some(dir) => write_results(dir, "spec", &rows, &md)?,
        None => Vec::new(),
    };
    print!("{md}{}", text::wrote(&written));
    Ok(())
}

/// `NAME.json` and `NAME.md` of an evaluation in `dir`, created if need be; their paths.
fn write_results(
    dir: &Path,
    name: &str,
    json: &impl serde::Serialize,
    md: &str,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join(format!("{name}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(json)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    Ok(vec![json_path, md_path])
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pairing: PairingArgs,
    /// The mixing file written by `eval fit`.
    #[arg(long)]
    mixing: PathBuf,
    /// What to sample from: neural, split, domain_split, gate, adaptive.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "neural,split,gate,adaptive"
    )]
    samplers: Vec<String>,
    #[arg(long, default_value_t = GenerationEvalOptions::default().prompts_per_domain)]
    prompts_per_domain: usize,
    #[arg(long, default_value_t = GenerationEvalOptions::default().prompt_tokens)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = GenerationEvalOptions::default().new_tokens)]
    new_tokens: usize,
    #[arg(long, default_value_t = GenerationEvalOptions::default().temperature)]
    temperature: f64,
    #[arg(long, default_value_t = GenerationEvalOptions::default().top_p)]
    top_p: f64,
    /// Prompt i is sampled with seed + i under every sampler.
    #[arg(long, default_value_t = GenerationEvalOptions::default().seed)]
    seed: u64,
    /// Folder for generate.json and generate.md (default: print the Markdown).
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// `neural`, or a rule (split, gate, adaptive) with `@N` for the copy guard at N tokens.
fn sampler(spec: &str, params: &MixingParams) -> Result<Sampler> {
    let (name, max_match) = match spec.split_once('@') {
        Some((name, n)) => (
            name,
            Some(
                n.parse::<usize>()
                    .with_context(|| format!("the guard of sampler {spec:?}"))?,
            ),
        ),
        None => (spec, None),
    };
    let rule = match name {
        "neural" if max_match.is_none() => return Ok(Sampler::Neural),
        "split" => LambdaRule::Split,
        "gate" if params.gate.is_some() => LambdaRule::Gate,
        "gate" => bail!("sampler {spec:?}: the mixing file has no gate"),
        "adaptive" => LambdaRule::Adaptive,
        _ => bail!(
            "unknown sampler {spec:?}: neural, or split, gate or adaptive with an optional @N"
        ),
    };
    Ok(Sampler::Mixed { rule, max_match })
}

fn run_generate(args: GenerateArgs) -> Result<()> {
    if !(args.temperature > 0.0 && args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--temperature must be above 0 and --top-p inside (0, 1]");
    }
    let params = MixingParams::load(&args.mixing)?;
    let samplers = args
        .samplers
        .iter()
        .map(|s| sampler(s, &params))
        .collect::<Result<Vec<_>>>()?;
    let (model, index) = open_pairing(&args.pairing)?;
    let pairing = Pairing::same_tokenizer(&model, &*index)?;
    params.check_pairing(&pairing.fingerprint(), false)?;
    let opts = GenerationEvalOptions {
        prompts_per_domain: args.prompts_per_domain,
        prompt_tokens: args.prompt_tokens,
        new_tokens: args.new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        ..GenerationEvalOptions::default()
    };
    let docs = load_documents(&args.pairing.inputs, &model, TokenBudget::All, None)?;
    let rows = generation::run(&model, Arc::clone(&index), &params, &docs, &samplers, &opts)?;
    let md = generation::markdown(&rows);
    let written = match &args.out_dir {
        Some(dir) => write_results(dir, "generate", &rows, &md)?,
        None => Vec::new(),
    };
    print!("{md}{}", text::wrote(&written));
    Ok(())
}

#[derive(Args)]
pub struct WorkloadArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The reference index (built with the model's tokenizer).
    #[arg(long)]
    index: PathBuf,
    /// JSON lines: `id`, `messages` (or `prompt`), `max_new_tokens`, `namespace`, `reference`
    /// (scripts/make_workload.py writes one).
    #[arg(long)]
    workload: PathBuf,
    /// Folder for workload.json, workload.md and replay.json (each request's prompt and output
    /// tokens, for other drafters' replays).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// A Python with arctic-inference's suffix_decoding module: the same outputs are then replayed
    /// through SuffixDecoding too (eval/suffix_decoding_replay.py), for the table's comparison.
    #[arg(long)]
    suffix_decoding_python: Option<PathBuf>,
    #[command(flatten)]
    draft: DraftArgs,
    /// The cost model's price of a drafted row, as a share of a decoding step: what a verification
    /// pass costs a row on the machine that will decode (`cargo bench --bench model`).
    #[arg(long, default_value_t = workload::DEFAULT_ROW_COST)]
    row_cost: f64,
    /// The replay.json of an earlier run of this workload: its outputs are replayed through the
    /// drafters (the simulated replays alone, written as simulated.json and simulated.md), without
    /// decoding again (the model is read for its tokenizer). Seconds instead of half an hour: for
    /// trying draft settings.
    #[arg(long)]
    replay: Option<PathBuf>,
}

/// SuffixDecoding's simulated replays of `replay_json`, from eval/suffix_decoding_replay.py.
fn suffix_decoding(
    python: &std::path::Path,
    replay_json: &str,
    row_cost: f64,
) -> Result<Vec<workload::Simulated>> {
    let file = tempfile_in_temp("replay.json", replay_json)?;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/suffix_decoding_replay.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(&file)
        .arg("--row-cost")
        .arg(row_cost.to_string())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    let _ = std::fs::remove_file(&file);
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Writes `text` to a new file of ours in the temporary folder.
fn tempfile_in_temp(name: &str, text: &str) -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("infini-sidecar-{}-{name}", std::process::id()));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn run_workload(args: WorkloadArgs) -> Result<()> {
    let draft = args.draft.options(workload::draft_options())?;
    if !(args.row_cost >= 0.0 && args.row_cost.is_finite()) {
        bail!("--row-cost {}: a number at least 0", args.row_cost);
    }
    let requests = workload::read(&args.workload)?;
    let model = load_model(&args.model)?;
    // Searches start from sampled ranks, as `serve` opens its index under the default config.
    let opened = OpenOptions {
        sample_ranks: true,
        ..OpenOptions::default()
    };
    let index = open_evidence(&args.index, &opened)?;
    Pairing::same_tokenizer(&model, &*index)?;
    let mut report = match &args.replay {
        Some(path) => workload::WorkloadReport {
            replay: workload::read_replay(path, &requests)?,
            references: workload::references_of(&model, &requests)?,
            draft,
            ..workload::WorkloadReport::default()
        },
        None => workload::run(&model, Arc::clone(&index), &requests, &draft)?,
    };
    report.cpu = infini_sidecar::cpu::CpuInfo::detect().summary();
    report.row_cost = args.row_cost;
    report.simulated = workload::simulate(
        Arc::clone(&index),
        &requests,
        &report.replay,
        &report.references,
        &draft,
        args.row_cost,
    )?;
    let replay_json = serde_json::to_string(&report.replay)?;
    if let Some(python) = &args.suffix_decoding_python {
        report
            .simulated
            .extend(suffix_decoding(python, &replay_json, args.row_cost)?);
    }
    let md = workload::markdown(&report);
    let mut written = Vec::new();
    match (&args.out_dir, &args.replay) {
        (Some(dir), Some(_)) => {
            let simulated = serde_json::json!({
                "cpu": report.cpu,
                "draft": report.draft,
                "row_cost": report.row_cost,
                "simulated": report.simulated,
            });
            written = write_results(dir, "simulated", &simulated, &md)?;
        }
        (Some(dir), None) => {
            report.replay.clear();
            written = write_results(dir, "workload", &report, &md)?;
            let replay = dir.join("replay.json");
            std::fs::write(&replay, &replay_json)
                .with_context(|| format!("writing {}", replay.display()))?;
            written.push(replay);
        }
        (None, _) => {}
    }
    print!("{md}{}", text::wrote(&written));
    Ok(())
}

/// Selective back-off settings of `eval backoff` (the k come apart: one list to score, one to
/// generate with).
#[derive(Args)]
pub struct BackoffArgs {
    /// Weight of level i is decay^i.
    #[arg(long, default_value_t = Backoff::default().decay)]
    decay: f64,
    /// How the levels mix: `counts` (decay^i times each level's counts, the post's rule) or
    /// `distributions` (decay^i times each level's normalised distribution).
    #[arg(long, default_value = "counts")]
    weighting: Weighting,
    /// Probability mass spread evenly over the vocabulary (keeps unseen tokens possible).
    #[arg(long, default_value_t = Backoff::default().floor)]
    floor: f64,
}

impl BackoffArgs {
    /// The settings, every level (each k replaces it).
    pub fn spec(&self) -> Backoff {
        Backoff {
            levels: None,
            decay: self.decay,
            weighting: self.weighting,
            floor: self.floor,
        }
    }
}

/// A k: a number of levels, or `all` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct Levels(pub Option<usize>);

impl std::str::FromStr for Levels {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Levels(None)),
            k => k
                .parse::<usize>()
                .ok()
                .filter(|&k| k > 0)
                .map(|k| Levels(Some(k)))
                .ok_or_else(|| format!("a number of levels (1 or more) or \"all\", not {k:?}")),
        }
    }
}

#[derive(Args)]
pub struct BackoffEvalArgs {
    /// A token or byte-level index (`index build --bytes`); documents are encoded with its tokenizer.
    #[arg(long)]
    index: PathBuf,
    /// Pile-style JSON lines, text files or folders.
    #[arg(long = "input", num_args = 1.., required = true)]
    inputs: Vec<PathBuf>,
    /// The k to score with, each a number of levels or `all`.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,5,all")]
    levels: Vec<Levels>,
    #[command(flatten)]
    backoff: BackoffArgs,
    /// Score only the first N tokens of each domain.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Tokens to generate for the speed figure; 0 for none.
    #[arg(long, default_value_t = 500)]
    generate: usize,
    /// The k to generate with.
    #[arg(long, default_value = "2")]
    generate_levels: Levels,
    #[arg(long, default_value = "First Citizen:\n")]
    prompt: String,
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the JSON report to this file.
    #[arg(long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    format: text::Format,
}

/// The documents of `inputs` cut into `index`'s tokens (bytes for a byte-level index), and its
/// tokenizer.
fn index_documents(
    index: &dyn Corpus,
    inputs: &[PathBuf],
    budget: TokenBudget,
) -> Result<(Vec<EvalDocument>, Tokenizer)> {
    let Some(tokenizer) = index.tokenizer().cloned() else {
        bail!("{}: the index carries no tokenizer", index.dir().display());
    };
    let encode = |text: &str| {
        tokenizer
            .encode(text)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    };
    let docs = load_documents_with(inputs, encode, budget, None)?;
    Ok((docs, tokenizer))
}

fn run_backoff(args: BackoffEvalArgs) -> Result<()> {
    let index = corpus::open(&args.index, &OpenOptions::default())?;
    let budget = args
        .max_tokens
        .map_or(TokenBudget::All, TokenBudget::PerDomain);
    let (docs, tokenizer) = index_documents(&*index, &args.inputs, budget)?;
    let opts = BackoffEvalOptions {
        levels: args.levels.iter().map(|l| l.0).collect(),
        backoff: args.backoff.spec(),
        generate: args.generate,
        generate_levels: args.generate_levels.0,
        prompt: tokenizer.encode(&args.prompt)?,
        temperature: args.temperature,
        seed: args.seed,
    };
    let report = eval_backoff::evaluate(&*index, &tokenizer, &docs, &opts)?;
    let mut written = Vec::new();
    if let Some(path) = &args.output {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(path.clone());
    }
    args.format.print(&report, || {
        text::backoff_report(&report) + &text::wrote(&written)
    })
}

#[derive(Args)]
pub struct ContaminationArgs {
    /// A token or byte-level index; items are cut into its tokens.
    #[arg(long)]
    index: PathBuf,
    /// The benchmark: Pile-style JSON lines (`text`, `meta.pile_set_name` for its domains), text
    /// files or folders.
    #[arg(long = "input", num_args = 1.., required = true)]
    inputs: Vec<PathBuf>,
    /// n-gram length in the index's tokens [default: 13 tokens, 50 bytes on a byte-level index].
    #[arg(long)]
    ngram: Option<usize>,
    /// Share of an item's n-grams found that makes it contaminated.
    #[arg(long, default_value_t = decontam::DEFAULT_THRESHOLD)]
    threshold: f64,
    /// Documents listed for each item's longest match.
    #[arg(long, default_value_t = 3)]
    max_documents: usize,
    /// Items listed in the table, those with the largest shares (the JSON has every item).
    #[arg(long, default_value_t = 20)]
    worst: usize,
    /// Write contamination.json (every item) and contamination.md here.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    #[command(flatten)]
    format: text::Format,
}

/// The contamination report of `args`' benchmark against `index`, of either kind.
fn contamination_report<I: Corpus + Occurrences>(
    index: &I,
    args: &ContaminationArgs,
) -> Result<ContaminationReport> {
    let (items, _) = index_documents(index, &args.inputs, TokenBudget::All)?;
    let ngram = args.ngram.unwrap_or(match index.is_byte_level() {
        true => contamination::BYTE_NGRAM,
        false => contamination::TOKEN_NGRAM,
    });
    let opts = ContaminationOptions {
        ngram,
        threshold: args.threshold,
        max_documents: args.max_documents,
    };
    Ok(contamination::report(index, &items, &opts)?)
}

fn run_contamination(args: ContaminationArgs) -> Result<()> {
    let report = match fm::is_compressed(&args.index) {
        true => contamination_report(&CompressedIndex::open(&args.index)?, &args)?,
        false => contamination_report(&Index::open(&args.index, &OpenOptions::default())?, &args)?,
    };
    let md = contamination::markdown(&report, args.worst);
    let written = match &args.out_dir {
        Some(dir) => write_results(dir, "contamination", &report, &md)?,
        None => Vec::new(),
    };
    args.format
        .print(&report, || md.clone() + &text::wrote(&written))
}
