"""End to end in Kubernetes mode, as a user on a laptop would: `flexinfer up --kubeconfig FILE` runs the control
plane here (embedded NATS and Postgres) against a cluster (the API emulator with its fake kubelet), the models
come from `kubectl apply`, requests go through the local proxy to the cluster's Pods, Ctrl-C stops the control
plane and leaves the cluster's Deployments as they are."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.embedded import free_port
from flexinfer_testbed.kube import KubeCluster

pytestmark = [pytest.mark.e2e, pytest.mark.emulator, pytest.mark.timeout(180)]

BIN = Path(sys.executable).parent


async def run_cli(env: dict[str, str], *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        str(BIN / "flexinfer"), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_flexinfer_up_with_a_kubeconfig_drives_the_cluster(kube: KubeCluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXINFER_")}
    ports = {service: free_port() for service in ("PROXY", "SCHEDULER", "LEASE_MANAGER", "ACTUATOR")}
    env.update({f"FLEXINFER_{service}_PORT": str(port) for service, port in ports.items()})
    env.update(
        {
            "FLEXINFER_RECONCILE_INTERVAL": "500ms",
            "FLEXINFER_LEADER_LEASE_DURATION": "3s",
            "FLEXINFER_LEADER_RENEW_DEADLINE": "2s",
            "FLEXINFER_LEADER_RETRY_PERIOD": "500ms",
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        up = await asyncio.create_subprocess_exec(
            str(BIN / "flexinfer"),
            "up",
            "--kubeconfig",
            str(kube.kubeconfig),
            "--state-dir",
            str(tmp_path / "state"),
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        async with asyncio.timeout(120):
            while "Watch the models" not in log.read_text():
                assert up.returncode is None, log.read_text()[-3000:]
                await asyncio.sleep(0.2)
        (await kube.kubectl("apply", "-f", "examples/kubernetes/homelab.yaml")).check()
        env["FLEXINFER_SCHEDULER_URL"] = f"http://127.0.0.1:{ports['SCHEDULER']}"
        env["FLEXINFER_STATE_DIR"] = str(tmp_path / "state")  # where `up` keeps the admin token it generated
        async with asyncio.timeout(30):  # the actuator hands the applied Models to the scheduler
            while True:
                listed = json.loads(await run_cli(env, "get", "models", "-o", "json"))["items"]
                if {m["metadata"]["name"] for m in listed} == {"chat-small", "chat-large"}:
                    break
                await asyncio.sleep(0.2)
        # The highest priority takes the GPU when asked for (whichever model was loaded first meanwhile).
        body: dict[str, Any] = {"model": "chat-large", "messages": [{"role": "user", "content": "hello"}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.1:{ports['PROXY']}/v1/chat/completions", json=body) as response,
        ):
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"] == "[chat-large] hello"
        await kube.wait_for(
            lambda: ((kube.get("Model", "chat-large") or {}).get("status") or {}).get("phase") == "Ready",
            message="chat-large Ready in the cluster",
        )
        printed = await run_cli(env, "get", "models")
        assert "chat-large" in printed and "chat-small" in printed
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(up.wait(), timeout=30)
            except TimeoutError:
                os.killpg(up.pid, signal.SIGKILL)
                await up.wait()
    assert up.returncode == 0, log.read_text()[-3000:]
    # The control plane went away; the cluster's model keeps running (nothing scales it down behind the user).
    assert kube.get("deployments", "chat-large")["spec"]["replicas"] == 1
    assert kube.ready_pods("app=chat-large")
