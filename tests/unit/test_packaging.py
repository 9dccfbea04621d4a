"""The distribution lists every package, and the public API is complete."""

import tomllib
from pathlib import Path

import agentstream

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_in_the_distribution():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for dist_name, folder in config["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([dist_name, *rel.parts]) if rel.parts else dist_name)
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_public_names_are_importable():
    for name in agentstream.__all__:
        assert hasattr(agentstream, name), name
