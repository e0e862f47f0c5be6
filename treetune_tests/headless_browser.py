# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Open an HTML report in headless Chromium (Debian's, installed by ``make setup``) and read what a script counted.

The reports' browser tests append a script to a copy of the page that, on ``load``, writes what it counted into the
``data-probe`` attribute of ``<body>``; ``--dump-dom`` prints the DOM after the page's scripts ran.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str | None:
    """The Chromium binary, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="no chromium binary (apt-get install chromium; make setup does)"
)


def probed_dom(page: Path, counts_js: str) -> subprocess.CompletedProcess:
    """Load a copy of ``page`` (next to it, so relative image paths hold) with a script that sets
    ``body[data-probe]`` to the template literal ``counts_js`` on load; Chromium's DOM dump in ``stdout``."""
    script = (
        "<script>window.addEventListener('load', () => { const ok = [...document.images].filter("
        f"i => i.complete && i.naturalWidth > 0).length; document.body.setAttribute('data-probe', `{counts_js}`); }});"
        "</script>"
    )
    copy = page.with_name("probe.html")
    copy.write_text(page.read_text().replace("</body>", script + "</body>"))
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--virtual-time-budget=5000",
            "--dump-dom",
            copy.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
