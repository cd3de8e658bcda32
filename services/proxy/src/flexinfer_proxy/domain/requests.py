"""Reading what the proxy needs from a request: the ``model`` of an OpenAI-style JSON body, header filtering, the
model's endpoint, and whether a request may be sent twice.

The body is parsed once, only to find ``model``; the original bytes are what gets forwarded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

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


_decode_json = json.JSONDecoder().decode


def model_of(body: bytes) -> str:
    """The ``model`` field of a JSON request body; raise ProxyError 400 when there is none."""
    if not body:
        raise invalid_request("the request body is empty; expected a JSON object with a 'model' field")
    try:
        parsed = _decode_json(body.decode())  # UTF-8, as RFC 8259 asks: straight to the C scanner
    except (ValueError, UnicodeDecodeError):
        try:
            parsed = json.loads(body)  # UTF-16/32 (detected from the bytes), or the error to report
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise invalid_request("the request body must be a JSON object with a 'model' field")
    model = parsed.get("model")
    if not isinstance(model, str) or not model.strip():
        raise invalid_request("the request body has no 'model' (a model name, namespace/name, or a service label)")
    return model.strip()


def prefixed_target(raw_target: str) -> tuple[str, str, str] | None:
    """``/ns/model/rest?q`` -> ``("ns", "model", "/rest?q")``, all still encoded as sent; None without a model."""
    path, sep, query = raw_target.partition("?")
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[0] != "" or not parts[1] or not parts[2]:
        return None
    rest = "/" + parts[3] if len(parts) == 4 else "/"
    return parts[1], parts[2], rest + sep + query


class ApiKeys:
    """The data plane's API keys (``FLEXINFER_PROXY_API_KEYS``), kept only as SHA-256 digests.

    ``allows`` compares the digest of the presented key with every known one, all of them every time and each in
    constant time (``hmac.compare_digest`` on equal-length digests), so neither a key's content nor its length nor
    which key matched shows in the answer time.
    """

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(hashlib.sha256(key.encode()).digest() for key in keys)
        if not self._digests:
            raise ValueError("no API keys given")

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._digests)} keys)"

    def allows(self, authorization: bytes | None) -> bool:
        """Whether an ``Authorization`` header value carries one of the keys as a bearer token."""
        if authorization is None:
            return False
        scheme, _, token = authorization.strip().partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        return matched and scheme.lower() == b"bearer"


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


_HOP_BY_HOP_RAW = frozenset(name.encode() for name in HOP_BY_HOP)


def raw_connection_tokens(connection_header: bytes) -> frozenset[bytes]:
    """``connection_tokens`` for raw (bytes) headers."""
    return frozenset(t.strip().lower() for t in connection_header.split(b",") if t.strip())


def forwardable_raw(
    headers: Iterable[tuple[bytes, bytes]], *, drop: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """``forwardable`` for raw (bytes) headers, as they come off the wire: the hot path never decodes them."""
    kept = []
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP_BY_HOP_RAW or lower in drop or lower.startswith(b"proxy-"):
            continue
        kept.append((name, value))
    return kept


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a model listens: ``http://host:port[/base]`` taken apart once."""

    host: str
    port: int
    base_path: str  # "" or "/base" (no trailing slash): prefixed to every forwarded target


def parse_endpoint(url: str) -> Endpoint:
    """A route's ``endpoint``; ValueError when it is not a plain ``http://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// endpoint: {url!r}")
    return Endpoint(parts.hostname, parts.port or 80, parts.path.rstrip("/"))


#: Methods that may be sent twice (RFC 9110 section 9.2.2, less PUT and DELETE, whose second try can surprise).
RETRY_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: POST paths whose second try does no harm: an embedding is a pure function of its input, with no side effect
#: and no stream, so sending it again costs only the model's time. Completions are not: the client may be billed
#: or see different output, and a stream may have started.
RETRY_SAFE_POSTS = frozenset({"/v1/embeddings"})


def retry_safe(method: str, path: str, *, body_held: bool) -> bool:
    """Whether a request whose answer never started may be sent once more.

    ``path`` is the model-side path (no query); ``body_held``: the proxy holds the whole body (a streamed upload
    cannot be replayed).
    """
    if not body_held:
        return False
    if method in RETRY_SAFE_METHODS:
        return True
    return method == "POST" and path.partition("?")[0] in RETRY_SAFE_POSTS
