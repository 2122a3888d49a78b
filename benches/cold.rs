//! Lookups with a cold page cache (`cargo bench --bench cold`): what one query costs when none of
//! the index's pages are in memory, as on a shard server whose index is far larger than its RAM.
//! Over the default index (`INFINI_SIDECAR_BENCH_INDEX` to name another), for 8-token windows of
//! held-out text: before each query the open index's pages are evicted from memory (its mappings'
//! pages dropped with `madvise`, then its files from the page cache with `posix_fadvise`, neither
//! of which needs privileges), as a shard server's would be; then `Count` of
//! the window's last 4 tokens and the ∞-gram of the whole window (its longest suffix, by binary
//! search, and a 64-sample distribution) are timed, and the pages each read from the device
//! counted (major page faults). The same queries warm, in the same run.
//! Writes `eval/results/cold.json`; eval/CLUSTER.md uses it for the 1 T-token layout.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use infini_sidecar::index::corpus::Corpus;
use infini_sidecar::index::{Index, OpenOptions};
use serde_json::json;

const QUERIES: usize = 200;

/// Drops every file of `dir` from the page cache: first from this process's page tables (the open
/// index's mappings, found in /proc/self/maps), then from the cache itself. Needs no privileges.
#[cfg(target_os = "linux")]
fn evict(dir: &Path) {
    use std::os::fd::AsRawFd;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(path)) = (fields.next(), fields.nth(4)) else {
            continue;
        };
        if !path.starts_with(&*dir.to_string_lossy()) {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let start = usize::from_str_radix(start, 16).unwrap();
        let end = usize::from_str_radix(end, 16).unwrap();
        // SAFETY: the range is a read-only file mapping of the index; dropping its pages from our
        // page tables only makes the next read fault them in from the file again.
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        assert_eq!(rc, 0, "madvise on {path}");
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
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

/// Major page faults of this process so far: pages read from the device.
fn page_reads() -> i64 {
    common::rusage().ru_majflt
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
        .unwrap_or_else(|| common::assets().join("index-minipile-train-decon-smollm2"));
    let open = || Index::open(&dir, &OpenOptions::default()).unwrap();
    let index = open();
    let tokenizer = index
        .tokenizer()
        .cloned()
        .expect("the index has a tokenizer");
    let windows: Vec<Vec<u32>> = common::test_documents(&common::assets(), &tokenizer, 64, QUERIES)
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

    let (mut cold_count, mut cold_infgram) = (Vec::new(), Vec::new());
    let (mut reads_count, mut reads_infgram) = (Vec::new(), Vec::new());
    for w in &windows {
        for (times, reads, infgram) in [
            (&mut cold_count, &mut reads_count, false),
            (&mut cold_infgram, &mut reads_infgram, true),
        ] {
            evict(&dir);
            let before = page_reads();
            times.push(time(|| query(&index, w, infgram)));
            reads.push((page_reads() - before) as f64);
        }
    }
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
        "suffix_arrays": index.num_parts(),
        "cold": {"count": percentiles(cold_count), "infgram_ntd_64": percentiles(cold_infgram)},
        // Pages each cold query read from the device (major faults): its latency on another
        // device is about this many random reads.
        "cold_page_reads": {"count": percentiles(reads_count), "infgram_ntd_64": percentiles(reads_infgram)},
        "warm": {"count": percentiles(warm_count), "infgram_ntd_64": percentiles(warm_infgram)},
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/results/cold.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
