//! Opening a service from its config: the index of either kind, the mixing file, the model and
//! the live index, each checked against the others before the first request.

use std::sync::Arc;

use tokio::sync::{watch, Semaphore};

use super::config::{Role, ServeConfig};
use super::metrics::Metrics;
use super::mix_sequences::MixSequences;
use super::session::Sessions;
use super::{ServeError, SidecarService, State};
use crate::cluster::identity::Expected;
use crate::cluster::partial::PartialAnswers;
use crate::cpu::{CpuInfo, KernelFlavour};
use crate::evidence::{byte_source, EvidenceSource};
use crate::index::fm::CompressedIndex;
use crate::index::{Index, OpenOptions, TokenWidth};
use crate::live::{LiveIndex, LiveStore, Vocabulary};
use crate::mix::MixingParams;
use crate::model::budget::KvBudget;
use crate::model::{LoadOptions, Model};
use crate::tokenizer::Tokenizer;

/// Where a service's evidence comes from, and what reads ids and text for it.
pub(super) struct Evidence {
    pub(super) corpus: Option<Arc<dyn PartialAnswers>>,
    pub(super) evidence: Arc<dyn EvidenceSource>,
    pub(super) tokenizer: Tokenizer,
    pub(super) live: Option<Arc<dyn LiveStore>>,
}

/// A config's mixing file and model, loaded (the model's kernels as the config asks).
pub(super) struct Neural {
    pub(super) mixing: Option<MixingParams>,
    pub(super) model: Option<Model>,
}

impl Neural {
    pub(super) fn load(config: &ServeConfig) -> Result<Self, ServeError> {
        let mixing = config
            .mixing
            .as_deref()
            .map(MixingParams::load)
            .transpose()?;
        if let Some(threads) = config.model_threads {
            crate::model::set_cpu_threads(threads);
        }
        let model = config
            .model
            .as_deref()
            .map(|path| {
                let kernels = KernelFlavour::requested(config.cpu.as_deref())?;
                let opts = LoadOptions {
                    kernels: Some(kernels),
                    ..LoadOptions::default()
                };
                let model = Model::load(path, &opts)?;
                // Bits per byte need every token's spelling: worked out now, not on a request.
                model.tokenizer().spelling(0);
                Ok::<_, crate::model::ModelError>(model)
            })
            .transpose()?;
        Ok(Self { mixing, model })
    }

    /// Beside a byte-level index: any model, and a mixing file fitted against one with this model.
    fn check_byte_level(&self) -> Result<(), ServeError> {
        match (&self.mixing, &self.model) {
            (Some(m), Some(model)) => Ok(m.check_pairing(model.tokenizer().fingerprint(), true)?),
            (Some(_), None) => Err(ServeError::Setup(
                "a mixing file beside a byte-level index needs the model it was fitted with".into(),
            )),
            (None, _) => Ok(()),
        }
    }

    /// Refuses a mixing file or a model fitted to another tokenizer than `whose`'s.
    pub(super) fn check_tokenizer(
        &self,
        tokenizer: &Tokenizer,
        whose: &str,
    ) -> Result<(), ServeError> {
        if let Some(m) = &self.mixing {
            m.check_pairing(tokenizer.fingerprint(), false)?;
        }
        if let Some(m) = &self.model {
            m.check_tokenizer(tokenizer.fingerprint(), whose)?;
        }
        Ok(())
    }
}

/// The live index of a config that turns it on, over `vocab`'s ids.
fn open_live(
    config: &ServeConfig,
    vocab: impl FnOnce() -> Result<Vocabulary, ServeError>,
) -> Result<Option<Arc<dyn LiveStore>>, ServeError> {
    config
        .live
        .config()
        .map(|live| Ok(Arc::new(LiveIndex::open(live, vocab()?)?) as Arc<dyn LiveStore>))
        .transpose()
}

/// The live index's vocabulary where it holds a model's tokens.
fn model_vocabulary(tokenizer: &Tokenizer) -> Result<Vocabulary, ServeError> {
    let eos_token_id = tokenizer.eos_token_id().ok_or_else(|| {
        ServeError::Setup("the live index needs the model's tokenizer to name an eos token".into())
    })?;
    Ok(Vocabulary {
        width: TokenWidth::for_vocab(tokenizer.vocab_size()),
        eos_token_id,
        vocab_size: tokenizer.vocab_size(),
    })
}

impl SidecarService {
    /// Opens the index (with its tokenizer), the mixing file and the model of a config.
    pub fn open(config: &ServeConfig) -> Result<Self, ServeError> {
        Self::open_with_metrics(config, Arc::new(Metrics::default()))
    }

    pub fn open_with_metrics(
        config: &ServeConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ServeError> {
        config.check()?;
        if crate::index::fm::is_compressed(&config.index) {
            return Self::open_compressed(config, metrics);
        }
        let opts = OpenOptions {
            sample_ranks: config.sample_ranks,
            ..OpenOptions::default()
        };
        let index = Arc::new(Index::open(&config.index, &opts)?);
        let tokenizer = index.tokenizer().cloned().ok_or_else(|| {
            ServeError::Setup(format!(
                "{}: the index has no tokenizer",
                config.index.display()
            ))
        })?;
        let neural = Neural::load(config)?;
        if index.is_byte_level() {
            if neural.model.is_some() && config.cluster.role == Role::Shard {
                return Err(ServeError::Setup(
                    "a shard server over a byte-level index follows its routers' byte ids: it \
                     takes no model"
                        .into(),
                ));
            }
            neural.check_byte_level()?;
            if let Some(model) = &neural.model {
                // What a byte index reads of the model's vocabulary: worked out now, not on a
                // request.
                model.tokenizer().spelling_order();
            }
        } else {
            neural.check_tokenizer(&tokenizer, "the index")?;
        }
        // Beside a model, a byte index follows the model's tokens: sequences (sessions, drafts,
        // live documents) hold those.
        let model_over_bytes = neural.model.as_ref().filter(|_| index.is_byte_level());
        let live = open_live(config, || match model_over_bytes {
            Some(model) => model_vocabulary(model.tokenizer()),
            None => Ok(Vocabulary::of(&*index)),
        })?;
        let evidence: Arc<dyn EvidenceSource> = match &neural.model {
            Some(model) => byte_source::for_model(index.clone(), model.tokenizer()),
            None => index.clone(),
        };
        Ok(Self::assemble(
            config,
            metrics,
            Evidence {
                corpus: Some(index),
                evidence,
                tokenizer,
                live,
            },
            neural,
        ))
    }

    /// A sidecar over a compressed index, or a shard server over one. Over bytes it takes no
    /// model: a model's tokens follow a byte-level index by reading its suffix arrays.
    fn open_compressed(config: &ServeConfig, metrics: Arc<Metrics>) -> Result<Self, ServeError> {
        if config.sample_ranks {
            tracing::warn!(
                "sample_ranks is for suffix-array indexes: a compressed index ignores it"
            );
        }
        let index = Arc::new(CompressedIndex::open(&config.index)?);
        let tokenizer = index.tokenizer().cloned().ok_or_else(|| {
            ServeError::Setup(format!(
                "{}: the index has no tokenizer",
                config.index.display()
            ))
        })?;
        if tokenizer.is_utf8_bytes() && config.model.is_some() {
            return Err(ServeError::Setup(
                "a compressed byte-level index is served without a model: a model's tokens \
                 follow a byte-level index by reading its suffix arrays; serve the index it was \
                 compressed from"
                    .into(),
            ));
        }
        let neural = Neural::load(config)?;
        match tokenizer.is_utf8_bytes() {
            true => neural.check_byte_level()?,
            false => neural.check_tokenizer(&tokenizer, "the index")?,
        }
        let live = open_live(config, || Ok(Vocabulary::of(&*index)))?;
        Ok(Self::assemble(
            config,
            metrics,
            Evidence {
                corpus: Some(index.clone()),
                evidence: index,
                tokenizer,
                live,
            },
            neural,
        ))
    }

    /// A service over `evidence` with `neural` (a router's, over its shard servers, has no index).
    pub(super) fn assemble(
        config: &ServeConfig,
        metrics: Arc<Metrics>,
        evidence: Evidence,
        neural: Neural,
    ) -> Self {
        if let Some(live) = &evidence.live {
            metrics.watch_live(Arc::clone(live));
        }
        Self {
            state: Arc::new(State {
                shard: (evidence.corpus.as_deref()).map(Expected::of_index),
                corpus: evidence.corpus,
                evidence: evidence.evidence,
                tokenizer: evidence.tokenizer,
                mixing: neural.mixing,
                model: neural.model,
                cpu: CpuInfo::detect(),
                limits: config.limits,
                in_flight: Arc::new(Semaphore::new(config.limits.max_in_flight)),
                sessions: Sessions::new(config.limits.max_sessions, Arc::clone(&metrics)),
                mix_sequences: MixSequences::default(),
                kv_budget: KvBudget::new(config.limits.max_kv_tokens, metrics.kv_tokens.clone()),
                live: evidence.live,
                metrics,
                closing: watch::channel(false).0,
            }),
        }
    }

    /// Ends open streams and running work with UNAVAILABLE: the drain deadline of a shutdown.
    pub(crate) fn close_streams(&self) {
        self.state.closing.send_replace(true);
    }

    /// Stops the live index's compactor and keeps what it learnt (`LiveIndex::close`).
    pub(crate) fn close_live(&self) {
        if let Some(live) = &self.state.live {
            live.close();
        }
    }
}
