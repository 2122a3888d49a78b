//! Mixing and the evaluator on the real assets: SmolLM2 and an ∞-gram index over (a quarter of) the
//! mini-Pile train split, decontaminated against the test split. Each figure is checked against an
//! independent computation: brute-force n-gram overlap, the engine's own ∞-gram query per position,
//! the model's next-token distribution per context, and the mixture recomputed by hand.

use crate::common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use infini_sidecar::corpus::{Content, InputDoc};
use infini_sidecar::eval::documents::{load_documents, TokenBudget};
use infini_sidecar::eval::experiment::{self, EvalInputs, Pairing};
use infini_sidecar::eval::records::Collector;
use infini_sidecar::evidence::{EvidenceSource, StepInfgram};
use infini_sidecar::index::build::decontam::Decontaminator;
use infini_sidecar::index::build::{build, BuildOptions};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::format::NextTableSpec;
use infini_sidecar::index::{Index, OpenOptions, TokenWidth};
use infini_sidecar::mix::features::{step_score, InfgramContext, SUPPORT_SAMPLES};
use infini_sidecar::mix::{self, GateOptions, MixingParams, NeuralDistribution};
use infini_sidecar::model::{DeviceChoice, LoadOptions, Model, WindowOptions};

const WINDOW: WindowOptions = WindowOptions {
    window: 1024,
    stride: 512,
};

fn minipile(split: &str) -> PathBuf {
    common::assets().join(format!("minipile/{split}.jsonl"))
}

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let opts = LoadOptions {
            device: DeviceChoice::Cpu,
            ..LoadOptions::default()
        };
        Model::load(&common::smollm2_gguf(), &opts).unwrap()
    })
}

fn text(doc: &InputDoc) -> &str {
    match &doc.content {
        Content::Text(t) => t,
        Content::Tokens(_) => unreachable!(),
    }
}

/// Every 13-gram of the documents, as token vectors (no hashing: the oracle for decontamination).
fn ngram_set(docs: &[Vec<u32>]) -> HashSet<Vec<u32>> {
    docs.iter()
        .flat_map(|d| d.windows(13).map(|w| w.to_vec()))
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    index: Arc<Index>,
    expected_dropped: u64,
}

/// An index over every fourth train document plus three test documents planted in it; built with
/// decontamination against the test split, which must drop the planted ones.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let tokenizer = common::smollm2_tokenizer();
        let test_docs = common::minipile_docs("test", usize::MAX);
        let mut reference: Vec<InputDoc> = common::minipile_docs("train", usize::MAX)
            .into_iter()
            .step_by(4)
            .collect();
        let planted: Vec<InputDoc> = test_docs
            .iter()
            .step_by(40)
            .take(3)
            .map(|d| InputDoc {
                content: Content::Text(text(d).to_string()),
                metadata: d.metadata.clone(),
                input_bytes: d.input_bytes,
            })
            .collect();
        reference.extend(planted);

        let encode = |d: &InputDoc| tokenizer.encode(text(d)).unwrap();
        let test_tokens: Vec<Vec<u32>> = test_docs.iter().map(encode).collect();
        let test_grams = ngram_set(&test_tokens);
        let expected_dropped = reference
            .iter()
            .map(encode)
            .filter(|t| {
                let grams: Vec<&[u32]> = t.windows(13).collect();
                !grams.is_empty()
                    && grams.iter().filter(|g| test_grams.contains(**g)).count() as f64
                        >= 0.8 * grams.len() as f64
            })
            .count() as u64;

        let decontaminator =
            Decontaminator::from_files(&[minipile("test")], &tokenizer, 13, 0.8).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("index");
        let vocab = tokenizer.vocab_size();
        let opts = BuildOptions {
            tokenizer: Some(&tokenizer),
            decontaminate: Some(&decontaminator),
            ..BuildOptions::new(out.clone(), TokenWidth::for_vocab(vocab), 0, vocab)
        };
        let report = build(reference.into_iter().map(Ok), &opts).unwrap();
        let record = report.decontamination.unwrap();
        assert_eq!(record.evaluation_documents, test_docs.len() as u64);
        let index = Index::open(&out, &OpenOptions::default()).unwrap();
        assert_eq!(
            index.manifest().unwrap().decontamination.as_ref(),
            Some(&record)
        );
        assert_eq!(record.documents_dropped, expected_dropped);
        Fixture {
            _dir: dir,
            index: Arc::new(index),
            expected_dropped,
        }
    })
}

#[test]
fn decontamination_drops_exactly_the_overlapping_documents() {
    let f = fixture();
    // The three planted test documents at least.
    assert!(f.expected_dropped >= 3, "{}", f.expected_dropped);
}

/// Every token is recorded once, with the engine's ∞-gram answer for its prefix and the model's
/// probability for its context.
#[test]
fn records_agree_with_per_position_queries() {
    let f = fixture();
    let model = model();
    let docs = load_documents(
        &[minipile("test")],
        model,
        TokenBudget::PerDomain(120),
        None,
    )
    .unwrap();
    let domains = Collector {
        model,
        index: &*f.index,
        window: WINDOW,
        work_dir: None,
    }
    .collect(&docs)
    .unwrap();
    assert_eq!(domains.len(), 5);
    let recorded: usize = domains.iter().map(|d| d.tokens.len()).sum();
    assert_eq!(
        recorded,
        docs.iter().map(|d| d.tokens.len() - 1).sum::<usize>()
    );
    for d in &domains {
        for r in d.tokens.iter().step_by(23) {
            let doc = docs.iter().find(|x| x.index == r.doc).unwrap();
            let prefix = &doc.tokens[..r.position];
            let want = f.index.infgram_prob(prefix, r.token).unwrap();
            assert_eq!(r.suffix_len, want.suffix_len, "{} {}", d.domain, r.position);
            assert_eq!(r.sparse, want.sparse);
            assert!((r.infgram_prob - want.prob.prob).abs() < 1e-12);
            // A fresh pass over exactly the context and the token: its last score is this token's.
            // Passes under 16 tokens run on the quantized weights (8-bit activations) while the
            // documents' windows use the dense copies, a ≈ 0.02-nat difference: skip those.
            if r.position + 1 < 16 {
                continue;
            }
            let fresh = model
                .transformer()
                .score_tokens(&doc.tokens[..=r.position])
                .unwrap();
            let lp = fresh.last().unwrap().logprob;
            assert!(
                (r.neural_logprob - lp).abs() < 2e-3,
                "{} vs {lp}",
                r.neural_logprob
            );
        }
    }
}

/// A decoding step's gate view, built with the subsample the step's exact answer found with it
/// (in the walked runs, or read where the next-token table answered), is the view searched afresh
/// (`InfgramContext::new`), at every position of real test-split text: some of its suffixes occur
/// more often than the gate samples. A step the gate will not read finds no subsample.
#[test]
fn a_step_gate_view_is_the_one_searched_afresh() {
    let f = fixture();
    let docs = load_documents(
        &[minipile("test")],
        model(),
        TokenBudget::PerDomain(80),
        None,
    )
    .unwrap();
    let source: Arc<dyn EvidenceSource> = f.index.clone();
    let neural = NeuralDistribution::from_top_k(vec![(0, 0.0)], 0.0, 8).unwrap();
    // The fixture's next-token table (the build's default) holds the suffixes these bound.
    let table = NextTableSpec::default();
    let (mut positions, mut sampled, mut tabled) = (0, 0, 0);
    for doc in &docs {
        let mut followed = Arc::clone(&source).follow(&doc.tokens[..1]).unwrap();
        for end in 2..doc.tokens.len() {
            let seq = &doc.tokens[..end];
            followed.advance(seq, end - 1).unwrap();
            let step = |for_gate| match followed.step(seq, &neural, for_gate).unwrap() {
                StepInfgram::Tokens {
                    answer,
                    gate_sample,
                } => (answer, gate_sample),
                StepInfgram::Bytes { .. } => panic!("a token index gives token steps"),
            };
            let (answer, gate_sample) = step(true);
            let (alone, none) = step(false);
            assert_eq!((&alone, none), (&answer, None));
            let over_cap = answer.suffix_len > 0 && answer.ntd.prompt_cnt > SUPPORT_SAMPLES;
            assert_eq!(
                gate_sample.is_some(),
                over_cap,
                "document {} at {end}",
                doc.index
            );
            sampled += usize::from(over_cap);
            tabled += usize::from(
                answer.suffix_len <= table.max_prompt_tokens as usize
                    && answer.ntd.prompt_cnt >= table.min_count,
            );
            positions += 1;
            let in_passing = source
                .context_after(seq, &answer, gate_sample.as_ref())
                .unwrap();
            let afresh = InfgramContext::new(&*f.index, seq, &step_score(&answer)).unwrap();
            assert_eq!(in_passing, afresh, "document {} at {end}", doc.index);
        }
    }
    // Most steps match a suffix seen at most 256 times; some, one the table answers.
    assert!(sampled >= 10, "{sampled} samples in {positions} steps");
    assert!(
        tabled >= 10,
        "{tabled} of {positions} steps answered by the table"
    );
}

fn inputs(split: &str, max_tokens: usize, work_dir: Option<&Path>) -> EvalInputs {
    EvalInputs {
        inputs: vec![minipile(split)],
        max_tokens_per_domain: Some(max_tokens),
        max_doc_tokens: Some(max_tokens / 2),
        exclude_domains: Vec::new(),
        window: WINDOW,
        work_dir: work_dir.map(Path::to_path_buf),
    }
}

/// λ fitted on validation, evaluated on test: the report's perplexities equal the mixture recomputed
/// from the per-token records, fitting is deterministic, and the mixing file round-trips exactly.
#[test]
fn fit_and_evaluate_end_to_end() {
    let f = fixture();
    let pairing = Pairing::new(model(), &*f.index).unwrap();
    let gate = GateOptions {
        trees: 8,
        min_samples_leaf: 10,
        ..GateOptions::default()
    };
    let work = tempfile::tempdir().unwrap();
    let params = experiment::fit(
        &pairing,
        &inputs("validation", 200, Some(work.path())),
        Some(gate),
    )
    .unwrap();
    assert!(params.lambda_sparse > params.lambda_dense, "{params:?}");
    let v = &params.fitted_on;
    assert!(v.split_perplexity < v.neural_perplexity, "{v:?}");
    // The same fit again, from scratch: the same λ and the same gate.
    let again = experiment::fit(&pairing, &inputs("validation", 200, None), Some(gate)).unwrap();
    assert_eq!(
        params.lambda_sparse.to_bits(),
        again.lambda_sparse.to_bits()
    );
    assert_eq!(params.fitted_on, again.fitted_on);

    let path = work.path().join("mixing.json");
    params.save(&path).unwrap();
    let loaded = MixingParams::load(&path).unwrap();
    assert_eq!(loaded.fitted_on, params.fitted_on);

    let (report, domains) = experiment::ppl(&pairing, &inputs("test", 150, None), &loaded).unwrap();
    assert_eq!(report.by_domain.len(), 5);
    let all: Vec<_> = domains.iter().flat_map(|d| &d.tokens).collect();
    let nll = |lambda: &dyn Fn(&infini_sidecar::evidence::TokenRecord) -> f64| {
        all.iter()
            .map(|t| {
                let p = lambda(t) * t.infgram_prob
                    + (1.0 - lambda(t)) * (t.neural_logprob as f64).exp();
                -p.ln()
            })
            .sum::<f64>()
            / all.len() as f64
    };
    let neural = nll(&|_| 0.0).exp();
    let split = nll(&|t| {
        if t.sparse {
            loaded.lambda_sparse
        } else {
            loaded.lambda_dense
        }
    })
    .exp();
    assert!((report.total.neural_perplexity - neural).abs() < 1e-9 * neural);
    assert!((report.total.split_perplexity - split).abs() < 1e-9 * split);
    let delta = mix::improvement_percent(split, neural);
    assert!((report.total.split_improvement - delta).abs() < 1e-9);
    let agreement = all.iter().filter(|t| t.infgram_prob > 0.5).count() as f64 / all.len() as f64;
    assert!((report.total.agreement - agreement).abs() < 1e-12);
    assert!(report.total.gate_perplexity.is_some());

    // The adaptive λ, by the Bayes-mixture identity: its probability of a whole document is the
    // prior-weighted sum over hypotheses of each hypothesis's probability of the document.
    assert_eq!(report.total.default_rule, "adaptive");
    assert_eq!(
        report.total.default_perplexity,
        report.total.adaptive_perplexity
    );
    let gate = loaded.gate.as_ref().unwrap();
    let opts = &loaded.adaptive;
    let logit = |p: f64| (p / (1.0 - p)).ln();
    let hypothesis = |h: usize, base: f64| match h {
        0 => mix::LAMBDA_MIN,
        h => (1.0 / (1.0 + (-(logit(base) + opts.offsets[h - 1])).exp()))
            .clamp(mix::LAMBDA_MIN, mix::LAMBDA_MAX),
    };
    let (mut adaptive_nll, mut neural_nll, mut documents) = (0.0, 0.0, 0usize);
    for d in &domains {
        let features: Vec<_> = d.tokens.iter().map(|t| t.features).collect();
        let bases = gate.predict(&features);
        let mut start = 0;
        while start < d.tokens.len() {
            let doc = d.tokens[start].doc;
            let end = start
                + d.tokens[start..]
                    .iter()
                    .take_while(|t| t.doc == doc)
                    .count();
            let log_terms: Vec<f64> = (0..=opts.offsets.len())
                .map(|h| {
                    let prior = match h {
                        0 => opts.prior_neural,
                        _ => (1.0 - opts.prior_neural) / opts.offsets.len() as f64,
                    };
                    prior.ln()
                        + (start..end)
                            .map(|i| {
                                let t = &d.tokens[i];
                                let l = hypothesis(h, bases[i]);
                                (l * t.infgram_prob + (1.0 - l) * t.neural_prob()).ln()
                            })
                            .sum::<f64>()
                })
                .collect();
            let max = log_terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            adaptive_nll -= max + log_terms.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            neural_nll -= d.tokens[start..end]
                .iter()
                .map(|t| t.neural_logprob as f64)
                .sum::<f64>();
            documents += 1;
            start = end;
        }
    }
    let want = (adaptive_nll / all.len() as f64).exp();
    let got = report.total.adaptive_perplexity;
    assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
    // Never more than ln(1 / prior) nats a document (and 1e-4 a token) behind the model alone.
    let bound = documents as f64 * (1.0 / opts.prior_neural).ln()
        - all.len() as f64 * (1.0 - mix::LAMBDA_MIN).ln();
    assert!(adaptive_nll <= neural_nll + bound + 1e-6);

    // A mixing file fitted for another tokenizer is refused.
    let mut other = MixingParams::load(&path).unwrap();
    other.tokenizer_fingerprint = "another".into();
    assert!(experiment::ppl(&pairing, &inputs("test", 20, None), &other).is_err());
}

fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
}

fn eval_cmd(op: &str, index: &Path, input: &Path) -> std::process::Command {
    let mut cmd = bin();
    cmd.args(["eval", op, "--cpu", "--max-tokens", "40", "--model"])
        .arg(common::smollm2_gguf())
        .arg("--index")
        .arg(index)
        .arg("--input")
        .arg(input);
    cmd
}

/// The CLI end to end: fit, then ppl twice on one work folder; the rerun reuses every finished domain
/// and reports the same numbers. Bad mixing files are refused with a message and exit code 2.
#[test]
fn cli_fit_ppl_and_resume() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let index = f.index.dir();
    let mixing = tmp.path().join("mixing.json");
    let fit = eval_cmd("fit", index, &minipile("validation"))
        .args(["--json", "--gate-trees", "4", "--out"])
        .arg(&mixing)
        .output()
        .unwrap();
    assert!(
        fit.status.success(),
        "{}",
        String::from_utf8_lossy(&fit.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&fit.stdout).unwrap();
    assert_eq!(
        summary["gate_feature_importances"]
            .as_array()
            .unwrap()
            .len(),
        mix::NUM_FEATURES
    );

    let run = |out: &str| {
        eval_cmd("ppl", index, &minipile("test"))
            .arg("--mixing")
            .arg(&mixing)
            .arg("--work-dir")
            .arg(tmp.path().join("work"))
            .arg("--out-dir")
            .arg(tmp.path().join(out))
            .output()
            .unwrap()
    };
    let first = run("a");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = run("b");
    assert!(second.status.success());
    let log = String::from_utf8_lossy(&second.stderr);
    assert_eq!(log.matches("reusing").count(), 5, "{log}");
    let report = |d: &str| {
        let text = std::fs::read_to_string(tmp.path().join(d).join("report.json")).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["timing"] = serde_json::Value::Null;
        v
    };
    assert_eq!(report("a"), report("b"));
    assert!(std::fs::read_to_string(tmp.path().join("a/report.md"))
        .unwrap()
        .contains("| all |"));

    std::fs::write(&mixing, "{\"format\": \"something else\"}").unwrap();
    let bad = run("c");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bad mixing file"));
}

/// Sampling with mixing on the real model and index, from prompts the index holds: with λ at its
/// largest the ∞-gram continues its match and the text is copied (most tokens inside ≥ 16-token
/// spans of the reference data, counted against a brute-force search of the prompt's own document);
/// the model alone copies far less; each sampler is reproducible from its seed.
#[test]
fn generation_copies_only_as_much_as_lambda_lets_it() {
    use infini_sidecar::eval::documents::EvalDocument;
    use infini_sidecar::eval::generation::{self, GenerationEvalOptions, Sampler};
    use infini_sidecar::mix::LambdaRule;

    let f = fixture();
    let docs: Vec<EvalDocument> = (0..40)
        .map(|i| f.index.get_document(i * 37).unwrap())
        .filter(|d| d.token_ids.len() > 200)
        .take(3)
        .enumerate()
        .map(|(i, d)| EvalDocument {
            index: i,
            domain: "indexed".into(),
            path: String::new(),
            tokens: d.token_ids,
        })
        .collect();
    assert_eq!(docs.len(), 3);
    let params = MixingParams::new(
        String::new(),
        String::new(),
        String::new(),
        (0.4, 0.05),
        None,
        Default::default(),
    );
    let opts = GenerationEvalOptions {
        prompts_per_domain: 3,
        prompt_tokens: 32,
        new_tokens: 24,
        ..GenerationEvalOptions::default()
    };
    let samplers = [
        Sampler::Neural,
        Sampler::Mixed {
            rule: LambdaRule::Fixed(1.0),
            max_match: None,
        },
    ];
    let rows = generation::run(model(), f.index.clone(), &params, &docs, &samplers, &opts).unwrap();
    let again =
        generation::run(model(), f.index.clone(), &params, &docs, &samplers, &opts).unwrap();
    assert_eq!(
        serde_json::to_string(&rows).unwrap(),
        serde_json::to_string(&again).unwrap()
    );
    let (neural, copying) = (&rows[0], &rows[1]);
    assert_eq!(
        (neural.sampler.as_str(), neural.mean_lambda),
        ("neural", 0.0)
    );
    assert!((copying.mean_lambda - mix::LAMBDA_MAX).abs() < 1e-12);
    assert!(copying.verbatim_share > 0.6, "{copying:?}");
    assert!(
        neural.verbatim_share + 0.3 < copying.verbatim_share,
        "{neural:?} vs {copying:?}"
    );
    // The mask itself against brute force on a copied continuation: every 16-token window of the
    // first prompt's document occurs in the index, so its own text is covered wherever it is long
    // enough.
    let doc = &docs[0].tokens[..60];
    let mask = generation::verbatim_mask(&*f.index, doc, 20, 16).unwrap();
    assert!(mask.iter().all(|&c| c), "{mask:?}");
}
