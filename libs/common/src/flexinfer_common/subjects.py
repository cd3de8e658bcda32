"""NATS subjects, streams, consumers and the routes bucket.

Model and namespace names become subject tokens. Kubernetes names may contain dots, which NATS uses as token
separators, so a dot in a name is written as ``_`` in a subject (``_`` cannot appear in a Kubernetes name, so the
mapping is reversible). Message bodies always carry the real names.
"""

from __future__ import annotations

PREFIX = "flexinfer"

DEMAND_PREFIX = f"{PREFIX}.demand"
IN_FLIGHT_PREFIX = f"{PREFIX}.proxy.inflight"
COMMAND_PREFIX = f"{PREFIX}.actuator.command"
RUNTIME_STATUS_PREFIX = f"{PREFIX}.actuator.status"
ACTUATOR_HELLO_PREFIX = f"{PREFIX}.actuator.hello"
STATUS_PREFIX = f"{PREFIX}.status"
MODEL_STATUS_PREFIX = f"{STATUS_PREFIX}.model"
GROUP_STATUS_PREFIX = f"{STATUS_PREFIX}.group"
SPEC_PREFIX = f"{PREFIX}.spec"
SPEC_RESYNC_PREFIX = f"{SPEC_PREFIX}.resync"
EVENTS_PREFIX = f"{PREFIX}.events"

DEMAND_STREAM = "FLEXINFER_DEMAND"
IN_FLIGHT_STREAM = "FLEXINFER_IN_FLIGHT"
COMMAND_STREAM = "FLEXINFER_COMMANDS"
RUNTIME_STATUS_STREAM = "FLEXINFER_RUNTIME_STATUS"
MODEL_STATUS_STREAM = "FLEXINFER_MODEL_STATUS"
EVENTS_STREAM = "FLEXINFER_EVENTS"
SPEC_STREAM = "FLEXINFER_SPECS"

ROUTES_BUCKET = "flexinfer_routes"


def token(name: str) -> str:
    return name.replace(".", "_")


def untoken(value: str) -> str:
    return value.replace("_", ".")


def demand_subject(namespace: str, model: str) -> str:
    return model_subject(DEMAND_PREFIX, namespace, model)


def in_flight_subject(source: str) -> str:
    return f"{IN_FLIGHT_PREFIX}.{token(source)}"


def command_subject(namespace: str, model: str) -> str:
    return model_subject(COMMAND_PREFIX, namespace, model)


def runtime_status_subject(namespace: str, model: str) -> str:
    return model_subject(RUNTIME_STATUS_PREFIX, namespace, model)


def actuator_hello_subject(instance: str) -> str:
    return f"{ACTUATOR_HELLO_PREFIX}.{token(instance)}"


def model_status_subject(namespace: str, model: str) -> str:
    return model_subject(MODEL_STATUS_PREFIX, namespace, model)


def group_status_subject(group: str) -> str:
    return f"{GROUP_STATUS_PREFIX}.{token(group)}"


def spec_subject(kind: str, namespace: str, name: str) -> str:
    """``flexinfer.spec.model.<ns>.<name>`` / ``flexinfer.spec.gpugroup.<ns>.<name>``."""
    return f"{SPEC_PREFIX}.{kind.lower()}.{token(namespace)}.{token(name)}"


def spec_resync_subject(kind: str) -> str:
    return f"{SPEC_RESYNC_PREFIX}.{kind.lower()}"


def event_subject(kind: str, group: str) -> str:
    return f"{EVENTS_PREFIX}.{kind}.{token(group)}"


def route_key(namespace: str, model: str) -> str:
    return f"{token(namespace)}.{token(model)}"


def model_subject(prefix: str, namespace: str, model: str) -> str:
    """``prefix.<ns>.<model>``: the subject of one model's messages under ``prefix`` (``split_model_subject``
    reads it back)."""
    return f"{prefix}.{route_key(namespace, model)}"


def split_model_subject(subject: str, prefix: str) -> tuple[str, str] | None:
    """``flexinfer.demand.ns.model`` -> ``("ns", "model")``; None when the subject does not fit."""
    if not subject.startswith(prefix + "."):
        return None
    rest = subject[len(prefix) + 1 :].split(".")
    if len(rest) != 2 or not all(rest):
        return None
    return untoken(rest[0]), untoken(rest[1])
