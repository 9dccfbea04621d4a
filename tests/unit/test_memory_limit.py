"""A service's cache bound follows the process's memory limit (issue 35, item 1).

The limit is read from the cgroup files a container sees (v2 ``memory.max``, v1
``memory/memory.limit_in_bytes``), written here into a fake cgroup directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentstream.ops import memory
from agentstream.ops.memory import (
    CACHE_BYTES_WITHOUT_LIMIT,
    cache_bytes_for_limit,
    default_cache_bytes,
    memory_limit_bytes,
)
from agentstream.ops.settings import Settings

MiB = 1 << 20


@pytest.mark.parametrize(
    ("limit_bytes", "bound_bytes"),
    [
        (None, 256 * MiB),  # no limit: the documented safe figure
        (512 * MiB, 128 * MiB),  # the chart's agent loop
        (256 * MiB, 64 * MiB),
        (2048 * MiB, 512 * MiB),
        (1, 0),
    ],
)
def test_the_bound_is_a_quarter_of_the_limit(limit_bytes: int | None, bound_bytes: int):
    assert cache_bytes_for_limit(limit_bytes) == bound_bytes


@pytest.mark.parametrize("limit_bytes", [0, -MiB])
def test_a_limit_that_is_not_positive_is_refused(limit_bytes: int):
    with pytest.raises(ValueError, match="memory limit must be positive"):
        cache_bytes_for_limit(limit_bytes)


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "limit_bytes"),
    [
        ({"memory.max": "536870912\n"}, 512 * MiB),  # v2
        ({"memory.max": "max\n"}, None),  # v2 without a limit
        ({"memory/memory.limit_in_bytes": "268435456\n"}, 256 * MiB),  # v1
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1 without a limit
        ({"memory.max": "max\n", "memory/memory.limit_in_bytes": "268435456\n"}, None),  # v2 first
        ({}, None),  # no cgroup filesystem (not Linux, not mounted)
    ],
)
def test_the_limit_is_read_from_the_cgroup(tmp_path: Path, files: dict[str, str], limit_bytes: int | None):
    assert memory_limit_bytes(_cgroup(tmp_path, files)) == limit_bytes


def test_an_unreadable_limit_names_the_file(tmp_path: Path):
    _cgroup(tmp_path, {"memory.max": "lots"})
    with pytest.raises(ValueError, match=r"memory\.max holds 'lots'"):
        memory_limit_bytes(tmp_path)


def test_the_settings_bound_follows_the_cgroup_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = _cgroup(tmp_path, {"memory.max": str(512 * MiB)})
    monkeypatch.setattr(memory, "PROCESS_LIMIT_BYTES", memory_limit_bytes(root))  # as read at import
    monkeypatch.delenv("AGENTSTREAM_FOLD_CACHE_BYTES", raising=False)
    assert default_cache_bytes() == 128 * MiB
    assert Settings().fold_cache_budget_bytes() == 128 * MiB
    monkeypatch.setenv("AGENTSTREAM_FOLD_CACHE_BYTES", "")
    assert Settings().fold_cache_budget_bytes() == 128 * MiB
    monkeypatch.setenv("AGENTSTREAM_FOLD_CACHE_BYTES", "1000")
    assert Settings().fold_cache_budget_bytes() == 1000
    monkeypatch.delenv("AGENTSTREAM_FOLD_CACHE_BYTES")
    (tmp_path / "memory.max").write_text("max\n")
    monkeypatch.setattr(memory, "PROCESS_LIMIT_BYTES", memory_limit_bytes(root))
    assert Settings().fold_cache_budget_bytes() == CACHE_BYTES_WITHOUT_LIMIT
