"""The Kubernetes API emulator's pure rules: selectors, the three patch flavours, structural schemas, the
store's object semantics (resourceVersion, generation, status subresource, finalizers, garbage collection)."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_testbed.kube.builders import crd
from flexinfer_testbed.kube.errors import ApiError, Reason
from flexinfer_testbed.kube.patching import json_patch, merge_patch, strategic_merge_patch
from flexinfer_testbed.kube.resources import types_from_crd
from flexinfer_testbed.kube.schema import apply_defaults, prune, validate
from flexinfer_testbed.kube.selectors import parse_field_selector, parse_label_selector
from flexinfer_testbed.kube.store import EventType, FieldValidation, PatchType, Store

LABELS = {"app": "chat", "tier": "gpu", "env": "prod"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        pytest.param("", True, id="empty-matches-all"),
        pytest.param("app=chat", True, id="equals"),
        pytest.param("app==chat", True, id="double-equals"),
        pytest.param("app!=chat", False, id="not-equals"),
        pytest.param("app!=other", True, id="not-equals-other"),
        pytest.param("missing!=x", True, id="not-equals-absent-key"),
        pytest.param("app in (chat, web)", True, id="in"),
        pytest.param("app notin (chat,web)", False, id="notin"),
        pytest.param("missing notin (a)", True, id="notin-absent-key"),
        pytest.param("tier", True, id="exists"),
        pytest.param("!tier", False, id="does-not-exist"),
        pytest.param("!missing", True, id="does-not-exist-absent"),
        pytest.param("app=chat,env in (prod),!missing", True, id="conjunction"),
        pytest.param("app=chat,env=dev", False, id="conjunction-fails"),
    ],
)
def test_label_selector(selector: str, matches: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is matches


def test_bad_label_selector_is_400() -> None:
    with pytest.raises(ApiError) as caught:
        parse_label_selector("app in chat")
    assert caught.value.code == 400


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        pytest.param("metadata.name=a", True, id="name"),
        pytest.param("metadata.name==a", True, id="name-double-equals"),
        pytest.param("metadata.name!=a", False, id="name-not"),
        pytest.param("metadata.namespace=ns,metadata.name=a", True, id="both"),
        pytest.param("metadata.namespace=other", False, id="namespace-differs"),
    ],
)
def test_field_selector(selector: str, matches: bool) -> None:
    obj = {"metadata": {"name": "a", "namespace": "ns"}}
    assert (
        parse_field_selector(selector, frozenset({"metadata.name", "metadata.namespace"}), "x").matches(obj) is matches
    )


def test_unsupported_field_label_is_400() -> None:
    with pytest.raises(ApiError, match=r"field label not supported: spec\.gpu"):
        parse_field_selector("spec.gpu=1", frozenset({"metadata.name"}), "models")


POD_SPEC = {
    "containers": [{"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}]}, {"name": "b", "image": "y:1"}]
}


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        pytest.param(
            {"containers": [{"name": "a", "image": "x:2"}]},
            {
                "containers": [
                    {"name": "a", "image": "x:2", "env": [{"name": "A", "value": "1"}]},
                    {"name": "b", "image": "y:1"},
                ]
            },
            id="containers-merge-by-name",
        ),
        pytest.param(
            {"containers": [{"name": "c", "image": "z:1"}]},
            {"containers": [*POD_SPEC["containers"], {"name": "c", "image": "z:1"}]},
            id="new-container-appended",
        ),
        pytest.param(
            {"containers": [{"name": "b", "$patch": "delete"}]},
            {"containers": [POD_SPEC["containers"][0]]},
            id="patch-delete-directive",
        ),
        pytest.param(
            {
                "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                "containers": [{"name": "a", "env": [{"name": "B", "value": "2"}]}],
            },
            {
                "containers": [
                    {"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                    {"name": "b", "image": "y:1"},
                ]
            },
            id="env-merged-by-name-order-directive-ignored",
        ),
        pytest.param(
            {"containers": [{"name": "a", "image": "q:1"}], "$patch": "replace"},
            {"containers": [{"name": "a", "image": "q:1"}]},
            id="replace-directive",
        ),
    ],
)
def test_strategic_merge_patch(patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert strategic_merge_patch(POD_SPEC, patch) == expected


def test_merge_patch_replaces_lists_and_null_deletes() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3]}) == {"a": {"c": 2, "d": 3}, "l": [3]}


def test_finalizers_merge_as_a_set() -> None:
    assert strategic_merge_patch({"metadata": {"finalizers": ["a"]}}, {"metadata": {"finalizers": ["b", "a"]}}) == {
        "metadata": {"finalizers": ["a", "b"]}
    }


@pytest.mark.parametrize(
    ("operations", "expected"),
    [
        pytest.param([{"op": "add", "path": "/l/-", "value": 3}], {"a": {"b": 1}, "l": [1, 2, 3]}, id="append"),
        pytest.param([{"op": "replace", "path": "/a/b", "value": 5}], {"a": {"b": 5}, "l": [1, 2]}, id="replace"),
        pytest.param([{"op": "remove", "path": "/l/0"}], {"a": {"b": 1}, "l": [2]}, id="remove"),
        pytest.param([{"op": "move", "from": "/a/b", "path": "/c"}], {"a": {}, "l": [1, 2], "c": 1}, id="move"),
        pytest.param(
            [{"op": "copy", "from": "/a", "path": "/d"}], {"a": {"b": 1}, "l": [1, 2], "d": {"b": 1}}, id="copy"
        ),
        pytest.param(
            [{"op": "test", "path": "/a/b", "value": 1}, {"op": "add", "path": "/x~1y", "value": 0}],
            {"a": {"b": 1}, "l": [1, 2], "x/y": 0},
            id="test-then-escaped-add",
        ),
    ],
)
def test_json_patch(operations: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    assert json_patch({"a": {"b": 1}, "l": [1, 2]}, operations) == expected


def test_failed_json_patch_test_is_422() -> None:
    with pytest.raises(ApiError) as caught:
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    assert caught.value.reason == Reason.INVALID


SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["group"],
            "properties": {
                "group": {"type": "string", "minLength": 1},
                "priority": {"type": "integer", "default": 0, "maximum": 1000},
                "mode": {"type": "string", "enum": ["A", "B"]},
                "gpu": {
                    "type": "object",
                    "default": {},
                    "properties": {"shared": {"type": "boolean", "default": False}},
                },
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
    },
}


def test_prune_reports_unknown_fields_and_keeps_preserved_ones() -> None:
    obj = {
        "apiVersion": "x/v1",
        "kind": "K",
        "metadata": {"name": "a"},
        "spec": {"group": "g", "bogus": 1, "free": {"anything": [1]}},
        "status": {"conditions": []},
    }
    pruned, unknown = prune(obj, SCHEMA)
    assert unknown == ["spec.bogus", "status.conditions"]
    assert pruned == {
        "apiVersion": "x/v1",
        "kind": "K",
        "metadata": {"name": "a"},
        "spec": {"group": "g", "free": {"anything": [1]}},
        "status": {},
    }


def test_defaults_apply_inside_defaulted_objects() -> None:
    assert apply_defaults({"spec": {"group": "g"}}, SCHEMA) == {
        "spec": {"group": "g", "priority": 0, "gpu": {"shared": False}}
    }


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        pytest.param({}, "spec.group", "Required value", id="required"),
        pytest.param({"group": ""}, "spec.group", "at least 1 chars", id="min-length"),
        pytest.param({"group": "g", "priority": "high"}, "spec.priority", "must be of type integer", id="type"),
        pytest.param({"group": "g", "priority": 5000}, "spec.priority", "less than or equal to 1000", id="maximum"),
        pytest.param({"group": "g", "mode": "C"}, "spec.mode", 'Unsupported value: "C"', id="enum"),
    ],
)
def test_validate_names_the_field(spec: dict[str, Any], field: str, words: str) -> None:
    errors = validate({"spec": spec}, SCHEMA)
    assert [f for f, _ in errors] == [field]
    assert words in errors[0][1]


# ------------------------------------------------------------------------------------------- the store

CRD = crd("Widget", "example.com", SCHEMA, short_names=("wd",))


@pytest.fixture
def store() -> Store:
    store = Store(history_limit=5)
    store.create(store.type("apiextensions.k8s.io", "v1", "customresourcedefinitions"), None, CRD)
    return store


def widget(name: str = "w", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"group": "g", **spec},
    }


def test_crd_becomes_a_served_type(store: Store) -> None:
    (rt,) = types_from_crd(CRD)
    assert store.type("example.com", "v1", "widgets") == rt
    assert rt.status_subresource and rt.short_names == ("wd",) and not rt.builtin


def test_create_sets_metadata_and_drops_status(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    before = store.resource_version
    created = store.create(rt, "default", {**widget(), "status": {"phase": "X"}})
    meta = created["metadata"]
    assert meta["resourceVersion"] == str(before + 1)
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["namespace"] == "default"
    assert "status" not in created
    assert created["spec"]["priority"] == 0  # schema default


def test_generation_moves_with_spec_only(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    store.create(rt, "default", widget())
    labelled = store.patch(rt, "default", "w", PatchType.MERGE, {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    status = store.patch(rt, "default", "w", PatchType.MERGE, {"status": {"phase": "Ready"}}, subresource="status")
    assert status["metadata"]["generation"] == 1 and status["status"] == {"phase": "Ready"}
    changed = store.patch(rt, "default", "w", PatchType.MERGE, {"spec": {"priority": 7}})
    assert changed["metadata"]["generation"] == 2


def test_main_resource_ignores_status_and_status_ignores_spec(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    store.create(rt, "default", widget())
    after = store.patch(rt, "default", "w", PatchType.MERGE, {"status": {"phase": "Ready"}})
    assert "status" not in after
    after = store.patch(
        rt, "default", "w", PatchType.MERGE, {"spec": {"priority": 9}, "status": {"phase": "A"}}, subresource="status"
    )
    assert after["spec"]["priority"] == 0 and after["status"] == {"phase": "A"}


def test_no_op_update_writes_nothing(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    created = store.create(rt, "default", widget())
    again = store.update(rt, "default", "w", created)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_stale_resource_version_conflicts(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    created = store.create(rt, "default", widget())
    store.patch(rt, "default", "w", PatchType.MERGE, {"spec": {"priority": 1}})
    with pytest.raises(ApiError) as caught:
        store.update(rt, "default", "w", created)
    assert (caught.value.code, caught.value.reason) == (409, Reason.CONFLICT)
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "spec": {"priority": 2}}
    with pytest.raises(ApiError, match="the object has been modified"):
        store.patch(rt, "default", "w", PatchType.MERGE, stale)


def test_strict_field_validation_refuses_unknown_fields(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    with pytest.raises(ApiError, match=r'unknown field "spec\.bogus"'):
        store.create(rt, "default", widget(bogus=1), validation=FieldValidation.STRICT)
    warnings: list[str] = []
    created = store.create(rt, "default", widget(bogus=1), warnings=warnings)
    assert warnings == ['unknown field "spec.bogus"'] and "bogus" not in created["spec"]


def test_finalizers_hold_deletion_until_removed(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    store.create(rt, "default", {**widget(), "metadata": {"name": "w", "finalizers": ["example.com/hold"]}})
    obj, gone = store.delete(rt, "default", "w")
    assert not gone and obj["metadata"]["deletionTimestamp"]
    store.patch(rt, "default", "w", PatchType.MERGE, {"metadata": {"finalizers": None}})
    assert store.find(rt, "default", "w") is None
    assert store.history[-1].type == EventType.DELETED


def test_owner_deletion_collects_dependents_whose_owners_are_all_gone(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    cms = store.type("", "v1", "configmaps")
    a = store.create(rt, "default", widget("a"))
    b = store.create(rt, "default", widget("b"))

    def ref(owner: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
        }

    store.create(cms, "default", {"metadata": {"name": "only-a", "ownerReferences": [ref(a)]}})
    store.create(cms, "default", {"metadata": {"name": "a-and-b", "ownerReferences": [ref(a), ref(b)]}})
    store.delete(rt, "default", "a")
    assert store.find(cms, "default", "only-a") is None
    survivor = store.find(cms, "default", "a-and-b")
    assert survivor is not None and [r["name"] for r in survivor["metadata"]["ownerReferences"]] == ["b"]


def test_watch_from_too_old_resource_version_is_410(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    first = store.create(rt, "default", widget("w0"))
    for i in range(1, 8):  # history_limit=5: the first events fall out
        store.create(rt, "default", widget(f"w{i}"))
    with pytest.raises(ApiError) as caught:
        store.watch(
            rt,
            "default",
            parse_label_selector(""),
            parse_field_selector("", frozenset(), "widgets"),
            first["metadata"]["resourceVersion"],
        )
    assert caught.value.code == 410 and caught.value.reason == Reason.GONE


def test_deleting_a_crd_stops_serving_it_and_deletes_its_objects(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    store.create(rt, "default", widget())
    store.delete(store.type("apiextensions.k8s.io", "v1", "customresourcedefinitions"), None, "widgets.example.com")
    with pytest.raises(ApiError) as caught:
        store.type("example.com", "v1", "widgets")
    assert caught.value.code == 404
    assert [e.type for e in store.history if e.key == rt.key][-1] == EventType.DELETED


def test_apply_patch_creates_then_merges(store: Store) -> None:
    rt = store.type("example.com", "v1", "widgets")
    with pytest.raises(ApiError, match="fieldManager"):
        store.patch(rt, "default", "w", PatchType.APPLY, widget())
    created = store.patch(rt, "default", "w", PatchType.APPLY, widget(priority=3), field_manager="test")
    assert created["spec"]["priority"] == 3
    merged = store.patch(rt, "default", "w", PatchType.APPLY, {"spec": {"mode": "A"}}, field_manager="test")
    assert (merged["spec"]["priority"], merged["spec"]["mode"]) == (3, "A")
