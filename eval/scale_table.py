#!/usr/bin/env python3
"""The table of eval/run_scale.sh: each build's text per CPU second (per core), wall time, peak
memory per text byte and size per text byte, from its /usr/bin/time record and the indexes'
folders; then the warm and cold query latencies of the two benchmark runs.

usage: scale_table.py RESULTS_DIR (eval/results/scale)
"""
import json
import os
import re
import sys


def time_record(path):
    """CPU seconds, wall seconds and peak resident bytes from `/usr/bin/time -v`."""
    text = open(path).read()
    field = lambda name: re.search(re.escape(name) + r":\s*(\S+)", text).group(1)
    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    seconds = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall)))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return cpu, seconds, int(field("Maximum resident set size (kbytes)")) * 1024


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main():
    out = sys.argv[1]
    warm = json.load(open(os.path.join(os.path.dirname(out.rstrip("/")), "compressed-scale-warm.json")))
    cold = json.load(open(os.path.join(os.path.dirname(out.rstrip("/")), "compressed-scale-cold.json")))
    text_bytes = warm["text_tokens"]
    scale = os.environ.get("SCALE", os.path.expanduser("~/.cache/infini-sidecar/scale"))
    print(f"CPU: {warm['cpu']}; {text_bytes / 1e9:.2f} GB of text, {warm['documents']:,} documents\n")
    print("| build | CPU s | text per CPU second | wall s | peak memory per text byte | size per text byte |")
    print("|---|---|---|---|---|---|")
    rows = [("suffix array (index build)", "build-sa", "sa"),
            ("compress the suffix array (index compress)", "build-compress", "fm-compress"),
            ("compressed directly (index build --compressed)", "build-direct", "fm")]
    cpu_of = {}
    for name, record, folder in rows:
        if not os.path.exists(os.path.join(out, record + ".time")):
            print(f"| {name} | not run | | | | |")
            continue
        cpu, wall, peak = time_record(os.path.join(out, record + ".time"))
        cpu_of[record] = cpu
        size = folder_bytes(os.path.join(scale, folder))
        print(f"| {name} | {cpu:.0f} | {text_bytes / cpu / 1e6:.2f} MB/s | {wall:.0f} | "
              f"{peak / text_bytes:.2f} | {size / text_bytes:.3f} |")
    if "build-compress" in cpu_of:
        route = cpu_of["build-sa"] + cpu_of["build-compress"]
        print(f"| suffix-array route (both) | {route:.0f} | {text_bytes / route / 1e6:.2f} MB/s | | | |")
        print(f"\ndirect build: {route / cpu_of['build-direct']:.2f}x the suffix-array route's text per CPU second\n")
    else:
        print(f"\ndirect build: {cpu_of['build-sa'] / cpu_of['build-direct']:.2f}x the suffix-array build's "
              "text per CPU second, before its compression\n")
    print("| query | suffix array warm µs | compressed warm µs | ratio | suffix array cold µs | compressed cold µs |")
    print("|---|---|---|---|---|---|")
    for w, c in zip(warm["latency_us"], cold["latency_us"]):
        print(f"| {w['query']} | {w['suffix_array']:.1f} | {w['compressed']:.1f} | "
              f"{w['compressed'] / w['suffix_array']:.2f}x | {c['suffix_array']:.1f} | {c['compressed']:.1f} |")
    print(f"| locate, µs a place | | {warm['locate_us_per_place']:.1f} | | | {cold['locate_us_per_place']:.1f} |")
    print(f"\nopen (cold): suffix array {cold['open_seconds']['suffix_array']:.2f} s, "
          f"compressed {cold['open_seconds']['compressed']:.2f} s")


if __name__ == "__main__":
    main()
