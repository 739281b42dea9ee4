"""The installed package holds every module of the tree: pyproject's package list names every
folder with an ``__init__.py`` (a non-editable install ships only the listed ones)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = tool["package-dir"]
    listed = set(tool["packages"])
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    missing = {p for p in found if not any(p == d or p.startswith(d + ".") for d in dirs) or p not in listed}
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
