//! The fuzz targets' kept inputs, replayed on stable through the very harness libFuzzer runs
//! (`fuzz/harness`): every file of `fuzz/corpus/TARGET/` and of `fuzz/regressions/TARGET/` (the
//! crashes fuzzing found, kept once fixed). Cheap, so it runs everywhere; `scripts/fuzz.sh` fuzzes
//! for real where a nightly toolchain is.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

#[path = "../../fuzz/harness/mod.rs"]
mod harness;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    files.sort();
    files
}

/// Runs every kept input of `target`; fails naming each input that panicked.
fn replay(target: &str, run: impl Fn(&[u8])) {
    let corpus = files_in(&fuzz_dir().join("corpus").join(target));
    assert!(!corpus.is_empty(), "fuzz/corpus/{target} holds no inputs");
    let inputs = corpus
        .into_iter()
        .chain(files_in(&fuzz_dir().join("regressions").join(target)));
    let mut failed = Vec::new();
    for path in inputs {
        let input = std::fs::read(&path).unwrap();
        let before = harness::panics();
        let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| run(&input))).is_err();
        if unwound || harness::panics() != before {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "these inputs panicked (messages above):\n{}",
        failed.join("\n")
    );
}

#[test]
fn protocol() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = harness::protocol::Fixture::new(dir.path());
    replay("protocol", |input| fixture.run(input));
}

#[test]
fn index_files() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = harness::index_files::Fixture::new(dir.path());
    replay("index_files", |input| fixture.run(input));
}

#[test]
fn compressed_file() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = harness::compressed_file::Fixture::new(dir.path());
    replay("compressed_file", |input| fixture.run(input));
}

#[test]
fn rpc() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = harness::rpc::Fixture::new(dir.path());
    replay("rpc", |input| fixture.run(input));
}

#[test]
fn live() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = harness::live::Fixture::new(dir.path());
    replay("live", |input| fixture.run(input));
}

#[test]
fn shard_answers() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = harness::shard_answers::Fixture::new(dir.path());
    replay("shard_answers", |input| fixture.run(input));
    // The seeds reach the merges: every shard's answer passes. Each corruption of the router
    // probe's fake shard is refused, the honest answers beside it pass.
    for (name, input) in harness::shard_answers::seeds() {
        let every = if name == "live" {
            vec![0]
        } else {
            vec![0, 1, 2]
        };
        assert_eq!(fixture.check(&input), every, "seed {name}");
    }
    for (name, input) in harness::shard_answers::corruptions() {
        assert_eq!(fixture.check(&input), vec![0, 2], "{name}");
    }
}

/// Writes the harness's seeds as `fuzz/corpus/TARGET/seed-NAME`, and the shard corruptions of the
/// router probe as `fuzz/regressions/shard_answers/NAME`: run it when an input format changes
/// (`cargo nextest run --run-ignored only -E 'test(fuzz_replay::write_seeds)'`).
#[test]
#[ignore = "writes into fuzz/corpus"]
fn write_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let targets = [
        ("protocol", harness::protocol::seeds()),
        ("index_files", harness::index_files::seeds(dir.path())),
        (
            "compressed_file",
            harness::compressed_file::seeds(dir.path()),
        ),
        ("rpc", harness::rpc::seeds()),
        ("live", harness::live::seeds()),
        ("shard_answers", harness::shard_answers::seeds()),
    ];
    for (target, seeds) in targets {
        let out = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&out).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(out.join(format!("seed-{name}")), bytes).unwrap();
        }
    }
    let out = fuzz_dir().join("regressions").join("shard_answers");
    std::fs::create_dir_all(&out).unwrap();
    for (name, bytes) in harness::shard_answers::corruptions() {
        std::fs::write(out.join(name), bytes).unwrap();
    }
}
