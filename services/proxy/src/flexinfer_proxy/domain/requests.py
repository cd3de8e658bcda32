"""Reading what the proxy needs from a request: the ``model`` of an OpenAI-style JSON body, and header filtering.

The body is parsed once, only to find ``model``; the original bytes are what gets forwarded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from flexinfer_proxy.domain.errors import invalid_request

#: Headers that describe one hop, not the message (RFC 9110 section 7.6.1), and so are never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def model_of(body: bytes) -> str:
    """The ``model`` field of a JSON request body; raise ProxyError 400 when there is none."""
    if not body:
        raise invalid_request("the request body is empty; expected a JSON object with a 'model' field")
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise invalid_request("the request body must be a JSON object with a 'model' field")
    model = parsed.get("model")
    if not isinstance(model, str) or not model.strip():
        raise invalid_request("the request body has no 'model' (a model name, namespace/name, or a service label)")
    return model.strip()


def connection_tokens(connection_header: str | None) -> frozenset[str]:
    """Header names listed in ``Connection`` (they are hop-by-hop too)."""
    if not connection_header:
        return frozenset()
    return frozenset(t.strip().lower() for t in connection_header.split(",") if t.strip())


def forwardable(headers: Iterable[tuple[str, str]], *, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The end-to-end headers of a message: hop-by-hop ones, ``proxy-*`` and the names in ``drop`` removed.

    ``drop`` holds lower-case names (e.g. ``host``, ``content-length``, and ``connection_tokens(...)``).
    """
    kept = []
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in drop or lower.startswith("proxy-"):
            continue
        kept.append((name, value))
    return kept
