#!/usr/bin/env python3
"""The crates' layers hold (issue #35): no import circles in any crate, and
in the runtime no import from a lower layer to a higher one.

`lock-runtime/src/lib.rs` declares the crate's modules bottom-up, one layer
after another; each module may use only the modules declared before it.
Inside a module made of several files (`backend/`), the files may use each
other but never in a circle. Tests (`#[cfg(test)]` and what follows it) are
not read (from the first `#[cfg(test)]` or `#[cfg(all(test, ...))]` on):
a test may reach anywhere.

Reads `crate::a::b` and `super::a` paths in `use` lines and in code.
Exits 1 with one line per problem, 0 with a one-line summary.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Each crate's source folder, and whether its root declares its modules
# bottom-up (then the order is checked too); the others are checked for
# circles alone.
CRATES = [
    ("lock-runtime/src", True),
    ("lock-macros/src", False),
    ("lockctl/src", False),
    ("bench/src", False),
    ("tests/src", False),
]


def code_of(path):
    """The file's text up to its tests, without comments."""
    text = path.read_text()
    cut = re.search(r"#\[cfg\((?:test|all\(test\b)", text)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"//[^\n]*", "", text)
    return text


def module_path(src, path):
    """`backend/redis/mod.rs` -> ['backend', 'redis']; `lib.rs` -> []."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def resolve(module, path_text):
    """The module path a `crate::`/`super::`/`self::` path starts in."""
    segments = [s for s in re.split(r"::", path_text) if s]
    if not segments:
        return None
    if segments[0] == "crate":
        return segments[1:]
    base = list(module)
    while segments and segments[0] in ("super", "self"):
        if segments[0] == "super":
            if not base:
                return None
            base = base[:-1]
        segments = segments[1:]
    return base + segments


def check(src, layered):
    """The problems of one crate, and a summary line."""
    # `src/bin/` holds programs of their own, each a crate root.
    files = {tuple(module_path(src, p)): p for p in src.rglob("*.rs") if "bin" not in p.relative_to(src).parts}
    root = src / "lib.rs" if (src / "lib.rs").exists() else src / "main.rs"
    order = re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_0-9]+)\s*;", root.read_text(), re.M)
    layer = {name: i for i, name in enumerate(order)} if layered else {}
    problems = []
    edges = {}
    for module, path in files.items():
        if not module:
            continue
        text = code_of(path)
        # `use a::{b, c::d}` groups are flattened to their first segment
        # after the prefix: a module dependency is all this check needs.
        refs = re.findall(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", text)
        grouped = re.findall(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}", text)
        for prefix, inner in grouped:
            for item in inner.split(","):
                item = item.strip().split(" ")[0]
                if item and item != "self":
                    refs.append(f"{prefix}::{item}")
        targets = set()
        for ref in refs:
            target = resolve(module, ref)
            if not target:
                continue
            # The longest prefix that is a file of the crate.
            for n in range(len(target), 0, -1):
                if tuple(target[:n]) in files:
                    if tuple(target[:n]) != module:
                        targets.add(tuple(target[:n]))
                    break
        edges[module] = targets
        for target in targets:
            top, target_top = module[0], target[0]
            if top != target_top and top in layer and target_top in layer:
                if layer[target_top] >= layer[top]:
                    problems.append(
                        f"{path.relative_to(ROOT)} (layer {layer[top]}, `{top}`) uses `{'::'.join(target)}` "
                        f"(layer {layer[target_top]}, `{target_top}`): only the modules lib.rs declares before it"
                    )
    # Circles among files (Tarjan's strongly connected components).
    index, low, stack, on_stack, circles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            # A file uses its parent module's file only through its own
            # path; a parent declaring a child is not a use.
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for component in circles:
        names = ", ".join(str(files[m].relative_to(ROOT)) for m in sorted(component))
        problems.append(f"import circle: {names}")
    arrows = sum(len(t) for t in edges.values())
    layers = f", {len(order)} layers in declared order" if layered else ""
    summary = f"{src.relative_to(ROOT)}: {len(files)} files, {arrows} imports between them{layers}"
    return problems, summary


def main():
    failed = False
    for folder, layered in CRATES:
        problems, summary = check(ROOT / folder, layered)
        for problem in problems:
            print(problem)
        failed |= bool(problems)
        print(f"{summary}: {len(problems)} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
