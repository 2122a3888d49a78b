//! `Score`: documents scored with the evaluator's protocol (the model over 1024-token windows, stride
//! 512; the ∞-gram densely over the whole prefix), streamed back one document at a time. The work
//! stops, mid-document too, at the deadline, as soon as the client goes away, or at a shutdown's
//! drain deadline.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::valid::{ScoredDocument, ValidScore};
use super::{index_status, mix_status, model_status, pb, stop_status, stopped, State, WorkPermit};
use crate::evidence::{bits_per_byte, document_records, mix_tokens, EvidenceError};
use crate::index::IndexError;
use crate::interrupt::StopSignal;
use crate::mix::{LambdaRule, MixError};
use crate::model::budget::KvReservation;
use crate::model::WindowOptions;

/// Documents scored ahead of a slow reader.
const STREAM_BUFFER: usize = 2;

/// Checks what the edge could not (a model to score with, the documents' ids) and starts scoring
/// on the blocking pool.
pub(super) fn start(
    state: Arc<State>,
    request: ValidScore,
    deadline: Option<Instant>,
) -> Result<ReceiverStream<Result<pb::ScoreResponse, Status>>, Status> {
    state.model()?;
    let rule =
        LambdaRule::resolve(request.lambda, state.mixing.as_ref(), true).map_err(mix_status)?;
    for d in &request.documents {
        state.check_model_ids(&d.tokens)?;
    }
    let kv = KvReservation::new(&state.kv_budget, WindowOptions::default().window)
        .map_err(model_status)?;
    let permit = state.permit()?;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let signal = StopSignal::new(deadline);
    // The client leaving (the stream dropped) or the drain deadline stops the work.
    let watcher = {
        let (signal, tx, state) = (signal.clone(), tx.clone(), Arc::clone(&state));
        tokio::spawn(async move {
            tokio::select! {
                _ = tx.closed() => {}
                _ = state.closed() => {}
            }
            signal.cancel();
        })
    };
    tokio::task::spawn_blocking(move || {
        let outcome = signal.run(|| score_all(&state, request, rule, &tx, permit));
        let outcome = stop_status(*state.closing.borrow(), &signal, outcome);
        if let Err(status) = outcome {
            // The client may be gone already; nothing else to tell.
            let _ = tx.blocking_send(Err(status));
        }
        watcher.abort();
        drop(kv);
    });
    Ok(ReceiverStream::new(rx))
}

type Sender = mpsc::Sender<Result<pb::ScoreResponse, Status>>;

fn score_all(
    s: &State,
    request: ValidScore,
    rule: LambdaRule,
    tx: &Sender,
    _permit: WorkPermit,
) -> Result<(), Status> {
    let model = s.model()?;
    let mut totals = pb::ScoreTotals::default();
    for (i, doc) in request.documents.into_iter().enumerate() {
        if crate::interrupt::interrupted() {
            return Err(stopped());
        }
        let scored = score_document(s, model, i, doc, rule, request.per_token)?;
        totals.documents += 1;
        totals.tokens += scored.tokens;
        totals.neural_nll += scored.neural_nll;
        totals.mixed_nll += scored.mixed_nll;
        totals.bytes += scored.bytes;
        let item = pb::score_response::Item::Document(scored);
        if tx
            .blocking_send(Ok(pb::ScoreResponse { item: Some(item) }))
            .is_err()
        {
            tracing::debug!("Score: the client left after {} documents", i + 1);
            return Ok(());
        }
    }
    let per_token = |nll: f64| (nll / totals.tokens.max(1) as f64).exp();
    totals.neural_perplexity = per_token(totals.neural_nll);
    totals.mixed_perplexity = per_token(totals.mixed_nll);
    totals.neural_bits_per_byte = bits_per_byte(totals.neural_nll, totals.bytes as usize);
    totals.mixed_bits_per_byte = bits_per_byte(totals.mixed_nll, totals.bytes as usize);
    let item = pb::score_response::Item::Totals(totals);
    let _ = tx.blocking_send(Ok(pb::ScoreResponse { item: Some(item) }));
    Ok(())
}

fn score_document(
    s: &State,
    model: &crate::model::Model,
    index: usize,
    doc: ScoredDocument,
    rule: LambdaRule,
    per_token: bool,
) -> Result<pb::DocumentScore, Status> {
    let records = document_records(
        model,
        &*s.evidence,
        WindowOptions::default(),
        index,
        &doc.tokens,
        |_| {},
    )
    .map_err(|e| match e {
        _ if crate::interrupt::interrupted() => stopped(),
        // A shard behind a router that did not answer: its status, as every other call gives it.
        EvidenceError::Index(e @ IndexError::Remote { .. })
        | EvidenceError::Mix(MixError::Index(e @ IndexError::Remote { .. })) => index_status(e),
        e => Status::internal(format!("scoring document {index}: {e:#}")),
    })?
    .tokens;
    let domain = (!doc.domain.is_empty()).then_some(doc.domain.as_str());
    let mixed = mix_tokens(&records, rule, s.mixing.as_ref(), domain).map_err(mix_status)?;
    let mut out = pb::DocumentScore {
        document: index as u32,
        tokens: records.len() as u64,
        ..Default::default()
    };
    for (r, m) in records.iter().zip(&mixed) {
        out.neural_nll -= r.neural_logprob as f64;
        out.mixed_nll -= m.logprob;
        out.bytes += model.tokenizer().spelling(r.token).byte_len() as u64;
        if per_token {
            out.token_scores.push(pb::TokenScore {
                token: r.token,
                neural_logprob: r.neural_logprob,
                infgram_prob: r.infgram_prob,
                mixed_logprob: m.logprob,
                lambda: m.lambda,
                suffix_len: r.suffix_len as u32,
                sparse: r.sparse,
            });
        }
    }
    out.neural_bits_per_byte = bits_per_byte(out.neural_nll, out.bytes as usize);
    out.mixed_bits_per_byte = bits_per_byte(out.mixed_nll, out.bytes as usize);
    Ok(out)
}
