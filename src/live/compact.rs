//! Compaction, in a background thread: a tail past the freeze size becomes a level-0 run; when
//! `fanout` runs of one level are the newest, they merge into one of the next level (so each token is
//! rebuilt O(log_fanout(budget / freeze)) times and a lookup visits that many runs per level); runs
//! stop merging at an eighth of the budget; and while the live index holds more than its budget, the
//! oldest run of any namespace is dropped. Searches go on throughout: a run is built beside what it
//! replaces and swapped in under the namespace's lock.

use std::sync::Arc;

use super::namespace::{Namespace, State};
use super::run::{folder_name, Run, RunMeta};
use super::{Inner, Result};

/// Biggest run compaction makes, as a share of the budget: eviction drops at most this much at once.
const MAX_RUN_SHARE: u64 = 8;

/// One round over every namespace: freeze, merge, evict.
pub(super) fn round(inner: &Inner) -> Result<()> {
    let _alone = inner.compacting.lock().unwrap_or_else(|e| e.into_inner());
    for ns in inner.namespaces() {
        freeze(inner, &ns)?;
        while merge(inner, &ns)? {}
    }
    evict(inner)
}

/// Builds the tail into a run once it reaches the freeze size. The frozen tail stays searchable
/// until its run replaces it; a build that fails leaves it so and is tried again next round.
fn freeze(inner: &Inner, ns: &Namespace) -> Result<()> {
    let (frozen, meta) = {
        let mut state = ns.write();
        let frozen = match &state.frozen {
            Some(frozen) => frozen.clone(),
            None if state.tail.tokens() as u64 >= inner.config.freeze_tokens => {
                let frozen = Arc::new(std::mem::take(&mut state.tail));
                state.frozen = Some(frozen.clone());
                frozen
            }
            None => return Ok(()),
        };
        (frozen, new_meta(inner, &mut state, 0))
    };
    let docs = frozen.documents().map(<[u32]>::to_vec);
    let run = Run::build(&ns.dir, meta, &inner.vocab, docs)?;
    let mut state = ns.write();
    state.frozen = None;
    state.runs.push(Arc::new(run));
    ns.write_list(&state)
}

/// Merges the newest `fanout` runs when they are all of one level and the merge stays under the
/// biggest run size. Returns whether it merged.
fn merge(inner: &Inner, ns: &Namespace) -> Result<bool> {
    let fanout = inner.config.merge_fanout;
    let (parts, meta) = {
        let mut state = ns.write();
        let n = state.runs.len();
        if n < fanout {
            return Ok(false);
        }
        let parts: Vec<Arc<Run>> = state.runs[n - fanout..].to_vec();
        let level = parts[0].meta.level;
        let tokens: u64 = parts.iter().map(|r| r.meta.tokens).sum();
        if parts.iter().any(|r| r.meta.level != level)
            || tokens > inner.config.budget_tokens / MAX_RUN_SHARE
        {
            return Ok(false);
        }
        let mut meta = new_meta(inner, &mut state, level + 1);
        meta.oldest = parts.iter().map(|r| r.meta.oldest).min().unwrap_or(0);
        (parts, meta)
    };
    let docs = parts.iter().flat_map(|r| r.index().documents());
    let run = Run::build(&ns.dir, meta, &inner.vocab, docs)?;
    let mut state = ns.write();
    // Only compaction changes the runs, so the parts are still the newest `fanout`.
    let n = state.runs.len();
    state.runs.splice(n - fanout.., [Arc::new(run)]);
    ns.write_list(&state)?;
    drop(state);
    for part in parts {
        remove_run(ns, &part.meta);
    }
    Ok(true)
}

/// Drops the oldest runs while the live index is over its budget. With no run left to drop, the
/// biggest tail is emptied (its documents are the oldest still held somewhere).
fn evict(inner: &Inner) -> Result<()> {
    loop {
        let namespaces = inner.namespaces();
        let total: u64 = namespaces.iter().map(|ns| ns.read().tokens()).sum();
        if total <= inner.config.budget_tokens {
            return Ok(());
        }
        let oldest = namespaces
            .iter()
            .filter_map(|ns| ns.read().runs.first().map(|r| (r.meta.oldest, ns.clone())))
            .min_by_key(|(oldest, _)| *oldest);
        if let Some((_, ns)) = oldest {
            let mut state = ns.write();
            let run = state.runs.remove(0);
            ns.write_list(&state)?;
            drop(state);
            tracing::info!(namespace = %ns.name, run = %run.meta.name, tokens = run.meta.tokens, "evicted the oldest live run");
            remove_run(&ns, &run.meta);
            continue;
        }
        let biggest = namespaces.iter().max_by_key(|ns| ns.read().tail.tokens());
        match biggest {
            Some(ns) if !ns.read().tail.is_empty() => {
                let dropped = std::mem::take(&mut ns.write().tail);
                tracing::info!(namespace = %ns.name, tokens = dropped.tokens(), "evicted a live tail");
            }
            _ => return Ok(()),
        }
    }
}

fn new_meta(inner: &Inner, state: &mut State, level: u32) -> RunMeta {
    let seq = state.next_run;
    state.next_run += 1;
    RunMeta {
        name: folder_name(seq),
        level,
        documents: 0,
        tokens: 0,
        oldest: inner.next_freeze(),
    }
}

/// Deletes a run's folder once no list names it. Readers that still hold the run keep its memory
/// maps, which outlive the files.
fn remove_run(ns: &Namespace, meta: &RunMeta) {
    let path = ns.dir.join(&meta.name);
    if let Err(e) = std::fs::remove_dir_all(&path) {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a replaced live run; it is removed at the next open");
    }
}
