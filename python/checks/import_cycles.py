"""Finds circles among the nestor package's modules: every import, at
module level or inside a function, is an edge from the importing module to
the one it names, and to the packages above that one (their __init__ runs
first) unless the importer is inside them. Prints each circle and exits 1
when there is one.

Usage: python3 python/checks/import_cycles.py [PACKAGE_DIR]
"""

import ast
import os
import sys


def modules(root: str) -> dict:
    """Module name -> file, for every .py below ``root`` (a package named after its directory)."""
    base = os.path.dirname(os.path.abspath(root))
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def edges(name: str, path: str, known: dict) -> set:
    """The nestor modules ``name`` imports."""
    is_package = path.endswith("__init__.py")
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{anchor}.{node.module}" if node.module else anchor
            else:
                mod = node.module or ""
            # `from pkg import sub` names the submodule when there is one.
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            if t not in known or t == name:
                continue
            out.add(t)
            # Importing `a.b.c` runs `a.b`'s __init__ first: an edge to every
            # package above it, unless the importer lives inside that package.
            parts = t.split(".")
            for i in range(1, len(parts)):
                above = ".".join(parts[:i])
                if above in known and not (name == above or name.startswith(above + ".")):
                    out.add(above)
    return out


def circles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "nestor")
    known = modules(root)
    graph = {name: edges(name, path, known) for name, path in known.items()}
    found = circles(graph)
    for comp in found:
        inner = {m: sorted(graph[m] & set(comp)) for m in comp}
        print("circle: " + "; ".join(f"{m} -> {', '.join(t)}" for m, t in inner.items()))
    print(f"{len(known)} modules, {sum(len(e) for e in graph.values())} imports, {len(found)} circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
