"""Backend presets of local mode (services/actuator/.../domain/presets.py): one row per engine and per rule."""

from __future__ import annotations

import pytest

from flexinfer_actuator.domain.presets import (
    LOCAL_BACKENDS,
    LOCAL_ENGINES,
    PresetError,
    choose_engine,
    engine_for_program,
    engines_for,
    render_preset,
)
from flexinfer_actuator.domain.rendering import DEFAULT_BACKENDS
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_common.enums import ParkStrategy
from flexinfer_common.messages import RuntimeSpec
from flexinfer_common.settings import SettingsError, load_settings

GGUF = "/srv/models/smollm2-135m-instruct-q4_1.gguf"


def spec(backend: str, source: str | None = GGUF, **extra: object) -> RuntimeSpec:
    return RuntimeSpec(namespace="default", name="chat", backend=backend, source=source, **extra)  # type: ignore[arg-type]


ENGINE = {e.id: e for e in LOCAL_ENGINES}
LOOPBACK = ("--host", "127.0.0.1", "--port", "{port}")


@pytest.mark.parametrize(
    ("engine", "runtime", "argv", "readiness", "env"),
    [
        pytest.param(
            "llama-server",
            spec("llama-cpp"),
            ["/usr/local/bin/llama-server", "--model", GGUF, "--alias", "chat", *LOOPBACK],
            "/health",
            {},
            id="llama-server-path",
        ),
        pytest.param(
            "llama-server",
            spec("llama-cpp", "HF://ggml-org/SmolLM2-135M-GGUF"),
            ["/usr/local/bin/llama-server", "-hf", "ggml-org/SmolLM2-135M-GGUF", "--alias", "chat", *LOOPBACK],
            "/health",
            {},
            id="llama-server-downloads-hf",
        ),
        pytest.param(
            "llama-cpp-python",
            spec("llama-cpp"),
            ["/opt/venv/bin/python", "-m", "llama_cpp.server", "--model", GGUF, "--model_alias", "chat", *LOOPBACK],
            "/v1/models",
            {},
            id="llama-cpp-python-has-no-health",
        ),
        pytest.param(
            "vllm",
            spec("vllm", "HF://Qwen/Qwen3-8B"),
            ["/usr/bin/vllm", "serve", "Qwen/Qwen3-8B", "--served-model-name", "chat", *LOOPBACK],
            "/health",
            {},
            id="vllm-hf",
        ),
        pytest.param(
            "vllm",
            spec("vllm", "/srv/qwen3", park_strategy=ParkStrategy.SLEEP),
            ["/usr/bin/vllm", "serve", "/srv/qwen3", "--served-model-name", "chat", *LOOPBACK, "--enable-sleep-mode"],
            "/health",
            {"VLLM_SERVER_DEV_MODE": "1"},
            id="vllm-sleep-mode",
        ),
        pytest.param(
            "sglang",
            spec("sglang", "HF://Qwen/Qwen3-8B"),
            [
                "/opt/sglang/bin/python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "Qwen/Qwen3-8B",
                "--served-model-name",
                "chat",
                *LOOPBACK,
            ],
            "/health",
            {},
            id="sglang",
        ),
        pytest.param(
            "infinity",
            spec("infinity", "HF://sentence-transformers/all-MiniLM-L6-v2"),
            [
                "/usr/bin/infinity_emb",
                "v2",
                "--model-id",
                "sentence-transformers/all-MiniLM-L6-v2",
                "--served-model-name",
                "chat",
                *LOOPBACK,
            ],
            "/health",
            {},
            id="infinity",
        ),
        pytest.param(
            "ollama",
            spec("ollama", None),
            ["/usr/bin/ollama", "serve"],
            "/api/version",
            {"OLLAMA_HOST": "127.0.0.1:{port}"},
            id="ollama-binds-loopback",
        ),
        pytest.param(
            "fake",
            spec("fake", None),
            ["/venv/bin/flexinfer-fake-model", "--model", "chat", "--port", "{port}"],
            "/health",
            {},
            id="fake-model",
        ),
        pytest.param(
            "llama-cpp-python",
            spec("llama-cpp", readiness_path="/v1/models?ready=1"),
            ["/opt/venv/bin/python", "-m", "llama_cpp.server", "--model", GGUF, "--model_alias", "chat", *LOOPBACK],
            "/v1/models?ready=1",
            {},
            id="readiness-path-of-the-spec-wins",
        ),
    ],
)
def test_render_preset(engine: str, runtime: RuntimeSpec, argv: list[str], readiness: str, env: dict[str, str]) -> None:
    """The command runs the engine's executable where it was found (``argv[0]``), with the engine's arguments."""
    launch = render_preset(runtime, engine=ENGINE[engine], executable=argv[0])
    assert launch.argv == argv
    assert launch.readiness_path == readiness
    assert launch.env == env


@pytest.mark.parametrize(
    ("engine", "runtime", "field"),
    [
        pytest.param("llama-server", spec("llama-cpp", None), "spec.source: required", id="source-required"),
        pytest.param(
            "llama-cpp-python",
            spec("llama-cpp", "HF://ggml-org/SmolLM2-135M-GGUF"),
            "cannot download from Hugging Face",
            id="llama-cpp-python-needs-a-path",
        ),
        pytest.param("vllm", spec("vllm", "pvc://models/qwen"), "pvc:// is Kubernetes mode's", id="no-pvc-locally"),
        pytest.param("vllm", spec("vllm", "relative/path"), "spec.source", id="relative-source-refused"),
        pytest.param("ollama", spec("ollama", GGUF), "leave spec.source unset", id="ollama-takes-no-source"),
    ],
)
def test_render_preset_refuses_naming_the_field(engine: str, runtime: RuntimeSpec, field: str) -> None:
    with pytest.raises(PresetError, match=field):
        render_preset(runtime, engine=ENGINE[engine], executable="/x")


@pytest.mark.parametrize(
    ("backend", "found", "engine"),
    [
        pytest.param(
            "llama-cpp",
            {"llama-server": "/a/llama-server", "llama-cpp-python": "/v/python"},
            "llama-server",
            id="llama-server-preferred",
        ),
        pytest.param("llama-cpp", {"llama-cpp-python": "/v/python"}, "llama-cpp-python", id="llama-cpp-python-else"),
        pytest.param("vllm", {"vllm": "/b/vllm"}, "vllm", id="vllm"),
    ],
)
def test_choose_engine(backend: str, found: dict[str, str], engine: str) -> None:
    chosen, executable = choose_engine(backend, found)
    assert chosen.id == engine and executable == found[engine]


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        pytest.param("llama-cpp", "FLEXINFER_LOCAL_ENGINES", id="nothing-found-says-the-setting"),
        pytest.param("mlc-llm", "has no local preset", id="kubernetes-only-backend"),
    ],
)
def test_choose_engine_refuses(backend: str, message: str) -> None:
    with pytest.raises(PresetError, match=message):
        choose_engine(backend, {})


@pytest.mark.parametrize(
    ("backend", "program", "engine"),
    [
        pytest.param("llama-cpp", "/opt/llama.cpp/build/bin/llama-server", "llama-server", id="an-executable"),
        pytest.param("llama-cpp", "/opt/venv/bin/python3.11", "llama-cpp-python", id="an-interpreter"),
        pytest.param("sglang", "python", "sglang", id="python-engine"),
        pytest.param("sglang", "/usr/bin/sglang", None, id="sglang-runs-on-python-only"),
    ],
)
def test_engine_for_program(backend: str, program: str, engine: str | None) -> None:
    found = engine_for_program(backend, program)
    assert (found.id if found else None) == engine


def test_every_local_backend_is_a_kubernetes_backend_with_the_same_readiness_where_the_engine_is_the_same() -> None:
    """One table of engines: a local preset's backend name means what it means in Kubernetes mode."""
    assert set(LOCAL_BACKENDS) <= set(DEFAULT_BACKENDS)
    for engine in ("llama-server", "vllm", "ollama", "fake"):
        backend = ENGINE[engine].backend
        assert ENGINE[engine].readiness_path == DEFAULT_BACKENDS[backend].get("readinessPath", "/health"), engine
    assert [e.id for e in engines_for("llama-cpp")] == ["llama-server", "llama-cpp-python"]


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        pytest.param("FLEXINFER_LOCAL_RUN_AS", "no-such-user-here", "no such user", id="run-as-unknown-user"),
        pytest.param("FLEXINFER_LOCAL_ENGINES", "mlc-llm=/opt/mlc", "no local preset for mlc-llm", id="engine-unknown"),
        pytest.param("FLEXINFER_LOCAL_ENGINES", "llama-cpp=bin/llama-server", "absolute path", id="engine-relative"),
        pytest.param("FLEXINFER_LOCAL_ENGINES", "llama-cpp", "name=value", id="engine-not-a-pair"),
    ],
)
def test_a_bad_local_setting_stops_the_actuator_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, error: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=f"{variable}.*{error}"):
        load_settings(ActuatorSettings)


def test_local_settings_defaults_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEXINFER_LOCAL_RUN_AS", raising=False)
    assert load_settings(ActuatorSettings).local_run_as == "nobody"
    monkeypatch.setenv("FLEXINFER_LOCAL_ENGINES", "llama-cpp=/opt/llama/llama-server, vllm=vllm")
    assert load_settings(ActuatorSettings).local_engines == {"llama-cpp": "/opt/llama/llama-server", "vllm": "vllm"}
