#!/usr/bin/env python3
"""Finds file-level import circles in a Rust source tree (default: src/).

A file imports another when its code (comments and test modules aside) names a path into it:
`use crate::a::b::Item`, `super::x`, `self::y` or `crate::a::b::f(...)` in an expression. A path
is resolved to the deepest file that holds it, so `crate::index::Index` is `index/mod.rs` (a
folder's mod.rs re-exporting a child is the folder's face, not an import). Prints each circle and
exits 1 when there is one; exits 0 and says so when there is none.
"""

import os
import re
import sys


def module_path(root, path):
    parts = os.path.relpath(path, root)[: -len(".rs")].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def expand(use):
    """The paths of one `use` tree: `a::{b, c::{d}}` gives a::b and a::c::d."""
    use = use.strip()
    brace = use.find("{")
    if brace < 0:
        return [use]
    prefix, body = use[:brace], use[brace + 1 : use.rfind("}")]
    items, depth, current = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [prefix + p for item in items if item.strip() for p in expand(item.strip())]


def imports(root):
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    files[path] = f.read()
    by_module = {module_path(root, p): p for p in files}

    def resolve(parts):
        for n in range(len(parts), 0, -1):
            if tuple(parts[:n]) in by_module:
                return by_module[tuple(parts[:n])]
        return None

    graph = {p: set() for p in files}
    for path, text in files.items():
        me = list(module_path(root, path))
        text = re.split(r"#\[cfg\(test\)\]\s*mod \w+", text)[0]
        text = re.sub(r"//[^\n]*", "", text)
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text, re.S):
            paths += expand(m.group(1))
        paths += [m.group(0) for m in re.finditer(r"\bcrate::(?:\w+::)*\w+", text)]
        for p in paths:
            parts = re.sub(r"\s+as\s+\w+$", "", p.strip()).split("::")
            if parts[0] == "crate":
                parts = parts[1:]
            elif parts[0] in ("super", "self"):
                base = me[:]
                while parts and parts[0] in ("super", "self"):
                    if parts[0] == "super":
                        base = base[:-1]
                    parts = parts[1:]
                parts = base + parts
            else:
                continue
            target = resolve(parts)
            if target and target != path:
                graph[path].add(target)
    return graph


def circles(graph):
    """Strongly connected components of more than one file (Tarjan, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    found = circles(imports(root))
    for component in found:
        print(f"import circle of {len(component)} files: {' '.join(component)}")
    if found:
        return 1
    print(f"{root}: no file-level import circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
