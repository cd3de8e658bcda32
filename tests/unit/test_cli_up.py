"""``flexinfer up`` orchestration with stand-in services (tiny aiohttp apps), real NATS and Postgres.

The stand-ins answer ``/readyz``; the scheduler one also takes ``PUT /api/v1/models/...``. Each records the
environment it was given and, on SIGTERM, the order in which it was stopped. The end-to-end test with the real
services lives in tests/e2e.
"""

from __future__ import annotations

import io
import os
import sys
import textwrap
from pathlib import Path

import pytest

from flexinfer_cli.client import CliError
from flexinfer_cli.config import Service
from flexinfer_cli.local_system import Up, UpOptions

REPO = Path(__file__).resolve().parents[2]
HOMELAB = REPO / "examples" / "homelab.yaml"

STAND_IN = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pathlib import Path
    from aiohttp import web

    name, journal = sys.argv[1], Path(sys.argv[2])
    mode = os.environ.get("STAND_IN_MODE_" + name.upper().replace("-", "_"), "ok")
    if mode == "crash":
        print(json.dumps({"service": name, "msg": "crashing on purpose"}), file=sys.stderr, flush=True)
        sys.exit(3)
    port = int(os.environ["FLEXINFER_" + name.upper().replace("-", "_") + "_PORT"])
    (journal / (name + ".env.json")).write_text(json.dumps(dict(os.environ)))
    models = {}

    async def ready(_):
        return web.json_response({"ready": True})

    async def put_model(request):
        body = await request.json()
        models[request.match_info["name"]] = body
        (journal / "models.json").write_text(json.dumps(models))
        return web.json_response(body)

    async def main():
        app = web.Application()
        app.router.add_get("/readyz", ready)
        app.router.add_get("/healthz", ready)
        app.router.add_put("/api/v1/models/{ns}/{name}", put_model)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, os.environ["FLEXINFER_BIND_HOST"], port).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(json.dumps({"service": name, "msg": "listening", "port": port}), file=sys.stderr, flush=True)
        await stop.wait()
        with open(journal / "stopped", "a") as f:
            f.write(name + "\\n")
        await runner.cleanup()

    asyncio.run(main())
    """
)


def stand_in_commands(tmp_path: Path) -> dict[Service, tuple[str, ...]]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return {service: (sys.executable, str(script), service.value, str(tmp_path)) for service in Service}


def free_service_ports() -> dict[str, str]:
    return {service.port_variable: "0" for service in Service}


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXINFER_")}
    return {**env, **free_service_ports(), **extra}


async def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = Up(
            UpOptions(
                state_dir=tmp_path / "state",
                env=base_env(FLEXINFER_PROXY_PORT=str(port)),
                out=io.StringIO(),
            )
        )
        with pytest.raises(CliError, match=f"port {port} for the proxy is already in use \\(FLEXINFER_PROXY_PORT\\)"):
            await up.run()
    assert not (tmp_path / "state").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_up_prints_the_status_page_with_its_token_on_a_terminal_and_without_it_into_a_log(tmp_path: Path) -> None:
    """Issue 24: the page's address with the one-time token, as Jupyter prints it; a banner written to a file (a
    log) keeps the token out and says where it is."""
    from flexinfer_cli.local_system import Up, UpOptions

    env = {"FLEXINFER_ADMIN_TOKEN": "s3cret"}
    on_terminal = Up(UpOptions(state_dir=tmp_path, env=env, out=_Terminal()))
    assert on_terminal._page_address("http://127.0.0.1:8081") == "http://127.0.0.1:8081/ui?token=s3cret"
    into_log = Up(UpOptions(state_dir=tmp_path, env=env, out=io.StringIO()))
    address = into_log._page_address("http://127.0.0.1:8081")
    assert "s3cret" not in address and address.startswith("http://127.0.0.1:8081/ui?token=TOKEN")
