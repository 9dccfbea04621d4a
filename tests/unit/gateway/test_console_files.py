"""The console is static files inside the package: the wheel carries every one, and the page
loads nothing from anywhere else (no CDN)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONSOLE = ROOT / "services" / "gateway" / "console"


def test_every_console_file_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["agentstream_services.gateway"]
    files = sorted(p.relative_to(CONSOLE.parent).as_posix() for p in CONSOLE.rglob("*") if p.is_file())
    assert {"console/index.html", "console/app.js", "console/style.css"} <= set(files)
    assert [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []


def test_the_page_references_only_its_own_files():
    html = (CONSOLE / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert sorted(refs) == ["app.js", "style.css"]
    for name in ("app.js", "style.css"):
        text = (CONSOLE / name).read_text()
        assert not re.search(r"https?://", text), f"{name} names an outside address"
        assert "@import" not in text and "innerHTML" not in text


def test_the_key_lives_in_the_tab_and_ids_are_one_encoded_path_segment():
    # issue 33: a key in localStorage outlives the tab; an id such as `a/../../traces/<victim>` was
    # sent as segments the browser normalised, so the console showed and cancelled another conversation
    app = (CONSOLE / "app.js").read_text()
    assert "localStorage" not in app and "sessionStorage.getItem(KEY_STORE)" in app
    assert "const enc = (id) => encodeURIComponent(id);" in app
    assert not re.search(r"/v1/traces/\$\{(?!enc\()", app), "a trace id in an API path that is not encoded"
