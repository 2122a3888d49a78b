//! The `infini-sidecar` command line: a thin layer over the library.

mod cli {
    pub mod eval;
    pub mod text;
}

use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use infini_sidecar::cluster::split::{self, ShardSplit};
use infini_sidecar::corpus;
use infini_sidecar::eval::documents::{load_documents, TokenBudget};
use infini_sidecar::eval::neural::score_documents;
use infini_sidecar::eval::EvalError;
use infini_sidecar::index::build::decontam::{self, Decontaminator};
use infini_sidecar::index::build::token_file;
use infini_sidecar::index::build::{build, BuildOptions, GivenVocabulary};
use infini_sidecar::index::fm::{self, CompressedIndex};
use infini_sidecar::index::format::NextTableSpec;
use infini_sidecar::index::{Index, IndexError, OpenOptions, TokenWidth};
use infini_sidecar::interrupt;
use infini_sidecar::model::{
    self, DeviceChoice, GenerateOptions, LoadOptions, Model, ModelError, WindowOptions,
};
use infini_sidecar::protocol;
use infini_sidecar::server::{self, config::ServeConfig};
use infini_sidecar::tokenizer::Tokenizer;

use cli::text;

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
    Eval(cli::eval::EvalCommand),
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
enum IndexCommand {
    /// Build an index from text (plain files, JSON lines, .gz) or from a pre-tokenized file.
    Build(BuildArgs),
    /// Print what an index holds (a summary; JSON with --json).
    Info(InfoArgs),
    /// Check every file's checksum against the manifest and every document offset.
    Verify(OpenArgs),
    /// Build the compressed form of an index (an FM-index per part) into a new folder.
    Compress(CompressArgs),
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Perplexity of a text or Pile-style JSON-lines file with the sliding-window protocol.
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
    /// Also write the JSON report to this file ("-": no file).
    #[arg(long, default_value = "-")]
    output: String,
    #[command(flatten)]
    format: text::Format,
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
    #[command(flatten)]
    format: text::Format,
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
        kernels: None,
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
    if args.output == "-" {
        return args.format.print(&report, || text::score_report(&report));
    }
    let mut out = open_writer(&args.output)?;
    serde_json::to_writer_pretty(&mut out, &report)?;
    writeln!(out)?;
    out.flush()?;
    args.format.print(&report, || {
        text::score_report(&report) + &text::wrote(&[Path::new(&args.output)])
    })
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
    let cpu = infini_sidecar::cpu::CpuInfo::detect();
    let out = serde_json::json!({
        "prompt": args.prompt,
        "text": text,
        "generation": generation,
        "kernel_flavour": model.kernel_name(),
        "cpu": cpu,
    });
    args.format.print(&out, || {
        text::generation(
            &args.prompt,
            &text,
            &generation,
            model.kernel_name(),
            &cpu.summary(),
        )
    })
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
    #[arg(long, required_unless_present_any = ["from_tokens", "bytes"])]
    tokenizer: Option<PathBuf>,
    /// Index raw UTF-8 bytes instead of a tokenizer's ids (1-byte tokens, eos 0xFE): one index
    /// that mixes with every model, whatever its tokenizer.
    #[arg(long, conflicts_with_all = ["tokenizer", "from_tokens", "eos_id", "vocab_size", "token_width"])]
    bytes: bool,
    #[command(flatten)]
    vocabulary: VocabularyArgs,
    /// Peak memory for the build, in GiB: decides how many tokens go in one part (one suffix array).
    #[arg(long, default_value_t = 8.0)]
    memory_gib: f64,
    /// Most tokens in one part, whatever the memory budget.
    #[arg(long, alias = "max-shard-tokens")]
    max_part_tokens: Option<u64>,
    /// Threads for tokenizing and suffix arrays (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Replace an existing index at --out.
    #[arg(long)]
    force: bool,
    /// Budget of each part's next-token table (exact next-token counts of the most frequent short
    /// prompts, so `ntd` after them is a lookup), in MiB; 0 writes none.
    #[arg(long, default_value_t = 64.0)]
    next_token_table_mib: f64,
    /// Fewest matches a prompt needs to get an entry in the next-token table.
    #[arg(long, default_value_t = NextTableSpec::default().min_count)]
    next_token_min_count: u64,
    /// Evaluation text (files, folders, JSON lines): drop input documents whose n-grams mostly occur
    /// in it (paper §5).
    #[arg(long, num_args = 1.., conflicts_with = "from_tokens")]
    decontaminate: Vec<PathBuf>,
    /// n-gram length for --decontaminate.
    #[arg(long, default_value_t = decontam::DEFAULT_NGRAM)]
    decontaminate_ngram: usize,
    /// Drop a document when at least this share of its n-grams occurs in the evaluation text.
    #[arg(long, default_value_t = decontam::DEFAULT_THRESHOLD)]
    decontaminate_threshold: f64,
    /// Build only shard K of a set of N (`K/N`, K from 0): a contiguous run of the input's
    /// documents, the same in every command of the set, for shard servers behind a router.
    #[arg(long)]
    shard: Option<ShardSplit>,
    /// Build a compressed index (an FM-index per part) straight from the text, with no suffix
    /// array built or kept: what `index compress` gives, at a fraction of the time and memory.
    #[arg(long, conflicts_with = "next_token_table_mib")]
    compressed: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    format: text::Format,
}

/// How densely a compressed index samples its text's positions.
#[derive(Args)]
struct SamplingArgs {
    /// A compressed index keeps the position of every this-many-th token (a power of two from 2
    /// to 65536): locating a match walks at most this many steps. 64 costs about 0.5 bits a
    /// token; 32 about 1 bit for 0.4 of the locate time, 16 about 1.9 bits for a seventh.
    #[arg(long, default_value_t = fm::DEFAULT_SAMPLE_EVERY)]
    sample_every: u64,
}

/// What token ids mean where neither a tokenizer nor our manifest says: for `index build` of
/// token files (each given one overrides the tokenizer's), and for indexes without our manifest
/// (built by the reference indexer).
#[derive(Args)]
struct VocabularyArgs {
    /// Token width in bits (8, 16, 32). A build: default the narrowest that fits the vocabulary.
    /// An index without our manifest: its width (default 16); with one, it must agree.
    #[arg(long)]
    token_width: Option<u32>,
    /// End-of-sequence id. A build: default the tokenizer's. An index without our manifest:
    /// required; with one, it must agree.
    #[arg(long)]
    eos_id: Option<u32>,
    /// Vocabulary size. A build: default the tokenizer's (for token files, all ids but the
    /// separator). An index without our manifest: default every id of its width but the
    /// separator; with one, it must agree.
    #[arg(long)]
    vocab_size: Option<u64>,
}

#[derive(Args)]
struct OpenArgs {
    #[arg(long)]
    index: PathBuf,
    #[command(flatten)]
    vocabulary: VocabularyArgs,
}

#[derive(Args)]
struct InfoArgs {
    #[command(flatten)]
    open: OpenArgs,
    #[command(flatten)]
    format: text::Format,
}

#[derive(Args)]
struct CompressArgs {
    #[command(flatten)]
    open: OpenArgs,
    /// The new folder to write it to.
    #[arg(long)]
    out: PathBuf,
    /// Threads for the suffix sort (default: all cores).
    #[arg(long)]
    threads: Option<u16>,
    #[command(flatten)]
    sampling: SamplingArgs,
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
        token_width: (args.vocabulary.token_width)
            .map(TokenWidth::from_bits)
            .transpose()?,
        eos_token_id: args.vocabulary.eos_id,
        vocab_size: args.vocabulary.vocab_size,
        ..OpenOptions::default()
    })
}

fn run_build(args: BuildArgs) -> Result<()> {
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .context("setting up threads")?;
    }
    let tokenizer = match &args.tokenizer {
        Some(path) => Some(Tokenizer::from_file(path)?),
        None => args.bytes.then(Tokenizer::utf8_bytes),
    };
    let vocabulary = GivenVocabulary {
        vocab_size: args.vocabulary.vocab_size,
        token_width_bits: args.vocabulary.token_width,
        eos_token_id: args.vocabulary.eos_id,
    }
    .resolve(tokenizer.as_ref(), args.from_tokens.is_some())?;
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
        max_part_tokens: args.max_part_tokens,
        threads: args.threads.unwrap_or_else(rayon::current_num_threads),
        force: args.force,
        compressed: args.compressed.then_some(args.sampling.sample_every),
        next_table: (args.next_token_table_mib > 0.0).then(|| NextTableSpec {
            budget_bytes: (args.next_token_table_mib * (1u64 << 20) as f64) as u64,
            min_count: args.next_token_min_count.max(1),
            ..NextTableSpec::default()
        }),
        ..BuildOptions::new(
            args.out.clone(),
            vocabulary.width,
            vocabulary.eos_token_id,
            vocabulary.vocab_size,
        )
    };

    let files = match &args.from_tokens {
        Some(_) => Vec::new(),
        None => corpus::expand_inputs(&args.inputs)?,
    };
    let documents = || -> Result<Box<dyn Iterator<Item = _>>> {
        Ok(match &args.from_tokens {
            Some(path) => Box::new(token_file::documents(path, vocabulary.width)?),
            None => {
                Box::new(corpus::text_documents(files.clone()).map(|d| d.map_err(IndexError::from)))
            }
        })
    };
    opts.input_bytes = match &args.from_tokens {
        Some(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        None => corpus::total_bytes(&files),
    };
    let report = match args.shard {
        Some(split) => {
            let survey = split::survey(documents()?)?;
            split.check(&survey)?;
            opts.shard_set = Some(split::set_record(split, &survey, &opts));
            opts.input_bytes = 0;
            build(split.take(&survey, documents()?), &opts)?
        }
        None => build(documents()?, &opts)?,
    };
    args.format.print(&report, || text::build_report(&report))
}

fn run_serve(path: &Path) -> Result<()> {
    let config = ServeConfig::load(path)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let served = runtime.block_on(async {
        // Listened for before anything opens, so a signal during start-up drains the server as soon
        // as it serves instead of meeting SIGTERM's default action (exit at once, no clean close).
        let signals =
            interrupt::Termination::listen().context("listening for Ctrl-C and SIGTERM")?;
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .with_context(|| format!("binding {}", config.bind))?;
        Ok::<_, anyhow::Error>(
            server::serve(config, listener, interrupt::shutdown_signal(signals)).await?,
        )
    });
    // Work the drain deadline cut off may still be finishing on the blocking pool: do not wait.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    served
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
        anyhow::bail!("--output {output} is the --input file: writing answers there would destroy the queries; name another file");
    }
    Ok(())
}

fn run_compress(args: CompressArgs) -> Result<()> {
    let index = Index::open(&args.open.index, &open_options(&args.open)?)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u16));
    let bar = infini_sidecar::progress::token_bar(index.total_tokens(), "compressing");
    let start = std::time::Instant::now();
    let built = CompressedIndex::build(
        &index,
        &args.out,
        (args.sampling.sample_every, threads),
        |n| bar.inc(n),
    )?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let info = built.info()?;
    println!(
        "compressed {} into {} in {seconds:.1} s ({:.2} M tokens/s on {threads} threads)",
        index.dir().display(),
        args.out.display(),
        index.total_tokens() as f64 / seconds / 1e6
    );
    print!("{}", text::compressed_info(&info));
    Ok(())
}

fn run_query(args: QueryArgs) -> Result<()> {
    check_distinct_files(&args.input, &args.output)?;
    let index = infini_sidecar::index::corpus::open(&args.open.index, &open_options(&args.open)?)?;
    if args.warm {
        index.warm_up();
    }
    let mut output = open_writer(&args.output)?;
    let (queries, errors) =
        protocol::run_batch(&*index, open_reader(&args.input)?, &mut output, args.timing)?;
    output.flush()?;
    tracing::info!(queries, errors, "answered");
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Index(IndexCommand::Build(args)) => run_build(args),
        Command::Index(IndexCommand::Info(args))
            if infini_sidecar::index::fm::is_compressed(&args.open.index) =>
        {
            let info = CompressedIndex::open(&args.open.index)?.info()?;
            args.format.print(&info, || text::compressed_info(&info))
        }
        Command::Index(IndexCommand::Compress(args)) => run_compress(args),
        Command::Index(IndexCommand::Info(args)) => {
            let index = Index::open(&args.open.index, &open_options(&args.open)?)?;
            let info = index.info();
            args.format.print(&info, || text::index_info(&info))
        }
        Command::Index(IndexCommand::Verify(args)) => {
            let opts = OpenOptions {
                verify_checksums: true,
                ..open_options(&args)?
            };
            let index = Index::open(&args.index, &opts)?;
            index.verify_documents()?;
            println!(
                "{}: ok ({} parts, checksums and document offsets verified)",
                index.dir().display(),
                index.num_parts()
            );
            Ok(())
        }
        Command::Query(args) => run_query(args),
        Command::Model(ModelCommand::Score(args)) => run_score(args),
        Command::Model(ModelCommand::Generate(args)) => run_generate(args),
        Command::Eval(command) => cli::eval::run(command),
        Command::Serve { config } => run_serve(&config),
        Command::Tokenize { tokenizer, text } => {
            let ids = Tokenizer::from_file(Path::new(&tokenizer))?.encode(&text)?;
            println!("{}", serde_json::to_string(&ids)?);
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    // Colour codes only on a terminal: a log in a file or a pipe stays plain text.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
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
            ) || e
                .downcast_ref::<EvalError>()
                .is_some_and(EvalError::is_interrupted) =>
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
