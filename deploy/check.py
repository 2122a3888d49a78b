#!/usr/bin/env python3
"""Checks the deployment files offline, as CI can (no cluster, no Docker daemon).

- Docker: every path the Dockerfile copies exists and survives .dockerignore, and every target
  Cargo.toml declares lies inside what is copied (cargo refuses a manifest with missing targets).
- Kubernetes: `kubectl kustomize` renders every overlay, and the objects fit together: selectors
  match pod labels, Service and probe ports are container ports, volumes and claims, ConfigMaps and
  Secrets exist, the configs the containers are started with are in their ConfigMap, the router's
  shard_service names the shards' headless Service and port and its replicas_per_shard is the
  layout's, and the shard count agrees in the
  StatefulSet (shards × replicas_per_shard, at least two a shard), the Indexed Job and the layout
  ConfigMap, whose budget lets no more pods down at once than leaves every shard a replica.

Writes each overlay's serve configs to OUT/<overlay>/ so the Rust test can load them with
ServeConfig::load. Exits 1 with one line per problem.
"""

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"
problems: list[str] = []


def problem(where: str, what: str) -> None:
    problems.append(f"{where}: {what}")


def check_docker() -> None:
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def kept(path: str) -> bool:
        keep = True
        for rule in ignore:
            negate = rule.startswith("!")
            pattern = rule[1:] if negate else rule
            pattern = pattern.rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                keep = negate
        return keep

    copied = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        for source in words[1:-1]:
            copied.append(source)
            if not (ROOT / source).exists():
                problem("Dockerfile", f"COPY {source}: no such path")
            elif not kept(source):
                problem("Dockerfile", f"COPY {source}: excluded by .dockerignore")
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    targets = [t.get("path") for kind in ("bin", "test", "bench") for t in manifest.get(kind, [])]
    targets += [f"benches/{b['name']}.rs" for b in manifest.get("bench", []) if "path" not in b]
    for path in filter(None, targets):
        if not any(path == c or path.startswith(c.rstrip("/") + "/") for c in copied):
            problem("Dockerfile", f"Cargo.toml declares {path}, which is not copied")


def render(overlay: Path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True
    )
    if out.returncode != 0:
        problem(overlay.name, f"kubectl kustomize failed: {out.stderr.strip()}")
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pod_spec(obj: dict) -> dict | None:
    if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
        return obj["spec"]["template"]["spec"]
    return None


def check_overlay(overlay: Path, out: Path) -> None:
    docs = render(overlay)
    where = overlay.name
    by_kind: dict[str, dict[str, dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    for kind in ("StatefulSet", "Deployment", "Job", "Service", "HorizontalPodAutoscaler"):
        if kind not in by_kind:
            problem(where, f"no {kind}")
    workloads = [d for d in docs if pod_spec(d) is not None]
    configmaps = by_kind.get("ConfigMap", {})
    secrets = by_kind.get("Secret", {})
    claims = by_kind.get("PersistentVolumeClaim", {})

    def labels(w: dict) -> dict:
        return w["spec"]["template"]["metadata"].get("labels", {})

    def selects(selector: dict, w: dict) -> bool:
        return all(labels(w).get(k) == v for k, v in selector.items())

    def ports(w: dict) -> dict:
        return {
            p.get("name"): p["containerPort"]
            for c in pod_spec(w)["containers"]
            for p in c.get("ports", [])
        }

    for name, svc in by_kind.get("Service", {}).items():
        targets = [w for w in workloads if selects(svc["spec"]["selector"], w)]
        if not targets:
            problem(where, f"Service {name} selects no workload")
        for w in targets:
            for p in svc["spec"]["ports"]:
                t = p.get("targetPort", p["port"])
                if t not in ports(w) and t not in ports(w).values():
                    problem(where, f"Service {name} port {t} is not a port of {w['metadata']['name']}")
    for w in workloads:
        wname = f"{w['kind']} {w['metadata']['name']}"
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        templates = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes and m["name"] not in templates:
                    problem(where, f"{wname}: mount {m['name']} has no volume")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    r = ref["configMapKeyRef"]
                    if r["key"] not in configmaps.get(r["name"], {}).get("data", {}):
                        problem(where, f"{wname}: env {e['name']} names a missing ConfigMap key")
                if "secretKeyRef" in ref:
                    r = ref["secretKeyRef"]
                    if r["key"] not in secrets.get(r["name"], {}).get("data", {}):
                        problem(where, f"{wname}: env {e['name']} names a missing Secret key")
            for probe in ("readinessProbe", "livenessProbe"):
                grpc = c.get(probe, {}).get("grpc")
                if grpc and grpc["port"] not in ports(w).values():
                    problem(where, f"{wname}: {probe} port {grpc['port']} is not a container port")
            args = c.get("args", [])
            if args[:2] == ["serve", "--config"]:
                config = Path(args[2])
                mount = next(
                    (m for m in c["volumeMounts"] if str(config).startswith(m["mountPath"] + "/")),
                    None,
                )
                cm = volumes.get(mount["name"], {}).get("configMap", {}).get("name") if mount else None
                text = configmaps.get(cm, {}).get("data", {}).get(config.name)
                if text is None:
                    problem(where, f"{wname}: {config} is in no mounted ConfigMap")
                else:
                    (out / config.name).write_text(text)
                    check_config(where, wname, tomllib.loads(text), by_kind, w)
        for v in volumes.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in claims:
                problem(where, f"{wname}: claim {claim} does not exist")
            cm = v.get("configMap", {}).get("name")
            if cm and cm not in configmaps:
                problem(where, f"{wname}: ConfigMap {cm} does not exist")
    for kind in ("PodDisruptionBudget",):
        for name, pdb in by_kind.get(kind, {}).items():
            sel = pdb["spec"]["selector"]["matchLabels"]
            if not any(selects(sel, w) for w in workloads):
                problem(where, f"PodDisruptionBudget {name} selects no workload")
    for name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        ref = hpa["spec"]["scaleTargetRef"]
        if ref["name"] not in by_kind.get(ref["kind"], {}):
            problem(where, f"HPA {name} scales a missing {ref['kind']} {ref['name']}")
    sts = by_kind.get("StatefulSet", {})
    jobs = by_kind.get("Job", {})
    layout = next((c for n, c in configmaps.items() if n.startswith("sidecar-layout")), None)
    shards = int(layout["data"]["shards"]) if layout else None
    per_shard = int(layout["data"].get("replicas_per_shard", 1)) if layout else None
    if per_shard is not None and per_shard < 2:
        problem(where, f"replicas_per_shard {per_shard}: a restart would take a shard away")
    for s in sts.values():
        if s["spec"]["serviceName"] not in by_kind.get("Service", {}):
            problem(where, f"StatefulSet {s['metadata']['name']}: no Service {s['spec']['serviceName']}")
        if shards is None or s["spec"]["replicas"] != shards * per_shard:
            problem(
                where,
                f"StatefulSet replicas {s['spec']['replicas']} != shards {shards} "
                f"× replicas_per_shard {per_shard}",
            )
        budgets = [
            (name, pdb["spec"])
            for name, pdb in by_kind.get("PodDisruptionBudget", {}).items()
            if selects(pdb["spec"]["selector"]["matchLabels"], s)
        ]
        if not budgets:
            problem(where, f"StatefulSet {s['metadata']['name']}: no PodDisruptionBudget")
        for name, spec in budgets:
            # Pods a budget lets go at once: maxUnavailable, or all but minAvailable.
            replicas = s["spec"]["replicas"]
            def pods(v: int | str) -> int:
                return -(-replicas * int(v[:-1]) // 100) if isinstance(v, str) else int(v)
            if "maxUnavailable" in spec:
                away = pods(spec["maxUnavailable"])
            else:
                away = replicas - pods(spec.get("minAvailable", 0))
            if per_shard is not None and away > per_shard - 1:
                problem(where, f"PodDisruptionBudget {name} may take every replica of a shard")
    for j in jobs.values():
        if j["spec"].get("completionMode") != "Indexed":
            problem(where, f"Job {j['metadata']['name']} is not Indexed")
        if j["spec"]["completions"] != shards:
            problem(where, f"Job completions {j['spec']['completions']} != shards {shards}")


def check_config(where: str, wname: str, config: dict, by_kind: dict, workload: dict) -> None:
    cluster = config.get("cluster", {})
    if cluster.get("role") != "router":
        return
    service = cluster.get("shard_service", "")
    host, _, port = service.rpartition(":")
    svc = by_kind.get("Service", {}).get(host.split(".")[0])
    if svc is None:
        problem(where, f"{wname}: shard_service {service} names no Service")
        return
    if svc["spec"].get("clusterIP") != "None":
        problem(where, f"{wname}: shard_service {host} is not headless (the router balances itself)")
    if int(port) not in [p["port"] for p in svc["spec"]["ports"]]:
        problem(where, f"{wname}: shard_service port {port} is not a port of Service {host}")
    configmaps = by_kind.get("ConfigMap", {})
    layout = next((c for n, c in configmaps.items() if n.startswith("sidecar-layout")), None)
    want = int(layout["data"].get("replicas_per_shard", 1)) if layout else None
    if want is not None and cluster.get("replicas_per_shard", 0) != want:
        problem(
            where,
            f"{wname}: cluster.replicas_per_shard {cluster.get('replicas_per_shard', 0)} is not "
            f"the layout's {want} (live appends would be acknowledged without a restarting replica)",
        )


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    check_docker()
    rendered = []
    for overlay in sorted(p for p in OVERLAYS.iterdir() if p.is_dir()):
        target = (out or Path("/tmp")) / overlay.name
        target.mkdir(parents=True, exist_ok=True)
        check_overlay(overlay, target)
        rendered.append(overlay.name)
    print(json.dumps({"overlays": rendered, "problems": problems}))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
