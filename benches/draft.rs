//! The drafter's costs on the default index (`cargo bench --bench draft`; needs the assets of
//! `scripts/run-default.sh`): keeping a sequence's state as tokens are appended, and drafting from
//! each source, over real test-split text. Prints µs per appended token, per draft and per drafted
//! token.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use infini_sidecar::decoding::Sequence;
use infini_sidecar::draft::{DraftOptions, DraftSource};
use infini_sidecar::index::{Index, OpenOptions};
use infini_sidecar::server::config::ServeConfig;

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = ServeConfig::load(&repo.join("configs/default.toml")).unwrap();
    let index = Arc::new(Index::open(&config.index, &OpenOptions::default()).unwrap());
    let tokenizer = index.tokenizer().unwrap().clone();
    let assets = config.index.parent().unwrap().to_path_buf();
    let docs: Vec<Vec<u32>> = common::test_documents(&assets, &tokenizer, 600, 20)
        .into_iter()
        .map(|mut ids| {
            ids.truncate(600);
            ids
        })
        .collect();
    for source in [DraftSource::Index, DraftSource::Prompt, DraftSource::All] {
        for samples in [16, 64] {
            let opts = DraftOptions {
                source,
                index_samples: samples,
                ..DraftOptions::default()
            };
            let (mut append_s, mut draft_s, mut drafts, mut drafted, mut appended) =
                (0.0, 0.0, 0usize, 0usize, 0usize);
            for doc in &docs {
                let mut seq = Sequence::new(index.clone(), doc[..100].to_vec()).unwrap();
                for &t in &doc[100..] {
                    let started = Instant::now();
                    let draft = seq.draft(&opts).unwrap();
                    draft_s += started.elapsed().as_secs_f64();
                    drafts += 1;
                    drafted += draft.len();
                    let started = Instant::now();
                    seq.append(&[t]).unwrap();
                    append_s += started.elapsed().as_secs_f64();
                    appended += 1;
                }
            }
            println!(
                "{source:?}, {samples} samples: append {:.1} µs/token, draft {:.1} µs/draft, {:.2} tokens/draft, {:.1} µs/drafted token (draft only), {:.1} µs/drafted token (draft + append)",
                append_s * 1e6 / appended as f64,
                draft_s * 1e6 / drafts as f64,
                drafted as f64 / drafts as f64,
                draft_s * 1e6 / drafted.max(1) as f64,
                (draft_s + append_s) * 1e6 / drafted.max(1) as f64,
            );
        }
    }
}
