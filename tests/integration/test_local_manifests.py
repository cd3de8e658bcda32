"""Local-mode manifests through the real services: the admin API refuses a ``spec.local.env`` variable
FLEXINFER_LOCAL_ENV does not allow (issue 22: a manifest setting PYTHONPYCACHEPREFIX for an allowed Python model
server was accepted with 201 and ran planted code as root), and a Model with a backend and no command runs its
backend preset (issue 25)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flexinfer_testbed.system import fake_model
from tests.support.system import SystemStarter

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("env", "status", "named"),
    [
        pytest.param({"PYTHONPYCACHEPREFIX": "/tmp/planted"}, 422, "PYTHONPYCACHEPREFIX", id="pycache-prefix-attack"),
        pytest.param({"PYTHONWARNINGS": "ignore"}, 422, "PYTHONWARNINGS", id="python-warnings"),
        pytest.param({"MY_UNLISTED_KNOB": "1"}, 422, "MY_UNLISTED_KNOB", id="unlisted"),
        pytest.param({"FAKE_MODEL_TOKEN_DELAY": "0"}, 201, "", id="a-listed-knob-is-accepted"),
    ],
)
async def test_a_manifest_env_off_the_allow_list_is_refused_naming_the_variable(
    env: dict[str, str], status: int, named: str, start_system: SystemStarter
) -> None:
    async with start_system(services=("scheduler",)) as system:
        assert system.http is not None
        manifest: dict[str, Any] = fake_model("m")
        manifest["spec"]["local"]["env"] = env
        url = system.url("scheduler") + "/api/v1/models/default/m"
        async with system.http.put(url, json=manifest) as resp:
            assert resp.status == status, await resp.text()
            body = await resp.json()
        if status == 422:
            error = body["error"]
            assert error["code"] == "env_not_allowed"
            assert named in error["message"] and "spec.local.env" in error["message"]
            assert "FLEXINFER_LOCAL_ENV" in error["message"]
            async with system.http.get(url) as resp:
                assert resp.status == 404  # nothing stored


async def test_a_model_with_a_backend_and_no_command_runs_its_preset(start_system: SystemStarter) -> None:
    async with start_system() as system:
        assert system.http is not None
        manifest = {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": "preset-chat", "namespace": "default"},
            "spec": {"backend": "fake", "gpu": {"shared": "gpu"}},
        }
        async with system.http.put(system.url("scheduler") + "/api/v1/models/default/preset-chat", json=manifest) as r:
            assert r.status == 201, await r.text()
        # The proxy learns of a new model from the bus a moment after the PUT answers.
        deadline = asyncio.get_running_loop().time() + 10
        while "preset-chat" not in str(await system.get("proxy", "/v1/models")):
            assert asyncio.get_running_loop().time() < deadline, "the proxy never listed preset-chat"
            await asyncio.sleep(0.05)
        body = {"model": "preset-chat", "messages": [{"role": "user", "content": "hi"}]}
        async with system.http.post(system.url("proxy") + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        assert answer["choices"][0]["message"]["content"].startswith("[preset-chat]")
