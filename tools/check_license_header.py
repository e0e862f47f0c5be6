# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
"""Pre-commit hook: every Python and shell file we own starts with the project license header.

Usage: ``python tools/check_license_header.py FILE...``; exits 1 and names each file that lacks it.
A shebang line may precede the header.
"""

import sys
from pathlib import Path

HEADER = ("# Copyright 2026 The treetune-verl Authors", "# SPDX-License-Identifier: Apache-2.0")


def has_header(path: Path) -> bool:
    lines = path.read_text(encoding="utf-8").splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return tuple(lines[:2]) == HEADER


def main(paths: list[str]) -> int:
    missing = [p for p in paths if not has_header(Path(p))]
    for p in missing:
        print(f"{p}: missing license header (first lines must be: {' / '.join(HEADER)})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
