"""The bus over TLS, as docs/operations.md ("Bus security") documents it: a service given a ``tls://`` URL and
``FLEXINFER_NATS_TLS_CA`` (plus ``FLEXINFER_NATS_TLS_CERT``/``_KEY`` where the server wants mutual TLS) talks to
a real nats-server that requires both, JetStream included; without its certificate, or trusting another CA, it
is refused. The certificates are made here with the openssl command line."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexinfer_cli.embedded import find_nats_server, free_port
from flexinfer_common.bus import Bus
from flexinfer_common.settings import CommonSettings
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

OPENSSL = shutil.which("openssl")


def openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def certificate_authority(directory: Path, name: str) -> None:
    """``<name>-ca.pem`` and its key."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name} test CA",
            "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", cwd=directory)  # fmt: skip


def signed(directory: Path, name: str, *, ca: str, extensions: str) -> None:
    """``<name>.pem`` and ``<name>.key``, signed by ``ca``."""
    (directory / f"{name}.ext").write_text(extensions)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", cwd=directory)  # fmt: skip
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-ca.pem", "-CAkey", f"{ca}-ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory)  # fmt: skip


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
    except OSError:
        return False
    return True


@pytest.fixture
async def tls_nats(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """A nats-server with JetStream on 127.0.0.1 that requires TLS and a client certificate of the test CA."""
    if OPENSSL is None:
        pytest.skip("the openssl command line is not installed (it makes this test's certificates)")
    certificate_authority(tmp_path, "test")
    certificate_authority(tmp_path, "other")
    signed(tmp_path, "server", ca="test", extensions="subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    signed(tmp_path, "client", ca="test", extensions="extendedKeyUsage=clientAuth\n")
    port = free_port()
    (tmp_path / "nats.conf").write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'tls {{ cert_file: "{tmp_path / "server.pem"}", key_file: "{tmp_path / "server.key"}", '
        f'ca_file: "{tmp_path / "test-ca.pem"}", verify: true, timeout: 2 }}\n'
    )
    with (tmp_path / "nats.log").open("wb") as log:
        server = await asyncio.create_subprocess_exec(
            str(find_nats_server()), "-c", str(tmp_path / "nats.conf"), stdout=log, stderr=log
        )
        try:
            await wait_for(lambda: server.returncode is not None or listening(port), what="nats-server to listen")
            assert server.returncode is None, "nats-server exited: " + (tmp_path / "nats.log").read_text()
            yield f"tls://127.0.0.1:{port}", tmp_path
        finally:
            server.terminate()
            await asyncio.wait_for(server.wait(), 10)


def bus_for(url: str, **tls: str) -> Bus:
    """The Bus a service makes from its settings (FLEXINFER_NATS_URL and FLEXINFER_NATS_TLS_*)."""
    settings = CommonSettings(nats_url=url, **tls)
    return Bus(settings.nats_url, name="tls-test", auth=settings.nats_auth())


async def test_a_service_with_the_ca_and_its_certificate_uses_the_bus_over_mutual_tls(
    tls_nats: tuple[str, Path],
) -> None:
    url, certs = tls_nats
    bus = bus_for(
        url,
        nats_tls_ca=str(certs / "test-ca.pem"),
        nats_tls_cert=str(certs / "client.pem"),
        nats_tls_key=str(certs / "client.key"),
    )
    await bus.connect(wait=10)
    try:
        await bus.ensure_streams()  # JetStream over the TLS connection
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(msg: object) -> None:
            await got.put(msg.data)  # type: ignore[attr-defined]

        await bus.nc.subscribe("flexinfer.tls.check", cb=on_message)
        await bus.nc.publish("flexinfer.tls.check", b"over tls")
        assert await asyncio.wait_for(got.get(), 5) == b"over tls"
        routes = await bus.routes()
        await routes.put("default.m1", b"{}")
        assert (await routes.get("default.m1")).value == b"{}"
    finally:
        await bus.close()


@pytest.mark.parametrize(
    "tls",
    [
        pytest.param({"nats_tls_ca": "test-ca.pem"}, id="no-client-certificate"),
        pytest.param(
            {"nats_tls_ca": "other-ca.pem", "nats_tls_cert": "client.pem", "nats_tls_key": "client.key"},
            id="server-not-trusted",
        ),
        pytest.param({}, id="no-ca-system-trust-only"),
    ],
)
async def test_a_service_without_its_certificate_or_trusting_another_ca_is_refused(
    tls_nats: tuple[str, Path], tls: dict[str, str]
) -> None:
    url, certs = tls_nats
    bus = bus_for(url, **{name: str(certs / file) for name, file in tls.items()})
    with pytest.raises(ConnectionError) as refused:
        await bus.connect(wait=2)
    assert not bus.connected
    # The service's start fails saying why, and which settings to look at.
    message = str(refused.value)
    assert message.startswith(f"cannot reach NATS at {url}: "), message
    assert message.endswith("(TLS: FLEXINFER_NATS_TLS_CA, _CERT and _KEY)"), message
    # the cause: a TLS alert, or (the server closing first, as TLS 1.3 lets it) a reset on the TLS connection
    assert "SSL" in message or "ConnectionResetError" in message, message
