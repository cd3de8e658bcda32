"""The ``model`` field of a multipart/form-data body, found as the body arrives (any split of it)."""

from __future__ import annotations

import pytest

from flexinfer_proxy.domain.errors import ProxyError
from flexinfer_proxy.domain.multipart import MODEL_WITHIN, ModelField, multipart_boundary

B = b"XyZ"


def body(*parts: tuple[str, bytes]) -> bytes:
    out = b""
    for name, value in parts:
        extra = b'; filename="f.wav"\r\nContent-Type: audio/wav' if name == "file" else b""
        out += b"--" + B + b'\r\nContent-Disposition: form-data; name="' + name.encode() + b'"' + extra
        out += b"\r\n\r\n" + value + b"\r\n"
    return out + b"--" + B + b"--\r\n"


def feed(data: bytes, step: int) -> tuple[str | None, int]:
    field = ModelField(B)
    for at in range(0, len(data), step):
        model = field.feed(data[at : at + step])
        if model is not None:
            return model, at + step
    return None, len(data)


@pytest.mark.parametrize("step", [1, 3, 64, 100_000])
@pytest.mark.parametrize(
    ("data", "model"),
    [
        pytest.param(body(("model", b"whisper-1"), ("file", b"\x00" * 5000)), "whisper-1", id="model-first"),
        pytest.param(body(("language", b"en"), ("model", b"ns/m"), ("file", b"x")), "ns/m", id="after-a-field"),
        pytest.param(body(("file", b"--XyZ not quite\r\n--Xy"), ("model", b"m")), "m", id="file-first-tricky"),
        pytest.param(body(("model", b"  chat \r\n")), "chat", id="trimmed"),
    ],
)
def test_the_model_is_found_before_the_rest_is_read(data: bytes, model: str, step: int) -> None:
    found, read = feed(data, step)
    assert found == model
    if step == 1 and data.index(b'"model"') < data.index(b"--XyZ--"):
        assert read < len(data) or data.endswith(b"--XyZ--\r\n")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(body(("file", b"x")), "no 'model' field", id="no-model"),
        pytest.param(body(("model", b"")), "is empty", id="empty-model"),
        pytest.param(body(("file", b"x" * (MODEL_WITHIN + 10)), ("model", b"m")), "before the file", id="too-far"),
        pytest.param(body(("model", b"m" * 5000)), "too long", id="model-too-long"),
    ],
)
def test_refusals_name_the_field(data: bytes, says: str) -> None:
    with pytest.raises(ProxyError) as caught:
        feed(data, 4096)
    assert caught.value.status == 400 and says in caught.value.message


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        pytest.param(b"multipart/form-data; boundary=abc", b"abc", id="plain"),
        pytest.param(b'Multipart/Form-Data; charset=utf-8; boundary="a b"', b"a b", id="quoted"),
        pytest.param(b"application/json", None, id="json"),
        pytest.param(None, None, id="none"),
    ],
)
def test_multipart_boundary(content_type: bytes | None, boundary: bytes | None) -> None:
    assert multipart_boundary(content_type) == boundary


def test_multipart_without_a_boundary_is_refused() -> None:
    with pytest.raises(ProxyError):
        multipart_boundary(b"multipart/form-data")
