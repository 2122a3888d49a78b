"""The text the standalone tables score (eval/run_standalone.sh, eval/run_scale.sh): Shakespeare's
mini-Pile splits (the test works cut to 20,000 bytes each) and samples of the mini-Pile test and
validation splits (the first 6 documents of each domain with at least 500 bytes, cut to 3,000 bytes),
so every model scores exactly the same text.

    python3 eval/cut_samples.py MINIPILE_DIR WORK_DIR
"""
import collections, json, sys
src, work = sys.argv[1], sys.argv[2]
def cut(text, n):
    return text.encode()[:n].decode("utf-8", "ignore")
for split in ["train", "validation", "test"]:
    with open(f"{work}/shakespeare-{split}.jsonl", "w") as out:
        for line in open(f"{src}/{split}.jsonl"):
            d = json.loads(line)
            if d["meta"]["pile_set_name"] == "shakespeare":
                if split == "test":
                    d["text"] = cut(d["text"], 20000)
                out.write(json.dumps(d) + "\n")
for split in ["test", "validation"]:
    seen = collections.Counter()
    with open(f"{work}/minipile-{split}-sample.jsonl", "w") as out:
        for line in open(f"{src}/{split}.jsonl"):
            d = json.loads(line)
            domain = d["meta"]["pile_set_name"]
            if seen[domain] < 6 and len(d["text"].encode()) >= 500:
                d["text"] = cut(d["text"], 3000)
                out.write(json.dumps(d) + "\n")
                seen[domain] += 1
