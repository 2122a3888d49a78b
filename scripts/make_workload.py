#!/usr/bin/env python3
"""Reproducible history-heavy workloads from the real assets, in three shapes (`--shape`):

- `agentic` (eval/workloads/agentic.jsonl): requests recur, with variations, over the same few dozen
  mini-Pile test documents: extract as JSON, summarise, answer about the document, rewrite its
  opening as a docstring; and follow-ups that quote an earlier request's answer.
- `code`: code editing. The files are the literal blocks of the mini-Pile's python-doc and linux-doc
  test documents (real Python and C); each request edits one (comments, a rename, a reformat, a
  fix), with the file as the session's reference, and follow-ups edit an earlier answer again. One
  namespace per repository (the file's domain).
- `chat`: multi-turn chat. Users of one app talk about passages of the mini-Pile's test text in
  conversations of up to five turns, interleaved; later turns carry every earlier answer and ask
  for it quoted, repeated or gathered. The app's users share its namespace (`--namespace`, default
  `chat`); `--namespace-per-user` isolates each user's.

An earlier answer is `{"answer_of": ID}` as an assistant message, filled in with what the model
generated for that request when the workload is replayed. One JSON object a line:

  {"id": "r007", "messages": [{"role": "user", "content": "..."}, ...],
   "max_new_tokens": 256, "namespace": "agent", "reference": "..."}   (reference optional)

`infini-sidecar eval workload` replays it in order. Usage:
  python3 scripts/make_workload.py --minipile ASSETS/minipile/test.jsonl --out eval/workloads/agentic.jsonl
  python3 scripts/make_workload.py --shape code --seed 5 --minipile ... --out eval/workloads/code.jsonl
"""

import argparse
import json
import random
import re

EXTRACT = [
    'Extract from the document below a JSON object with the keys "title", "topic", "entities" '
    '(a list of names) and "summary" (one sentence). Answer with the JSON only.',
    'Return a JSON object describing the document below, with the keys "title", "topic", '
    '"entities" (a list of names) and "summary" (one sentence). Output JSON only.',
]
SUMMARISE = [
    "Summarise the document below in three sentences.",
    "Write a three-sentence summary of the document below.",
]
ANSWER = [
    "Read the document below and answer: what is its main subject, and who is it written for?",
    "What is the document below mainly about, and who would read it? Answer briefly.",
]
DOCSTRING = [
    "Rewrite the opening of the document below as the docstring of a Python function named "
    "`describe`. Answer with the function only.",
]
FOLLOW_UPS = [
    'Add a key "keywords" with five keywords and return the whole JSON again.',
    "Now give the same JSON with the summary shortened to ten words.",
]


CODE_EDITS = [
    "Add a short comment above each group of lines in the code below saying what it does. "
    "Answer with the whole code only.",
    "Reformat the code below with consistent indentation and spacing, changing nothing else. "
    "Answer with the whole code only.",
    "Fix any mistake you find in the code below and return the whole corrected code.",
]
CODE_FOLLOW_UPS = [
    "Now add a comment at the top saying what the code is for, and return the whole code again.",
    "Keep those changes and also remove any blank lines. Return the whole code again.",
]
CHAT_OPENERS = [
    "What is this passage about? Answer in three sentences.",
    "Explain this passage to a student in a few sentences.",
    "Who or what is this passage about, and what happens in it?",
]
CHAT_TURNS = [
    "Quote the most important sentence of your last answer, then say why it matters.",
    "Repeat your first answer word for word, then add one more sentence.",
    "Put everything you have said so far into a short bulleted list.",
    "Rewrite your last answer in simpler words.",
]


def texts(path):
    """The mini-Pile test documents as (domain, text)."""
    with open(path, encoding="utf-8") as f:
        return [
            (d["meta"]["pile_set_name"], d["text"]) for d in (json.loads(line) for line in f)
        ]


def documents(path, count, rng):
    """`count` test documents of a workable length, their first 1,200 characters."""
    usable = [t for _, t in texts(path) if 800 <= len(t) <= 20000]
    rng.shuffle(usable)
    return [t[:1200].rsplit(" ", 1)[0] for t in usable[:count]]


def user(instruction, doc, label="Document"):
    return {"role": "user", "content": f"{instruction}\n\n{label}:\n{doc}"}


def agentic(args, rng):
    docs = documents(args.minipile, args.documents, rng)
    requests = []
    extracted = []  # (request id, document) of JSON extractions, for follow-ups
    for n in range(args.requests):
        rid = f"r{n:03d}"
        doc = rng.choice(docs)
        kind = rng.choices(
            ["extract", "summarise", "answer", "docstring", "follow_up"],
            weights=[4, 2, 2, 1, 2 if extracted else 0],
        )[0]
        request = {"id": rid, "max_new_tokens": args.max_new_tokens, "namespace": args.namespace}
        if kind == "follow_up":
            earlier, doc = rng.choice(extracted)
            request["messages"] = [
                user(EXTRACT[0], doc),
                {"role": "assistant", "answer_of": earlier},
                {"role": "user", "content": rng.choice(FOLLOW_UPS)},
            ]
        else:
            instruction = rng.choice(
                {"extract": EXTRACT, "summarise": SUMMARISE, "answer": ANSWER, "docstring": DOCSTRING}[kind]
            )
            request["messages"] = [user(instruction, doc)]
            if kind == "docstring":
                # The caller knows the answer will quote the document: a predicted output.
                request["reference"] = doc
            if kind == "extract":
                extracted.append((rid, doc))
        request["kind"] = kind
        requests.append(request)
    return requests, len(docs)


def literal_blocks(text):
    """The reStructuredText literal blocks (after a line ending in `::`) of `text`, dedented."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        if not lines[i].rstrip().endswith("::"):
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        k = j
        while k < len(lines) and (not lines[k].strip() or lines[k][:1] in " \t"):
            k += 1
        block = [line.rstrip() for line in lines[j:k]]
        while block and not block[-1]:
            block.pop()
        indent = min((len(b) - len(b.lstrip()) for b in block if b), default=0)
        blocks.append("\n".join(b[indent:] for b in block))
        i = k
    return blocks


def code_files(path, count, rng):
    """`count` literal blocks of 8 to 40 lines that hold code, as (repository, code)."""
    files = []
    for domain, text in texts(path):
        if domain not in ("python-doc", "linux-doc"):
            continue
        for block in literal_blocks(text):
            lines = [b for b in block.split("\n") if b.strip()]
            looks_like_code = sum(any(c in b for c in "=();{}") for b in lines) >= len(lines) // 2
            if 8 <= len(lines) <= 40 and len(block) <= 1500 and looks_like_code:
                files.append((domain.split("-")[0], block))
    rng.shuffle(files)
    return files[:count]


def code(args, rng):
    files = code_files(args.minipile, args.documents, rng)
    requests, edited = [], []  # edited: (request id, repository, file) of first edits
    for n in range(args.requests):
        rid = f"r{n:03d}"
        request = {"id": rid, "max_new_tokens": args.max_new_tokens}
        if edited and rng.random() < 0.3:
            earlier, repo, body = rng.choice(edited)
            instruction = rng.choice(CODE_EDITS)
            request["messages"] = [
                user(instruction, body, "Code"),
                {"role": "assistant", "answer_of": earlier},
                {"role": "user", "content": rng.choice(CODE_FOLLOW_UPS)},
            ]
            kind = "follow_up"
        else:
            repo, body = rng.choice(files)
            names = sorted(set(re.findall(r"\b[a-z_][a-z0-9_]{3,}\b", body)))
            if names and rng.random() < 0.3:
                old = rng.choice(names)
                instruction = (
                    f"Rename `{old}` to `{old}_v2` everywhere in the code below. "
                    "Answer with the whole code only."
                )
                kind = "rename"
            else:
                instruction = rng.choice(CODE_EDITS)
                kind = "edit"
            request["messages"] = [user(instruction, body, "Code")]
            edited.append((rid, repo, body))
        # The file being edited is the session's reference: the answer will quote it.
        request["reference"] = body
        request["namespace"] = f"repo-{repo}"
        request["kind"] = kind
        requests.append(request)
    return requests, len(files)


def passages(path, count, rng):
    """`count` passages of prose (Brown, Shakespeare, the documentation), about 600 characters."""
    usable = [t for _, t in texts(path) if len(t) >= 1500]
    rng.shuffle(usable)
    out = []
    for t in usable[:count]:
        start = rng.randrange(0, len(t) - 1200)
        piece = t[start : start + 700]
        out.append(piece.split(" ", 1)[1].rsplit(" ", 1)[0].strip())
    return out


def chat(args, rng):
    texts_ = passages(args.minipile, args.documents, rng)
    open_chats = []  # [namespace, messages so far]
    requests = []
    for n in range(args.requests):
        rid = f"r{n:03d}"
        if open_chats and (len(open_chats) >= args.users or rng.random() < 0.6):
            chat_ = rng.choice(open_chats)
            namespace, messages = chat_
            turn = len(messages) // 2 - 1  # 0 for the second user message
            messages = messages + [{"role": "user", "content": CHAT_TURNS[turn]}]
            kind = "follow_up"
        else:
            user_ = rng.randrange(args.users)
            namespace = f"user-{user_}" if args.namespace_per_user else args.namespace
            opener = rng.choice(CHAT_OPENERS)
            messages = [user(opener, rng.choice(texts_), "Passage")]
            chat_ = [namespace, messages]
            open_chats.append(chat_)
            kind = "opener"
        requests.append(
            {"id": rid, "max_new_tokens": args.max_new_tokens, "namespace": namespace,
             "messages": messages, "kind": kind}
        )
        # The next turn carries this answer.
        chat_[1] = messages + [{"role": "assistant", "answer_of": rid}]
        if len(chat_[1]) >= 2 * (1 + len(CHAT_TURNS)):
            open_chats.remove(chat_)
    return requests, len(texts_)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minipile", required=True, help="mini-Pile test.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=["agentic", "code", "chat"], default="agentic")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--documents", type=int, default=24, help="documents, files or passages")
    ap.add_argument("--users", type=int, default=6, help="chat: users (conversations open at once)")
    ap.add_argument("--namespace-per-user", action="store_true", help="chat: a namespace for each user")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--namespace", help="agentic and chat: the namespace (default: the shape's name)")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    args.namespace = args.namespace or {"agentic": "agent"}.get(args.shape, args.shape)
    requests, sources = {"agentic": agentic, "code": code, "chat": chat}[args.shape](args, rng)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(requests)} {args.shape} requests over {sources} sources -> {args.out}")


if __name__ == "__main__":
    main()
