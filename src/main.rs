//! The `infini-sidecar` command line: a thin layer over the library.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use infini_sidecar::corpus;
use infini_sidecar::draft::{spec, DraftOptions};
use infini_sidecar::eval::documents::{load_documents, TokenBudget};
use infini_sidecar::eval::experiment::{self, EvalInputs, Pairing};
use infini_sidecar::eval::neural::score_documents;
use infini_sidecar::eval::records::DomainRecords;
use infini_sidecar::eval::report as eval_report;
use infini_sidecar::eval::spec::{self as eval_spec, SpecEvalOptions};
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::decontam::{self, Decontaminator};
use infini_sidecar::index::{Index, IndexError, OpenOptions, TokenWidth};
use infini_sidecar::interrupt;
use infini_sidecar::mix::{self, GateOptions, LambdaRule, MixingParams};
use infini_sidecar::model::{
    self, DeviceChoice, GenerateOptions, LoadOptions, Model, ModelError, WindowOptions,
};
use infini_sidecar::protocol;
use infini_sidecar::server::{self, config::ServeConfig};
use infini_sidecar::tokenizer::Tokenizer;

#[derive(Parser)]
#[command(
    name = "infini-sidecar",
    version,
    about = "∞-gram language model engine and sidecar"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build, inspect and verify indexes.
    #[command(subcommand)]
    Index(IndexCommand),
    /// Answer JSON-lines queries (count, prob, ntd, infgram_prob, infgram_ntd, find, search_docs, score).
    Query(QueryArgs),
    /// Run the neural model: perplexity of documents, or generation.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Mix the ∞-gram with the model: fit λ on validation text, evaluate perplexity on test text.
    #[command(subcommand)]
    Eval(EvalCommand),
    /// Serve the gRPC API (sidecar.v1) with the index, tokenizer and mixing file of a config.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the token ids of a text (one JSON list).
    Tokenize {
        #[arg(long)]
        tokenizer: PathBuf,
        #[arg(long)]
        text: String,
    },
}

#[derive(Subcommand)]
enum EvalCommand {
    /// Fit λ1/λ2 and the random-forest gate on validation text; writes a mixing file.
    Fit(FitArgs),
    /// Neural vs mixed perplexity per domain (JSON and Markdown), per-token output on request.
    Ppl(PplArgs),
    /// Speculative greedy decoding with ∞-gram drafts vs plain greedy decoding, per domain and draft
    /// source: acceptance, drafter cost, speed-up.
    Spec(SpecArgs),
}

/// A model, an index built with its tokenizer, and evaluation text.
#[derive(Args)]
struct PairingArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The reference index (built with the model's tokenizer).
    #[arg(long)]
    index: PathBuf,
    /// Pile-style JSON lines (`text`, `meta.pile_set_name`), text files or folders.
    #[arg(long = "input", num_args = 1.., required = true)]
    inputs: Vec<PathBuf>,
}

#[derive(Args)]
struct SpecArgs {
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
    /// Longest draft (at most 14: one pass verifies the pending token and the draft).
    #[arg(long, default_value_t = DraftOptions::default().max_tokens)]
    max_draft: usize,
    #[arg(long, default_value_t = DraftOptions::default().min_token_prob)]
    min_token_prob: f64,
    /// Draft a node only if its path's calibrated acceptance probability reaches this.
    #[arg(long, default_value_t = DraftOptions::default().min_path_prob)]
    min_path_prob: f64,
    /// Draft at most this many tokens per matched context token (0: fixed length).
    #[arg(long, default_value_t = DraftOptions::default().match_len_factor)]
    match_len_factor: f64,
    /// Draft trees (verified a tree per pass) rather than chains.
    #[arg(long)]
    tree: bool,
    /// Most nodes of a draft tree.
    #[arg(long, default_value_t = DraftOptions::default().tree_budget)]
    tree_budget: usize,
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
    #[arg(long, default_value_t = 1024)]
    window: usize,
    #[arg(long, default_value_t = 512)]
    stride: usize,
    /// Save each finished domain's token records here; a rerun with the same inputs reuses them.
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[derive(Args)]
struct FitArgs {
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
}

#[derive(Args)]
struct PplArgs {
    #[command(flatten)]
    eval: EvalArgs,
    /// The mixing file written by `eval fit`.
    #[arg(long)]
    mixing: PathBuf,
    /// Folder for report.json and report.md (default: print the JSON).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Also write every token's neural, ∞-gram and mixed log-probs (JSON lines) here.
    #[arg(long)]
    per_token: Option<PathBuf>,
}

#[derive(Subcommand)]
enum IndexCommand {
    /// Build an index from text (plain files, JSON lines, .gz) or from a pre-tokenized file.
    Build(BuildArgs),
    /// Print what an index holds (JSON).
    Info(OpenArgs),
    /// Check every file's checksum against the manifest and every document offset.
    Verify(OpenArgs),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Perplexity of a text or Pile-style JSON-lines file with the sliding-window protocol (JSON out).
    Score(ScoreArgs),
    /// Continue a prompt (greedy unless a temperature is given).
    Generate(GenerateArgs),
}

#[derive(Args)]
struct ModelArgs {
    /// A `.gguf` file (llama or gemma3) or an HF llama directory.
    #[arg(long)]
    model: PathBuf,
    /// A tokenizer.json to use instead of the one beside the model or in its GGUF metadata.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// CPU threads for the model (default: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Run on the CPU even when a GPU is available.
    #[arg(long)]
    cpu: bool,
    /// Keep many-token inputs on the quantized weights (less memory, slower scoring).
    #[arg(long)]
    quantized_prefill: bool,
}

#[derive(Args)]
struct ScoreArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text files, folders or JSON-lines files (`text`, `meta.pile_set_name`).
    #[arg(long = "input", num_args = 1.., required = true)]
    inputs: Vec<PathBuf>,
    /// Score only the first N tokens of the input.
    #[arg(long)]
    max_tokens: Option<usize>,
    #[arg(long, default_value_t = 1024)]
    window: usize,
    #[arg(long, default_value_t = 512)]
    stride: usize,
    /// Leave the per-document list out of the JSON.
    #[arg(long)]
    summary: bool,
    #[arg(long, default_value = "-")]
    output: String,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Sample at this temperature instead of decoding greedily.
    #[arg(long)]
    temperature: Option<f64>,
    #[arg(long)]
    top_p: Option<f64>,
    #[arg(long, default_value_t = 299792458)]
    seed: u64,
}

fn load_model(args: &ModelArgs) -> Result<Model> {
    model::set_cpu_threads(args.threads);
    let opts = LoadOptions {
        tokenizer: args.tokenizer.clone(),
        device: if args.cpu {
            DeviceChoice::Cpu
        } else {
            DeviceChoice::Auto
        },
        quantized_prefill: args.quantized_prefill,
    };
    Ok(Model::load(&args.model, &opts)?)
}

fn run_score(args: ScoreArgs) -> Result<()> {
    let model = load_model(&args.model)?;
    let budget = args.max_tokens.map_or(TokenBudget::All, TokenBudget::Total);
    let docs = load_documents(&args.inputs, &model, budget, None)?;
    let opts = WindowOptions {
        window: args.window,
        stride: args.stride,
    };
    let (mut report, _) = score_documents(&model, &docs, opts)?;
    if args.summary {
        report.documents.clear();
    }
    let mut out = open_writer(&args.output)?;
    serde_json::to_writer_pretty(&mut out, &report)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

fn run_generate(args: GenerateArgs) -> Result<()> {
    let model = load_model(&args.model)?;
    let prompt = model.encode_document(&args.prompt)?;
    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        stop_token: model.tokenizer().eos_token_id(),
    };
    let generation = model.transformer().generate(&prompt, &opts)?;
    let text = model.decode(&generation.tokens)?;
    let out = serde_json::json!({
        "prompt": args.prompt,
        "text": text,
        "generation": generation,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

#[derive(Args)]
struct BuildArgs {
    /// Text inputs: files or folders (JSON lines `.jsonl`/`.json`, optionally `.gz`; other files are one document each).
    #[arg(long = "input", num_args = 1.., required_unless_present = "from_tokens", conflicts_with = "from_tokens")]
    inputs: Vec<PathBuf>,
    /// A pre-tokenized file in the infini-gram layout (separator before every document).
    #[arg(long)]
    from_tokens: Option<PathBuf>,
    /// Output folder (must not exist unless --force).
    #[arg(long)]
    out: PathBuf,
    /// tokenizer.json, or a GGUF model whose metadata carries the tokenizer.
    #[arg(long, required_unless_present = "from_tokens")]
    tokenizer: Option<PathBuf>,
    /// Token width in bits (8, 16, 32); default: the narrowest that fits the vocabulary.
    #[arg(long)]
    token_width: Option<u32>,
    /// End-of-sequence id (default: the tokenizer's).
    #[arg(long)]
    eos_id: Option<u32>,
    /// Vocabulary size (default: the tokenizer's; for token files, all ids but the separator).
    #[arg(long)]
    vocab_size: Option<u64>,
    /// Peak memory for the build, in GiB: decides how many tokens go in one shard.
    #[arg(long, default_value_t = 8.0)]
    memory_gib: f64,
    /// Most tokens in one shard, whatever the memory budget.
    #[arg(long)]
    max_shard_tokens: Option<u64>,
    /// Threads for tokenizing and suffix arrays (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Replace an existing index at --out.
    #[arg(long)]
    force: bool,
    /// Evaluation text (files, folders, JSON lines): drop input documents whose n-grams mostly occur
    /// in it (paper §5).
    #[arg(long, num_args = 1.., requires = "tokenizer")]
    decontaminate: Vec<PathBuf>,
    /// n-gram length for --decontaminate.
    #[arg(long, default_value_t = decontam::DEFAULT_NGRAM)]
    decontaminate_ngram: usize,
    /// Drop a document when at least this share of its n-grams occurs in the evaluation text.
    #[arg(long, default_value_t = decontam::DEFAULT_THRESHOLD)]
    decontaminate_threshold: f64,
}

#[derive(Args)]
struct OpenArgs {
    #[arg(long)]
    index: PathBuf,
    /// For indexes without our manifest (built by the reference indexer): token width in bits.
    #[arg(long)]
    token_width: Option<u32>,
    /// For indexes without our manifest: the eos token id.
    #[arg(long)]
    eos_id: Option<u32>,
    /// For indexes without our manifest: the vocabulary size.
    #[arg(long)]
    vocab_size: Option<u64>,
}

#[derive(Args)]
struct QueryArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// Queries, one JSON object a line ("-" for standard input).
    #[arg(long, default_value = "-")]
    input: String,
    /// Answers, one JSON object a line ("-" for standard output).
    #[arg(long, default_value = "-")]
    output: String,
    /// Add `latency` (ms of CPU time) to every answer.
    #[arg(long)]
    timing: bool,
    /// Touch every page of the index before answering (steady latencies from the first query).
    #[arg(long)]
    warm: bool,
}

fn open_options(args: &OpenArgs) -> Result<OpenOptions> {
    Ok(OpenOptions {
        token_width: args.token_width.map(TokenWidth::from_bits).transpose()?,
        eos_token_id: args.eos_id,
        vocab_size: args.vocab_size,
        ..OpenOptions::default()
    })
}

fn input_size(files: &[(PathBuf, String)]) -> u64 {
    files
        .iter()
        .filter_map(|(p, _)| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn run_build(args: BuildArgs) -> Result<()> {
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .context("setting up threads")?;
    }
    let tokenizer = args
        .tokenizer
        .as_deref()
        .map(Tokenizer::from_file)
        .transpose()?;
    let vocab_size = match (args.vocab_size, &tokenizer) {
        (Some(v), _) => v,
        (None, Some(t)) => t.vocab_size(),
        (None, None) => {
            let bits = args
                .token_width
                .context("--from-tokens needs --token-width")?;
            TokenWidth::from_bits(bits)?.capacity() - 1
        }
    };
    let width = match args.token_width {
        Some(bits) => TokenWidth::from_bits(bits)?,
        None => TokenWidth::for_vocab(vocab_size),
    };
    let eos_token_id = match (
        args.eos_id,
        tokenizer.as_ref().and_then(Tokenizer::eos_token_id),
    ) {
        (Some(e), _) | (None, Some(e)) => e,
        (None, None) if args.from_tokens.is_some() => {
            bail!("--from-tokens needs --eos-id (the reference engine needs it too)")
        }
        (None, None) => bail!("the tokenizer names no eos token: pass --eos-id"),
    };
    let decontaminator = match (&tokenizer, args.decontaminate.is_empty()) {
        (Some(t), false) => Some(Decontaminator::from_files(
            &args.decontaminate,
            t,
            args.decontaminate_ngram,
            args.decontaminate_threshold,
        )?),
        _ => None,
    };
    let mut opts = BuildOptions {
        tokenizer: tokenizer.as_ref(),
        decontaminate: decontaminator.as_ref(),
        memory_budget: (args.memory_gib * (1u64 << 30) as f64) as u64,
        max_shard_tokens: args.max_shard_tokens,
        threads: args.threads.unwrap_or_else(rayon::current_num_threads),
        force: args.force,
        ..BuildOptions::new(args.out.clone(), width, eos_token_id, vocab_size)
    };

    let report = match &args.from_tokens {
        Some(path) => {
            opts.input_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            build(corpus::token_file_documents(path, width)?, &opts)?
        }
        None => {
            let files = corpus::expand_inputs(&args.inputs)?;
            opts.input_bytes = input_size(&files);
            build(corpus::text_documents(files), &opts)?
        }
    };
    tracing::info!(
        "built {}: {} shards, {} documents, {} tokens, {:.2} bytes/token on disk, peak {:.0} MiB ({:.2} bytes/token), {:.1} s",
        report.out,
        report.shards,
        report.documents,
        report.tokens,
        report.bytes_per_token,
        report.peak_rss_bytes as f64 / (1 << 20) as f64,
        report.peak_bytes_per_token,
        report.seconds_total
    );
    if let Some(d) = &report.decontamination {
        tracing::info!(
            "decontamination: dropped {} documents ({} tokens) with ≥{:.0}% of their {}-grams in the evaluation text",
            d.documents_dropped,
            d.tokens_dropped,
            d.threshold * 100.0,
            d.ngram
        );
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

fn index_info(index: &Index) -> serde_json::Value {
    serde_json::json!({
        "dir": index.dir().display().to_string(),
        "shards": index.num_shards(),
        "documents": index.total_documents(),
        "tokens_with_separators": index.total_tokens(),
        "token_width": index.width().bytes(),
        "eos_token_id": index.eos_token_id(),
        "vocab_size": index.vocab_size(),
        "tokenizer": index.manifest().and_then(|m| m.tokenizer.clone()),
        "manifest": index.manifest().is_some(),
    })
}

fn run_serve(path: &Path) -> Result<()> {
    let config = ServeConfig::load(path)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .with_context(|| format!("binding {}", config.bind))?;
        Ok::<_, anyhow::Error>(server::serve(config, listener, shutdown_signal()).await?)
    });
    // Work the drain deadline cut off may still be finishing on the blocking pool: do not wait.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}

/// Resolves at the first Ctrl-C or SIGTERM (the server then drains); a second one exits at once.
async fn shutdown_signal() {
    termination().await;
    tokio::spawn(async {
        termination().await;
        eprintln!("second signal: exiting now");
        std::process::exit(130);
    });
}

async fn termination() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Model, index and inputs of an evaluation, checked to belong together.
fn open_pairing(args: &PairingArgs) -> Result<(Model, Index)> {
    let model = load_model(&args.model)?;
    let index = Index::open(&args.index, &OpenOptions::default())?;
    Ok((model, index))
}

fn eval_setup(args: &EvalArgs) -> Result<(Model, Index, EvalInputs)> {
    let (model, index) = open_pairing(&args.pairing)?;
    let inputs = EvalInputs {
        inputs: args.pairing.inputs.clone(),
        max_tokens_per_domain: args.max_tokens,
        max_doc_tokens: args.max_doc_tokens,
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
    let params = experiment::fit(&Pairing::new(&model, &index)?, &inputs, gate)?;
    params.save(&args.out)?;
    let importances = match &params.gate {
        Some(g) => g
            .feature_names
            .iter()
            .cloned()
            .zip(g.importances()?)
            .collect(),
        None => Vec::new(),
    };
    let summary = serde_json::json!({
        "out": args.out,
        "lambda_sparse": params.lambda_sparse,
        "lambda_dense": params.lambda_dense,
        "by_domain": params.by_domain,
        "validation": params.fitted_on,
        "gate_feature_importances": importances,
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

fn run_ppl(args: PplArgs) -> Result<()> {
    let (model, index, inputs) = eval_setup(&args.eval)?;
    let params = MixingParams::load(&args.mixing)?;
    let (report, domains) = experiment::ppl(&Pairing::new(&model, &index)?, &inputs, &params)?;
    if let Some(path) = &args.per_token {
        write_per_token(path, &domains, &params)?;
    }
    match &args.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            std::fs::write(
                dir.join("report.json"),
                serde_json::to_string_pretty(&report)?,
            )?;
            std::fs::write(dir.join("report.md"), eval_report::markdown(&report))?;
            print!("{}", eval_report::markdown(&report));
        }
        None => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(())
}

fn run_spec(args: SpecArgs) -> Result<()> {
    if args.max_draft + 1 > spec::MAX_VERIFY_ROWS {
        anyhow::bail!("--max-draft must be at most {}", spec::MAX_VERIFY_ROWS - 1);
    }
    let (model, index) = open_pairing(&args.pairing)?;
    Pairing::new(&model, &index)?;
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
        draft: DraftOptions {
            max_tokens: args.max_draft,
            min_token_prob: args.min_token_prob,
            min_path_prob: args.min_path_prob,
            match_len_factor: args.match_len_factor,
            tree: args.tree,
            tree_budget: args.tree_budget,
            ..DraftOptions::default()
        },
    };
    let rows = eval_spec::run(&model, &index, &docs, &opts)?;
    let md = eval_spec::markdown(&rows);
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("spec.json"), serde_json::to_string_pretty(&rows)?)?;
        std::fs::write(dir.join("spec.md"), &md)?;
    }
    print!("{md}");
    Ok(())
}

/// One JSON line per scored token: the three log-probs and what the ∞-gram matched.
fn write_per_token(path: &Path, domains: &[DomainRecords], params: &MixingParams) -> Result<()> {
    let mut out = open_writer(&path.display().to_string())?;
    for d in domains {
        let sparse: Vec<bool> = d.tokens.iter().map(|t| t.sparse).collect();
        let features: Vec<_> = d.tokens.iter().map(|t| t.features).collect();
        let split = params.lambdas(LambdaRule::Split, None, &sparse, &features)?;
        let domain_split =
            params.lambdas(LambdaRule::DomainSplit, Some(&d.domain), &sparse, &features)?;
        let gate = params
            .gate
            .as_ref()
            .map(|g| g.predict(&features))
            .transpose()?;
        for (i, t) in d.tokens.iter().enumerate() {
            let e = t.evidence();
            let mixed = |l: f64| mix::mixed_prob(e.p_infgram, e.p_neural, l).ln();
            let line = serde_json::json!({
                "domain": d.domain, "doc": t.doc, "position": t.position, "token": t.token,
                "neural_logprob": t.neural_logprob, "infgram_prob": t.infgram_prob,
                "suffix_len": t.suffix_len, "prompt_cnt": t.prompt_cnt, "sparse": t.sparse,
                "lambda_split": split[i], "mixed_logprob_split": mixed(split[i]),
                "lambda_domain_split": domain_split[i],
                "mixed_logprob_domain_split": mixed(domain_split[i]),
                "lambda_gate": gate.as_ref().map(|g| g[i]),
                "mixed_logprob_gate": gate.as_ref().map(|g| mixed(g[i])),
            });
            writeln!(out, "{line}")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn open_writer(path: &str) -> Result<Box<dyn Write>> {
    Ok(if path == "-" {
        Box::new(BufWriter::new(std::io::stdout().lock()))
    } else {
        Box::new(BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {path}"))?,
        ))
    })
}

fn open_reader(path: &str) -> Result<Box<dyn BufRead>> {
    Ok(if path == "-" {
        Box::new(BufReader::new(std::io::stdin().lock()))
    } else {
        Box::new(BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {path}"))?,
        ))
    })
}

/// Refuses `--output` naming the file `--input` reads (by device and inode, so links count too):
/// creating the output would empty the queries before they are read.
fn check_distinct_files(input: &str, output: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if input == "-" || output == "-" {
        return Ok(());
    }
    let (Ok(i), Ok(o)) = (std::fs::metadata(input), std::fs::metadata(output)) else {
        return Ok(());
    };
    if (i.dev(), i.ino()) == (o.dev(), o.ino()) {
        bail!("--output {output} is the --input file: writing answers there would destroy the queries; name another file");
    }
    Ok(())
}

fn run_query(args: QueryArgs) -> Result<()> {
    check_distinct_files(&args.input, &args.output)?;
    let index = Index::open(&args.open.index, &open_options(&args.open)?)?;
    if args.warm {
        index.warm_up();
    }
    let mut output = open_writer(&args.output)?;
    let (queries, errors) =
        protocol::run_batch(&index, open_reader(&args.input)?, &mut output, args.timing)?;
    output.flush()?;
    tracing::info!(queries, errors, "answered");
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Index(IndexCommand::Build(args)) => run_build(args),
        Command::Index(IndexCommand::Info(args)) => {
            let index = Index::open(&args.index, &open_options(&args)?)?;
            println!("{}", serde_json::to_string_pretty(&index_info(&index))?);
            Ok(())
        }
        Command::Index(IndexCommand::Verify(args)) => {
            let opts = OpenOptions {
                verify_checksums: true,
                ..open_options(&args)?
            };
            let index = Index::open(&args.index, &opts)?;
            index.verify_documents()?;
            println!(
                "{}: ok ({} shards, checksums and document offsets verified)",
                index.dir().display(),
                index.num_shards()
            );
            Ok(())
        }
        Command::Query(args) => run_query(args),
        Command::Model(ModelCommand::Score(args)) => run_score(args),
        Command::Model(ModelCommand::Generate(args)) => run_generate(args),
        Command::Eval(EvalCommand::Fit(args)) => run_fit(args),
        Command::Eval(EvalCommand::Ppl(args)) => run_ppl(args),
        Command::Eval(EvalCommand::Spec(args)) => run_spec(args),
        Command::Serve { config } => run_serve(&config),
        Command::Tokenize { tokenizer, text } => {
            let ids = Tokenizer::from_file(Path::new(&tokenizer))?.encode(&text)?;
            println!("{}", serde_json::to_string(&ids)?);
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    // The server handles its own signals: it drains instead of interrupting every request.
    if !matches!(cli.command, Command::Serve { .. }) {
        interrupt::install_handler();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if matches!(
                e.downcast_ref::<IndexError>(),
                Some(IndexError::Interrupted)
            ) || matches!(
                e.downcast_ref::<ModelError>(),
                Some(ModelError::Interrupted)
            ) =>
        {
            eprintln!("interrupted: nothing was left behind");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
