//! The deployment files, checked offline: `deploy/check.py` renders every kustomize overlay with
//! the real `kubectl kustomize` and checks that the objects fit together and that the Docker build
//! context holds what the Dockerfile copies; the serve configs the pods start with must then load
//! as the binary loads them, each in the role its workload needs.

use std::process::Command;

use infini_sidecar::server::config::{Role, ServeConfig};

#[test]
fn manifests_render_and_their_configs_load_in_their_roles() {
    let out = tempfile::tempdir().unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let run = Command::new("python3")
        .arg(format!("{root}/deploy/check.py"))
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("python3 runs deploy/check.py (kubectl must be on PATH)");
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let overlays = report["overlays"].as_array().unwrap();
    assert!(overlays.len() >= 2, "{report}");
    for overlay in overlays {
        let dir = out.path().join(overlay.as_str().unwrap());
        let shard = ServeConfig::load(&dir.join("shard.toml")).unwrap();
        assert_eq!(shard.cluster.role, Role::Shard);
        assert!(shard.index.is_absolute());
        let router = ServeConfig::load(&dir.join("router.toml")).unwrap();
        assert_eq!(router.cluster.role, Role::Router);
        assert!(router.cluster.shard_service.is_some());
        assert_eq!(router.bind.port(), shard.bind.port());
    }
}
