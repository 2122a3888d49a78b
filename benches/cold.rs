//! Lookups with a cold page cache (`cargo bench --bench cold`): what one query costs when none of
//! the index's pages are in memory, as on a shard server whose index is far larger than its RAM.
//! Over the default index (`INFINI_SIDECAR_BENCH_INDEX` to name another), for 8-token windows of
//! held-out text: before each query the index is closed, its files are evicted from the page cache
//! (`posix_fadvise(DONTNEED)`, which needs no privileges) and it is opened again; then `Count` of
//! the window's last 4 tokens and the ∞-gram of the whole window (its longest suffix, by binary
//! search, and a 64-sample distribution) are timed. The same queries warm, in the same run.
//! Writes `eval/results/cold.json`; eval/CLUSTER.md uses it for the 1 T-token layout.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use infini_sidecar::index::{Index, OpenOptions};
use serde_json::json;

const QUERIES: usize = 200;

fn assets() -> PathBuf {
    std::env::var_os("INFINI_SIDECAR_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/infini-sidecar/assets")
        })
}

/// Drops every file of `dir` from the page cache (clean pages no process maps).
#[cfg(target_os = "linux")]
fn evict(dir: &Path) {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            evict(&path);
            continue;
        }
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: an advisory call on a file descriptor we own; it changes no memory of ours.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise on {}", path.display());
    }
}

#[cfg(not(target_os = "linux"))]
fn evict(_: &Path) {
    panic!("evicting files from the page cache is implemented for Linux only");
}

/// `Count` of the window's last 4 tokens, or the ∞-gram of the whole window.
fn query(index: &Index, window: &[u32], infgram: bool) {
    match infgram {
        false => {
            std::hint::black_box(index.count(&window[4..]).unwrap());
        }
        true => {
            std::hint::black_box(index.infgram_ntd(window, Some(64)).unwrap());
        }
    }
}

/// µs of `f`.
fn time(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e6
}

fn percentiles(mut micros: Vec<f64>) -> serde_json::Value {
    micros.sort_by(f64::total_cmp);
    let at = |p: f64| micros[((micros.len() - 1) as f64 * p).round() as usize];
    json!({"calls": micros.len(), "p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99)})
}

fn main() {
    let dir = std::env::var_os("INFINI_SIDECAR_BENCH_INDEX")
        .map(PathBuf::from)
        .unwrap_or_else(|| assets().join("index-minipile-train-decon-smollm2"));
    let open = || Index::open(&dir, &OpenOptions::default()).unwrap();
    let index = open();
    let tokenizer = index
        .tokenizer()
        .cloned()
        .expect("the index has a tokenizer");
    let windows: Vec<Vec<u32>> = common::test_documents(&assets(), &tokenizer, 64, QUERIES)
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let at = (i * 104_729) % (d.len() - 8);
            d[at..at + 8].to_vec()
        })
        .collect();
    let bytes: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let tokens = index.total_tokens();
    drop(index);

    let (mut cold_count, mut cold_infgram) = (Vec::new(), Vec::new());
    for w in &windows {
        for (times, infgram) in [(&mut cold_count, false), (&mut cold_infgram, true)] {
            evict(&dir);
            let index = open();
            evict(&dir);
            times.push(time(|| query(&index, w, infgram)));
        }
    }
    let index = open();
    let (mut warm_count, mut warm_infgram) = (Vec::new(), Vec::new());
    for pass in 0..3 {
        for w in &windows {
            let (count, infgram) = (
                time(|| query(&index, w, false)),
                time(|| query(&index, w, true)),
            );
            // The first pass brings the pages in.
            if pass > 0 {
                warm_count.push(count);
                warm_infgram.push(infgram);
            }
        }
    }
    let report = json!({
        "bench": "cold",
        "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
        "index": dir.display().to_string(),
        "index_bytes": bytes,
        "index_tokens": tokens,
        "suffix_arrays": index.num_shards(),
        "cold": {"count": percentiles(cold_count), "infgram_ntd_64": percentiles(cold_infgram)},
        "warm": {"count": percentiles(warm_count), "infgram_ntd_64": percentiles(warm_infgram)},
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results/cold.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
