"""The package list a wheel is built from (pyproject.toml) names every package of the source tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def listed_packages() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools]", 1)[1]
    match = re.search(r"^packages\s*=\s*\[(.*?)\]", section, re.MULTILINE | re.DOTALL)
    assert match, "pyproject.toml: [tool.setuptools] packages not found"
    return set(re.findall(r'"([^"]+)"', match.group(1)))


def source_packages() -> set[str]:
    return {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "linker").rglob("__init__.py")}


def test_every_package_is_listed_for_the_wheel():
    assert source_packages() >= {"linker", "linker.batch", "linker.sim", "linker.link.tree_match"}
    assert listed_packages() == source_packages()
