//! Compaction, in a background thread (or when the owner asks: `LiveIndex::compact`): a tail
//! past the freeze size becomes a level-0 run; when `fanout` runs of one level are the newest, they
//! merge into one of the next level (so each token is rebuilt O(log_fanout(budget / freeze)) times
//! and a lookup visits that many runs per level); runs stop merging at a quarter of the budget,
//! and the newest runs of one level merge early when no further run of their size would fit, so
//! the biggest runs fill up to that size; and while the live index holds more than its budget,
//! every tail is frozen early and the oldest run of any namespace is dropped. Searches go on
//! throughout: a run is built beside what it replaces and swapped in under the namespace's lock,
//! and the run list is written before that lock is taken (only compaction changes runs, so what
//! it writes stays true). A namespace whose compaction fails is logged and skipped; the others
//! and eviction go on. Freezing a tail starts its journal's next generation; the older ones are
//! removed once the run is listed. A frozen tail whose build fails (a full disk) is never dropped: it stays in
//! memory, searchable, and is tried again later each time, while appends are refused
//! (`Inner::write_failure`). Eviction takes from the namespace that holds the most, so one tenant
//! cannot push out another's documents; empty namespaces are reclaimed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::journal;
use super::namespace::Namespace;
use super::run::{folder_name, Run, RunMeta};
use super::{Inner, Result};

/// Biggest run a merge makes, as a share of the budget: eviction drops at most this much at once
/// (or a run frozen from one tail, at most 4 × `freeze_tokens`). A lookup searches every run; at an
/// eighth the biggest runs stopped at the fan-out's power below it, a tenth of the budget or less
/// (`cargo bench --bench live`, 10 M tokens: 15–17 runs then, 5–6 now, plus up to `fanout − 1`
/// per lower level in general; eval/RESULTS.md).
const MAX_RUN_SHARE: u64 = 4;
/// Longest wait before a failed build of a frozen tail is tried again (the first is 250 ms,
/// doubling).
const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);

/// One round over every namespace: freeze, evict, merge, reclaim. With `flush`, every tail is
/// frozen whatever its size (a clean shutdown, or a live index over its budget); when the tails
/// hold more than their share of the budget, the biggest are frozen until they hold half of it.
/// Eviction comes before merging, so that a namespace's oldest run goes alone, not first merged
/// with newer runs that would then go with it.
pub(super) fn round(inner: &Inner, flush: bool) {
    let _alone = inner.compacting.lock().unwrap_or_else(|e| e.into_inner());
    let flush = flush || over_budget(inner);
    let namespaces = inner.namespaces();
    let early = match flush {
        true => Vec::new(),
        false => early_freezes(inner, &namespaces),
    };
    for ns in &namespaces {
        if inner.stop.load(Ordering::Relaxed) && !flush {
            return;
        }
        let now = flush || early.iter().any(|e| Arc::ptr_eq(e, ns));
        if let Err(e) = freeze(inner, ns, now) {
            tracing::error!(namespace = %ns.name, error = %e, "building a frozen live tail failed; it stays in memory and searchable, and is tried again");
        }
    }
    if let Err(e) = evict(inner) {
        tracing::error!(error = %e, "live eviction failed");
    }
    for ns in &namespaces {
        if let Err(e) = merge_all(inner, ns) {
            tracing::error!(namespace = %ns.name, error = %e, "live merge failed; its runs stay searchable and it is tried again");
        }
    }
    for ns in &namespaces {
        if let Err(e) = inner.reclaim(ns) {
            tracing::warn!(namespace = %ns.name, error = %e, "could not reclaim an empty live namespace");
        }
    }
}

/// The namespaces whose tails to freeze before they are full, biggest first: when the tails hold
/// more than their share of the budget, until what is left holds half of it; when an append was
/// refused for room, all of them (that append may need all the room there is).
fn early_freezes(inner: &Inner, namespaces: &[Arc<Namespace>]) -> Vec<Arc<Namespace>> {
    let cap = inner.pending_cap();
    let mut pending = inner.pending.load(Ordering::Relaxed);
    let target = match inner.room_wanted.swap(false, Ordering::Relaxed) {
        true => 0,
        false if pending > cap => cap / 2,
        false => return Vec::new(),
    };
    let mut by_size: Vec<(u64, &Arc<Namespace>)> = namespaces
        .iter()
        .map(|ns| (ns.read().tail.tokens() as u64, ns))
        .filter(|(t, _)| *t > 0)
        .collect();
    by_size.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
    let mut chosen = Vec::new();
    for (tokens, ns) in by_size {
        if pending <= target {
            break;
        }
        pending = pending.saturating_sub(tokens);
        chosen.push(Arc::clone(ns));
    }
    chosen
}

/// Merges until nothing is left to merge, or the index is closing.
fn merge_all(inner: &Inner, ns: &Namespace) -> Result<()> {
    while !inner.stop.load(Ordering::Relaxed) {
        if !merge(inner, ns)? {
            break;
        }
    }
    Ok(())
}

/// Whether the index holds more than its budget, tails weighed at what they cost in memory.
fn over_budget(inner: &Inner) -> bool {
    let floor = inner.run_floor();
    let runs: u64 = inner
        .namespaces()
        .iter()
        .map(|ns| ns.read().run_cost(floor))
        .sum();
    runs + super::TAIL_WEIGHT * inner.pending.load(Ordering::Relaxed) > inner.config.budget_tokens
}

/// Builds the tail into a run once it reaches the freeze size (any size with `now`). The frozen
/// tail stays searchable until its run replaces it; a build that fails leaves it so, and it is
/// tried again after a wait that doubles with each failure (at a clean shutdown at once).
fn freeze(inner: &Inner, ns: &Namespace, now: bool) -> Result<()> {
    let due = {
        let state = ns.read();
        let waiting = state.retry_at.is_some_and(|t| Instant::now() < t)
            && !inner.stop.load(Ordering::Relaxed);
        (state.frozen.is_some() && !waiting)
            || (state.frozen.is_none()
                && !state.tail.is_empty()
                && (now || state.tail.tokens() as u64 >= inner.config.freeze_tokens))
    };
    if !due {
        return Ok(());
    }
    let (frozen, through, meta) = {
        let mut state = ns.write();
        if state.frozen.is_none() {
            let ids = (inner.recent.lock().unwrap_or_else(|e| e.into_inner())).of(&ns.name);
            state.freeze_tail(&ids);
        }
        let frozen = state.frozen.clone().unwrap_or_default();
        let through = state.frozen_through;
        (frozen, through, new_meta(inner, &mut state.next_run, 0))
    };
    let built = Run::build(
        &ns.dir,
        meta,
        &inner.vocab,
        frozen.documents().map(<[u32]>::to_vec),
    )
    .and_then(|run| {
        let run = Arc::new(run);
        let (mut runs, next_run) = {
            let state = ns.read();
            (state.runs.clone(), state.next_run)
        };
        runs.push(Arc::clone(&run));
        ns.write_list(&runs, next_run, through)?;
        Ok(run)
    });
    let mut state = ns.write();
    match built {
        Ok(run) => {
            state.frozen = None;
            state.journal_from = through;
            state.runs.push(run);
            (state.failures, state.retry_at) = (0, None);
            inner
                .pending
                .fetch_sub(frozen.tokens() as u64, Ordering::Relaxed);
            inner.wrote();
            drop(state);
            // Older generations are never read again (the list starts after them); a file left
            // by a failure here is removed at the next freeze.
            if let Err(e) = journal::remove_before(&ns.dir, through) {
                tracing::warn!(namespace = %ns.name, error = %e, "could not remove a live journal whose tail is in a run");
            }
            Ok(())
        }
        Err(e) => {
            state.failures += 1;
            let wait = Duration::from_millis(250)
                .saturating_mul(1 << state.failures.min(8))
                .min(MAX_RETRY_WAIT);
            state.retry_at = Some(Instant::now() + wait);
            inner.failed_to_write(&e);
            Err(e)
        }
    }
}

/// Merges the newest runs of one level: the most of them, up to `fanout`, that fit under the
/// biggest run size, when they are `fanout`, or when one more of their average size would not fit
/// (so the biggest runs fill up to that size instead of waiting for `fanout` that never fit).
/// Before that, the newest runs smaller than the run floor merge whatever their number (see
/// [`small_runs`]). Only the newest group is looked at: older groups left by the
/// eighth-of-the-budget rule before 2026-11-28 stay as they are until evicted. Returns whether it
/// merged.
fn merge(inner: &Inner, ns: &Namespace) -> Result<bool> {
    let (parts, meta) = {
        let state = ns.read();
        let Some((k, level)) =
            small_runs(inner, &state.runs).or_else(|| by_level(inner, &state.runs))
        else {
            return Ok(false);
        };
        let parts: Vec<Arc<Run>> = state.runs[state.runs.len() - k..].to_vec();
        drop(state);
        let mut meta = new_meta(inner, &mut ns.write().next_run, level);
        meta.oldest = parts.iter().map(|r| r.meta.oldest).min().unwrap_or(0);
        (parts, meta)
    };
    let docs = parts.iter().flat_map(|r| r.index().documents());
    let run = Arc::new(written(
        inner,
        Run::build(&ns.dir, meta, &inner.vocab, docs),
    )?);
    // Only compaction changes the runs, so the parts are still the newest ones.
    let (mut runs, next_run, journal_from) = {
        let state = ns.read();
        (state.runs.clone(), state.next_run, state.journal_from)
    };
    let n = runs.len();
    runs.splice(n - parts.len().., [run]);
    written(inner, ns.write_list(&runs, next_run, journal_from))?;
    ns.write().runs = runs;
    for part in parts {
        remove_run(ns, &part.meta);
    }
    Ok(true)
}

/// The newest runs below the run floor, when there are two or more: they merge into one of the
/// highest level among them, whatever their number. Each costs the floor against the budget and a
/// few partly used pages in memory however few its tokens, and a namespace that many small tails
/// were frozen from (a tenant among a thousand, its tail frozen early each time the tails were
/// full) would otherwise hold a run for each: a soak over 1,000 namespaces held 2,600 of them.
/// Merging them costs little (they are small) and keeps each namespace to one such run.
fn small_runs(inner: &Inner, runs: &[Arc<Run>]) -> Option<(usize, u32)> {
    let floor = inner.run_floor();
    let (count, level) = (runs.iter().rev())
        .take_while(|r| r.meta.tokens < floor)
        .fold((0, 0), |(n, level), r| (n + 1, level.max(r.meta.level)));
    (count >= 2).then_some((count, level))
}

/// How many of the newest runs merge by the fan-out rule (see [`merge`]), and the merged run's
/// level.
fn by_level(inner: &Inner, runs: &[Arc<Run>]) -> Option<(usize, u32)> {
    let fanout = inner.config.merge_fanout;
    let n = runs.len();
    let level = runs.last()?.meta.level;
    let same = (runs.iter().rev())
        .take(fanout)
        .take_while(|r| r.meta.level == level)
        .count();
    let cap = inner.config.budget_tokens / MAX_RUN_SHARE;
    let newest = |k: usize| -> u64 { runs[n - k..].iter().map(|r| r.meta.tokens).sum() };
    // The most of them that fit under the biggest run size.
    let k = (2..=same).rev().find(|&k| newest(k) <= cap)?;
    let tokens = newest(k);
    let full = tokens + tokens / k as u64 > cap;
    (k == fanout || full).then_some((k, level + 1))
}

/// Records a disk write's outcome for the appends (`Inner::write_failure`).
fn written<T>(inner: &Inner, outcome: Result<T>) -> Result<T> {
    match &outcome {
        Ok(_) => inner.wrote(),
        Err(e) => inner.failed_to_write(e),
    }
    outcome
}

/// Drops runs while the live index is over its budget (the round froze every tail first when it
/// was over, so what is held is in runs): the oldest run of the namespace that holds the most
/// tokens, so that what one tenant writes pushes out its own oldest documents, not another's.
fn evict(inner: &Inner) -> Result<()> {
    while over_budget(inner) {
        let largest = inner
            .namespaces()
            .into_iter()
            .filter_map(|ns| {
                let state = ns.read();
                let held = (!state.runs.is_empty()).then(|| state.run_cost(inner.run_floor()));
                drop(state);
                held.map(|held| (held, ns))
            })
            .max_by_key(|(held, ns)| (*held, std::cmp::Reverse(ns.name.clone())));
        let Some((_, ns)) = largest else {
            return Ok(());
        };
        let (runs, next_run, journal_from) = {
            let state = ns.read();
            (state.runs[1..].to_vec(), state.next_run, state.journal_from)
        };
        written(inner, ns.write_list(&runs, next_run, journal_from))?;
        let run = {
            let mut state = ns.write();
            state.runs.remove(0)
        };
        inner.stats.evicted_runs.fetch_add(1, Ordering::Relaxed);
        tracing::info!(namespace = %ns.name, run = %run.meta.name, tokens = run.meta.tokens, "evicted the oldest live run of the namespace that holds the most");
        remove_run(&ns, &run.meta);
    }
    Ok(())
}

fn new_meta(inner: &Inner, next_run: &mut u64, level: u32) -> RunMeta {
    let seq = *next_run;
    *next_run += 1;
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
