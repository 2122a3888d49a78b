//! The chaos run of issue 52 (`cargo bench --bench chaos`, as root; needs the assets of
//! `scripts/run-default.sh`): the first 2,000 mini-Pile train documents built whole and as 3
//! shards; 2 routers and 3 shards × 2 replicas, each in a network namespace of its own, under a
//! mixed workload for `CHAOS_SECONDS` (default 600) while replicas are killed, stopped,
//! partitioned, slowed and made lossy at random (`tests/integration/common/chaos.rs` says how, and
//! how every answer is checked). `CHAOS_SEED` picks the schedule (default 52); with
//! `SIDECAR_TEST_LOGS` naming a folder, every server's log is kept there (one file each), and a
//! call left unanswered is reported on stderr as it happens. Writes `eval/results/chaos.json`;
//! eval/CLUSTER.md discusses it.

mod common;
// The bench uses part of the tests' harness.
#[allow(dead_code)]
#[path = "../tests/integration/common/chaos.rs"]
mod chaos;
#[allow(dead_code)]
#[path = "../tests/integration/common/netns.rs"]
mod netns;

use std::path::{Path, PathBuf};
use std::time::Duration;

use netns::Net;
use serde_json::json;

const DOCUMENTS: usize = 2_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let net = match Net::new(8) {
        Ok(net) => net,
        Err(why) => {
            println!("chaos: skipped, network namespaces cannot be made here ({why})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(common::assets().join("minipile/train.jsonl")).unwrap();
    let input = dir.path().join("docs.jsonl");
    let lines: Vec<&str> = text.lines().take(DOCUMENTS).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let whole = dir.path().join("whole");
    common::build_index(&input, &whole, None);
    let shards: Vec<PathBuf> = (0..3).map(|k| dir.path().join(format!("s{k}"))).collect();
    for (k, s) in shards.iter().enumerate() {
        common::build_index(&input, s, Some((k, 3)));
    }
    let model = common::assets().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let setup = chaos::Setup {
        dir: dir.path(),
        whole: &whole,
        shards: &shards,
        model: &model,
        duration: Duration::from_secs(env_or("CHAOS_SECONDS", 600)),
        seed: env_or("CHAOS_SEED", 52),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let report = runtime.block_on(chaos::run(&net, &setup));
    for (kind, tally) in &report.calls {
        println!(
            "{kind:>12}: {:>6} calls, {:>6} equal, {:>4} partial (flagged), {:>4} unavailable naming the shard, {:?} failed otherwise, {} hung, {} wrong; {:.1}% failed",
            tally.calls,
            tally.equal,
            tally.partial_flagged,
            tally.unavailable_named,
            tally.failed,
            tally.hung,
            tally.wrong,
            100.0 * tally.failed_share()
        );
    }
    println!("   documents: {:?}", report.documents);
    println!(
        "{} faults in {:.0} s; {} wrong answers",
        report.schedule.len(),
        report.seconds,
        report.wrong_answers
    );
    let out = json!({
        "cpu": infini_sidecar::cpu::CpuInfo::detect().summary(),
        "documents_in_index": DOCUMENTS,
        "report": report,
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/results/chaos.json");
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap() + "\n").unwrap();
    println!("wrote {}", path.display());
}
