"""NATS subjects, streams, consumers and the routes bucket.

Model and namespace names become subject tokens. Kubernetes names may contain dots, which NATS uses as token
separators, so a dot in a name is written as ``_`` in a subject (``_`` cannot appear in a Kubernetes name, so the
mapping is reversible). Message bodies always carry the real names.
"""

from __future__ import annotations

PREFIX = "flexinfer"

DEMAND_PREFIX = f"{PREFIX}.demand"
COMMAND_PREFIX = f"{PREFIX}.actuator.command"
RUNTIME_STATUS_PREFIX = f"{PREFIX}.actuator.status"
ACTUATOR_HELLO_PREFIX = f"{PREFIX}.actuator.hello"
MODEL_STATUS_PREFIX = f"{PREFIX}.status.model"
EVENTS_PREFIX = f"{PREFIX}.events"

DEMAND_STREAM = "FLEXINFER_DEMAND"
COMMAND_STREAM = "FLEXINFER_COMMANDS"
RUNTIME_STATUS_STREAM = "FLEXINFER_RUNTIME_STATUS"
MODEL_STATUS_STREAM = "FLEXINFER_MODEL_STATUS"
EVENTS_STREAM = "FLEXINFER_EVENTS"

ROUTES_BUCKET = "flexinfer_routes"


def token(name: str) -> str:
    return name.replace(".", "_")


def untoken(value: str) -> str:
    return value.replace("_", ".")


def demand_subject(namespace: str, model: str) -> str:
    return f"{DEMAND_PREFIX}.{token(namespace)}.{token(model)}"


def command_subject(namespace: str, model: str) -> str:
    return f"{COMMAND_PREFIX}.{token(namespace)}.{token(model)}"


def runtime_status_subject(namespace: str, model: str) -> str:
    return f"{RUNTIME_STATUS_PREFIX}.{token(namespace)}.{token(model)}"


def actuator_hello_subject(instance: str) -> str:
    return f"{ACTUATOR_HELLO_PREFIX}.{token(instance)}"


def model_status_subject(namespace: str, model: str) -> str:
    return f"{MODEL_STATUS_PREFIX}.{token(namespace)}.{token(model)}"


def event_subject(kind: str, group: str) -> str:
    return f"{EVENTS_PREFIX}.{kind}.{token(group)}"


def route_key(namespace: str, model: str) -> str:
    return f"{token(namespace)}.{token(model)}"


def split_model_subject(subject: str, prefix: str) -> tuple[str, str] | None:
    """``flexinfer.demand.ns.model`` -> ``("ns", "model")``; None when the subject does not fit."""
    if not subject.startswith(prefix + "."):
        return None
    rest = subject[len(prefix) + 1 :].split(".")
    if len(rest) != 2 or not all(rest):
        return None
    return untoken(rest[0]), untoken(rest[1])
