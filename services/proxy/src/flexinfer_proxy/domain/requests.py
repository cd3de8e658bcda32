"""Reading what the proxy needs from a request: the ``model`` of an OpenAI-style JSON body, header filtering, the
model's endpoint, and whether a request may be sent twice.

The body is parsed once, only to find ``model``; the original bytes are what gets forwarded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import json.scanner
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from flexinfer_proxy.domain.errors import ProxyError, invalid_request

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


#: The JSON module's own scanner (C): one value from a position, as ``json.loads`` reads it.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # (typeshed has it wrong)


def model_of(body: bytes) -> str:
    """The ``model`` field of a JSON request body; raise ProxyError 400 when there is none."""
    if not body:
        raise invalid_request("the request body is empty; expected a JSON object with a 'model' field")
    parsed: object = None
    try:
        # The usual body, a UTF-8 object with nothing after it, goes straight to the scanner ...
        text = body.decode()
        value, end = _scan_json(text, 0)
        if end == len(text) or not text[end:].strip(" \t\n\r"):
            parsed = value
    except (ValueError, UnicodeDecodeError, StopIteration):
        pass
    except RecursionError:  # (arrays or objects nested thousands deep: the C scanner recurses per level)
        raise _too_deep() from None
    if parsed is None:
        try:  # ... anything else is read by json.loads (UTF-16/32, surrounding whitespace), or refused as it says
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid_request(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise _too_deep() from None
    if not isinstance(parsed, dict):
        raise invalid_request("the request body must be a JSON object with a 'model' field")
    model = parsed.get("model")
    if isinstance(model, str) and (model := model.strip()):
        return model
    raise invalid_request("the request body has no 'model' (a model name, namespace/name, or a service label)")


def _too_deep() -> ProxyError:
    return invalid_request("the request body is not valid JSON: it is nested too deeply")


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


_HOP_BY_HOP_RAW = frozenset(name.encode() for name in HOP_BY_HOP)
#: Request fields the proxy reads and never forwards (lower-case): the hop-by-hop ones, ``Host`` and the body's
#: framing (the proxy sets them itself), and ``Expect`` (the proxy answers ``100-continue`` itself). ``Proxy-*``
#: fields are not forwarded either, nor those named in ``Connection``.
NOT_FORWARDED = _HOP_BY_HOP_RAW | {b"host", b"content-length", b"expect"}
#: ``Connection`` values that name no other field.
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})


def raw_connection_tokens(connection_header: bytes) -> frozenset[bytes]:
    """The field names listed in a ``Connection`` value (lower-case): hop-by-hop too."""
    return frozenset(t.strip().lower() for t in connection_header.split(b",") if t.strip())


# An answer's hop-by-hop fields, as whole lines of the lower-cased head (the proxy's parser refused anything but CRLF
# line endings and plain ``name:`` fields, so a line match is a field match).
_HOP_LINE = re.compile(rb"\r\n(connection|keep-alive|proxy-[^:\r]*|te|trailer|upgrade|transfer-encoding):([^\r]*)")


def relayed_head(
    head: bytes, extra: Iterable[tuple[bytes, bytes]] = (), *, keep_framing: bool = True, close: bool = False
) -> bytes:
    """A model's answer head (status line to blank line, as received) as the client gets it: hop-by-hop fields and
    those named in ``Connection`` removed (``Transfer-Encoding`` too unless ``keep_framing``: the body is relayed
    with its chunk framing), ``extra`` fields added, and ``Connection: close`` when the client's connection ends with
    this answer."""
    lower = head.lower()
    match = _HOP_LINE.search(lower)
    if match is None:
        stripped = head
    elif (
        match.group(1) == b"connection"  # the usual one: ``Connection: keep-alive`` (or close), alone
        and match.group(2).strip() in _PLAIN_CONNECTION
        # (none after it: either it is the last field, as nginx writes it, or a second search finds none)
        and (match.end() + 4 == len(lower) or _HOP_LINE.search(lower, match.end()) is None)
    ):
        stripped = head[: match.start()] + head[match.end() :]
    else:
        stripped = _without_hop_fields(head, lower, keep_framing=keep_framing)
    if not extra and not close:
        return stripped
    lines = [stripped[:-2]]
    for name, value in extra:
        lines += (name, b": ", value, b"\r\n")
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _without_hop_fields(head: bytes, lower: bytes, *, keep_framing: bool) -> bytes:
    """``head`` less every hop-by-hop field and those its ``Connection`` names (``lower``: ``head`` lower-cased)."""
    kept: list[bytes] = []
    cut = 0
    listed: frozenset[bytes] = frozenset()
    for match in _HOP_LINE.finditer(lower):
        name = match.group(1)
        if name == b"transfer-encoding" and keep_framing:
            continue
        if name == b"connection" and match.group(2).strip() not in _PLAIN_CONNECTION:
            listed |= raw_connection_tokens(match.group(2)) - _PLAIN_CONNECTION
        kept.append(head[cut : match.start()])
        cut = match.end()
    stripped = b"".join(kept) + head[cut:] if kept else head
    if listed:  # (rare: a Connection field naming other fields)
        names = b"|".join(re.escape(name) for name in sorted(listed))
        stripped = re.sub(rb"\r\n(?:" + names + rb"):[^\r]*", b"", stripped, flags=re.IGNORECASE)
    return stripped


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
