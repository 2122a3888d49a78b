//! What the model and the index say at every scored token of a document.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::bytes;
use super::{EvidenceError, EvidenceSource};
use crate::index::dense::TokenScore;
use crate::mix::features::{gate_features, GateFeatures, InfgramContext, NeuralContext};
use crate::mix::fit::ScoredToken;
use crate::model::{Model, WindowOptions};

/// Version of [`TokenRecord`] and of the gate features in it: bump when either changes, so saved
/// records from older code are recomputed instead of reused.
pub const RECORD_FORMAT: u32 = 1;

/// Everything measured at one scored token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Index of the document in the input.
    pub doc: usize,
    pub position: usize,
    pub token: u32,
    pub neural_logprob: f32,
    pub infgram_prob: f64,
    pub suffix_len: usize,
    pub prompt_cnt: u64,
    pub sparse: bool,
    pub features: GateFeatures,
}

impl TokenRecord {
    pub fn neural_prob(&self) -> f64 {
        (self.neural_logprob as f64).exp()
    }

    pub fn evidence(&self) -> ScoredToken {
        ScoredToken {
            p_infgram: self.infgram_prob,
            p_neural: self.neural_prob(),
            sparse: self.sparse,
            features: self.features,
        }
    }

    pub fn effective_n(&self) -> usize {
        self.suffix_len + 1
    }
}

/// The records of one document's tokens `1..n` and what they cost.
pub struct DocumentRecords {
    pub tokens: Vec<TokenRecord>,
    pub neural_seconds: f64,
    pub infgram_seconds: f64,
}

/// Scores one document (`doc` is its index in the input): the model with the window protocol, the
/// reference data densely, and the gate features of every position. A byte-level index reads the
/// model's distribution at each position ([`super::bytes`]). `progress` hears of scored tokens.
pub fn document_records(
    model: &Model,
    source: &dyn EvidenceSource,
    window: WindowOptions,
    doc: usize,
    tokens: &[u32],
    progress: impl FnMut(usize),
) -> Result<DocumentRecords, EvidenceError> {
    let (neural, infgram, neural_seconds, infgram_seconds) = match source.byte_index() {
        Some(index) => {
            let t = Instant::now();
            let (neural, positions, infgram_seconds) =
                bytes::document(model, index, window, tokens, progress)?;
            let infgram: Vec<(TokenScore, InfgramContext)> = positions
                .into_iter()
                .map(|p| (p.score, p.context))
                .collect();
            let neural_seconds = t.elapsed().as_secs_f64() - infgram_seconds;
            (neural, infgram, neural_seconds, infgram_seconds)
        }
        None => {
            let t = Instant::now();
            let neural = model
                .transformer()
                .score_document(tokens, window, progress)?;
            let neural_seconds = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let (scores, contexts) = source.document(tokens)?;
            // Neural position scores start at token 1 (token 0 is only context).
            let infgram = scores.into_iter().zip(contexts).skip(1).collect();
            (neural, infgram, neural_seconds, t.elapsed().as_secs_f64())
        }
    };
    let records = neural
        .positions
        .iter()
        .zip(infgram)
        .enumerate()
        .map(|(offset, (nn, (inf, context)))| {
            let position = offset + 1;
            let neural_context = NeuralContext {
                entropy: nn.entropy as f64,
                top_prob: nn.top_prob as f64,
            };
            TokenRecord {
                doc,
                position,
                token: tokens[position],
                neural_logprob: nn.logprob,
                infgram_prob: inf.prob,
                suffix_len: inf.suffix_len,
                prompt_cnt: inf.prompt_cnt,
                sparse: inf.sparse,
                features: gate_features(&context, &neural_context),
            }
        })
        .collect();
    Ok(DocumentRecords {
        tokens: records,
        neural_seconds,
        infgram_seconds,
    })
}
