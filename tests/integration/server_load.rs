//! A bounded load test on loopback: concurrent clients mixing (caller top-64), stepping sessions and
//! scoring short documents with the real model for `SIDECAR_LOAD_SECS` (default 8; the recorded run
//! in eval/SERVICE.md uses 60). No request may fail, and the process may not grow beyond a bound once
//! warm. Latency percentiles are printed, and written to `$SIDECAR_LOAD_REPORT` when set.

use crate::common;

use std::time::{Duration, Instant};

use common::server::{start, with_model, Running};
use infini_sidecar::corpus::Content;
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, mix_request, session_mix, session_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const MIX_CLIENTS: usize = 6;
const SESSION_CLIENTS: usize = 4;
const SCORE_CLIENTS: usize = 1;
/// Growth of the resident set allowed in the second half: caches may settle, nothing may leak per
/// request (thousands of requests run in that time).
const MAX_RSS_GROWTH_MB: f64 = 64.0;

fn rss_mb() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / (1 << 20) as f64
}

fn top_64(i: usize) -> pb::NeuralTopK {
    let tokens: Vec<u32> = (0..64)
        .map(|k| ((i * 131 + k * 977) % 49_000) as u32)
        .collect();
    let logprobs: Vec<f32> = (0..64).map(|k| -4.0 - 0.05 * k as f32).collect();
    let mass: f64 = logprobs.iter().map(|&l| (l as f64).exp()).sum();
    pb::NeuralTopK {
        tokens,
        logprobs,
        rest_mass: 1.0 - mass,
    }
}

/// Latencies in µs of one kind of work, and its failures.
#[derive(Default)]
struct Tally {
    micros: Vec<u64>,
    errors: Vec<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.micros.extend(other.micros);
        self.errors.extend(other.errors);
    }

    fn percentile(&mut self, p: f64) -> u64 {
        self.micros.sort_unstable();
        let i = ((self.micros.len() as f64 - 1.0) * p).round() as usize;
        self.micros.get(i).copied().unwrap_or(0)
    }
}

async fn timed<T>(
    tally: &mut Tally,
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Option<T> {
    let t = Instant::now();
    match call.await {
        Ok(v) => {
            tally.micros.push(t.elapsed().as_micros() as u64);
            Some(v)
        }
        Err(e) => {
            tally.errors.push(format!("{e:?}"));
            None
        }
    }
}

async fn mixer(mut client: SidecarClient<Channel>, doc: Vec<u32>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    let mut i = 0;
    while Instant::now() < until {
        let end = 8 + (i * 37) % (doc.len() - 8);
        let request = pb::MixRequest {
            context: doc[..end].to_vec(),
            neural: Some(mix_request::Neural::TopKLogprobs(top_64(i))),
            lambda: Some(mix_request::Lambda::Split(true)),
            top_k: 16,
            sequence_id: String::new(),
            max_match: 0,
        };
        timed(&mut tally, client.mix(request)).await;
        i += 1;
    }
    tally
}

async fn session_stepper(
    mut client: SidecarClient<Channel>,
    doc: Vec<u32>,
    until: Instant,
) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let (tx, rx) = mpsc::channel(2);
        let Ok(replies) = client.session(ReceiverStream::new(rx)).await else {
            tally.errors.push("session refused".into());
            continue;
        };
        let mut replies = replies.into_inner();
        let steps = std::iter::once(session_request::Step::Start(pb::SessionStart {
            context: doc[..16].to_vec(),
            use_model: false,
            ..Default::default()
        }))
        .chain(doc[16..].iter().enumerate().flat_map(|(i, &t)| {
            [
                session_request::Step::Append(pb::SessionAppend { tokens: vec![t] }),
                session_request::Step::Mix(pb::SessionMix {
                    neural: Some(session_mix::Neural::TopKLogprobs(top_64(i))),
                    lambda: Some(session_mix::Lambda::Split(true)),
                    top_k: 16,
                    max_match: 0,
                }),
            ]
        }));
        for step in steps {
            if Instant::now() >= until {
                break;
            }
            let t = Instant::now();
            if tx
                .send(pb::SessionRequest { step: Some(step) })
                .await
                .is_err()
            {
                tally.errors.push("session closed".into());
                break;
            }
            match replies.message().await {
                Ok(Some(r))
                    if !matches!(r.result, Some(pb::session_response::Result::Error(_))) =>
                {
                    tally.micros.push(t.elapsed().as_micros() as u64)
                }
                other => {
                    tally.errors.push(format!("{other:?}"));
                    break;
                }
            }
        }
    }
    tally
}

async fn scorer(mut client: SidecarClient<Channel>, doc: Vec<u32>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let request = pb::ScoreRequest {
            documents: vec![pb::ScoreDocument {
                token_ids: doc[..64].to_vec(),
                domain: String::new(),
            }],
            lambda: Some(pb::score_request::Lambda::Split(true)),
            per_token: true,
        };
        let call = async {
            let mut stream = client.score(request).await?.into_inner();
            while stream.message().await?.is_some() {}
            Ok(())
        };
        timed(&mut tally, call).await;
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_mix_step_and_score_without_errors_or_growth() {
    let secs: u64 = std::env::var("SIDECAR_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let Running {
        client, addr, stop, ..
    } = start(with_model(dir.path())).await;
    let tokenizer = common::smollm2_tokenizer();
    let docs: Vec<Vec<u32>> = common::minipile_docs("test", 40)
        .iter()
        .filter_map(|d| match &d.content {
            Content::Text(t) => Some(tokenizer.encode(t).unwrap()),
            Content::Tokens(_) => None,
        })
        .filter(|ids| ids.len() >= 300)
        .map(|mut ids| {
            ids.truncate(300);
            ids
        })
        .collect();
    assert!(docs.len() >= MIX_CLIENTS + SESSION_CLIENTS);

    // Warm-up: the same mix of work for a while, then the resident set is the baseline.
    let run = |duration: Duration| {
        let until = Instant::now() + duration;
        let mut tasks = Vec::new();
        for doc in &docs[..MIX_CLIENTS] {
            tasks.push(tokio::spawn(mixer(client.clone(), doc.clone(), until)));
        }
        for i in 0..SESSION_CLIENTS {
            let doc = docs[MIX_CLIENTS + i].clone();
            tasks.push(tokio::spawn(session_stepper(client.clone(), doc, until)));
        }
        for _ in 0..SCORE_CLIENTS {
            tasks.push(tokio::spawn(scorer(client.clone(), docs[0].clone(), until)));
        }
        tasks
    };
    let mut warm = Tally::default();
    for t in run(Duration::from_secs(4)) {
        warm.merge(t.await.unwrap());
    }
    assert!(warm.errors.is_empty(), "{:?}", &warm.errors[..1]);
    let rss_before = rss_mb();

    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        for _ in 0..secs {
            tokio::time::sleep(Duration::from_secs(1)).await;
            samples.push(rss_mb().round());
        }
        samples
    });
    let tasks = run(Duration::from_secs(secs));
    let (mut mix, mut steps, mut score) = (Tally::default(), Tally::default(), Tally::default());
    for (i, t) in tasks.into_iter().enumerate() {
        let tally = t.await.unwrap();
        match i {
            i if i < MIX_CLIENTS => mix.merge(tally),
            i if i < MIX_CLIENTS + SESSION_CLIENTS => steps.merge(tally),
            _ => score.merge(tally),
        }
    }
    let rss_after = rss_mb();
    let rss_by_second = sampler.await.unwrap();
    for (name, t) in [("mix", &mix), ("session", &steps), ("score", &score)] {
        assert!(
            t.errors.is_empty(),
            "{name}: {} errors, first {:?}",
            t.errors.len(),
            &t.errors[..1]
        );
        assert!(!t.micros.is_empty(), "{name}: nothing done");
    }
    let mut report = serde_json::json!({
        "seconds": secs,
        "clients": {"mix": MIX_CLIENTS, "session": SESSION_CLIENTS, "score": SCORE_CLIENTS},
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
        "rss_mb_by_second": rss_by_second,
        "addr": addr.to_string(),
    });
    for (name, t) in [
        ("mix_top64", &mut mix),
        ("session_step", &mut steps),
        ("score_64_tokens", &mut score),
    ] {
        let n = t.micros.len();
        report[name] = serde_json::json!({
            "count": n,
            "per_second": n as f64 / secs as f64,
            "p50_us": t.percentile(0.5),
            "p90_us": t.percentile(0.9),
            "p99_us": t.percentile(0.99),
            "max_us": t.percentile(1.0),
        });
    }
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    if let Some(path) = std::env::var_os("SIDECAR_LOAD_REPORT") {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    }
    // Allocator arenas and caches settle in the first half; the second half must stay flat.
    let halfway = rss_by_second[rss_by_second.len() / 2];
    assert!(
        rss_after - halfway < MAX_RSS_GROWTH_MB,
        "resident set grew from {halfway:.0} to {rss_after:.0} MB in the second half: {rss_by_second:?}"
    );
    let _ = stop.send(());
}
