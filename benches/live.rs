//! The live index's costs (`cargo bench --bench live`; needs the assets of `scripts/run-default.sh`).
//! Streams the reference index's own documents into one namespace (LIVE_TOKENS, default 10 M) and
//! prints: µs per appended token (the caller's cost; compaction runs beside it), the time until
//! compaction has caught up, and µs per lookup of real test-split text in the live index against the
//! same lookup in the static reference index (LOOKUP_PASSES passes, default 4). Then a soak:
//! SOAK_TOKENS (default 50 M) more stream through a budget of LIVE_TOKENS, with the process's RSS
//! sampled against the budget's bytes. Then the drafter end to end through the RPC: a served
//! sidecar's namespace is filled with as many tokens over `AddDocuments`, and the agentic workload's
//! recorded outputs (eval/results/workload/replay.json) are replayed through `Session` streams on
//! loopback (draft, then append what verification would accept), timed at the client. Last, the
//! static index's lookups without and with sampled ranks.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::live::{LiveConfig, LiveError, LiveIndex, LiveStore, Vocabulary};
use infini_sidecar::server::config::ServeConfig;
use infini_sidecar::server::pb::{self, session_request, session_response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn env_tokens(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A field of /proc/self/status in bytes (VmRSS; RssAnon, the heap, where the tails live).
fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What streaming cost: µs per token of the appends themselves, and per token over the whole stream
/// (appends refused while compaction catches up are retried after a millisecond, as a client would).
struct Streamed {
    append_us: f64,
    sustained_us: f64,
}

/// Appends documents of `index` (cycling) until `tokens` went in.
fn stream(live: &LiveIndex, index: &Index, tokens: u64, mut each: impl FnMut(u64)) -> Streamed {
    let mut sent = 0u64;
    let mut appending = 0.0;
    let started = Instant::now();
    while sent < tokens {
        for doc in index.documents() {
            let id = live.new_document();
            // A decoding loop appends a few tokens a step.
            for piece in doc.chunks(4) {
                loop {
                    let t = Instant::now();
                    let appended = live.append("bench", id, piece);
                    appending += t.elapsed().as_secs_f64();
                    match appended {
                        Ok(()) => break,
                        Err(LiveError::Full(_)) => std::thread::sleep(Duration::from_millis(1)),
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            sent += doc.len() as u64;
            each(sent);
            if sent >= tokens {
                break;
            }
        }
    }
    Streamed {
        append_us: appending * 1e6 / sent as f64,
        sustained_us: started.elapsed().as_secs_f64() * 1e6 / sent as f64,
    }
}

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = ServeConfig::load(&repo.join("configs/default.toml")).unwrap();
    let index = Index::open(&config.index, &OpenOptions::default()).unwrap();
    let tokenizer = index.tokenizer().unwrap().clone();
    let live_tokens = env_tokens("LIVE_TOKENS", 10_000_000);
    let soak_tokens = env_tokens("SOAK_TOKENS", 50_000_000);
    let vocab = Vocabulary {
        width: index.width(),
        eos_token_id: index.eos_token_id(),
        vocab_size: index.vocab_size(),
    };
    let live_config = LiveConfig {
        budget_tokens: live_tokens,
        ..LiveConfig::default()
    };
    let base_rss = status_bytes("VmRSS:");
    let base_anon = status_bytes("RssAnon:");
    let live = LiveIndex::open(live_config.clone(), vocab).unwrap();

    let filled = stream(&live, &index, live_tokens * 9 / 10, |_| {});
    let started = Instant::now();
    while live.stats().tail_tokens >= live_config.freeze_tokens {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Waits out a round in progress and runs one more: no merge is left to compete with lookups.
    live.compact();
    let caught_up = started.elapsed().as_secs_f64();
    let stats = live.stats();
    println!(
        "append: {:.2} µs/token (sustained, with compaction's back-pressure: {:.2}); compaction caught up {caught_up:.1} s after the last append; live index: {} tokens in {} runs + tail {}",
        filled.append_us, filled.sustained_us, stats.tokens, stats.runs, stats.tail_tokens
    );

    let assets = config.index.parent().unwrap().to_path_buf();
    let texts = common::test_documents(&assets, &tokenizer, 300, 20);
    let patterns: Vec<&[u32]> = texts
        .iter()
        .flat_map(|text| (100..300).map(move |end| &text[..end]))
        .collect();
    let passes = env_tokens("LOOKUP_PASSES", 4) as usize;
    let [live_us, static_us] = lookup_us(
        &patterns,
        passes,
        [
            &|p| {
                std::hint::black_box(live.continuations("bench", p, 64, 8));
            },
            &|p| static_lookup(&index, p),
        ],
    );
    println!(
        "lookup (longest match ≤ 64 tokens + 64 sampled continuations of 8, {} lookups): live {live_us:.1} µs, static index {static_us:.1} µs ({:.2}×)",
        patterns.len() * passes,
        live_us / static_us
    );

    let (mut peak_rss, mut peak_anon, mut next_sample) = (0u64, 0u64, 0u64);
    let soaked = stream(&live, &index, soak_tokens, |sent| {
        if sent >= next_sample {
            peak_rss = peak_rss.max(status_bytes("VmRSS:").saturating_sub(base_rss));
            peak_anon = peak_anon.max(status_bytes("RssAnon:").saturating_sub(base_anon));
            next_sample = sent + 1_000_000;
        }
    });
    println!(
        "soak: {soak_tokens} tokens through a budget of {live_tokens} ({:.2} µs/token sustained): live index {} tokens at the end; peak growth over the process before the live index: RSS {:.0} MB, heap {:.0} MB (the budget at 8 B/token: {:.0} MB; RSS includes the reference index's pages the stream read)",
        soaked.sustained_us,
        live.stats().tokens,
        peak_rss as f64 / 1e6,
        peak_anon as f64 / 1e6,
        live_tokens as f64 * 8.0 / 1e6
    );

    drop(live);
    let rpc = tokio::runtime::Runtime::new().unwrap().block_on(rpc_replay(
        config.clone(),
        &index,
        live_tokens * 9 / 10,
    ));
    println!(
        "drafting through the RPC (Session on loopback, a namespace of {} tokens, {} requests replayed): {:.1} µs per drafted token ({} drafted, {:.0} µs a step: append and draft in one round trip, {:.1} drafted a step; the floor, an Info round trip: {:.0} µs p50)",
        rpc.namespace_tokens,
        rpc.requests,
        rpc.seconds * 1e6 / rpc.drafted as f64,
        rpc.drafted,
        rpc.seconds * 1e6 / rpc.steps as f64,
        rpc.drafted as f64 / rpc.steps as f64,
        rpc.round_trip_p50 * 1e6
    );
    let floor = common::loopback_floor(2000);
    println!(
        "the loopback floor, a plain TCP round trip of 32 bytes: {:.0} µs p50 with both sides blocked while they wait, {:.0} µs with both polling",
        floor["blocking_p50_us"].as_f64().unwrap(),
        floor["spinning_p50_us"].as_f64().unwrap()
    );

    // Last, so that neither its samples nor its pages count in the soak: the reference index
    // without and with its ranks sampled as the live runs' are (`index::read::rank_samples`), the
    // samples' own gain apart from the runs' layout.
    let open = |sample_ranks| {
        let started = Instant::now();
        let opts = OpenOptions {
            sample_ranks,
            ..OpenOptions::default()
        };
        let index = Index::open(&config.index, &opts).unwrap();
        (index, started.elapsed().as_secs_f64())
    };
    let (_, plain_open_s) = open(false);
    let (sampled, sampled_open_s) = open(true);
    let [plain_us, sampled_us] = lookup_us(
        &patterns,
        passes,
        [&|p| static_lookup(&index, p), &|p| {
            static_lookup(&sampled, p)
        }],
    );
    println!(
        "static index lookup, the same {} lookups: {plain_us:.1} µs without sampled ranks, {sampled_us:.1} µs with them ({:.2}× faster); opening its {} tokens took {sampled_open_s:.2} s with them, {plain_open_s:.2} s without",
        patterns.len() * passes,
        plain_us / sampled_us,
        sampled.total_tokens()
    );
}

/// The longest match of `pattern`'s end in the reference index, and 64 continuations of 8 sampled
/// after it: what the live index's lookup does in one index.
fn static_lookup(index: &Index, pattern: &[u32]) {
    let found = index.longest_suffix_from(pattern, 0, 64);
    std::hint::black_box(found.map(|m| index.continuations_of(&m, 64, 8, m.count())));
}

/// One kind of lookup, of a pattern's end.
type Lookup<'a> = &'a dyn Fn(&[u32]);

/// µs per lookup of each kind over `patterns`. Each pass times every lookup of one kind in a row
/// (a server doing only that keeps its own structure in cache); the kinds take turns, in reverse
/// order every other pass (a kind timed after another may find pages and lines it left), so that
/// a slow spell of the machine falls on all alike.
fn lookup_us<const K: usize>(patterns: &[&[u32]], passes: usize, kinds: [Lookup; K]) -> [f64; K] {
    let mut seconds = [0.0; K];
    for pass in 0..passes {
        for k in 0..K {
            let k = if pass % 2 == 0 { k } else { K - 1 - k };
            let started = Instant::now();
            patterns.iter().for_each(|p| kinds[k](p));
            seconds[k] += started.elapsed().as_secs_f64();
        }
    }
    seconds.map(|s| s * 1e6 / (patterns.len() * passes) as f64)
}

/// What the RPC replay measured.
struct RpcReplay {
    namespace_tokens: u64,
    requests: usize,
    steps: usize,
    drafted: usize,
    /// Client-side time of the drafting steps (append and draft), the Start of each stream excluded.
    seconds: f64,
    /// Median time of an `Info` call.
    round_trip_p50: f64,
}

/// Serves `config` with a live index of `tokens` on loopback, fills namespace "bench" with the
/// reference index's documents over `AddDocuments`, then replays each recorded request: a Session
/// started on its prompt in that namespace (learning), and per step a chain draft (up to the
/// workload's 31 tokens), the accepted tokens and one more appended as verification would.
async fn rpc_replay(mut config: ServeConfig, index: &Index, tokens: u64) -> RpcReplay {
    config.model = None;
    config.live.enabled = true;
    config.live.budget_tokens = tokens * 10 / 9;
    let served = common::Served::start(config);
    let mut client = served.client().await;
    // A request carries at most the sidecar's context limit of tokens: documents longer than
    // that go in pieces.
    const REQUEST_TOKENS: usize = 1 << 15;
    let mut pieces = index
        .documents()
        .flat_map(|doc| {
            doc.chunks(REQUEST_TOKENS)
                .map(<[u32]>::to_vec)
                .collect::<Vec<_>>()
        })
        .peekable();
    let mut added = 0u64;
    while added < tokens && pieces.peek().is_some() {
        let mut documents = Vec::new();
        let mut held = 0;
        while let Some(ids) = pieces.next_if(|p| held + p.len() <= REQUEST_TOKENS) {
            held += ids.len();
            documents.push(pb::LiveDocument {
                content: Some(pb::live_document::Content::Tokens(pb::TokenIds { ids })),
            });
        }
        let request = pb::AddDocumentsRequest {
            namespace: "bench".into(),
            request_id: String::new(),
            documents,
        };
        // Compaction far behind: the sidecar refuses, and the caller tries again shortly.
        loop {
            match client.add_documents(request.clone()).await {
                Ok(r) => break added += r.into_inner().tokens,
                Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(status) => panic!("{status}"),
            }
        }
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let replay: Vec<(Vec<u32>, Vec<u32>)> = serde_json::from_str(
        &std::fs::read_to_string(repo.join("eval/results/workload/replay.json")).unwrap(),
    )
    .unwrap();
    let options = pb::DraftOptions {
        max_tokens: 31,
        ..Default::default()
    };
    let (mut steps, mut drafted, mut seconds) = (0, 0, 0.0);
    for (prompt, truth) in &replay {
        let (tx, rx) = mpsc::channel(4);
        let mut responses = client
            .session(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let step = |step: session_request::Step| {
            let tx = tx.clone();
            async move {
                tx.send(pb::SessionRequest { step: Some(step) })
                    .await
                    .unwrap();
            }
        };
        step(session_request::Step::Start(pb::SessionStart {
            context: prompt.clone(),
            namespace: "bench".into(),
            learn: true,
            ..Default::default()
        }))
        .await;
        responses.message().await.unwrap().unwrap();
        // A decoding loop sends what was accepted and asks for the next draft at once: one round
        // trip a step.
        let (mut done, mut accepted): (usize, Option<Vec<u32>>) = (0, None);
        loop {
            let started = Instant::now();
            let appending = accepted.take();
            if let Some(tokens) = &appending {
                step(session_request::Step::Append(pb::SessionAppend {
                    tokens: tokens.clone(),
                }))
                .await;
            }
            let more = done < truth.len();
            if more {
                step(session_request::Step::Draft(options)).await;
            }
            if appending.is_some() {
                responses.message().await.unwrap().unwrap();
            }
            if !more {
                seconds += started.elapsed().as_secs_f64();
                break;
            }
            let reply = responses.message().await.unwrap().unwrap();
            seconds += started.elapsed().as_secs_f64();
            let Some(session_response::Result::Draft(draft)) = reply.result else {
                panic!("no draft: {reply:?}");
            };
            // The chain's tokens, as many as the output has room for.
            let room = truth.len() - done - 1;
            let chain = &draft.token_ids[..draft.token_ids.len().min(room)];
            let agree = chain
                .iter()
                .zip(&truth[done..])
                .take_while(|(a, b)| a == b)
                .count();
            accepted = Some(truth[done..done + agree + 1].to_vec());
            steps += 1;
            drafted += chain.len();
            done += agree + 1;
        }
    }
    // The floor of a round trip here: an RPC that does no work.
    let mut floor = Vec::new();
    for _ in 0..1000 {
        let started = Instant::now();
        client.info(pb::InfoRequest {}).await.unwrap();
        floor.push(started.elapsed().as_secs_f64());
    }
    floor.sort_by(f64::total_cmp);
    served.stop();
    RpcReplay {
        namespace_tokens: added,
        requests: replay.len(),
        steps,
        drafted,
        seconds,
        round_trip_p50: floor[floor.len() / 2],
    }
}
