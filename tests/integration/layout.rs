//! The house's layout rules (issue 50), checked on the tree as it is: no file-level import circle in
//! `src/` (`scripts/import_circles.py`, itself shown to find one in a small tree that has it), and a
//! server whose `mod.rs` only declares and wires (at most 300 lines).

use std::path::Path;
use std::process::Command;

fn circles(root: &Path) -> (bool, String) {
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/import_circles.py"))
        .arg(root)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
    )
}

#[test]
fn the_scan_finds_a_circle_where_there_is_one() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::create_dir(root.join("index")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(root.join(path), text).unwrap();
    write("lib.rs", "pub mod index;\npub mod tokenizer;\n");
    write("index/mod.rs", "pub mod shard;\npub mod table;\n");
    // shard → table → shard, through a braced `use` and a path in an expression; the tokenizer
    // only mentions the index in a comment and a test module.
    write(
        "index/shard.rs",
        "use crate::index::{table::Table, IndexError};\npub struct Shard;\n",
    );
    write(
        "index/table.rs",
        "pub struct Table;\nfn f() { crate::index::shard::Shard; }\n",
    );
    write(
        "tokenizer.rs",
        "//! See [`crate::index::shard`].\n#[cfg(test)]\nmod tests {\n    use crate::index::shard::Shard;\n}\n",
    );
    let (ok, said) = circles(root);
    assert!(!ok, "{said}");
    let shard = root.join("index/shard.rs");
    let table = root.join("index/table.rs");
    assert!(
        said.contains(&format!(
            "import circle of 2 files: {} {}",
            shard.display(),
            table.display()
        )),
        "{said}"
    );
    assert!(!said.contains("tokenizer"), "{said}");

    // Taking the path out of the table's code breaks the circle.
    write("index/table.rs", "pub struct Table;\n");
    assert!(circles(root).0);
}

#[test]
fn src_has_no_import_circle_and_a_small_server_mod() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (ok, said) = circles(&src);
    assert!(ok, "{said}");
    let server = std::fs::read_to_string(src.join("server/mod.rs")).unwrap();
    assert!(
        server.lines().count() <= 300,
        "server/mod.rs has {} lines",
        server.lines().count()
    );
}
