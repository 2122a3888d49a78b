//! The neural side: a real pretrained causal LM (llama family or Gemma-3, from GGUF or an HF
//! directory) run by candle, with logits at every position, a cache that rolls back, and the scoring
//! the evaluator and the service need.

pub mod budget;
mod cache;
pub mod config;
#[cfg(target_arch = "x86_64")]
mod exp_lanes;
mod gated;
mod generate;
mod scoring;
mod short_attention;
mod short_matmul;
mod transformer;
mod weights;

use std::path::{Path, PathBuf};

use candle_core::Device;

pub use cache::KvCache;

/// Passes of fewer rows than this are short (decoding): they run on the quantized weights and
/// attend row by row, so every row comes out exactly as a one-token step computes it. Longer passes
/// (window scoring, prefill) use the dense f32 copies and batched attention (eval/MODEL.md), unless
/// they are exact ([`MAX_EXACT_ROWS`]): draft verification.
pub const SHORT_PASS_ROWS: usize = 16;
/// Most rows of an exact pass ([`Transformer::forward_exact`], [`Transformer::forward_tree`]):
/// short-pass arithmetic whatever the rows, so a verified draft reproduces plain decoding. A row
/// costs about a fifth of a one-token SmolLM2 step on a CPU (eval/MODEL.md); past this many, drafts
/// are rarely accepted far enough to pay for their rows.
pub const MAX_EXACT_ROWS: usize = 32;
pub use config::{Activation, Architecture, ModelConfig};
pub use generate::{GenerateOptions, Generation};
pub use scoring::{
    plan_windows, DocumentScore, LogitRow, NextTokenDistribution, PositionScore, Window,
    WindowOptions,
};
pub use transformer::Transformer;

use crate::cpu::KernelFlavour;
use crate::tokenizer::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{0}")]
    Io(String),
    #[error("model file: {0}")]
    Format(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// Bad input from a caller (ids outside the vocabulary, a context too long, bad options).
    #[error("{0}")]
    Invalid(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("interrupted")]
    Interrupted,
    /// A shared limit (the KV caches' budget) has no room for the work.
    #[error("{0}")]
    Exhausted(String),
    #[error("tokenizers differ: {0}")]
    Mismatch(String),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("kernels: {0}")]
    Cpu(#[from] crate::cpu::CpuError),
}

/// Where to run the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first CUDA device when candle was built with CUDA and one is present, else the CPU.
    #[default]
    Auto,
    Cpu,
}

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// A `tokenizer.json` to use instead of the one found beside the model or in its GGUF metadata.
    pub tokenizer: Option<PathBuf>,
    pub device: DeviceChoice,
    /// Run many-row inputs on the quantized weights too, instead of dense f32 copies: less memory
    /// (the file's size instead of 4 bytes per parameter), much slower window scoring on CPU.
    pub quantized_prefill: bool,
    /// The flavour of our quantized kernels; None: what `INFINI_SIDECAR_CPU` asks for, else the
    /// best this CPU runs.
    pub kernels: Option<KernelFlavour>,
}

/// Tokens a tokenizer.json may add beyond the model's embedding rows (Gemma's adds an image token
/// the text model never sees); more than this means the two do not belong together.
const TOKENIZER_EXTRA_TOKENS: usize = 8;

/// Sets how many CPU threads candle's kernels use. Takes effect only before the first model call
/// (candle sizes its thread pools once), so the CLI calls it at start-up.
pub fn set_cpu_threads(threads: usize) {
    if threads > 0 {
        std::env::set_var("CANDLE_NUM_THREADS", threads.to_string());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
}

/// Runs `work` on a worker of rayon's global pool, which the CPU kernels split their work over (at
/// once when already on one). From any other thread, the pool's idle workers would spin against the
/// pass's own sequential parts (on a 2-core machine, 25% of a decoding step) and against what the
/// caller does between passes, so decoding loops run wholly inside the pool too. The caller's stop
/// signal goes with it: a pass of a request that is stopped stops between two layers wherever it
/// runs (without it, a server's long pass ran to its end after its client left).
pub fn on_rayon_worker<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let signal = crate::interrupt::current();
    // `scope` runs its body on a worker, injecting it into the pool from outside.
    rayon::scope(|_| crate::interrupt::run_under(signal.as_ref(), work))
}

/// Loads the network alone (no tokenizer): a `.gguf` file or an HF llama directory, with the kernel
/// flavour `INFINI_SIDECAR_CPU` asks for (else the best this CPU runs).
pub fn load_transformer(path: &Path, device: DeviceChoice) -> Result<Transformer, ModelError> {
    load_network(path, device, KernelFlavour::requested(None)?)
}

fn load_network(
    path: &Path,
    device: DeviceChoice,
    flavour: KernelFlavour,
) -> Result<Transformer, ModelError> {
    let device = match device {
        DeviceChoice::Cpu => Device::Cpu,
        DeviceChoice::Auto => Device::cuda_if_available(0)?,
    };
    let (config, weights) = if path.is_dir() {
        weights::load_hf_dir(path, &device)?
    } else {
        weights::load_gguf(path, &device, flavour)?
    };
    Transformer::new(config, weights, device)
}

/// A model and the tokenizer that gives its ids their meaning.
pub struct Model {
    transformer: Transformer,
    tokenizer: Tokenizer,
    source: PathBuf,
}

impl Model {
    /// Loads a `.gguf` file (llama or gemma3) or an HF llama directory (`config.json`,
    /// `*.safetensors`, `tokenizer.json`).
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self, ModelError> {
        let flavour = match opts.kernels {
            Some(flavour) => flavour.check()?,
            None => KernelFlavour::requested(None)?,
        };
        let mut transformer = load_network(path, opts.device, flavour)?;
        if !opts.quantized_prefill {
            transformer.add_dense_copies()?;
        }
        let config = transformer.config();
        let tokenizer_path = opts.tokenizer.clone().unwrap_or_else(|| {
            let beside = path.with_file_name("tokenizer.json");
            let inside = path.join("tokenizer.json");
            match (path.is_dir(), beside.exists()) {
                (true, _) => inside,
                (false, true) => beside,
                (false, false) => path.to_path_buf(),
            }
        });
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        if tokenizer.vocab_size() as usize > config.vocab_size + TOKENIZER_EXTRA_TOKENS {
            return Err(ModelError::Mismatch(format!(
                "{} has {} tokens but the model only {}",
                tokenizer.source(),
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        tracing::info!(
            model = %path.display(),
            architecture = ?config.architecture,
            layers = config.num_layers,
            vocab = config.vocab_size,
            device = ?transformer.device(),
            kernels = transformer.kernel_flavour().map_or("candle", KernelFlavour::name),
            cpu = %crate::cpu::CpuInfo::detect().summary(),
            "model loaded"
        );
        Ok(Self {
            transformer,
            tokenizer,
            source: path.to_path_buf(),
        })
    }

    pub fn transformer(&self) -> &Transformer {
        &self.transformer
    }

    pub fn config(&self) -> &ModelConfig {
        self.transformer.config()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The flavour of our kernels that serves decoding, or "candle" where candle's kernels do.
    pub fn kernel_name(&self) -> &'static str {
        self.transformer
            .kernel_flavour()
            .map_or("candle", KernelFlavour::name)
    }

    /// Refuses to pair this model with an index (or anything else) tokenized differently.
    pub fn check_tokenizer(&self, fingerprint: &str, what: &str) -> Result<(), ModelError> {
        if fingerprint == self.tokenizer.fingerprint() {
            Ok(())
        } else {
            Err(ModelError::Mismatch(format!(
                "{what} was tokenized with tokenizer {fingerprint:.12}…, the model {} uses {:.12}… ({})",
                self.source.display(),
                self.tokenizer.fingerprint(),
                self.tokenizer.source()
            )))
        }
    }

    /// Token ids of `text`, with the model's BOS in front when it wants one.
    pub fn encode_document(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let mut ids: Vec<u32> = self.config().bos_token_id.into_iter().collect();
        ids.extend(
            self.tokenizer
                .encode(text)
                .map_err(|e| ModelError::Tokenizer(e.to_string()))?,
        );
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.tokenizer
            .decode(ids)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }
}
