"""``flexinfer up``: the whole system on one machine.

Order of events: parse FILE (a bad manifest stops here, before anything starts) -> check settings and ports ->
NATS (``FLEXINFER_NATS_URL``, else an embedded server) -> Postgres (``FLEXINFER_DATABASE_URL``, else an embedded
server with a ``flexinfer`` database) -> migrations -> the four services under a :class:`Supervisor` -> wait for
each ``/readyz`` (scheduler, actuator, lease-manager, proxy) -> apply FILE through the admin APIs (the code path
of ``flexinfer apply``) -> banner -> supervise until SIGINT/SIGTERM -> stop the services (proxy, lease-manager,
scheduler, actuator), then the embedded Postgres and NATS. A second signal kills everything at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import signal
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from flexinfer_cli.apply_plan import ApiCall, PlanStep, execute_plan, plan_apply, read_manifests
from flexinfer_cli.bus_credentials import CredentialsError, credentials_file, ensure_credentials
from flexinfer_cli.client import AdminClient, CliError
from flexinfer_cli.config import (
    DEFAULT_NATS_URL,
    Service,
    default_namespace,
    endpoints_file,
    service_port,
    token_file,
)
from flexinfer_cli.embedded import EmbeddedNats, EmbeddedPostgres, free_port
from flexinfer_cli.settings import UpSettings
from flexinfer_cli.supervisor import STOP_TIMEOUT, EmbeddedWatch, Liveness, ServiceSpec, Supervisor
from flexinfer_common.manifests import Resource
from flexinfer_common.nats_auth import SERVICE_IDENTITIES, Identity, inbox_prefix, redact_url
from flexinfer_common.settings import ENV_PREFIX, SettingsError, load_settings
from flexinfer_common.tcp import port_is_free

log = logging.getLogger("flexinfer.up")

DATABASE_NAME = "flexinfer"
# The embedded PostgreSQL's role for the services and the migrations: owner of DATABASE_NAME only, not a superuser.
DATABASE_ROLE = "flexinfer"
NATS_PREFERRED_PORT = 4222  # the port `flexinfer demand` (and any NATS client) tries by default
READY_ORDER: tuple[Service, ...] = (Service.SCHEDULER, Service.ACTUATOR, Service.LEASE_MANAGER, Service.PROXY)
STOP_ORDER: tuple[Service, ...] = (Service.PROXY, Service.LEASE_MANAGER, Service.SCHEDULER, Service.ACTUATOR)
MODULES: dict[Service, str] = {
    Service.SCHEDULER: "flexinfer_scheduler",
    Service.ACTUATOR: "flexinfer_actuator",
    Service.LEASE_MANAGER: "flexinfer_lease_manager",
    Service.PROXY: "flexinfer_proxy",
}
# `up` gives every service these (an empty value means "start an embedded server").
REPLACED_SETTINGS = frozenset({"FLEXINFER_NATS_URL", "FLEXINFER_DATABASE_URL"})
# The operator's bus credentials, replaced by each service's own identity when NATS is embedded.
NATS_AUTH_VARIABLES = (
    "FLEXINFER_NATS_USER",
    "FLEXINFER_NATS_PASSWORD",
    "FLEXINFER_NATS_CREDS",
    "FLEXINFER_NATS_NKEY",
    "FLEXINFER_NATS_INBOX_PREFIX",
)
# A service that exits this many times before it is ready is failing to start, not flaking: give up.
MAX_START_FAILURES = 3


class UpError(CliError):
    """``flexinfer up`` cannot go on; the message says why (everything started is stopped)."""


class SettingsProblem(CliError):
    exit_code = 2


@dataclass
class UpOptions:
    files: Sequence[str | Path] = ()
    state_dir: Path = Path(".flexinfer")
    ready_timeout: float = 60.0
    stop_timeout: float = STOP_TIMEOUT
    # (service, argv) to run; default: ``sys.executable -m <module>`` for each service (tests swap in fakes).
    commands: Mapping[Service, Sequence[str]] | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    out: TextIO | None = None  # where the banner goes (stdout)
    # Kubernetes mode: the control plane runs here, the models are Deployments of the cluster this kubeconfig
    # (and context) reaches; Models and GPUGroups are read from the cluster.
    kubeconfig: Path | None = None
    kube_context: str = ""


def _connect_host(bind_host: str) -> str:
    """Where to reach a service bound to ``bind_host`` from this machine."""
    if bind_host in ("", "0.0.0.0", "::", "*"):
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(bind_host).version == 6:
            return f"[{bind_host}]"
    except ValueError:
        pass
    return bind_host


def resolve_ports(env: Mapping[str, str], bind_host: str) -> dict[Service, int]:
    """Each service's port (``FLEXINFER_<SERVICE>_PORT``, default from the contract; 0 picks a free one),
    refusing a port that is already taken so two ``up`` runs do not fight over it."""
    ports: dict[Service, int] = {}
    for service in READY_ORDER:
        try:
            port = service_port(service, env)
        except ValueError as exc:
            raise SettingsProblem(str(exc)) from None
        if port == 0:
            port = free_port()
        elif not port_is_free(port, bind_host or "0.0.0.0"):
            raise UpError(
                f"port {port} for the {service.value} is already in use ({service.port_variable}); "
                "is another `flexinfer up` running? Stop it, or choose other ports with FLEXINFER_*_PORT."
            )
        ports[service] = port
    return ports


def service_env(
    base: Mapping[str, str],
    *,
    nats_url: str,
    database_url: str,
    state_dir: Path,
    ports: Mapping[Service, int],
    kubeconfig: Path | None = None,
    kube_context: str = "",
) -> dict[str, str]:
    """The environment every service gets: ours, plus where NATS and Postgres are, the actuator's back-end (local
    processes, or the cluster of ``kubeconfig``), and its port."""
    env = dict(base)
    env["FLEXINFER_NATS_URL"] = nats_url
    env["FLEXINFER_DATABASE_URL"] = database_url
    if kubeconfig is not None:
        env["FLEXINFER_ACTUATOR"] = "kubernetes"
        env["FLEXINFER_KUBECONFIG"] = str(kubeconfig.absolute())
        if kube_context:
            env["FLEXINFER_KUBE_CONTEXT"] = kube_context
    else:
        env["FLEXINFER_ACTUATOR"] = "local"
    env["FLEXINFER_STATE_DIR"] = str(state_dir.absolute())
    env.setdefault("FLEXINFER_BIND_HOST", "127.0.0.1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    for service, port in ports.items():
        env[service.port_variable] = str(port)
    return env


def check_settings(env: Mapping[str, str]) -> UpSettings:
    """The settings (the services' common ones and ``up``'s own) as ``env`` gives them (every field passed
    explicitly, so only ``env`` counts)."""
    values: dict[str, object] = {}
    for name, info in UpSettings.model_fields.items():
        variable = ENV_PREFIX + name.upper()
        value = env.get(variable)
        if value is None or (variable in REPLACED_SETTINGS and not value.strip()):
            values[name] = info.get_default(call_default_factory=True)
        else:
            values[name] = value
    try:
        return load_settings(UpSettings, **values)
    except SettingsError as exc:
        raise SettingsProblem(str(exc)) from None


def private_state_dir(state_dir: Path) -> None:
    """Create the state folder with mode 0700, or take group and others' read and write off an existing one (the
    embedded PostgreSQL's system user, when ``up`` runs as root, still needs o+x to reach its data)."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(state_dir.stat().st_mode)
    if mode & 0o066:
        state_dir.chmod(mode & ~0o066)


def write_endpoints(state_dir: Path, urls: Mapping[Service, str], nats_url: str) -> Path:
    """Write the URLs this run serves to ``endpoints.json`` in the state folder (mode 0600), so the CLI run in the
    same folder finds them as it finds the token: ``describe``'s events and ``demand`` need NATS, which the
    embedded server may serve on a port of its choosing."""
    path = endpoints_file(state_dir)
    data = {service.value: url for service, url in urls.items()}
    data["nats"] = nats_url
    data["ui"] = urls[Service.SCHEDULER] + "/ui"
    private_state_dir(state_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    path.chmod(0o600)
    return path


def ensure_admin_token(env: Mapping[str, str], state_dir: Path) -> str:
    """The admin token of this run: ``FLEXINFER_ADMIN_TOKEN`` when given, else the one kept in the state folder,
    else a new random one written there with mode 0600 (so the CLI, run in the same folder, finds it)."""
    given = env.get("FLEXINFER_ADMIN_TOKEN", "").strip()
    if given:
        return given
    path = token_file(state_dir)
    private_state_dir(state_dir)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise UpError(f"cannot read the admin token file {path}: {exc}") from None
    if token:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            log.warning("%s was readable by others; made it private (mode 0600)", path, extra={"file": str(path)})
            path.chmod(0o600)
        return token
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(token + "\n")
        path.chmod(0o600)
    except OSError as exc:
        raise UpError(f"cannot write the admin token file {path}: {exc}") from None
    log.info("generated an admin token in %s (mode 0600)", path, extra={"file": str(path)})
    return token


class _Signals:
    """First SIGINT/SIGTERM: stop in order. Second: kill at once."""

    def __init__(self, on_force: Callable[[], None]) -> None:
        self.stop = asyncio.Event()
        self.count = 0
        self._on_force = on_force

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._handle, sig)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    def _handle(self, sig: int) -> None:
        self.count += 1
        name = signal.Signals(sig).name
        if self.count == 1:
            log.info("%s received: stopping (again to kill at once)", name, extra={"signal": name})
            self.stop.set()
        else:
            log.warning("%s received again: killing everything now", name, extra={"signal": name})
            self._on_force()


class _Interrupted(Exception):
    """A stop was requested while starting up."""


class Up:
    def __init__(self, options: UpOptions) -> None:
        self.options = options
        self.env = dict(options.env)
        self.state_dir = Path(options.state_dir).absolute()
        self.nats: EmbeddedNats | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.supervisor: Supervisor | None = None
        self.nats_passwords: dict[Identity, str] | None = None  # the embedded NATS's, one per identity
        self.watches: list[EmbeddedWatch] = []
        self.token_generated = False
        self.signals = _Signals(self._kill_everything)
        self.out = options.out or sys.stdout
        self.settings: UpSettings | None = None

    # -- the whole run ----------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until signalled; return the exit code (0 after a requested stop). Raises CliError on failure."""
        if self.options.kubeconfig is not None and self.options.files:
            raise SettingsProblem(
                "with --kubeconfig the models come from the cluster: apply them with `kubectl apply -f FILE`, "
                "not `flexinfer up -f FILE`"
            )
        resources = read_manifests(self.options.files)  # ManifestFileError (exit 2) before anything starts
        namespace = default_namespace(self.env)
        plan = plan_apply(resources, default_namespace=namespace)
        self.token_generated = not self.env.get("FLEXINFER_ADMIN_TOKEN", "").strip()
        self.settings = self._check_settings()
        bind_host = self.env.get("FLEXINFER_BIND_HOST") or "127.0.0.1"
        ports = resolve_ports(self.env, bind_host)
        self.env["FLEXINFER_ADMIN_TOKEN"] = ensure_admin_token(self.env, self.state_dir)
        urls = {service: f"http://{_connect_host(bind_host)}:{port}" for service, port in ports.items()}
        self.signals.install()
        try:
            nats_url, database_url = await self._start_infrastructure()
            self._interrupted()
            self._watch_embedded()
            self.supervisor = self._supervisor(nats_url, database_url, ports)
            await self.supervisor.start()
            await self._wait_ready(urls)
            await self._apply(plan, urls, self.env["FLEXINFER_ADMIN_TOKEN"])
            write_endpoints(self.state_dir, urls, nats_url)
            self._banner(urls, nats_url, resources)
            await self.signals.stop.wait()
            return 0
        except _Interrupted:
            return 0
        finally:
            with contextlib.suppress(OSError):
                endpoints_file(self.state_dir).unlink(missing_ok=True)
            await self._stop_everything()
            self.signals.uninstall()

    def _check_settings(self) -> UpSettings:
        """Refuse a bad FLEXINFER_* value before starting anything (the message names the variable). The services
        will have a token (given, or generated next), so the check counts one as set."""
        return check_settings({**self.env, "FLEXINFER_ADMIN_TOKEN": self.env.get("FLEXINFER_ADMIN_TOKEN") or "up"})

    def _interrupted(self) -> None:
        if self.signals.stop.is_set():
            raise _Interrupted

    # -- NATS and Postgres ------------------------------------------------------------------------------

    async def _start_infrastructure(self) -> tuple[str, str]:
        private_state_dir(self.state_dir)
        nats_url = self.env.get("FLEXINFER_NATS_URL", "").strip()
        if nats_url:
            shown = redact_url(nats_url)
            log.info("using NATS at %s (FLEXINFER_NATS_URL)", shown, extra={"nats_url": shown})
        else:
            preferred = NATS_PREFERRED_PORT if port_is_free(NATS_PREFERRED_PORT) else None
            try:
                self.nats_passwords = ensure_credentials(self.state_dir)
            except CredentialsError as exc:
                raise UpError(str(exc)) from None
            self.nats = EmbeddedNats(self.state_dir / "nats", port=preferred, passwords=self.nats_passwords)
            log.info("starting embedded NATS", extra={"data_dir": str(self.nats.data_dir)})
            try:
                nats_url = await asyncio.to_thread(self.nats.start)
            except Exception as exc:
                raise UpError(f"cannot start the embedded NATS server: {exc}") from None
            log.info("embedded NATS ready at %s", nats_url, extra={"nats_url": nats_url})
        self._interrupted()

        database_url = self.env.get("FLEXINFER_DATABASE_URL", "").strip()
        if database_url:
            log.info("using the database of FLEXINFER_DATABASE_URL")
        else:
            self.postgres = EmbeddedPostgres(self.state_dir / "postgres")
            log.info("starting embedded PostgreSQL", extra={"data_dir": str(self.postgres.data_dir)})
            try:
                await asyncio.to_thread(self.postgres.start)
            except Exception as exc:
                raise UpError(f"cannot start the embedded PostgreSQL server: {exc}") from None
            self._interrupted()
            try:
                database_url = await asyncio.to_thread(self.postgres.ensure_app_database, DATABASE_NAME, DATABASE_ROLE)
            except Exception as exc:
                raise UpError(f"cannot create the {DATABASE_NAME!r} database: {exc}") from None
            log.info(
                "embedded PostgreSQL ready (password authentication; the services connect as %r)",
                DATABASE_ROLE,
                extra={"port": self.postgres.port, "database": DATABASE_NAME, "role": DATABASE_ROLE},
            )
        self._interrupted()

        from flexinfer_common.db import upgrade_database

        log.info("applying database migrations")
        try:
            await upgrade_database(database_url)
        except Exception as exc:
            raise UpError(f"database migrations failed: {exc}") from None
        return nats_url, database_url

    def _watch_embedded(self) -> None:
        """Restart the embedded NATS and PostgreSQL when they die, as the services are (back-off, logged)."""
        for name, server in (("NATS", self.nats), ("PostgreSQL", self.postgres)):
            if server is not None:
                watch = EmbeddedWatch(server, name=name, logger=logging.getLogger("flexinfer.up"))
                watch.start()
                self.watches.append(watch)

    # -- services -------------------------------------------------------------------------------------

    def _supervisor(self, nats_url: str, database_url: str, ports: Mapping[Service, int]) -> Supervisor:
        env = service_env(
            self.env,
            nats_url=nats_url,
            database_url=database_url,
            state_dir=self.state_dir,
            ports=ports,
            kubeconfig=self.options.kubeconfig,
            kube_context=self.options.kube_context,
        )
        commands = self.options.commands or {
            service: (sys.executable, "-m", module) for service, module in MODULES.items()
        }
        host = _connect_host(env["FLEXINFER_BIND_HOST"] or "127.0.0.1")
        specs = [
            ServiceSpec(
                name=service.value,
                argv=tuple(commands[service]),
                env=self._bus_identity(env, service),
                health_url=f"http://{host}:{ports[service]}/healthz",
            )
            for service in READY_ORDER
        ]
        settings = self.settings or self._check_settings()
        liveness = Liveness(
            period=settings.liveness_period.total_seconds(),
            timeout=settings.liveness_timeout.total_seconds(),
            failure_threshold=settings.liveness_failure_threshold,
            initial_delay=settings.liveness_initial_delay.total_seconds(),
        )
        return Supervisor(
            specs,
            stop_timeout=self.options.stop_timeout,
            logger=logging.getLogger("flexinfer.up"),
            liveness=liveness,
        )

    def _bus_identity(self, env: Mapping[str, str], service: Service) -> dict[str, str]:
        """``env`` with the embedded NATS's identity of ``service`` (its own, and only its own, subjects). With an
        external NATS every service gets the operator's ``FLEXINFER_NATS_*`` as they are."""
        if self.nats_passwords is None:
            return dict(env)
        identity = SERVICE_IDENTITIES[service.value]
        own = {k: v for k, v in env.items() if not k.startswith(NATS_AUTH_VARIABLES)}
        return {
            **own,
            "FLEXINFER_NATS_USER": identity.value,
            "FLEXINFER_NATS_PASSWORD": self.nats_passwords[identity],
            "FLEXINFER_NATS_INBOX_PREFIX": inbox_prefix(identity),
        }

    async def _wait_ready(self, urls: Mapping[Service, str]) -> None:
        assert self.supervisor is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.ready_timeout
        for service in READY_ORDER:
            async with AdminClient(service, urls[service]) as client:
                while not await client.ready():
                    self._interrupted()
                    failures = self.supervisor.exits(service.value)
                    if failures >= MAX_START_FAILURES:
                        raise UpError(
                            f"the {service.value} exited {failures} times while starting "
                            f"(last: {self.supervisor.last_exit(service.value)}); see its log lines above"
                        )
                    if loop.time() > deadline:
                        raise UpError(
                            f"the {service.value} did not become ready within {self.options.ready_timeout:.0f} s "
                            f"(GET {urls[service]}/readyz); see its log lines above"
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.signals.stop.wait(), 0.2)
            log.info("%s ready", service.value, extra={"child": service.value, "url": urls[service]})
        self._interrupted()

    async def _apply(self, plan: Sequence[PlanStep], urls: Mapping[Service, str], token: str | None) -> None:
        if not plan:
            return
        needed = {step.service for step in plan if isinstance(step, ApiCall)}
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                service: await stack.enter_async_context(AdminClient(service, urls[service], token=token))
                for service in needed
            }
            try:
                await execute_plan(
                    plan,
                    clients,
                    echo=lambda line: log.info("applied %s", line, extra={"resource": line}),
                    warn=lambda line: log.warning(line),
                )
            except CliError as exc:
                raise UpError(f"applying {', '.join(map(str, self.options.files))} failed: {exc}") from None

    # -- stopping -------------------------------------------------------------------------------------

    async def _stop_everything(self) -> None:
        if self.supervisor is not None:
            await self.supervisor.stop([service.value for service in STOP_ORDER])
        for watch in self.watches:
            await watch.stop()
        for server in (self.postgres, self.nats):
            if server is not None:
                try:
                    await asyncio.to_thread(server.stop)
                except Exception as exc:
                    log.error("cannot stop embedded %s: %s", type(server).__name__, exc)
        if self.postgres is not None or self.nats is not None:
            log.info("embedded servers stopped")

    def _kill_everything(self) -> None:
        self.signals.stop.set()
        if self.supervisor is not None:
            self.supervisor.kill_all()
        for watch in self.watches:
            watch.stopping = True
        for server in (self.postgres, self.nats):
            pid = server.pid if server is not None else None
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    # -- banner ---------------------------------------------------------------------------------------

    def _page_address(self, scheduler: str) -> str:
        """The status page's address with the token (one click, as Jupyter prints it) on a terminal; when the output
        goes to a file (a log) the token stays out of it, and the line says where to find it."""
        isatty = getattr(self.out, "isatty", None)
        if callable(isatty) and isatty():
            return f"{scheduler}/ui?token={self.env['FLEXINFER_ADMIN_TOKEN']}"
        where = token_file(self.state_dir) if self.token_generated else "FLEXINFER_ADMIN_TOKEN"
        return f"{scheduler}/ui?token=TOKEN   (TOKEN: the admin token, in {where})"

    def _banner(self, urls: Mapping[Service, str], nats_url: str, resources: Sequence[Resource]) -> None:
        proxy, scheduler = urls[Service.PROXY], urls[Service.SCHEDULER]
        lines = [
            "",
            "FlexInfer is up.",
            f"  OpenAI-compatible proxy   {proxy}/v1",
            f"  scheduler admin API       {scheduler}/api/v1   (OpenAPI: {scheduler}/docs)",
            f"  lease manager API         {urls[Service.LEASE_MANAGER]}/api/v1",
            f"  status page               {self._page_address(scheduler)}",
            "  admin token               "
            + (
                f"{token_file(self.state_dir)} (mode 0600; the CLI reads it)"
                if self.token_generated
                else "FLEXINFER_ADMIN_TOKEN"
            ),
            f"  NATS                      {redact_url(nats_url)}"
            + (f"   (embedded; credentials in {credentials_file(self.state_dir)}, mode 0600)" if self.nats else ""),
            "  Postgres                  "
            + (f"embedded, data in {self.postgres.data_dir}" if self.postgres else "FLEXINFER_DATABASE_URL"),
        ]
        models = [r for r in resources if r.kind == "Model"]
        if models:
            lines.append(f"  models                    {', '.join(r.metadata.name for r in models)}")
        exports = []
        for service in (Service.SCHEDULER, Service.PROXY, Service.LEASE_MANAGER):
            if urls[service] != f"http://127.0.0.1:{service.default_port}":
                exports.append(f"export {service.url_variable}={urls[service]}")
        if nats_url != DEFAULT_NATS_URL:
            exports.append(f"export FLEXINFER_NATS_URL={redact_url(nats_url)}")
        if (self.token_generated or self.nats) and self.state_dir != Path.cwd() / ".flexinfer":
            exports.append(f"export FLEXINFER_STATE_DIR={self.state_dir}   # where the CLI finds its credentials")
        lines.append("")
        if exports:
            lines.append("In another terminal, first:")
            lines += [f"  {line}" for line in exports]
        lines.append("Watch the models:   flexinfer get models      (also: groups, swaps, queues, leases)")
        if models:
            first = models[0].metadata.name
            lines.append(
                f"Send a request:     curl -s {proxy}/v1/chat/completions -H 'Content-Type: application/json' "
                f"""-d '{{"model": "{first}", "messages": [{{"role": "user", "content": "hi"}}]}}'"""
            )
        lines.append("Stop:               Ctrl-C")
        lines.append("")
        print("\n".join(lines), file=self.out, flush=True)


async def run_up(options: UpOptions) -> int:
    return await Up(options).run()
