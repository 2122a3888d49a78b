#!/usr/bin/env python3
"""Fetch gigabytes of real text for the scale benchmarks: Debian source packages.

Debian's sources are code in many languages with their manuals, READMEs, RFC-style notes and
test data: the Pile's GitHub side, from a registry this machine reaches. The script

1. points a private apt state (under the cache, the system's apt untouched) at the system's own
   Debian mirrors with `deb-src` lines, and fetches the packages of `PACKAGES` in order with
   `apt-get source --download-only`, which checks every file against the signed Sources index;
2. reads each package's tarballs as a stream (nothing unpacked to disk) and keeps every regular
   file that is text: UTF-8, no NUL byte, at most `MAX_FILE_BYTES`; a file whose content was
   already kept (vendored copies, the same licence text) is dropped, so the corpus is deduplicated
   by exact content;
3. stops after the package that brings the kept text past `--target-bytes`, so the same list and
   the same target give the same corpus (package versions move with Debian's point releases: they
   are recorded in SOURCES.json beside the text with each .dsc's sha256).

Output, in $CACHE/debian-corpus (`$INFINI_SIDECAR_CACHE`, else ~/.cache/infini-sidecar):
  text/NN-PACKAGE.jsonl.gz   Pile-style JSON lines: {"text", "meta": {"pile_set_name": "debian-src",
                             "path": "PACKAGE/VERSION/member"}}, one a kept file
  SOURCES.json               versions, .dsc checksums, files and bytes kept and dropped, per package

A package whose text file exists is skipped, so a second run costs nothing. Standard library only.
"""
import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import time
import zlib

# In order: the largest bodies of code and documentation first, so the target is reached with few
# packages; every one a `main` source package of the system's release.
PACKAGES = [
    "linux", "gcc-12", "llvm-toolchain-15", "openjdk-17", "boost1.81", "golang-1.19",
    "qtbase-opensource-src", "gdb", "glibc", "rustc", "nodejs", "python3.11", "emacs",
    "postgresql-15", "mesa", "binutils", "qemu", "perl", "ruby3.1", "php8.2", "systemd", "ffmpeg",
    "git", "texlive-base",
]
MAX_FILE_BYTES = 2 << 20
DOMAIN = "debian-src"
# Largest member read: a kept file, or a nested tarball of sources.
NESTED_MAX_BYTES = 1 << 30
NESTED_TARBALL = re.compile(r"\.(tar|tar\.(xz|gz|bz2)|tgz)$")


def cache_dir():
    root = os.environ.get("INFINI_SIDECAR_CACHE", os.path.expanduser("~/.cache/infini-sidecar"))
    return os.path.join(root, "debian-corpus")


def apt_options(apt):
    """apt-get options for a private state under `apt`: its own source list, lists and cache."""
    return [
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::Etc::SourceParts={apt}/sources.list.d",
        "-o", f"Dir::State::Lists={apt}/lists",
        "-o", f"Dir::Cache={apt}/cache",
        "-o", "APT::Sandbox::User=root",
        "-qq",
    ]


def prepare_apt(apt):
    """The system's Debian sources as deb-src lines, and their indexes fetched."""
    for sub in ("sources.list.d", "lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(apt, sub), exist_ok=True)
    system = "/etc/apt/sources.list.d/debian.sources"
    with open(system) as f:
        deb = f.read()
    # The release's own suites: the security archive here serves binaries only.
    stanzas = [s for s in deb.split("\n\n") if s.strip() and "-security" not in s]
    src = re.sub(r"^Types:\s*deb\s*$", "Types: deb-src", "\n\n".join(stanzas), flags=re.M)
    with open(os.path.join(apt, "sources.list.d", "src.sources"), "w") as f:
        f.write(src)
    subprocess.run(["apt-get", *apt_options(apt), "update"], check=True)


def download(apt, package, into):
    """The package's source files into `into` (checked by apt against the signed index)."""
    os.makedirs(into, exist_ok=True)
    if not any(n.endswith(".dsc") for n in os.listdir(into)):
        subprocess.run(["apt-get", *apt_options(apt), "source", "--download-only", package],
                       cwd=into, check=True)
    dsc = next(n for n in sorted(os.listdir(into)) if n.endswith(".dsc"))
    with open(os.path.join(into, dsc), "rb") as f:
        body = f.read()
    version = re.search(rb"^Version:\s*(\S+)", body, re.M).group(1).decode()
    tarballs = sorted(n for n in os.listdir(into) if ".tar." in n and not n.endswith(".asc"))
    return version, hashlib.sha256(body).hexdigest(), tarballs


def text_of(data):
    """The file's text, or None when it is not text we keep."""
    if not data or len(data) > MAX_FILE_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def extract(package, version, folder, tarballs, seen, out_path):
    """Kept files of the package's tarballs as JSON lines; returns the counts."""
    kept = dropped_dup = dropped_binary = bytes_kept = 0
    partial = out_path + ".partial"
    with gzip.open(partial, "wt", encoding="utf-8", compresslevel=1) as out:
        def files(tar, prefix, nested):
            """(path, bytes) of the tar stream's regular files, tarballs one level down opened
            (gcc's sources ship as a tarball inside the package's); a damaged nested tarball
            (test data) gives what it holds up to the damage."""
            for member in tar:
                # Sizes are read from the header: a test tarball's sparse file of gigabytes is
                # never read.
                if not member.isfile() or member.size > NESTED_MAX_BYTES:
                    continue
                path = f"{prefix}/{member.name}"
                stream = tar.extractfile(member)
                if nested and NESTED_TARBALL.search(member.name):
                    try:
                        with tarfile.open(fileobj=stream, mode="r|*") as inner:
                            yield from files(inner, path, False)
                    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error):
                        pass
                else:
                    yield path, stream.read()

        for name in tarballs:
            with tarfile.open(os.path.join(folder, name), "r|*") as tar:
                for path, data in files(tar, f"{package}/{version}/{name}", True):
                    text = text_of(data)
                    if text is None:
                        dropped_binary += 1
                        continue
                    digest = hashlib.blake2b(data, digest_size=16).digest()
                    if digest in seen:
                        dropped_dup += 1
                        continue
                    seen.add(digest)
                    meta = {"pile_set_name": DOMAIN, "path": path}
                    out.write(json.dumps({"text": text, "meta": meta}, ensure_ascii=False) + "\n")
                    kept += 1
                    bytes_kept += len(data)
    os.replace(partial, out_path)
    return {"files_kept": kept, "bytes_kept": bytes_kept, "dropped_duplicate": dropped_dup,
            "dropped_not_text": dropped_binary}


def rehash(out_path, seen):
    """Marks the content of an already written package as seen, so later packages dedupe as on
    the first run."""
    with gzip.open(out_path, "rt", encoding="utf-8") as f:
        for line in f:
            data = json.loads(line)["text"].encode("utf-8")
            seen.add(hashlib.blake2b(data, digest_size=16).digest())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-bytes", type=float, default=4.3e9,
                        help="stop after the package that brings the kept text past this")
    args = parser.parse_args()
    root = cache_dir()
    apt, text = os.path.join(root, "apt"), os.path.join(root, "text")
    os.makedirs(text, exist_ok=True)
    prepare_apt(apt)
    seen, sources, total = set(), [], 0
    recorded = os.path.join(root, "SOURCES.json")
    old = {}
    if os.path.exists(recorded):
        with open(recorded) as f:
            old = {s["package"]: s for s in json.load(f)["packages"]}
    started = time.time()
    for n, package in enumerate(PACKAGES):
        if total >= args.target_bytes:
            break
        folder = os.path.join(root, "src", package)
        version, dsc_sha256, tarballs = download(apt, package, folder)
        out_path = os.path.join(text, f"{n:02d}-{package}.jsonl.gz")
        record = {"package": package, "version": version, "dsc_sha256": dsc_sha256,
                  "tarballs": tarballs, "text": os.path.relpath(out_path, root)}
        if os.path.exists(out_path) and package in old:
            rehash(out_path, seen)
            record.update({k: old[package][k] for k in old[package] if k not in record})
        else:
            record.update(extract(package, version, folder, tarballs, seen, out_path))
        total += record["bytes_kept"]
        sources.append(record)
        print(f"[{time.time() - started:6.0f} s] {package} {version}: {record['files_kept']} files, "
              f"{record['bytes_kept'] / 1e6:.0f} MB kept; {total / 1e9:.2f} GB in all",
              file=sys.stderr, flush=True)
        with open(recorded, "w") as f:
            json.dump({"domain": DOMAIN, "target_bytes": args.target_bytes, "bytes": total,
                       "max_file_bytes": MAX_FILE_BYTES, "packages": sources}, f, indent=1)
    if total < args.target_bytes:
        sys.exit(f"the package list holds {total / 1e9:.2f} GB of text, short of the target")
    print(os.path.join(root, "text"))


if __name__ == "__main__":
    main()
