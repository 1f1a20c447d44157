"""Ray's public names, read from an installed Ray's source (no import of
Ray: its frameworks need not be installed), and nestor's table of them.

    python python/checks/ray_api.py RAY_PACKAGE_DIR --write   # rewrites nestor/_ray_api.json
    python python/checks/ray_api.py RAY_PACKAGE_DIR --check   # nestor answers every name (the test)

A module's public names are its ``__all__`` (``extend`` and ``+=`` included,
also inside ``if`` blocks), the classes and functions it defines under
Ray's ``@PublicAPI``, ``@DeveloperAPI`` or ``@Deprecated``, and, in the
integration modules (``ray.air.integrations.*``, ``ray.tune.integration.*``),
every public class and function they define. The modules are those of
``ray.tune``, ``ray.train`` and ``ray.air``, and the parts of ``ray.data``
a training script uses; never a private, test, example or implementation
package.

``--check`` imports ``nestor.<path>`` for every Ray module ``ray.<path>`` and
reads every name from it: each must be nestor's own object, or a stand-in
whose use raises an error naming ``ray.<path>.<name>``. It prints one JSON
line ``RAY_API {"modules": .., "names": .., "implemented": .., "refused": ..,
"problems": [..], "refused_names": [..]}``.
"""

import ast
import json
import os
import sys
from typing import Dict, List, Set

#: Packages never walked (any path component).
SKIP = {"tests", "examples", "impl", "execution", "internal", "benchmarks", "llm", "_internal"}
#: The parts of ray.data a training script uses.
DATA = ("ray.data", "ray.data.preprocessors", "ray.data.preprocessor", "ray.data.context", "ray.data.iterator",
        "ray.data.dataset", "ray.data.aggregate", "ray.data.read_api", "ray.data.grouped_data")
#: Of ray.train.v2, the frameworks' public packages only (the rest is Ray's implementation).
V2_PUBLIC = ("ray.train.v2.jax",)
DECORATORS = {"PublicAPI", "DeveloperAPI", "Deprecated"}
INTEGRATIONS = ("ray.air.integrations.", "ray.tune.integration.")


def _wanted(module: str) -> bool:
    parts = module.split(".")
    if any(p.startswith("_") or p in SKIP for p in parts):
        return False
    if module.startswith("ray.train.v2"):
        return any(module == p or module.startswith(p + ".") for p in V2_PUBLIC)
    if module.startswith("ray.data"):
        return any(module == p or module.startswith(p + ".") for p in DATA if p != "ray.data") or module == "ray.data"
    return True


def _all_names(tree: ast.Module) -> Set[str]:
    names: Set[str] = set()

    def literal(node: ast.AST) -> List[str]:
        try:
            value = ast.literal_eval(node)
        except (ValueError, SyntaxError):
            return []
        return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []

    def visit(body: List[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names.update(literal(node.value))
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
                names.update(literal(node.value))
            elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                  and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "__all__"):
                if node.value.func.attr == "extend" and node.value.args:
                    names.update(literal(node.value.args[0]))
                elif node.value.func.attr == "append" and node.value.args:
                    names.update(literal(ast.List(elts=[node.value.args[0]], ctx=ast.Load())))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return names


def _decorated(tree: ast.Module, everything: bool) -> Set[str]:
    names: Set[str] = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        if everything:
            names.add(node.name)
            continue
        for d in node.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            if (d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else "") in DECORATORS:
                names.add(node.name)
    return names


def walk(ray_dir: str) -> Dict[str, List[str]]:
    """Ray's public names by module, from the package directory ``ray_dir``."""
    out: Dict[str, List[str]] = {}
    base = os.path.dirname(os.path.abspath(ray_dir))
    for root in ("tune", "train", "air", "data"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ray_dir, root)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("_") and d not in SKIP)
            for f in sorted(filenames):
                if not f.endswith(".py") or (f.startswith("_") and f != "__init__.py"):
                    continue
                path = os.path.join(dirpath, f)
                module = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                module = module[: -len(".__init__")] if module.endswith(".__init__") else module
                if not _wanted(module):
                    continue
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read(), path)
                names = _all_names(tree) | _decorated(tree, module.startswith(INTEGRATIONS))
                names = {n for n in names if not n.startswith("_")}
                if names:
                    out[module] = sorted(names)
    return out


def check(surface: Dict[str, List[str]]) -> Dict[str, object]:
    """Reads every name from nestor; what it found."""
    import importlib

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if here not in sys.path:
        sys.path.insert(0, here)
    from nestor._ray_api import Refused

    # Reading every name imports every framework nestor wraps into this one
    # process. TensorFlow before Lightning aborts it (two copies of LLVM
    # register the same options), so the frameworks come in an order that
    # loads; a framework that is not installed is left to its names' refusal.
    for framework in ("torch", "lightning", "transformers", "tensorflow"):
        try:
            importlib.import_module(framework)
        except Exception:  # any failure to import: its nestor module says so when asked
            pass

    implemented = refused = 0
    problems: List[str] = []
    refused_names: List[str] = []
    for module, names in sorted(surface.items()):
        target = "nestor" + module[len("ray"):]
        try:
            mod = importlib.import_module(target)
        except Exception as e:  # an import that fails is a problem to report, whatever it raised
            problems.append(f"import {target}: {type(e).__name__}: {e}")
            continue
        for name in names:
            full = f"{module}.{name}"
            try:
                value = getattr(mod, name)
            except Exception as e:
                problems.append(f"{full}: {type(e).__name__}: {e}")
                continue
            if isinstance(value, Refused):
                try:
                    value()
                except NotImplementedError as e:
                    if full not in str(e):
                        problems.append(f"{full}: refused without naming it: {e}")
                        continue
                else:
                    problems.append(f"{full}: a refused name that did not refuse when used")
                    continue
                refused += 1
                refused_names.append(full)
            else:
                implemented += 1
    return {"modules": len(surface), "names": sum(len(v) for v in surface.values()), "implemented": implemented,
            "refused": refused, "problems": problems, "refused_names": refused_names}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[2] not in ("--write", "--check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    surface = walk(sys.argv[1])
    table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nestor", "_ray_api.json")
    if sys.argv[2] == "--write":
        with open(table, "w", encoding="utf-8") as f:
            json.dump(surface, f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"{sum(len(v) for v in surface.values())} names of {len(surface)} modules written to {table}")
        return
    with open(table, encoding="utf-8") as f:
        known = json.load(f)
    report = check(surface)
    stale = sorted(set(surface) ^ set(known)) + sorted(
        f"{m}.{n}" for m in set(surface) & set(known) for n in set(surface[m]) ^ set(known[m]))
    if stale:
        report["problems"] = list(report["problems"]) + [f"nestor/_ray_api.json differs from this Ray at {s}" for s in stale[:20]]
    print("RAY_API " + json.dumps(report))


if __name__ == "__main__":
    main()
