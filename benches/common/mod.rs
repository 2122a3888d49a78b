//! What the benchmarks share: real test-split text of the default assets, tokenized, latency
//! measurement, and a sidecar served on loopback. Each bench uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::time::Instant;

use infini_sidecar::corpus::{expand_inputs, text_documents, Content};
use infini_sidecar::tokenizer::Tokenizer;
use serde_json::json;

/// The assets folder: `$INFINI_SIDECAR_ASSETS`, else `~/.cache/infini-sidecar/assets`.
pub fn assets() -> std::path::PathBuf {
    std::env::var_os("INFINI_SIDECAR_ASSETS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap())
                .join(".cache/infini-sidecar/assets")
        })
}

/// `index build` of `input` into `out` with SmolLM2's tokenizer; shard `k` of `n` when given.
pub fn build_index(input: &Path, out: &Path, shard: Option<(usize, usize)>) {
    let tokenizer = assets().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_infini-sidecar"));
    cmd.args(["index", "build", "--force", "--input"])
        .arg(input)
        .arg("--tokenizer")
        .arg(tokenizer)
        .arg("--out")
        .arg(out);
    if let Some((k, n)) = shard {
        cmd.args(["--shard", &format!("{k}/{n}")]);
    }
    let status = cmd.output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A caller's top 32 tokens' log-probs, falling geometrically; 5% of the mass on the others.
pub fn neural_top_k() -> infini_sidecar::server::pb::NeuralTopK {
    let q: f64 = 0.8;
    let norm = (1.0 - q.powi(32)) / (1.0 - q);
    infini_sidecar::server::pb::NeuralTopK {
        tokens: (0..32).map(|t| t * 97 + 13).collect(),
        logprobs: (0..32)
            .map(|r| (0.95 * q.powi(r) / norm).ln() as f32)
            .collect(),
        rest_mass: 0.05,
    }
}

/// The first `count` mini-Pile test documents longer than `min_tokens`, tokenized; `assets` is the
/// folder holding `minipile/`.
pub fn test_documents(
    assets: &Path,
    tokenizer: &Tokenizer,
    min_tokens: usize,
    count: usize,
) -> Vec<Vec<u32>> {
    let files = expand_inputs(&[assets.join("minipile/test.jsonl")]).unwrap();
    text_documents(files)
        .filter_map(|d| match d.unwrap().content {
            Content::Text(t) => Some(tokenizer.encode(&t).unwrap()),
            Content::Tokens(_) => None,
        })
        .filter(|ids| ids.len() > min_tokens)
        .take(count)
        .collect()
}

/// p50/p99 (µs) and calls per second of `n` sequential calls, with the process's CPU a call and
/// the cores it kept busy over them ([`cpu_seconds`]).
pub async fn measure<F, Fut>(n: usize, mut call: F) -> serde_json::Value
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for i in 0..n / 10 {
        call(i).await;
    }
    let mut micros = Vec::with_capacity(n);
    let (start, cpu_before) = (Instant::now(), cpu_seconds());
    for i in 0..n {
        let t = Instant::now();
        call(i).await;
        micros.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (total, cpu) = (start.elapsed(), cpu_seconds() - cpu_before);
    micros.sort_by(f64::total_cmp);
    let at = |p: f64| micros[((micros.len() - 1) as f64 * p).round() as usize];
    json!({
        "calls": n,
        "p50_us": at(0.5),
        "p99_us": at(0.99),
        "per_second": n as f64 / total.as_secs_f64(),
        "cpu_us_per_call": cpu * 1e6 / n as f64,
        "cores_busy": cpu / total.as_secs_f64(),
    })
}

/// The middle value of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// This process's resource use so far (CPU time, page faults).
pub fn rusage() -> libc::rusage {
    // SAFETY: getrusage writes the struct we pass and nothing else.
    let (rc, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::getrusage(libc::RUSAGE_SELF, &mut usage), usage)
    };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    usage
}

/// CPU seconds this process has used so far, user and system, over all its threads: a bench that
/// serves itself on loopback counts client and server alike, so over the wall-clock time it says
/// how much of the machine a call kept busy, not only how long it waited.
pub fn cpu_seconds() -> f64 {
    let usage = rusage();
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The floor under every figure of a call on loopback: p50 (µs) of `n` round trips of 32 bytes over
/// a plain TCP connection to an echo thread, with both sides blocked in `read` while they wait (as
/// gRPC's threads park), and with both sides polling a non-blocking socket instead. On a VM whose
/// idle vCPUs halt, the difference is the cost of waking a thread, which no server can avoid.
pub fn loopback_floor(n: usize) -> serde_json::Value {
    json!({
        "round_trips": n,
        "blocking_p50_us": echo_round_trip_p50(n, false),
        "spinning_p50_us": echo_round_trip_p50(n, true),
    })
}

fn echo_round_trip_p50(n: usize, spin: bool) -> f64 {
    use std::io::{ErrorKind, Read, Write as _};
    assert!(n > 0, "no round trips to time");
    /// Writes all of `buf`, polling when the socket is non-blocking.
    fn write_all(s: &mut std::net::TcpStream, buf: &[u8]) {
        let mut sent = 0;
        while sent < buf.len() {
            match s.write(&buf[sent..]) {
                Ok(k) => sent += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("echo: {e}"),
            }
        }
    }
    /// Reads exactly `buf.len()` bytes, polling when the socket is non-blocking.
    fn read_all(s: &mut std::net::TcpStream, buf: &mut [u8]) -> bool {
        let mut got = 0;
        while got < buf.len() {
            match s.read(&mut buf[got..]) {
                Ok(0) => return false,
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("echo: {e}"),
            }
        }
        true
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        s.set_nonblocking(spin).unwrap();
        let mut buf = [0u8; 32];
        while read_all(&mut s, &mut buf) {
            write_all(&mut s, &buf);
        }
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_nonblocking(spin).unwrap();
    let mut buf = [7u8; 32];
    let mut micros = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        write_all(&mut s, &buf);
        assert!(read_all(&mut s, &mut buf), "echo closed");
        if i >= n / 10 {
            micros.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(s);
    echo.join().unwrap();
    micros.sort_by(f64::total_cmp);
    micros[micros.len() / 2]
}

/// A sidecar served on loopback from a thread with a runtime of its own, as it would run in its own
/// process.
pub struct Served {
    pub addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), infini_sidecar::server::ServeError>>,
}

impl Served {
    pub fn start(config: infini_sidecar::server::config::ServeConfig) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    infini_sidecar::server::serve(config, listener, async {
                        let _ = stopped.await;
                    })
                    .await
                })
        });
        Self { addr, stop, thread }
    }

    /// A client, once the server answers.
    pub async fn client(
        &self,
    ) -> infini_sidecar::server::pb::sidecar_client::SidecarClient<tonic::transport::Channel> {
        loop {
            assert!(
                !self.thread.is_finished(),
                "the sidecar stopped before answering"
            );
            let url = format!("http://{}", self.addr);
            match infini_sidecar::server::pb::sidecar_client::SidecarClient::connect(url).await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap().unwrap();
    }
}
