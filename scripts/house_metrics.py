#!/usr/bin/env python3
"""How readable the house is, counted from the source of a checkout (issues 43 and 56): the largest
modules, functions and classes, the modules over 500 lines and the functions over 60, the import
cycles among the package's modules (imports inside functions count), the options declared in more
than one place, how many modules have a test module of their own name, and how many package
imports sit inside functions. Reads files only; run it on two checkouts to compare.

It is also the house's gate (issue 68), run by ``make test``: it exits 1 at a module over 500
lines, a function over 60, an import cycle or an option declared twice, and warns (exit 0) from
400 lines and 50, so a module is split along a seam before the limit forces a cut.

    python scripts/house_metrics.py [CHECKOUT]   # default: this one
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 60
WARN_MODULE_LINES, WARN_FUNCTION_LINES = 400, 50
#: A declaration of an option: argparse's add_argument, or a catalogue row (options/flags.py's
#: Option, the sweep's Flag), with the flag's first name.
_DECLARED = re.compile(r"""(?:add_argument|\bOption|\bFlag)\(\s*\(?\s*["'](--[a-z0-9-]+)["']""")
#: The ways a module asks which workload it has (issue 68): the Workload's own flag, a generation's
#: parts tested for None, and the older helpers that looked for a language model or a column.
_ASKS_WORKLOAD = re.compile(r"\.generates\b|\b(?:gen|feed|generation|g) is (?:not )?None|is_language_model\(|"
                            r"\.language_model\b|is_generation\(")


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    out = {}
    for path in (root / "paretopipe").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The package's modules one import statement names (a name imported from a package may be a
    module of it)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if node.level:
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its body (functions included)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(name, path, node, modules):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def options_declared_twice(modules: dict[str, Path], root: Path) -> dict[str, list[str]]:
    """Each option whose flag is declared in more than one place, with where."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in modules.values():
        text = path.read_text()
        for m in _DECLARED.finditer(text):
            places[m.group(1)].append(f"{path.relative_to(root)}:{text[:m.start()].count(chr(10)) + 1}")
    return {flag: where for flag, where in sorted(places.items()) if len(where) > 1}


def main(root: Path) -> int:
    """Print the counts; 1 when a limit is broken (each named on a line starting "error:")."""
    modules = module_names(root)
    paths = sorted(modules.values())
    lines = {p: p.read_text().count("\n") for p in paths}
    print("largest modules:", ", ".join(f"{n} {p.relative_to(root)}" for p, n in
                                        sorted(lines.items(), key=lambda kv: -kv[1])[:10]))
    spans, classes, lazy = [], [], 0
    for p in paths:
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                span = (node.end_lineno - node.lineno + 1, f"{p.relative_to(root)}:{node.name}")
                (classes if isinstance(node, ast.ClassDef) else spans).append(span)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += sum(isinstance(s, ast.ImportFrom) and s.level > 0 for s in ast.walk(node))
    print("largest functions:", ", ".join(f"{n} {name}" for n, name in sorted(spans, reverse=True)[:10]))
    print("largest classes:", ", ".join(f"{n} {name}" for n, name in sorted(classes, reverse=True)[:5]))
    sized = [(n, str(p.relative_to(root))) for p, n in lines.items()]
    errors = _over(sized, MAX_MODULE_LINES, "modules", "lines") + _over(spans, MAX_FUNCTION_LINES, "functions", "lines")
    found = cycles(import_graph(modules), sorted(modules))
    print(f"import cycles (imports inside functions count): {len(found)}"
          + (f" ({'; '.join(' <-> '.join(c) for c in found)})" if found else ""))
    errors += [f"an import cycle: {' <-> '.join(c)}" for c in found]
    twice = options_declared_twice(modules, root)
    print(f"options declared in more than one place: {len(twice)}"
          + (f" ({'; '.join(f'{flag}: ' + ', '.join(where) for flag, where in twice.items())})" if twice else ""))
    errors += [f"option {flag} declared in {len(where)} places: {', '.join(where)}" for flag, where in twice.items()]
    source = "\n".join(p.read_text() for p in paths)
    print('"closed" spelled as a string:', len(re.findall(r"""["']closed["']""", source)))
    tested = {p.stem[len("test_"):] for p in (root / "tests").rglob("test_*.py")}
    named = [p for p in paths if p.stem not in ("__init__", "__main__")]
    own = [p for p in named if p.stem in tested]
    print(f"modules: {len(named)}, with a test module of their own name: {len(own)}")
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in named:
        by_name[p.name].append(f"{p.parent.relative_to(root)}/")
    shared = {n: where for n, where in sorted(by_name.items()) if len(where) > 1}
    print(f"file names several modules share: {len(shared)} ("
          + "; ".join(f"{n} in {', '.join(sorted(w))}" for n, w in shared.items())
          + "; each kept, with why, in tests/test_architecture.py SHARED_NAMES)")
    print("package imports inside functions:", lazy)
    print(workload_branches(paths, root))
    for warn, limit, what in ((WARN_MODULE_LINES, MAX_MODULE_LINES, "module"), (WARN_FUNCTION_LINES, MAX_FUNCTION_LINES, "function")):
        near = sorted((n, name) for n, name in (sized if what == "module" else spans) if warn <= n <= limit)
        if near:
            print(f"warning: {len(near)} {what}s within {limit - warn} lines of the {limit}-line limit: "
                  + ", ".join(f"{name} {n}" for n, name in reversed(near)))
    for line in errors:
        print(f"error: {line}")
    return 1 if errors else 0


def workload_branches(paths: list[Path], root: Path) -> str:
    """How often the package asks which workload it has (:data:`_ASKS_WORKLOAD`), outside the
    module that answers (workload.py), with the modules that ask most."""
    per = {str(p.relative_to(root)): len(_ASKS_WORKLOAD.findall(p.read_text())) for p in paths
           if p.name != "workload.py"}
    asking = sorted(((n, m) for m, n in per.items() if n), reverse=True)
    return (f"workload asked: {sum(n for n, _ in asking)} times in {len(asking)} modules (most: "
            + ", ".join(f"{m} {n}" for n, m in asking[:6]) + ")")


def _over(sized: list[tuple[int, str]], limit: int, what: str, unit: str) -> list[str]:
    """Print how many of ``sized`` exceed ``limit``; each one as an error line."""
    over = sorted((n, name) for n, name in sized if n > limit)
    print(f"{what} over {limit} {unit}: {len(over)}" + (f" ({', '.join(f'{n} {name}' for n, name in over)})" if over else ""))
    return [f"{name} has {n} {unit}, over the {limit}-{unit[:-1]} limit" for n, name in over]


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]))
