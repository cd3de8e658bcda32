"""The Kubernetes API emulator against the official `kubernetes` client, unmodified, over real HTTP.

The client is blocking and the emulator serves in the test's event loop: every client call runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError

from flexinfer_testbed.kube import KubeCluster, in_thread
from flexinfer_testbed.kube.builders import deployment

pytestmark = pytest.mark.emulator

NS = "default"


def status_of(error: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


def raw(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """The generic call the actuator's back-end makes: param_serialize + call_api, JSON body, no preloading."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    method, url, headers, serialized, _ = api.param_serialize(
        method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = api.call_api(method, url, headers, serialized)
    return response.status, json.loads(response.read() or b"null")


def model(name: str, **gpu: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {"backend": "fake", "gpu": {"shared": "g", **gpu}},
    }


MODELS = ("ai.flexinfer", "v1alpha2", NS, "models")


async def test_crud_status_codes_and_bodies(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    created = await in_thread(
        core.create_namespaced_config_map, NS, {"metadata": {"name": "cm", "labels": {"a": "1"}}, "data": {"k": "v"}}
    )
    assert created.metadata.uid and created.metadata.resource_version
    fetched = await in_thread(core.read_namespaced_config_map, "cm", NS)
    assert fetched.data == {"k": "v"}

    with pytest.raises(ApiException) as exists:
        await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "cm"}})
    assert exists.value.status == 409 and status_of(exists.value)["reason"] == "AlreadyExists"

    fetched.data = {"k": "w"}
    replaced = await in_thread(core.replace_namespaced_config_map, "cm", NS, fetched)
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)

    status, listed = await asyncio.to_thread(raw, kube.api_client(), "GET", f"/api/v1/namespaces/{NS}/configmaps")
    assert status == 200
    assert (listed["kind"], listed["apiVersion"]) == ("ConfigMapList", "v1")
    assert listed["metadata"]["resourceVersion"] == replaced.metadata.resource_version
    assert [i["metadata"]["name"] for i in listed["items"]] == ["cm"]

    await in_thread(core.delete_namespaced_config_map, "cm", NS)
    with pytest.raises(ApiException) as missing:
        await in_thread(core.read_namespaced_config_map, "cm", NS)
    body = status_of(missing.value)
    assert missing.value.status == 404
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "NotFound", 404)
    assert body["message"] == 'configmaps "cm" not found'


async def test_generate_name_and_namespace_from_the_url(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    created = await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"generateName": "lease-"}})
    assert created.metadata.name.startswith("lease-") and len(created.metadata.name) == len("lease-") + 5
    assert created.metadata.namespace == NS
    with pytest.raises(ApiException) as mismatch:
        await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "x", "namespace": "other"}})
    assert mismatch.value.status == 400 and status_of(mismatch.value)["reason"] == "BadRequest"


async def test_stale_resource_version_is_409_conflict(kube: KubeCluster) -> None:
    custom = client.CustomObjectsApi(kube.api_client())
    first = await in_thread(custom.create_namespaced_custom_object, *MODELS, model("m"))
    await in_thread(custom.patch_namespaced_custom_object, *MODELS, "m", {"spec": {"gpu": {"priority": 1}}})
    stale = {**first, "spec": {**first["spec"], "backend": "vllm"}}
    with pytest.raises(ApiException) as caught:
        await in_thread(custom.replace_namespaced_custom_object, *MODELS, "m", stale)
    body = status_of(caught.value)
    assert caught.value.status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    # A resourceVersion inside a patch body is a precondition too.
    with pytest.raises(ApiException) as patched:
        await in_thread(
            custom.patch_namespaced_custom_object,
            *MODELS,
            "m",
            {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}, "spec": {"source": "x"}},
        )
    assert patched.value.status == 409


async def test_generation_status_subresource_and_schema(kube: KubeCluster) -> None:
    custom = client.CustomObjectsApi(kube.api_client())
    created = await in_thread(
        custom.create_namespaced_custom_object, *MODELS, {**model("m"), "status": {"phase": "Ready"}}
    )
    assert created["metadata"]["generation"] == 1 and "status" not in created
    assert created["spec"]["gpu"]["priority"] == 0  # the CRD's default

    status = await in_thread(
        custom.patch_namespaced_custom_object_status,
        *MODELS,
        "m",
        {"status": {"phase": "Loading", "sharedGroup": {"state": "Active", "queuePosition": 0}}},
    )
    assert status["status"]["phase"] == "Loading" and status["metadata"]["generation"] == 1

    ignored = await in_thread(custom.patch_namespaced_custom_object, *MODELS, "m", {"status": {"phase": "Failed"}})
    assert ignored["status"]["phase"] == "Loading" and ignored["metadata"]["generation"] == 1

    labelled = await in_thread(
        custom.patch_namespaced_custom_object, *MODELS, "m", {"metadata": {"labels": {"x": "y"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    changed = await in_thread(custom.patch_namespaced_custom_object, *MODELS, "m", {"spec": {"gpu": {"priority": 5}}})
    assert changed["metadata"]["generation"] == 2

    with pytest.raises(ApiException) as invalid:
        await in_thread(custom.patch_namespaced_custom_object_status, *MODELS, "m", {"status": {"phase": "Dancing"}})
    body = status_of(invalid.value)
    assert invalid.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "status.phase"


async def test_deployment_scale_subresource(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    d = deployment("d", gpu=0, command=[], image="registry.example/none:1", readiness_path=None)
    await in_thread(apps.create_namespaced_deployment, NS, d)
    scale = await in_thread(apps.read_namespaced_deployment_scale, "d", NS)
    assert (scale.kind, scale.api_version, scale.spec.replicas, scale.status.selector) == (
        "Scale",
        "autoscaling/v1",
        0,
        "app=d",
    )
    patched = await in_thread(apps.patch_namespaced_deployment_scale, "d", NS, {"spec": {"replicas": 1}})
    assert patched.spec.replicas == 1
    stored = await in_thread(apps.read_namespaced_deployment, "d", NS)
    assert stored.spec.replicas == 1 and stored.metadata.generation == 2

    scale.spec.replicas = 3  # scale still carries the old resourceVersion
    with pytest.raises(ApiException) as caught:
        await in_thread(apps.replace_namespaced_deployment_scale, "d", NS, scale)
    assert caught.value.status == 409
    status, body = await asyncio.to_thread(
        raw,
        kube.api_client(),
        "PATCH",
        f"/apis/apps/v1/namespaces/{NS}/deployments/d/scale",
        body=[{"op": "replace", "path": "/spec/replicas", "value": 0}],
        content_type="application/json-patch+json",
    )
    assert status == 200 and body["spec"]["replicas"] == 0


async def test_label_and_field_selectors_on_list(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    await in_thread(core.create_namespace, {"metadata": {"name": "other"}})
    for ns, name, labels in [
        (NS, "a", {"app": "x", "tier": "gpu"}),
        (NS, "b", {"app": "y"}),
        ("other", "c", {"app": "x"}),
    ]:
        await in_thread(core.create_namespaced_config_map, ns, {"metadata": {"name": name, "labels": labels}})

    async def names(**kwargs: Any) -> list[str]:
        found = await in_thread(core.list_config_map_for_all_namespaces, **kwargs)
        return sorted(i.metadata.name for i in found.items)

    assert await names(label_selector="app=x") == ["a", "c"]
    assert await names(label_selector="app in (x,y),tier") == ["a"]
    assert await names(label_selector="app!=x") == ["b"]
    assert await names(label_selector="!tier") == ["b", "c"]
    assert await names(label_selector="app notin (y)") == ["a", "c"]
    assert await names(field_selector="metadata.namespace=other") == ["c"]
    assert await names(field_selector="metadata.name!=a,metadata.namespace==default") == ["b"]
    only = await in_thread(core.list_namespaced_config_map, "other")
    assert [i.metadata.name for i in only.items] == ["c"]
    with pytest.raises(ApiException) as caught:
        await names(field_selector="data.k=v")
    assert caught.value.status == 400 and "field label not supported" in status_of(caught.value)["message"]


def watch_events(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Consume a watch (official Watch helper) until the server ends it; (type, name, rv) per event."""
    events = []
    for event in watch.Watch().stream(fn, *args, **kwargs):
        raw_object = event["raw_object"]
        events.append(
            {
                "type": event["type"],
                "name": raw_object["metadata"].get("name"),
                "rv": raw_object["metadata"].get("resourceVersion"),
                "object": raw_object,
            }
        )
    return events


async def test_watch_resumes_from_a_resource_version_and_filters(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "before", "labels": {"w": "1"}}})
    listed = await in_thread(core.list_namespaced_config_map, NS)
    since = listed.metadata.resource_version
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "a", "labels": {"w": "1"}}})
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "unlabelled"}})
    await in_thread(core.patch_namespaced_config_map, "a", NS, {"data": {"k": "v"}})
    await in_thread(core.patch_namespaced_config_map, "a", NS, {"metadata": {"labels": {"w": "2"}}})  # leaves selector
    await in_thread(core.delete_namespaced_config_map, "before", NS)
    events = await in_thread(
        watch_events,
        core.list_namespaced_config_map,
        NS,
        resource_version=since,
        label_selector="w=1",
        timeout_seconds=1,
    )
    assert [(e["type"], e["name"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("DELETED", "before"),
    ]
    rvs = [int(e["rv"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(since)


async def test_watch_without_resource_version_starts_with_current_objects(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "x"}})
    events = await in_thread(watch_events, core.list_namespaced_config_map, NS, timeout_seconds=1)
    assert [(e["type"], e["name"]) for e in events] == [("ADDED", "x")]


async def test_watch_after_compaction_gets_410_gone(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    listed = await in_thread(core.list_namespaced_config_map, NS)
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "x"}})
    kube.compact()
    with pytest.raises(ApiException) as caught:
        await in_thread(
            watch_events,
            core.list_namespaced_config_map,
            NS,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=1,
        )
    assert caught.value.status == 410
    # On the wire: HTTP 200, then one ERROR event carrying the Status.
    status, _ = await asyncio.to_thread(
        raw, kube.api_client(), "GET", f"/api/v1/namespaces/{NS}/configmaps", query=[("limit", "1")]
    )
    assert status == 200
    http_status, text = await kube_get_text(
        kube, f"/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={listed.metadata.resource_version}"
    )
    (line,) = text.splitlines()
    event = json.loads(line)
    assert http_status == 200 and event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


async def kube_get_text(kube: KubeCluster, path: str) -> tuple[int, str]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"{kube.url}{path}") as response:
        return response.status, await response.text()


async def test_bookmarks_and_timeout_seconds(kube: KubeCluster) -> None:
    kube.emulator.bookmark_interval = 0.1
    core = client.CoreV1Api(kube.api_client())
    listed = await in_thread(core.list_namespaced_config_map, NS)

    def watch_for_a_second(**options: Any) -> Awaitable[list[dict[str, Any]]]:
        """The ConfigMaps' events after the list, for the watch's own ``timeoutSeconds`` of 1 s."""
        return in_thread(
            watch_events,
            core.list_namespaced_config_map,
            NS,
            timeout_seconds=1,
            resource_version=listed.metadata.resource_version,
            **options,
        )

    started = time.monotonic()
    events = await watch_for_a_second(allow_watch_bookmarks=True)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 5.0
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert events[0]["object"] == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": listed.metadata.resource_version},
    }
    without = await watch_for_a_second()
    assert without == []


async def test_expire_watches_ends_open_streams(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    listed = await in_thread(core.list_namespaced_config_map, NS)
    ending = asyncio.ensure_future(
        in_thread(
            watch_events,
            core.list_namespaced_config_map,
            NS,
            timeout_seconds=60,
            resource_version=listed.metadata.resource_version,
        )
    )
    await kube.wait_for(lambda: kube.store.watchers, message="the watch to open")
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "seen"}})
    kube.expire_watches()
    events = await asyncio.wait_for(ending, timeout=10)
    assert [(e["type"], e["name"]) for e in events] == [("ADDED", "seen")]


async def test_owner_reference_garbage_collection(kube: KubeCluster) -> None:
    api = kube.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    owner = await in_thread(custom.create_namespaced_custom_object, *MODELS, model("m"))
    ref = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "name": "m",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "owned", "ownerReferences": [ref]}})
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "free"}})
    await in_thread(custom.delete_namespaced_custom_object, *MODELS, "m")
    remaining = await in_thread(core.list_namespaced_config_map, NS)
    assert [i.metadata.name for i in remaining.items] == ["free"]


async def test_unreachable_refuses_then_recovers(kube: KubeCluster) -> None:
    api = kube.api_client()
    api.configuration.retries = 0
    core = client.CoreV1Api(api)
    async with kube.unreachable():
        with pytest.raises(MaxRetryError):
            await in_thread(core.list_namespaced_config_map, NS, _request_timeout=2)
    listed = await in_thread(core.list_namespaced_config_map, NS)
    assert listed.items == []


async def test_unreachable_drops_open_watches(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    ending = asyncio.ensure_future(in_thread(watch_events, core.list_namespaced_config_map, NS, timeout_seconds=60))
    await kube.wait_for(lambda: kube.store.watchers, message="the watch to open")
    async with kube.unreachable():
        (outcome,) = await asyncio.wait_for(asyncio.gather(ending, return_exceptions=True), timeout=10)
    assert isinstance(outcome, ProtocolError)  # the stream broke off, as when an API server dies


async def test_injected_conflicts_and_the_request_log(kube: KubeCluster) -> None:
    custom = client.CustomObjectsApi(kube.api_client())
    await in_thread(custom.create_namespaced_custom_object, *MODELS, model("m"))
    kube.inject_conflicts(2, resource="models", name="m", subresource="status")
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            await in_thread(custom.patch_namespaced_custom_object_status, *MODELS, "m", {"status": {"phase": "Ready"}})
        assert caught.value.status == 409 and status_of(caught.value)["reason"] == "Conflict"
    done = await in_thread(custom.patch_namespaced_custom_object_status, *MODELS, "m", {"status": {"phase": "Ready"}})
    assert done["status"]["phase"] == "Ready"
    writes = kube.calls(resource="models", subresource="status")
    assert [(c.verb, c.api_group, c.namespace, c.name, c.status) for c in writes] == [
        ("patch", "ai.flexinfer", NS, "m", 409),
        ("patch", "ai.flexinfer", NS, "m", 409),
        ("patch", "ai.flexinfer", NS, "m", 200),
    ]
    assert writes[0].resource_path == "models/status"
    assert {c.verb for c in kube.calls(resource="models")} == {"create", "patch"}


async def test_send_initial_events_ends_with_an_annotated_bookmark(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "x"}})
    _, text = await kube_get_text(
        kube,
        f"/api/v1/namespaces/{NS}/configmaps?watch=true&sendInitialEvents=true"
        "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
    )
    events = [json.loads(line) for line in text.splitlines()]
    assert [e["type"] for e in events[:2]] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
