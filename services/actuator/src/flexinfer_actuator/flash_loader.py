"""``flexinfer-flash-loader``: the init container of a Model with ``cache.strategy: Memory``, and its cleanup Job.

``copy --source DIR --target DIR --identity TEXT`` copies the weights from their volume into the node's tmpfs
directory, so the next start of the model on that node (a swap back) reads memory instead of the disk. What is in
the target is trusted only if its marker matches: the marker (``.flexinfer-complete``) names the source and a
fingerprint of its files (path, size, modification time), and is written last, after every file. So a copy that
was interrupted (no marker) or made from other weights (another marker) is wiped and made again, never served and
never waited on: the seed's "Stale tmpfs Blocking Flash-Loader" cannot happen.

``remove --target DIR`` deletes a model's copy (the Model was deleted, or its source changed).

Exit codes: 0 done, 1 the copy failed (the message says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

MARKER = ".flexinfer-complete"


def fingerprint(source: Path, identity: str) -> str:
    """The source's identity and every file's relative path, size and modification time (the weights themselves are
    not read: that is the copy's job)."""
    digest = hashlib.sha256(identity.encode())
    if source.is_file():
        stat = source.stat()
        digest.update(f"{source.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return digest.hexdigest()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(source)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def marker_of(target: Path) -> dict[str, str] | None:
    try:
        data = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _clear(target: Path) -> None:
    """Empty ``target`` (a mount point: the directory itself stays), the marker first."""
    (target / MARKER).unlink(missing_ok=True)
    for child in target.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def copy(source: Path, target: Path, identity: str) -> str:
    """Make ``target`` a verified copy of ``source``; returns what was done ("current" or "copied ...")."""
    if not source.exists():
        raise FileNotFoundError(f"source {source} does not exist (is the claim mounted, is the path right?)")
    wanted = fingerprint(source, identity)
    target.mkdir(parents=True, exist_ok=True)
    marker = marker_of(target)
    if marker is not None and marker.get("fingerprint") == wanted:
        return "current: the copy in memory matches the source"
    reason = "no complete copy" if marker is None else f"the copy was made from {marker.get('identity')!r}"
    started = time.monotonic()
    _clear(target)
    files = size = 0
    if source.is_file():
        shutil.copy2(source, target / source.name)
        files, size = 1, source.stat().st_size
    else:
        for path in sorted(source.rglob("*")):
            destination = target / path.relative_to(source)
            if path.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
            elif path.is_file():
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, destination)
                files += 1
                size += path.stat().st_size
    # The marker last, atomically: whatever a reader finds is either no marker or the whole copy.
    pending = target / f"{MARKER}.tmp"
    pending.write_text(json.dumps({"identity": identity, "fingerprint": wanted, "files": files, "bytes": size}))
    os.replace(pending, target / MARKER)
    took = time.monotonic() - started
    return f"copied {files} files, {size} bytes in {took:.1f}s ({reason})"


def remove(target: Path) -> str:
    if not target.is_absolute() or target == Path("/") or len(target.parts) < 3:
        raise ValueError(f"refusing to remove {target}: not a model's directory")
    if not target.exists():
        return f"{target}: nothing to remove"
    shutil.rmtree(target)
    return f"{target}: removed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flexinfer-flash-loader", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    copying = commands.add_parser(
        "copy", help="copy the weights into the node's memory, unless a verified copy is there"
    )
    copying.add_argument("--source", required=True, type=Path)
    copying.add_argument("--target", required=True, type=Path)
    copying.add_argument("--identity", required=True, help="the Model's spec.source")
    removing = commands.add_parser("remove", help="delete a model's copy")
    removing.add_argument("--target", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "copy":
            print(copy(args.source, args.target, args.identity), flush=True)
        else:
            print(remove(args.target), flush=True)
    except (OSError, ValueError) as exc:
        print(f"flexinfer-flash-loader: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
