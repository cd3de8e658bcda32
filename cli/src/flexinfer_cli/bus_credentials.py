"""The bus's credentials of a ``flexinfer up`` run: one random password per identity of
:mod:`flexinfer_common.nats_auth`, kept in the state folder (``nats-credentials.json``, mode 0600, the folder 0700)
and reused when the same state folder is started again.

``flexinfer up`` gives each service its own (``FLEXINFER_NATS_USER`` / ``FLEXINFER_NATS_PASSWORD``); the CLI, run
by the same user in the same folder, finds the ``demand`` identity (``flexinfer demand``) and the ``observer``
identity (``flexinfer describe``) here. A user who cannot read the file cannot use the bus at all.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from flexinfer_common.nats_auth import Identity, NatsAuth

log = logging.getLogger("flexinfer.up")

CREDENTIALS_FILE_NAME = "nats-credentials.json"


class CredentialsError(RuntimeError):
    """The credentials file cannot be read or written; the message names it."""


def credentials_file(state_dir: Path) -> Path:
    return state_dir / CREDENTIALS_FILE_NAME


def make_private_dir(directory: Path) -> None:
    """Create ``directory`` (and its parents); nobody but its owner may list or change it (0700; the search bit
    others may keep is the one the embedded PostgreSQL, run as its own user when we are root, needs to reach its
    data, and the files here are 0600 anyway)."""
    directory.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o066:
        directory.chmod(mode & ~0o066)


def _read(path: Path) -> dict[str, str]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CredentialsError(f"cannot read the bus credentials file {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise CredentialsError(f"{path}: expected a JSON object of identity: password")
    return {str(k): v for k, v in raw.items() if isinstance(v, str) and v}


def ensure_credentials(state_dir: Path) -> dict[Identity, str]:
    """A password for every identity: those already in the state folder's file, new random ones for the rest
    (written back, mode 0600)."""
    make_private_dir(state_dir)
    path = credentials_file(state_dir)
    known = _read(path)
    passwords = {identity: known.get(identity.value) or secrets.token_urlsafe(32) for identity in Identity}
    if any(identity.value not in known for identity in Identity):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump({identity.value: password for identity, password in passwords.items()}, out, indent=2)
                out.write("\n")
        except OSError as exc:
            raise CredentialsError(f"cannot write the bus credentials file {path}: {exc}") from None
        log.info("generated the bus credentials in %s (mode 0600)", path, extra={"file": str(path)})
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        log.warning("%s was readable by others; made it private (mode 0600)", path, extra={"file": str(path)})
    path.chmod(0o600)
    return passwords


def cli_auth(identity: Identity, url: str, env: Mapping[str, str], state_dir: Path) -> NatsAuth:
    """How a CLI command authenticates to NATS: ``FLEXINFER_NATS_USER``/``_PASSWORD``, ``_CREDS`` or ``_NKEY`` when
    set (with ``FLEXINFER_NATS_TLS_*``), else ``identity`` from the state folder's credentials when readable, else
    nothing (a NATS without authentication, or the URL's own ``user:password``)."""
    tls = {
        "tls_ca": env.get("FLEXINFER_NATS_TLS_CA", "").strip() or None,
        "tls_cert": env.get("FLEXINFER_NATS_TLS_CERT", "").strip() or None,
        "tls_key": env.get("FLEXINFER_NATS_TLS_KEY", "").strip() or None,
        "inbox_prefix": env.get("FLEXINFER_NATS_INBOX_PREFIX", "").strip() or None,
    }
    user = env.get("FLEXINFER_NATS_USER", "").strip()
    creds = env.get("FLEXINFER_NATS_CREDS", "").strip()
    nkey = env.get("FLEXINFER_NATS_NKEY", "").strip()
    if any(urlsplit(part.strip()).username for part in url.split(",")):
        return NatsAuth(**tls)  # the URL's own user and password
    if user or creds or nkey:
        return NatsAuth(
            user=user or None,
            password=env.get("FLEXINFER_NATS_PASSWORD") or None,
            creds_file=creds or None,
            nkey_file=nkey or None,
            **tls,
        )
    try:
        password = _read(credentials_file(state_dir)).get(identity.value)
    except CredentialsError:
        password = None
    if password:
        return NatsAuth(user=identity.value, password=password, **tls)
    return NatsAuth(**tls)
