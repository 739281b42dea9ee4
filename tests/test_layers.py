"""The import graph in layers, read from the source (nothing is imported):
kernels < core (laquant.* but cli) < laquant.eval < laquant.cli. A layer imports only from below."""

import ast
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module, by the dotted name it installs as (pyproject's package-dir: eval/ is
    laquant.eval), with its file and whether it is a package's ``__init__``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = config["tool"]["setuptools"]["package-dir"]
    modules = {}
    for package, folder in package_dir.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join([package, *(parts[:-1] if is_package else parts)])
            modules.setdefault(name, (path, is_package))
    return modules


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of what ``module`` imports anywhere in it (function bodies too); for
    ``from A import b`` both A and A.b, since b may be a submodule."""
    package = module if is_package else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(importer, forbidden) -> list[str]:
    """``file: name`` for each import of a module selected by ``importer`` that ``forbidden`` refuses."""
    found = []
    for module, (path, is_package) in sorted(_modules().items()):
        if importer(module):
            for name in sorted(imported_names(path.read_text(), module, is_package)):
                if forbidden(name):
                    found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def _is_core(module: str) -> bool:
    return _within(module, "laquant") and not any(
        _within(module, f"laquant.{layer}") for layer in ("kernels", "eval", "cli"))


def test_the_tree_is_mapped_to_its_installed_names():
    modules = _modules()
    for name in ("laquant.api", "laquant.cli", "laquant.cli.calibrate", "laquant.eval.ppl", "laquant.kernels"):
        assert name in modules, name
    assert modules["laquant.eval.ppl"][0] == ROOT / "eval" / "ppl.py"


def test_relative_imports_resolve_against_the_package():
    source = "from . import a\nfrom .b import c\nfrom ..common import d\nimport laquant.x as y\n"
    assert imported_names(source, "laquant.kernels.gla.chunk", False) == {
        "laquant.kernels.gla", "laquant.kernels.gla.a", "laquant.kernels.gla.b", "laquant.kernels.gla.b.c",
        "laquant.kernels.common", "laquant.kernels.common.d", "laquant.x"}
    assert "laquant.kernels.gla.a" in imported_names("from . import a\n", "laquant.kernels.gla", True)


def test_kernels_import_nothing_else_from_laquant():
    assert _violations(lambda m: _within(m, "laquant.kernels"),
                       lambda n: _within(n, "laquant") and not _within(n, "laquant.kernels")) == []


def test_core_imports_neither_eval_nor_cli():
    assert _violations(_is_core, lambda n: _within(n, "laquant.eval") or _within(n, "laquant.cli")) == []


def test_eval_does_not_import_the_cli():
    assert _violations(lambda m: _within(m, "laquant.eval"), lambda n: _within(n, "laquant.cli")) == []
