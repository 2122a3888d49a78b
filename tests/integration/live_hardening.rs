//! The live index under hostile use, through the real server (and the real binary where a process
//! must stop or start): nothing acknowledged is lost, nothing outside the data folder is touched,
//! a refused request changes nothing, and a departed client's stream steps stop. Each test is a
//! finding of the probe in shared/repro/live-and-streams.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use infini_sidecar::server::config::{LiveSection, ServeConfig};
use infini_sidecar::server::pb::sidecar_client::SidecarClient;
use infini_sidecar::server::pb::{self, session_request};
use tonic::transport::Channel;
use tonic::Code;

use crate::common::server::{
    add, build_index, config, config_file, connect, draftable, open_session, permit_comes_back,
    random_documents, spawn_serve, start, step, with_model, Running, Served,
};

async fn live_info(client: &mut SidecarClient<Channel>) -> pb::LiveInfo {
    let info = client.info(pb::InfoRequest {}).await.unwrap().into_inner();
    info.live.expect("Info says what the live index holds")
}

fn live_config(dir: &Path, data_dir: Option<PathBuf>, budget: u64, freeze: u64) -> ServeConfig {
    let index = build_index(dir);
    ServeConfig {
        live: LiveSection {
            data_dir,
            budget_tokens: budget,
            freeze_tokens: freeze,
            ..LiveSection::default()
        },
        ..config(dir, index, false)
    }
}

fn sigterm(child: &mut std::process::Child) -> std::process::ExitStatus {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap()
}

/// Every file below `dir` with its contents, to see that nothing changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files.push((p.clone(), Vec::new()));
                stack.push(p);
            } else {
                files.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// F2: `[live] data_dir` over a folder of someone's files. It was taken for the live index's: its
/// `run-*` subfolders deleted, the others moved to `.bad-*`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_that_is_not_the_live_index_s_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let index = build_index(dir.path());
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("projects/run-2024")).unwrap();
    std::fs::create_dir_all(home.join("notes")).unwrap();
    std::fs::write(home.join("projects/run-2024/results.csv"), "2024 results").unwrap();
    std::fs::write(home.join("notes/todo.txt"), "keep me").unwrap();
    let before = snapshot(&home);
    let path = config_file(dir.path(), &index, &home, "");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "it served over someone's folder: {log}"
    );
    assert!(log.contains(&home.display().to_string()), "{log}");
    assert!(
        log.contains("\"notes\""),
        "the refusal names what it found: {log}"
    );
    assert_eq!(snapshot(&home), before, "the folder changed");

    // The live index's own folder, with a stranger put inside it later: refused the same way.
    let data = dir.path().join("data");
    let path = config_file(dir.path(), &index, &data, "");
    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    let docs = random_documents(1, 2);
    client.add_documents(add("team", &docs, "")).await.unwrap();
    assert!(sigterm(&mut child.0).success());
    std::fs::create_dir_all(data.join("photos/run-7")).unwrap();
    std::fs::write(data.join("photos/run-7/a.jpg"), "jpg").unwrap();
    let before = snapshot(&data);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infini-sidecar"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(log.contains("\"photos\""), "{log}");
    assert_eq!(snapshot(&data), before);
}

/// Mounts a 2 MiB tmpfs at `at` (root, as CI runs); `None` where mounting is not allowed.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path) -> Option<Self> {
        std::fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(at.to_path_buf()))
    }

    /// A small disk under `dir` and a serve config whose live data folder is on it (a budget of
    /// 200,000 tokens, tails frozen at 4,096): the disk, the data folder and the config file.
    /// `None`, saying so, where no tmpfs can be mounted.
    fn serve_config(dir: &Path) -> Option<(Self, PathBuf, PathBuf)> {
        let Some(disk) = Self::mount(&dir.join("disk")) else {
            println!(
                "skipped: cannot mount a tmpfs here (not root?); the disk-full test needs one"
            );
            return None;
        };
        let data = disk.0.join("live");
        let index = build_index(dir);
        let config = config_file(
            dir,
            &index,
            &data,
            "budget_tokens = 200000\nfreeze_tokens = 4096\n",
        );
        Some((disk, data, config))
    }

    /// Fills the disk but for `leave` bytes with one file, returned.
    fn fill(&self, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// F3: with the disk full for about 2 s, documents AddDocuments had acknowledged were dropped for
/// good ("gave up … documents are dropped"), even after space came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_keeps_what_was_acknowledged_and_refuses_what_comes_next() {
    let dir = tempfile::tempdir().unwrap();
    let Some((disk, _, path)) = SmallDisk::serve_config(dir.path()) else {
        return;
    };
    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    client
        .add_documents(add("acked", &random_documents(7, 1), ""))
        .await
        .unwrap();
    // Room for the journal's record of the next 6,000 tokens (24 KB), not for their run: they are
    // past the freeze size, so their build starts at once, and fails.
    let filler = disk.fill(32 << 10);
    let docs = random_documents(3, 20);
    client.add_documents(add("acked", &docs, "")).await.unwrap();
    let started = Instant::now();
    while live_info(&mut client).await.failed_writes < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failed build"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = live_info(&mut client).await;
    assert!(!info.write_failure.is_empty(), "{info:?}");
    assert_eq!(draftable(&mut client, "acked", &docs).await, 20);
    // Appends are refused while the disk takes no writes, naming it.
    let refused = client
        .add_documents(add("acked", &random_documents(4, 1), ""))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("disk"), "{}", refused.message());
    std::fs::remove_file(filler).unwrap();
    let started = Instant::now();
    while !live_info(&mut client).await.write_failure.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60), "still failing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(live_info(&mut client).await.tail_tokens, 0);
    assert_eq!(draftable(&mut client, "acked", &docs).await, 20);
    client
        .add_documents(add("acked", &random_documents(4, 1), ""))
        .await
        .unwrap();
    assert!(sigterm(&mut child.0).success());
    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    assert_eq!(draftable(&mut client, "acked", &docs).await, 20);
    assert!(sigterm(&mut child.0).success());
}

/// The soak in CI: a namespace first written to while the disk was full got Internal ("No space left
/// on device" from its marker file) instead of ResourceExhausted, and its folder stayed behind with
/// an empty marker, so the namespace was refused for good ("its folder exists already") and a
/// restart refused the whole data folder (a corrupt marker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_begun_on_a_full_disk_is_refused_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let Some((disk, data, path)) = SmallDisk::serve_config(dir.path()) else {
        return;
    };
    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    let first = random_documents(5, 2);
    client
        .add_documents(add("first", &first, ""))
        .await
        .unwrap();
    let filler = disk.fill(0);
    let second = random_documents(6, 2);
    let refused = client
        .add_documents(add("second", &second, ""))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("disk"), "{}", refused.message());
    assert!(
        !data.join("second").exists(),
        "a refused namespace left its folder"
    );
    std::fs::remove_file(filler).unwrap();
    client
        .add_documents(add("second", &second, ""))
        .await
        .unwrap();
    assert!(sigterm(&mut child.0).success());
    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    assert_eq!(draftable(&mut client, "first", &first).await, 2);
    assert_eq!(draftable(&mut client, "second", &second).await, 2);
    assert!(sigterm(&mut child.0).success());
}

/// Acknowledged documents and a session's learnt tokens sat in the tail, in memory only, until
/// the tail was built into a run: a kill of the process lost them all (a restart drafted none of
/// 10 documents AddDocuments had acknowledged). The journal keeps them; a retry of an
/// acknowledged request adds nothing twice after the restart either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_acknowledged_survives_a_kill_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("live");
    let index = build_index(dir.path());
    // A freeze size no test reaches: everything stays in the tail.
    let path = config_file(
        dir.path(),
        &index,
        &data,
        "budget_tokens = 2000000
freeze_tokens = 100000
",
    );
    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    let docs = random_documents(11, 10);
    client
        .add_documents(add("acked", &docs, "request-1"))
        .await
        .unwrap();
    let learnt = random_documents(12, 1).remove(0);
    let (tx, mut replies, _) = learning_session(&mut client, &learnt[..10], "learnt").await;
    for (append, keep) in [(&learnt[10..], None), (&[][..], Some(200))] {
        let step_request = match keep {
            None => session_request::Step::Append(pb::SessionAppend {
                tokens: append.to_vec(),
            }),
            Some(length) => session_request::Step::Truncate(pb::SessionTruncate { length }),
        };
        let answer = step(&tx, &mut replies, step_request).await;
        assert!(answer.result.is_none(), "{:?}", answer.result);
    }
    assert_eq!(live_info(&mut client).await.tail_tokens, 3_200);
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    drop(tx);

    let (child, addr) = spawn_serve(&path).await;
    let mut child = Served(child);
    let mut client = SidecarClient::new(connect(addr).await);
    let info = live_info(&mut client).await;
    assert_eq!((info.tokens, info.tail_tokens), (3_200, 3_200), "{info:?}");
    assert_eq!(draftable(&mut client, "acked", &docs).await, 10);
    assert_eq!(
        draftable(&mut client, "learnt", &[learnt[..200].to_vec()]).await,
        1
    );
    let again = client
        .add_documents(add("acked", &docs, "request-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(again.repeated, "{again:?}");
    assert_eq!(live_info(&mut client).await.tokens, 3_200);
    assert!(sigterm(&mut child.0).success());
}

/// F1: `[A, B]` with B too large added A; a request refused with "try again shortly" part way kept
/// the part, so a retry as told doubled it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_documents_adds_all_or_nothing_and_a_request_id_makes_a_retry_safe() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing is compacted during the test: tails hold what was added.
    let Running {
        mut client, stop, ..
    } = start(live_config(dir.path(), None, 200_000, 4096)).await;
    let docs = random_documents(11, 60);
    let mut too_big = docs[1].clone();
    too_big.resize(4 * 4096 + 1, 7);
    let err = client
        .add_documents(add("ns", &[docs[0].clone(), too_big], ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(draftable(&mut client, "ns", &docs[..1]).await, 0);
    assert_eq!(
        live_info(&mut client).await.namespaces,
        0,
        "a refused call creates nothing"
    );
    // 8 documents at once, again and again until one is refused: a refused request adds none.
    let mut added = 0;
    for chunk in docs.chunks(8) {
        match client.add_documents(add("ns", chunk, "")).await {
            Ok(_) => added += chunk.len(),
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                break;
            }
        }
    }
    let info = live_info(&mut client).await;
    assert_eq!(info.tokens, 300 * added as u64, "{info:?}");
    // A request sent twice with one id is added once; its second answer says so.
    let fresh = random_documents(12, 2);
    let first = client
        .add_documents(add("other", &fresh, "req-1"))
        .await
        .unwrap()
        .into_inner();
    let again = client
        .add_documents(add("other", &fresh, "req-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.repeated && again.repeated);
    assert_eq!(
        live_info(&mut client).await.tokens,
        300 * (added as u64 + 2)
    );
    let long_id = "x".repeat(129);
    let err = client
        .add_documents(add("other", &fresh, &long_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let _ = stop.send(());
}

/// A session started on `context` that learns into `namespace`, and its start's answer.
async fn learning_session(
    client: &mut SidecarClient<Channel>,
    context: &[u32],
    namespace: &str,
) -> (
    tokio::sync::mpsc::Sender<pb::SessionRequest>,
    tonic::Streaming<pb::SessionResponse>,
    pb::SessionResponse,
) {
    let (tx, mut replies) = open_session(client).await;
    let start = pb::SessionStart {
        context: context.to_vec(),
        namespace: namespace.into(),
        learn: true,
        ..Default::default()
    };
    let started = step(&tx, &mut replies, session_request::Step::Start(start)).await;
    (tx, replies, started)
}

/// F6: namespaces were never freed (a refused call created one, eviction and restarts kept them);
/// once `max_namespaces` was reached every new tenant was refused and a learning Session failed to
/// start at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_namespaces_are_reclaimed_and_learning_without_one_degrades_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = live_config(dir.path(), Some(dir.path().join("live")), 200_000, 4096);
    config.live.max_namespaces = 3;
    let Running {
        mut client, stop, ..
    } = start(config).await;
    let docs = random_documents(5, 3);
    for (i, d) in docs[..2].iter().enumerate() {
        client
            .add_documents(add(&format!("t{i}"), std::slice::from_ref(d), ""))
            .await
            .unwrap();
    }
    // The third namespace learns from a session, which then takes back all it appended.
    let (learner, mut learnt, started) = learning_session(&mut client, &docs[2][..10], "t2").await;
    assert_eq!(started.state.unwrap().warning, "");
    assert_eq!(live_info(&mut client).await.namespaces, 3);
    let err = client
        .add_documents(add("t3", &docs[..1], ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        !dir.path().join("live/t3").exists(),
        "a refused call creates nothing"
    );
    // A learning session that cannot get a namespace still decodes, and says why it does not learn.
    let (tx, _replies, started) = learning_session(&mut client, &docs[0][..10], "t4").await;
    assert!(started.result.is_none(), "{:?}", started.result);
    let state = started.state.unwrap();
    assert!(state.warning.contains("max_namespaces"), "{state:?}");
    drop(tx);
    // t2's learner takes its tokens back: t2 is empty, reclaimed, and a new tenant fits.
    let back = step(
        &learner,
        &mut learnt,
        session_request::Step::Truncate(pb::SessionTruncate { length: 0 }),
    )
    .await;
    assert!(back.result.is_none(), "{:?}", back.result);
    let started = Instant::now();
    while live_info(&mut client).await.namespaces > 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "t2 was not reclaimed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!dir.path().join("live/t2").exists());
    client
        .add_documents(add("t3", &docs[..1], ""))
        .await
        .unwrap();
    assert_eq!(live_info(&mut client).await.namespaces_reclaimed, 1);
    drop(learner);
    let _ = stop.send(());
}

/// F8: a learning session that appended and took back one token 500 times taught the live index
/// 33,036 tokens for a 600-token sequence (55×).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learning_session_teaches_no_more_than_it_appended() {
    let dir = tempfile::tempdir().unwrap();
    let Running {
        mut client, stop, ..
    } = start(live_config(dir.path(), None, 2_000_000, 65_536)).await;
    let doc = random_documents(21, 1).remove(0);
    let (tx, mut replies, _) = learning_session(&mut client, &doc, "loop").await;
    for i in 0..500u32 {
        let appended = step(
            &tx,
            &mut replies,
            session_request::Step::Append(pb::SessionAppend {
                tokens: vec![1 + i % 7],
            }),
        )
        .await;
        assert!(appended.result.is_none());
        let back = step(
            &tx,
            &mut replies,
            session_request::Step::Truncate(pb::SessionTruncate { length: 300 }),
        )
        .await;
        assert!(back.result.is_none());
    }
    let info = live_info(&mut client).await;
    assert_eq!(info.tokens, 300, "the sequence kept 300 tokens: {info:?}");
    assert_eq!(draftable(&mut client, "loop", &[doc]).await, 1);
    drop(tx);
    let _ = stop.send(());
}

/// F9 (the namespace's side): one tenant writing 260k tokens evicted all 20 documents of another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_writing_fast_cannot_evict_another_s_documents() {
    let dir = tempfile::tempdir().unwrap();
    let Running {
        mut client, stop, ..
    } = start(live_config(dir.path(), None, 65_536, 4096)).await;
    let quiet = random_documents(31, 20);
    client
        .add_documents(add("quiet", &quiet, ""))
        .await
        .unwrap();
    let loud = random_documents(32, 900);
    for chunk in loud.chunks(10) {
        // Refusals while the compactor catches up are retried, as a client would.
        while let Err(e) = client.add_documents(add("loud", chunk, "")).await {
            assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let info = live_info(&mut client).await;
    assert!(info.evicted_runs > 0, "{info:?}");
    assert!(info.tokens <= 65_536, "{info:?}");
    assert_eq!(draftable(&mut client, "quiet", &quiet).await, 20);
    assert!(draftable(&mut client, "loud", &loud[..20]).await < 20);
    let _ = stop.send(());
}

/// How soon abandoned model work gives its permit back. It stops between two layers of one
/// part's forward pass, which takes well under a second alone but can take seconds while another
/// test holds both cores; left running, the work below (32 prefills of 1,500 tokens) holds its
/// permit for minutes (490 s on two Zen 3 cores).
const ABANDONED_WORK_STOPS_WITHIN: Duration = Duration::from_secs(10);

/// F4: a Batch step of 400 model parts ran minutes of CPU after its client left, holding its permit
/// and KV tokens; so did a Session mix over 6,000 tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_steps_stop_when_their_client_leaves_or_their_deadline_passes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_model(dir.path());
    config.limits.max_in_flight = 1;
    config.live.enabled = false;
    let Running {
        mut client,
        addr,
        stop,
        ..
    } = start(config).await;
    let context: Vec<u32> = (0..1_500).map(|i| 100 + i % 5_000).collect();
    let heavy_part = |id: u64| pb::SequenceStep {
        id,
        start: Some(pb::SessionStart {
            context: context.clone(),
            use_model: true,
            ..Default::default()
        }),
        mix: Some(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::OwnModel(true)),
            top_k: 4,
            ..Default::default()
        }),
        ..Default::default()
    };
    // A Batch step of 32 parts of 1,500 tokens each: many seconds of model work.
    let mut leaving = SidecarClient::new(connect(addr).await);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut answers = leaving
        .batch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::BatchStep {
        sequences: (0..32).map(heavy_part).collect(),
    })
    .await
    .unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(500), answers.message()).await;
    assert!(gave_up.is_err(), "the step should outlast 500 ms");
    drop((tx, answers, leaving));
    permit_comes_back(&mut client, ABANDONED_WORK_STOPS_WITHIN).await;

    // A Session whose stream has a deadline: its long mix stops there.
    let mut timed = SidecarClient::new(connect(addr).await);
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.set_timeout(Duration::from_millis(800));
    let mut answers = timed.session(request).await.unwrap().into_inner();
    let start = pb::SessionStart {
        context: (0..3_000).map(|i| 100 + i % 5_000).collect(),
        use_model: true,
        ..Default::default()
    };
    tx.send(pb::SessionRequest {
        step: Some(session_request::Step::Start(start)),
    })
    .await
    .unwrap();
    tx.send(pb::SessionRequest {
        step: Some(session_request::Step::Mix(pb::SessionMix {
            neural: Some(pb::session_mix::Neural::OwnModel(true)),
            top_k: 4,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    // The stream ends with DEADLINE_EXCEEDED (tonic's own timer may say CANCELLED) once the mix,
    // stopped between two layers, has answered.
    let started = Instant::now();
    let ended = loop {
        match answers.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => break None,
            Err(status) => break Some(status.code()),
        }
    };
    assert!(
        matches!(ended, Some(Code::DeadlineExceeded | Code::Cancelled)),
        "{ended:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(tx);
    permit_comes_back(&mut client, ABANDONED_WORK_STOPS_WITHIN).await;
    let _ = stop.send(());
}

/// F12: Trace tokenized megabytes of text before refusing it on its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_beyond_the_token_limit_is_refused_before_it_is_tokenized() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = live_config(dir.path(), None, 200_000, 4096);
    config.limits.max_context_tokens = 1_000;
    let Running {
        mut client, stop, ..
    } = start(config).await;
    let text = "word ".repeat(4_000);
    let err = client
        .trace(pb::TraceRequest {
            text: text.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("bytes of text"), "{}", err.message());
    let err = client
        .add_documents(pb::AddDocumentsRequest {
            namespace: "n".into(),
            documents: vec![pb::LiveDocument {
                content: Some(pb::live_document::Content::Text(text)),
            }],
            request_id: String::new(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("bytes of text"), "{}", err.message());
    let _ = stop.send(());
}
