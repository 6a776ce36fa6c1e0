"""Line counts and import arrows of the two packages, room by room (a room: a subpackage, or
the package's top-level modules), for the structure report (issue 19).

    python tools/structure_metrics.py [--arrows]

An arrow is one module importing another module in a different room (counted once per pair);
the agent must never import the host, and tests should not import other test modules."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"edge_remat": ROOT / "host" / "edge_remat",
            "edge_remat_agent": ROOT / "agent" / "edge_remat_agent"}


def module_name(package: str, path: Path) -> str:
    parts = list(path.relative_to(PACKAGES[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def room(module: str) -> str:
    parts = module.split(".")
    package_dir = PACKAGES[parts[0]]
    if len(parts) > 1 and (package_dir / parts[1]).is_dir():
        return f"{parts[0]}.{parts[1]}"
    return f"{parts[0]} (top)"


def imports(package: str, path: Path) -> set[str]:
    here = module_name(package, path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(here[:len(here) - node.level + 1]) if node.level else "")
            target = ".".join(p for p in (base, node.module or "") if p)
            if node.module is None:  # from . import x: each name may be a module
                found.update(f"{target}.{alias.name}" for alias in node.names)
            else:
                found.add(target)
    return {name for name in found if name.split(".")[0] in PACKAGES}


def resolve(name: str) -> str:
    """The imported name as a module that exists (from pkg import function -> pkg)."""
    parts = name.split(".")
    while len(parts) > 1:
        base = PACKAGES[parts[0]].joinpath(*parts[1:])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            break
        parts.pop()
    return ".".join(parts)


def main() -> None:
    lines, files, arrows = Counter(), Counter(), Counter()
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            module = module_name(package, path)
            lines[room(module)] += len(path.read_text().splitlines())
            files[room(module)] += 1
            for target in {resolve(name) for name in imports(package, path)}:
                if room(target) != room(module):
                    arrows[(room(module), room(target))] += 1
    print(f"{'room':<34}{'files':>6}{'lines':>8}")
    for name in sorted(lines):
        print(f"{name:<34}{files[name]:>6}{lines[name]:>8}")
    print(f"{'total':<34}{sum(files.values()):>6}{sum(lines.values()):>8}")
    upward = sum(n for (a, b), n in arrows.items()
                 if a.startswith("edge_remat_agent") and not b.startswith("edge_remat_agent"))
    print(f"\nimport arrows between rooms: {sum(arrows.values())} module pairs across "
          f"{len(arrows)} room pairs; agent -> host: {upward}")
    if "--arrows" in sys.argv:
        for (a, b), n in sorted(arrows.items()):
            print(f"  {a:<32} -> {b:<32} {n}")
    tests = ROOT / "tests"
    test_lines = sum(len(p.read_text().splitlines()) for p in tests.rglob("*.py"))
    cross = 0
    for path in tests.rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("test_"):
                cross += 1
            elif isinstance(node, ast.Import):
                cross += sum(a.name.startswith("test_") for a in node.names)
    print(f"tests: {len(list(tests.rglob('test_*.py')))} test files, {test_lines} lines; "
          f"imports of other test modules: {cross}")


if __name__ == "__main__":
    main()
