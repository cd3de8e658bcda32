"""What every generator in scripts/ does with the file it renders: write it, or with ``--check`` (``make verify``)
fail when the file in the tree differs from what the code renders now."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, *, check: bool | None = None) -> int:
    """Write ``text`` to ``path`` (exit status 0), or, when checking (``--check`` on the command line unless
    ``check`` says), compare: 1 and a line naming the file when it is stale or missing."""
    check = "--check" in sys.argv if check is None else check
    name = path.relative_to(Path(__file__).resolve().parent.parent) if path.is_absolute() else path
    if check:
        if not path.is_file() or path.read_text() != text:
            print(f"{name} is stale: run `make docs`", file=sys.stderr)
            return 1
        print(f"{name} is up to date")
        return 0
    path.write_text(text)
    print(f"wrote {name}")
    return 0
