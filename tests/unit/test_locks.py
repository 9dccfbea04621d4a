"""The locks pin what pyproject.toml asks for: requirements.lock (the image's, with hashes) every
runtime dependency and the ``otel`` and ``mcp`` extras; requirements-dev.lock (scripts/bootstrap's
constraints) every extra, at the same versions where both pin a package. A dependency added to or
changed in pyproject.toml without running ``scripts/lock`` fails here: under pip's constraints it
would install unpinned, at whatever version is newest that day."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
IMAGE_EXTRAS = ("otel", "mcp")  # what the Dockerfile installs besides the dependencies

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def pins(text: str) -> dict[str, str]:
    """A pip-compile output file's text → {canonical package name: pinned version}."""
    found = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def unmet(requirements: list[str], pinned: dict[str, str]) -> list[str]:
    """The requirements (PEP 508 strings) that ``pinned`` does not pin at a version they allow, each
    said in one line; requirements whose marker does not apply to this Python are left out."""
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement.name}: not pinned")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name}: pinned {version}, pyproject.toml asks {requirement.specifier}")
    return problems


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_image_lock_pins_every_runtime_dependency_with_its_hashes():
    project = _project()
    wanted = project["dependencies"] + [r for extra in IMAGE_EXTRAS for r in project["optional-dependencies"][extra]]
    text = (ROOT / "requirements.lock").read_text()
    assert unmet(wanted, pins(text)) == [], "run scripts/lock"
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n\n", 1)[-1]):
        if "==" in block:  # the Dockerfile installs with --require-hashes
            assert "--hash=sha256:" in block, block


def test_the_dev_lock_pins_every_extra_at_the_image_locks_versions():
    project = _project()
    wanted = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    dev = pins((ROOT / "requirements-dev.lock").read_text())
    assert unmet(wanted, dev) == [], "run scripts/lock"
    image = pins((ROOT / "requirements.lock").read_text())
    assert {name: (version, dev.get(name)) for name, version in image.items() if dev.get(name) != version} == {}


def test_a_requirement_the_lock_misses_or_pins_outside_its_range_is_named():
    pinned = pins("redis==8.2.0 \\\n    --hash=sha256:00\nllama-cpp-python==0.3.36\n    # via agentstream\n")
    assert pinned == {"redis": "8.2.0", "llama-cpp-python": "0.3.36"}
    assert unmet(["redis[hiredis]>=8.1,<8.3", "llama_cpp_python[server]==0.3.36"], pinned) == []
    assert unmet(["redis[hiredis]>=8.1,<8.2", "mypy>=1", "tomli>=2; python_version < '3.0'"], pinned) == [
        "redis: pinned 8.2.0, pyproject.toml asks <8.2,>=8.1",
        "mypy: not pinned",
    ]
