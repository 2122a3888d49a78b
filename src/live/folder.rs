//! What in a data folder is the live index's own. The live index deletes and moves folders (runs it
//! replaced, namespaces it reclaims or sets aside), so it must never mistake someone else's folder
//! for one of its own: a data folder is adopted only when it is empty or carries the live index's
//! marker file (with its format version), and a folder inside it is a namespace only when it carries
//! a namespace's marker. Anything else is a refusal at start that names what was found.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{LiveError, Result};

/// The data folder's marker.
pub(super) const ROOT_MARKER: &str = "live-index.json";
/// A namespace folder's marker.
pub(super) const NAMESPACE_MARKER: &str = "namespace.json";
/// The data folder's lock file (never a namespace name).
pub(crate) const LOCK_FILE: &str = "LOCK";
/// Prefix of what the live index set aside (namespaces and runs it could not open): kept for a
/// person to look at, never read or deleted.
pub(super) const SET_ASIDE_PREFIX: &str = ".bad-";

const FORMAT: &str = "infini-sidecar live index";
/// 2: marker files (2026-11-29). Folders of version 1 (a `LOCK` file and namespace folders holding
/// only `runs.json` and runs) are recognised and marked.
const VERSION: u32 = 2;

/// What a fresh file system may put in a folder that is otherwise empty.
const FILE_SYSTEM_ENTRIES: &[&str] = &["lost+found"];

#[derive(Serialize, Deserialize)]
struct Marker {
    format: String,
    version: u32,
}

/// Adopts `root` as a live data folder: creates it if missing, marks it if empty (or of version
/// 1), checks its marker otherwise; refuses anything else, naming it.
pub(super) fn adopt_root(root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).map_err(|e| LiveError::io(root, e))?;
    let marker = root.join(ROOT_MARKER);
    if marker.exists() {
        return check_marker(&marker);
    }
    let entries = entries(root)?;
    if holds_nothing_but_begun(&entries, ROOT_MARKER) {
        return write_marker(&marker);
    }
    if let Some(namespaces) = version_1_namespaces(root, &entries) {
        for ns in &namespaces {
            write_marker(&root.join(ns).join(NAMESPACE_MARKER))?;
        }
        tracing::info!(root = %root.display(), namespaces = namespaces.len(), "marked a live data folder of the previous format");
        return write_marker(&marker);
    }
    Err(LiveError::Invalid(format!(
        "[live] data_dir {}: the folder holds {:?} and is not a live data folder (no {ROOT_MARKER}); \
         the live index only takes an empty folder or one it made, so that it never deletes or moves \
         what is not its own. Name an empty or new folder",
        root.display(),
        entries[0]
    )))
}

/// Marks a namespace folder just created.
pub(super) fn mark_namespace(dir: &Path) -> Result<()> {
    write_marker(&dir.join(NAMESPACE_MARKER))
}

/// Whether `dir` is a namespace folder of ours: it carries a readable marker of this format.
pub(super) fn is_namespace(dir: &Path) -> Result<bool> {
    let marker = dir.join(NAMESPACE_MARKER);
    if !marker.exists() {
        return Ok(false);
    }
    check_marker(&marker).map(|()| true)
}

/// The entries of `dir` but those a file system makes itself, by name.
pub(super) fn entries(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LiveError::io(dir, e))? {
        let name = entry
            .map_err(|e| LiveError::io(dir, e))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if !FILE_SYSTEM_ENTRIES.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn check_marker(path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| LiveError::io(path, e))?;
    let marker: Marker = serde_json::from_str(&text)
        .map_err(|e| LiveError::Corrupt(format!("{}: {e}", path.display())))?;
    if marker.format != FORMAT {
        return Err(LiveError::Invalid(format!(
            "{}: a marker of {:?}, not of the live index",
            path.display(),
            marker.format
        )));
    }
    if marker.version > VERSION {
        return Err(LiveError::Invalid(format!(
            "{}: written by a newer build (format {}; this build reads up to {VERSION})",
            path.display(),
            marker.version
        )));
    }
    Ok(())
}

/// Where a marker is written before it is moved into place.
fn partial_marker(marker: &Path) -> std::path::PathBuf {
    let mut name = marker.as_os_str().to_owned();
    name.push(".partial");
    name.into()
}

/// Writes a marker whole or not at all (a kill or a full disk mid-write leaves only its partial
/// file, never a marker that cannot be read), and durably.
fn write_marker(path: &Path) -> Result<()> {
    let marker = Marker {
        format: FORMAT.into(),
        version: VERSION,
    };
    let json = serde_json::to_vec_pretty(&marker).map_err(|e| LiveError::Invalid(e.to_string()))?;
    write_whole(path, &partial_marker(path), &json)
}

/// Writes `bytes` to `path` whole or not at all, durably: to `temp` first, synced, renamed over
/// `path`, and the folder synced (a kill leaves the old file or `temp`, never half of either).
pub(super) fn write_whole(path: &Path, temp: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e| LiveError::io(temp, e);
    let mut file = std::fs::File::create(temp).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(temp, path).map_err(|e| LiveError::io(path, e))?;
    sync_entries(path.parent().unwrap_or(Path::new(".")))
}

/// Makes the entries of folder `dir` durable: a file made, renamed or removed in it survives a
/// power cut once this returns.
pub(super) fn sync_entries(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LiveError::io(dir, e))
}

/// Whether `entries` of a folder are nothing, or only the partial file of `marker` (named in
/// the folder): what a kill before the marker was in place leaves.
fn holds_nothing_but_begun(entries: &[String], marker: &str) -> bool {
    let partial = format!("{marker}.partial");
    entries.iter().all(|e| *e == partial)
}

/// Removes `dir` if it is a namespace folder a kill or a failed write left before its marker
/// was in place (empty, or holding only the marker's partial file); says whether it did.
pub(super) fn remove_if_begun(dir: &Path) -> Result<bool> {
    let entries = entries(dir)?;
    if !holds_nothing_but_begun(&entries, NAMESPACE_MARKER) {
        return Ok(false);
    }
    for name in &entries {
        let path = dir.join(name);
        std::fs::remove_file(&path).map_err(|e| LiveError::io(&path, e))?;
    }
    std::fs::remove_dir(dir).map_err(|e| LiveError::io(dir, e))?;
    Ok(true)
}

/// The namespaces of a data folder of format 1, or `None` if `entries` are anything else: the
/// lock file, folders set aside, and folders that hold a run list and nothing but runs. A marking
/// a kill interrupted left some namespaces marked (or half) and the root's marker half written:
/// those are taken too, so the next start finishes the marking.
fn version_1_namespaces(root: &Path, entries: &[String]) -> Option<Vec<String>> {
    if !entries.iter().any(|e| e == LOCK_FILE) {
        return None;
    }
    let root_partial = format!("{ROOT_MARKER}.partial");
    let mut namespaces = Vec::new();
    for name in entries {
        let path = root.join(name);
        if name == LOCK_FILE
            || *name == root_partial
            || (name.starts_with(SET_ASIDE_PREFIX) && path.is_dir())
        {
            continue;
        }
        let inside = self::entries(&path).ok()?;
        let ours = path.is_dir()
            && inside.iter().any(|e| e == super::namespace::LIST_FILE)
            && inside.iter().all(|e| {
                e.starts_with(super::namespace::LIST_FILE)
                    || e.starts_with(NAMESPACE_MARKER)
                    || super::run::is_run_folder(e)
            });
        if !ours {
            return None;
        }
        namespaces.push(name.clone());
    }
    Some(namespaces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_adopted_empty_marked_or_of_the_first_format_and_refused_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        // New, and empty but for what a file system makes.
        adopt_root(&dir.path().join("new")).unwrap();
        assert!(dir.path().join("new").join(ROOT_MARKER).exists());
        std::fs::create_dir_all(dir.path().join("fresh/lost+found")).unwrap();
        adopt_root(&dir.path().join("fresh")).unwrap();
        adopt_root(&dir.path().join("fresh")).unwrap();
        // Its marker half written by a process killed then: taken as empty, the marker put in place.
        let killed = dir.path().join("killed");
        std::fs::create_dir_all(&killed).unwrap();
        std::fs::write(killed.join("live-index.json.partial"), "{\"for").unwrap();
        adopt_root(&killed).unwrap();
        assert_eq!(entries(&killed).unwrap(), [ROOT_MARKER]);
        // Someone's files: refused by name, nothing touched.
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join("projects/run-2024")).unwrap();
        let err = adopt_root(&home).unwrap_err().to_string();
        assert!(err.contains("\"projects\""), "{err}");
        assert!(home.join("projects/run-2024").exists());
        assert!(!home.join(ROOT_MARKER).exists());
        // A folder of the first format: its namespaces get their markers.
        let old = dir.path().join("old");
        std::fs::create_dir_all(old.join("team/run-00000001")).unwrap();
        std::fs::write(old.join("team/runs.json"), "{}").unwrap();
        std::fs::write(old.join(LOCK_FILE), "").unwrap();
        adopt_root(&old).unwrap();
        assert!(is_namespace(&old.join("team")).unwrap());
        // The same marking killed half way: one namespace marked, one half, the root's marker
        // half written. The next start finishes it.
        let killed = dir.path().join("killed-marking");
        for ns in ["done", "half", "not-yet"] {
            std::fs::create_dir_all(killed.join(ns).join("run-00000001")).unwrap();
            std::fs::write(killed.join(ns).join("runs.json"), "{}").unwrap();
        }
        std::fs::write(killed.join(LOCK_FILE), "").unwrap();
        write_marker(&killed.join("done").join(NAMESPACE_MARKER)).unwrap();
        std::fs::write(killed.join("half/namespace.json.partial"), "{\"for").unwrap();
        std::fs::write(killed.join("live-index.json.partial"), "{\"for").unwrap();
        adopt_root(&killed).unwrap();
        for ns in ["done", "half", "not-yet"] {
            assert!(is_namespace(&killed.join(ns)).unwrap(), "{ns}");
        }
        assert!(killed.join(ROOT_MARKER).exists());
        // The same with a stranger beside it is not of the first format.
        let mixed = dir.path().join("mixed");
        std::fs::create_dir_all(mixed.join("team/run-00000001")).unwrap();
        std::fs::write(mixed.join("team/runs.json"), "{}").unwrap();
        std::fs::write(mixed.join("team/notes.txt"), "mine").unwrap();
        std::fs::write(mixed.join(LOCK_FILE), "").unwrap();
        assert!(adopt_root(&mixed).is_err());
        // A marker of a newer format is refused.
        std::fs::write(
            old.join(ROOT_MARKER),
            r#"{"format": "infini-sidecar live index", "version": 99}"#,
        )
        .unwrap();
        assert!(adopt_root(&old).unwrap_err().to_string().contains("newer"));
    }
}
