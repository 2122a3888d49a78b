//! The service under hostile but fair use (issue 15's reproductions, each kept as a test): requests
//! whose work is bounded before it starts, deadlines and departed clients that stop work and free
//! its permit, unguessable session ids, a KV-cache budget, connections that cannot pin the server,
//! a drain deadline on shutdown, size limits answered RESOURCE_EXHAUSTED, configs that could not
//! serve refused, and metrics that count every call however it ended.

use crate::common;

use std::time::{Duration, Instant};

use common::server::{
    authed, build_index, config, connect, free_port, open_session, permit_comes_back, sample,
    scrape, spawn_serve, start, step, with_model, Running,
};
use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::config::{Limits, ServeConfig};
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, draft_request, session_request};
use tokio::io::AsyncReadExt;
use tonic::Code;

/// The most frequent token of an index: the costliest one-token clause.
fn most_frequent_token(index_dir: &std::path::Path) -> u32 {
    let index = Index::open(index_dir, &OpenOptions::default()).unwrap();
    let dist = index.ntd(&[], None).unwrap().dist;
    let (&token, _) = dist
        .iter()
        .filter(|(&t, _)| t != index.eos_token_id())
        .max_by_key(|(_, &c)| c)
        .unwrap();
    token
}

fn search(clauses: usize, token: u32, max_clause_freq: u64) -> pb::SearchDocumentsRequest {
    pb::SearchDocumentsRequest {
        allow_partial: false,
        cnf: (0..clauses)
            .map(|_| pb::Clause {
                ngrams: vec![pb::NGram { ids: vec![token] }],
            })
            .collect(),
        maxnum: 1,
        max_disp_len: 10,
        max_clause_freq,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_search_work_is_bounded_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let token = most_frequent_token(&index);
    let Running {
        mut client, stop, ..
    } = start(config(dir.path(), index, false)).await;
    let limits = Limits::default();

    // Thousands of one-token clauses: refused by count, not run for minutes.
    let started = Instant::now();
    let err = client
        .search_documents(search(32_768, token, 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("clauses"), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A clause frequency far past the limit: refused.
    let err = client
        .search_documents(search(2, token, 1_000_000_000_000_000_000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("max_clause_freq"), "{err:?}");

    // Within the limits, answered.
    let found = client
        .search_documents(search(limits.max_cnf_clauses, token, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(found.cnt > 0);

    // An answer that could not be sent is refused before any search.
    let mut big = search(1, token, 0);
    big.maxnum = 1000;
    big.max_disp_len = 100_000;
    let err = client.search_documents(big).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let _ = stop.send(());
}

/// A server allowing one request at a time and searches long enough to outlive any deadline here.
fn one_at_a_time(dir: &std::path::Path) -> (ServeConfig, u32) {
    let index = build_index(dir);
    let token = most_frequent_token(&index);
    let mut config = config(dir, index, false);
    config.limits.max_in_flight = 1;
    config.limits.max_cnf_clauses = 100_000;
    config.limits.max_search_places = u64::MAX;
    (config, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_stops_the_work_and_frees_its_permit() {
    let dir = tempfile::tempdir().unwrap();
    let (config, token) = one_at_a_time(dir.path());
    let Running {
        mut client, stop, ..
    } = start(config).await;
    // Tens of millions of places: minutes of work if nothing stops it.
    let mut request = tonic::Request::new(search(30_000, token, 1_000_000));
    request.set_timeout(Duration::from_millis(300));
    let err = client.search_documents(request).await.unwrap_err();
    // tonic's own timer (client or server side) may answer first, with CANCELLED.
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    permit_comes_back(&mut client, Duration::from_secs(3)).await;
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_stops_the_work_and_frees_its_permit() {
    let dir = tempfile::tempdir().unwrap();
    let (config, token) = one_at_a_time(dir.path());
    let Running {
        mut client,
        addr,
        stop,
        ..
    } = start(config).await;
    // No grpc-timeout: the client just gives up and closes its connection.
    let mut leaving = SidecarClient::new(connect(addr).await);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        leaving.search_documents(search(30_000, token, 1_000_000)),
    )
    .await;
    assert!(gave_up.is_err(), "the search should outlast 300 ms");
    drop(leaving);
    permit_comes_back(&mut client, Duration::from_secs(3)).await;
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_ids_cannot_be_guessed_from_another_connection() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let Running {
        mut client,
        addr,
        stop,
        ..
    } = start(config(dir.path(), index, false)).await;
    let (tx, mut replies) = open_session(&mut client).await;
    let started = step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: vec![504, 3458, 281, 504, 3458],
            use_model: false,
            ..Default::default()
        }),
    )
    .await;
    let id = started.state.unwrap().session_id;
    // Counting up from 1 found the first session; neighbours of a known id are no better.
    let mut other = SidecarClient::new(connect(addr).await);
    for guess in [1, 2, id.wrapping_add(1), id.wrapping_sub(1)] {
        let err = other
            .draft(pb::DraftRequest {
                target: Some(draft_request::Target::SessionId(guess)),
                options: None,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "guess {guess}: {err:?}");
    }
    // The id itself still reaches the session (it is the capability).
    other
        .draft(pb::DraftRequest {
            target: Some(draft_request::Target::SessionId(id)),
            options: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_sessions_share_a_kv_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_model(dir.path());
    config.limits.max_kv_tokens = 100;
    let metrics = free_port();
    config.metrics_bind = Some(metrics);
    let Running {
        mut client, stop, ..
    } = start(config).await;
    let start_with = |n: usize| {
        session_request::Step::Start(pb::SessionStart {
            context: vec![504; n],
            use_model: true,
            ..Default::default()
        })
    };
    let error_code = |r: &pb::SessionResponse| match &r.result {
        Some(pb::session_response::Result::Error(e)) => Some(Code::from(e.code)),
        _ => None,
    };
    let (tx_a, mut a) = open_session(&mut client).await;
    assert_eq!(error_code(&step(&tx_a, &mut a, start_with(60)).await), None);
    // A second session past the budget is refused; within it, accepted.
    let (tx_b, mut b) = open_session(&mut client).await;
    let refused = step(&tx_b, &mut b, start_with(50)).await;
    assert_eq!(error_code(&refused), Some(Code::ResourceExhausted));
    assert_eq!(error_code(&step(&tx_b, &mut b, start_with(40)).await), None);
    // Growing past it is refused and changes nothing.
    let append = session_request::Step::Append(pb::SessionAppend { tokens: vec![13] });
    let grown = step(&tx_a, &mut a, append.clone()).await;
    assert_eq!(error_code(&grown), Some(Code::ResourceExhausted));
    assert_eq!(grown.state.unwrap().length, 60);
    // Taking tokens back gives them back to the budget.
    let truncated = step(
        &tx_a,
        &mut a,
        session_request::Step::Truncate(pb::SessionTruncate { length: 50 }),
    )
    .await;
    assert_eq!(error_code(&truncated), None);
    assert_eq!(error_code(&step(&tx_a, &mut a, append).await), None);
    let text = tokio::task::spawn_blocking(move || scrape(metrics))
        .await
        .unwrap();
    assert_eq!(sample(&text, "sidecar_kv_tokens "), 91.0);
    // A closed session gives all of its tokens back.
    drop((tx_b, b));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = tokio::task::spawn_blocking(move || scrape(metrics))
        .await
        .unwrap();
    assert_eq!(sample(&text, "sidecar_kv_tokens "), 51.0);
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let mut config = config(dir.path(), index, false);
    config.limits.handshake_timeout_secs = 1;
    config.limits.max_connections = 1;
    let Running {
        client, addr, stop, ..
    } = start(config).await;
    // The test's own client holds the one slot; let it go.
    drop(client);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A connection that never sends the HTTP/2 preface is closed after the handshake timeout.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    // While it holds the only slot, a real client waits; it gets through once the silent one is
    // closed.
    let waiting = tokio::spawn(async move {
        let mut c = SidecarClient::new(connect(addr).await);
        c.info(pb::InfoRequest {}).await.unwrap();
        started.elapsed()
    });
    // The server speaks first (its HTTP/2 settings); then, hearing nothing, it closes.
    let mut heard = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut heard)).await;
    assert!(
        closed.is_ok(),
        "the silent connection was still open after 5 s"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    let waited = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting client never got through")
        .unwrap();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_open_sessions_at_the_drain_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let mut config = config(dir.path(), index, false);
    config.limits.drain_secs = 1;
    let Running {
        mut client,
        stop,
        task,
        ..
    } = start(config).await;
    let (tx, mut replies) = open_session(&mut client).await;
    step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: vec![504, 3458],
            use_model: false,
            ..Default::default()
        }),
    )
    .await;
    let started = Instant::now();
    let _ = stop.send(());
    // The idle session is ended with UNAVAILABLE once the drain deadline passes...
    let ended = tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("the session stream stayed open after the drain deadline");
    let err = ended.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    // ... and the server stops.
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_get_resource_exhausted_and_every_call_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let mut config = config(dir.path(), index, false);
    config.limits.max_message_bytes = 4096;
    let metrics = free_port();
    config.metrics_bind = Some(metrics);
    let Running {
        mut client, stop, ..
    } = start(config).await;
    // A request over the limit.
    let err = client
        .count(pb::CountRequest {
            allow_partial: false,
            ids: vec![1000; 3000],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    // An answer over the limit: the distribution after the empty prompt (the whole vocabulary
    // seen in the index) does not fit 4 kB.
    let err = client
        .next_token_distribution(pb::NextTokenDistributionRequest {
            allow_partial: false,
            prompt: vec![],
            infinite: false,
            max_support: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    // Score refused at validation (the server has no model).
    let mut score = client
        .score(pb::ScoreRequest {
            documents: vec![],
            lambda: None,
            per_token: false,
        })
        .await;
    if let Ok(stream) = score.as_mut() {
        let _ = stream.get_mut().message().await;
    }
    // A call cut off by its deadline.
    let mut request = tonic::Request::new(pb::CountRequest {
        allow_partial: false,
        ids: vec![13],
    });
    request.set_timeout(Duration::from_nanos(1));
    let _ = client.count(request).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = tokio::task::spawn_blocking(move || scrape(metrics))
        .await
        .unwrap();
    let count = |method: &str, code: &str| {
        sample(
            &text,
            &format!("sidecar_requests_total{{method=\"{method}\",code=\"{code}\"}}"),
        )
    };
    assert_eq!(count("Count", "ResourceExhausted"), 1.0, "{text}");
    assert_eq!(
        count("NextTokenDistribution", "ResourceExhausted"),
        1.0,
        "{text}"
    );
    assert_eq!(count("Score", "FailedPrecondition"), 1.0, "{text}");
    let cut_off = count("Count", "DeadlineExceeded") + count("Count", "Cancelled");
    assert_eq!(cut_off, 1.0, "{text}");
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configs_that_could_not_serve_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    // An empty bearer token would let `Bearer ` in.
    let mut empty_token = config(dir.path(), index.clone(), true);
    let var = format!("SIDECAR_EMPTY_TOKEN_{}", std::process::id());
    std::env::set_var(&var, "");
    empty_token.auth_token_env = Some(var);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = infini_sidecar::server::serve(empty_token, listener, async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");

    // Limits of 0 give a server that refuses everything.
    for (key, value) in [("max_in_flight", "0"), ("max_message_bytes", "0")] {
        let path = dir.path().join(format!("{key}.toml"));
        std::fs::write(
            &path,
            format!(
                "index = {:?}\n[limits]\n{key} = {value}\n",
                index.display().to_string()
            ),
        )
        .unwrap();
        let err = ServeConfig::load(&path).unwrap_err();
        assert!(err.to_string().contains(key), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_is_compared_whole() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let Running {
        mut client, stop, ..
    } = start(config(dir.path(), index, true)).await;
    for given in ["", "s3cre", "s3cret0", "S3cret"] {
        let mut request = tonic::Request::new(pb::InfoRequest {});
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {given}").parse().unwrap());
        let err = client.info(request).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{given:?}");
    }
    client.info(authed(pb::InfoRequest {})).await.unwrap();
    let _ = stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_drains_on_sigterm_and_exits_on_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let path = dir.path().join("serve.toml");
    std::fs::write(
        &path,
        format!(
            "index = {:?}\nbind = \"127.0.0.1:0\"\n[limits]\ndrain_secs = 600\n",
            index.display().to_string()
        ),
    )
    .unwrap();
    let (mut child, addr) = spawn_serve(&path).await;
    let mut client = SidecarClient::new(connect(addr).await);
    let (tx, mut replies) = open_session(&mut client).await;
    step(
        &tx,
        &mut replies,
        session_request::Step::Start(pb::SessionStart {
            context: vec![504],
            use_model: false,
            ..Default::default()
        }),
    )
    .await;
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill only sends a signal to the child we spawned.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal should drain, not exit, while a session is open"
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("a second SIGTERM did not end the server");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(130));
    drop(tx);
}
