#!/usr/bin/env python3
"""How readable the house is, counted from the source of a checkout (issue 43's closing figures):
the largest modules, functions and classes, how many times the shared options are declared, how
many modules have a test module of their own name, and how many package imports sit inside
functions. Reads files only; run it on two checkouts to compare.

    python scripts/house_metrics.py [CHECKOUT]   # default: this one
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


def main(root: Path) -> None:
    modules = sorted((root / "paretopipe").rglob("*.py"))
    lines = {p: p.read_text().count("\n") for p in modules}
    print("largest modules:", ", ".join(f"{n} {p.relative_to(root)}" for p, n in
                                        sorted(lines.items(), key=lambda kv: -kv[1])[:10]))
    spans, classes, lazy = [], [], 0
    for p in modules:
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                span = (node.end_lineno - node.lineno + 1, f"{p.relative_to(root)}:{node.name}")
                (classes if isinstance(node, ast.ClassDef) else spans).append(span)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy += sum(isinstance(s, ast.ImportFrom) and s.level > 0 for s in ast.walk(node))
    print("largest functions:", ", ".join(f"{n} {name}" for n, name in sorted(spans, reverse=True)[:10]))
    print("largest classes:", ", ".join(f"{n} {name}" for n, name in sorted(classes, reverse=True)[:5]))
    source = "\n".join(p.read_text() for p in modules)
    declared = r"""(add_argument|Flag|Option)\(\(?\s*["']--num-classes["']"""
    print("--num-classes declared:", len(re.findall(declared, source)))
    print("a literal default of 10 classes:", len(re.findall(r"num_classes: int = 10\b|num-classes.*default=10", source)))
    print("RPC transport choices spelled out:", len(re.findall(r"""[(\[]["']uv["'], ["']auto["'][)\]]""", source)))
    print("RPC source choices spelled out:", len(re.findall(r"""[(\[]["']master["'], ["']stage1["'][)\]]""", source)))
    tested = {p.stem[len("test_"):] for p in (root / "tests").rglob("test_*.py")}
    named = [p for p in modules if p.stem not in ("__init__", "__main__")]
    own = [p for p in named if p.stem in tested]
    print(f"modules: {len(named)}, with a test module of their own name: {len(own)}")
    print("package imports inside functions:", lazy)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
