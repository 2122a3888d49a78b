"""The documents of the Pile-style perplexity tasks: a local JSON-lines file ({"text": ..., "meta":
{"pile_set_name": ...}}), by default the mini-Pile test split of the project's assets. `--metadata`
may set `path` (another file) and `max_docs` (the first documents of each task only)."""
import json
import os
from pathlib import Path

import datasets


def default_path() -> Path:
    assets = os.environ.get("INFINI_SIDECAR_ASSETS") or Path.home() / ".cache/infini-sidecar/assets"
    return Path(assets) / "minipile/test.jsonl"


def load(path=None, domain=None, max_docs=None, **_):
    docs = []
    for line in open(path or default_path(), encoding="utf-8"):
        doc = json.loads(line)
        name = (doc.get("meta") or {}).get("pile_set_name", "")
        if domain is None or name == domain:
            docs.append({"text": doc["text"], "domain": name})
        if max_docs is not None and len(docs) >= int(max_docs):
            break
    return {"test": datasets.Dataset.from_list(docs)}
