"""The ``model`` form field of a ``multipart/form-data`` body (OpenAI's audio transcriptions and translations, image
edits), read as the body arrives: only up to the end of that field, so the rest (the file) can be streamed on.

``ModelField.feed`` takes the body piece by piece and returns the model once its part is complete; the bytes fed
are the caller's to keep and forward. A body whose ``model`` part does not end within ``MODEL_WITHIN`` bytes (a
client that sends the file first) is refused, as is one that ends without it: 400 naming the field. No I/O.
"""

from __future__ import annotations

import re

from flexinfer_proxy.domain.errors import ProxyError, invalid_request

#: How far into a multipart body the ``model`` part must end (the SDKs send the form fields before the file).
MODEL_WITHIN = 1024 * 1024
#: The longest part head read (its Content-Disposition and Content-Type lines).
_PART_HEAD_MAX = 8 * 1024

_BOUNDARY = re.compile(r'(?i)(?:^|;)\s*boundary\s*=\s*(?:"([^"]{1,70})"|([^\s;"]{1,70}))')
_NAME = re.compile(rb'(?i)\r\ncontent-disposition:[^\r]*?;\s*name\s*=\s*(?:"([^"\r]*)"|([^\s;\r]+))')


def multipart_boundary(content_type: bytes | None) -> bytes | None:
    """The boundary of a ``multipart/form-data`` Content-Type; None when the body is not multipart form data."""
    if content_type is None:
        return None
    text = content_type.decode("latin-1")
    kind, _, params = text.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return None
    match = _BOUNDARY.search(params)
    if match is None:
        raise invalid_request("the multipart/form-data Content-Type has no boundary")
    return (match.group(1) or match.group(2)).encode("latin-1")


class ModelField:
    """Finds the ``model`` field in a multipart body fed piece by piece (see the module docstring)."""

    def __init__(self, boundary: bytes) -> None:
        self._delimiter = b"\r\n--" + boundary
        self._buffer = b"\r\n"  # (so the first delimiter, at the very start, looks like every other one)
        self._search = 0  # where the next delimiter is looked for
        self._head_at: int | None = None  # a part's head starts here (after a delimiter), not read yet
        self._name: bytes | None = None  # the part being read (its head was read)
        self._value_at = 0

    def feed(self, data: bytes) -> str | None:
        """The model, once its part is complete; None while more is needed. Raises ProxyError 400."""
        buffer = self._buffer = self._buffer + data
        delimiter = self._delimiter
        while True:
            if self._head_at is not None:  # a part's head follows the delimiter's line end
                head_end = buffer.find(b"\r\n\r\n", self._head_at)
                if head_end < 0:
                    if len(buffer) - self._head_at > _PART_HEAD_MAX:
                        raise invalid_request("a multipart/form-data part head is too long")
                    return self._more(len(buffer))
                match = _NAME.search(buffer, self._head_at, head_end + 2)
                self._name = (match.group(1) or match.group(2)) if match else b""
                self._value_at = self._search = head_end + 4
                self._head_at = None
            found = buffer.find(delimiter, self._search)
            if found < 0:
                self._search = max(self._search, len(buffer) - len(delimiter))
                if self._name == b"model" and len(buffer) - self._value_at > 1024:
                    raise invalid_request("the multipart/form-data field 'model' is too long")
                return self._more(len(buffer))
            if self._name == b"model":
                model = buffer[self._value_at : found].decode("utf-8", "replace").strip()
                if not model:
                    raise invalid_request("the multipart/form-data field 'model' is empty")
                return model
            after = found + len(delimiter)
            if len(buffer) < after + 2:
                self._search = found
                return self._more(len(buffer))
            if buffer[after : after + 2] == b"--":
                raise no_model()  # the closing delimiter
            self._head_at = after
            self._name = None

    @staticmethod
    def _more(fed: int) -> None:
        if fed > MODEL_WITHIN:
            raise invalid_request(
                f"the multipart/form-data body has no complete 'model' field in its first {MODEL_WITHIN} bytes: "
                "send the 'model' field before the file"
            )
        return None


def no_model() -> ProxyError:
    return invalid_request(
        "the multipart/form-data body has no 'model' field (a model name, namespace/name, or a service label)"
    )
