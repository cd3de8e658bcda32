"""Backend presets of local mode: ``spec.backend`` and ``spec.source`` make the command line, the readiness path and
the environment of the model's process, as Kubernetes mode renders a Deployment from them (domain/rendering.py).

Pure: the table of engines, which engine serves a backend given the executables the adapter found, and the argv.
``spec.local.command`` still overrides a preset (and then follows the allow-list rule alone).

Every preset binds 127.0.0.1 on the port the actuator chose (``spec.endpoint.port`` or a free one) and serves the
model under its FlexInfer name (``--served-model-name`` / ``--alias``), so a client's ``"model": "<name>"`` works.
``{model}`` is where the weights are: the absolute path of ``spec.source``, or the Hugging Face id of an
``HF://org/name`` source for the engines that download by themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flexinfer_actuator.domain.rendering import DEFAULT_BACKENDS, RenderError, SourceKind, parse_source
from flexinfer_common.enums import ParkStrategy
from flexinfer_common.local_commands import ENGINES_SETTING, is_interpreter
from flexinfer_common.messages import RuntimeSpec

_LOOPBACK = ("--host", "127.0.0.1", "--port", "{port}")


@dataclass(frozen=True)
class LocalEngine:
    """One way to serve a backend on this machine."""

    id: str  # "llama-server", "llama-cpp-python", ...
    backend: str  # the spec.backend it serves
    program: str  # looked up on PATH; for a Python engine (``module``), the interpreter
    args: tuple[str, ...]  # after the program; {model}, {name}, {port}
    readiness_path: str
    health: str  # what the readiness path answers, for the docs and the messages
    module: str = ""  # a Python engine: ``<python> -m <module>``
    hf_args: tuple[str, ...] | None = None  # the args for an HF:// source; None: it cannot download (a path only)
    needs_source: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    sleep_args: tuple[str, ...] = ()  # parkStrategy Sleep
    sleep_env: Mapping[str, str] = field(default_factory=dict)


# In order of preference within a backend: llama.cpp's own server first (it has /health), then llama-cpp-python's.
LOCAL_ENGINES: tuple[LocalEngine, ...] = (
    LocalEngine(
        id="llama-server",
        backend="llama-cpp",
        program="llama-server",
        args=("--model", "{model}", "--alias", "{name}", *_LOOPBACK),
        hf_args=("-hf", "{model}", "--alias", "{name}", *_LOOPBACK),
        readiness_path="/health",
        health="503 while the model loads, 200 once loaded",
    ),
    LocalEngine(
        id="llama-cpp-python",
        backend="llama-cpp",
        program="python",
        module="llama_cpp.server",
        args=("--model", "{model}", "--model_alias", "{name}", *_LOOPBACK),
        readiness_path="/v1/models",
        health="no /health; the server listens only once the model is loaded, so /v1/models answering means ready",
    ),
    LocalEngine(
        id="vllm",
        backend="vllm",
        program="vllm",
        args=("serve", "{model}", "--served-model-name", "{name}", *_LOOPBACK),
        hf_args=("serve", "{model}", "--served-model-name", "{name}", *_LOOPBACK),
        readiness_path="/health",
        health="200 once the engine is up (the weights are loaded before it listens)",
        sleep_args=("--enable-sleep-mode",),
        sleep_env={"VLLM_SERVER_DEV_MODE": "1"},  # vLLM serves /sleep and /wake_up only in dev mode
    ),
    LocalEngine(
        id="sglang",
        backend="sglang",
        program="python",
        module="sglang.launch_server",
        args=("--model-path", "{model}", "--served-model-name", "{name}", *_LOOPBACK),
        hf_args=("--model-path", "{model}", "--served-model-name", "{name}", *_LOOPBACK),
        readiness_path="/health",
        health="200 once the model is loaded and a warm-up request passed",
    ),
    LocalEngine(
        id="infinity",
        backend="infinity",
        program="infinity_emb",
        args=("v2", "--model-id", "{model}", "--served-model-name", "{name}", *_LOOPBACK),
        hf_args=("v2", "--model-id", "{model}", "--served-model-name", "{name}", *_LOOPBACK),
        readiness_path="/health",
        health="200 once the model is loaded",
    ),
    LocalEngine(
        id="ollama",
        backend="ollama",
        program="ollama",
        args=("serve",),
        readiness_path=str(DEFAULT_BACKENDS["ollama"]["readinessPath"]),  # the same as Kubernetes mode's
        health="200 once the server is up; a model loads on its first request (and must have been pulled)",
        needs_source=False,
        env={"OLLAMA_HOST": "127.0.0.1:{port}"},
    ),
    LocalEngine(
        id="fake",
        backend="fake",
        program="flexinfer-fake-model",
        args=("--model", "{name}", "--port", "{port}"),
        readiness_path="/health",
        health="503 while it 'loads' (--startup-delay), then 200",
        needs_source=False,
    ),
)

LOCAL_BACKENDS: tuple[str, ...] = tuple(dict.fromkeys(e.backend for e in LOCAL_ENGINES))


def engines_for(backend: str) -> list[LocalEngine]:
    """The engines that can serve ``backend``, preferred first (empty: no local preset for it)."""
    return [e for e in LOCAL_ENGINES if e.backend == backend]


def engine_for_program(backend: str, program: str) -> LocalEngine | None:
    """The engine an executable named in ``FLEXINFER_LOCAL_ENGINES`` stands for: a Python interpreter runs the
    backend's Python engine (``-m llama_cpp.server``), anything else its executable engine (``llama-server``)."""
    python = is_interpreter(program)
    for engine in engines_for(backend):
        if bool(engine.module) == python:
            return engine
    return None


@dataclass(frozen=True)
class PresetLaunch:
    """What to start for a Model that names a backend and no ``spec.local.command``."""

    engine: LocalEngine
    argv: list[str]  # ``{port}`` still in it: the actuator chooses the port
    readiness_path: str
    env: dict[str, str]  # ``{port}`` still in it


class PresetError(ValueError):
    """The Model cannot be served by its backend's preset here; the message names the field or the setting."""


def choose_engine(backend: str, found: Mapping[str, str]) -> tuple[LocalEngine, str]:
    """The first engine of ``backend`` whose program the adapter ``found`` (engine id -> executable), with it."""
    engines = engines_for(backend)
    if not engines:
        known = ", ".join(LOCAL_BACKENDS)
        raise PresetError(
            f"spec.backend: {backend!r} has no local preset (local presets: {known}); give spec.local.command"
        )
    for engine in engines:
        if engine.id in found:
            return engine, found[engine.id]
    looked = "; ".join(
        f"{e.id}: {f'a Python with the {e.module} module' if e.module else f'{e.program!r} on PATH'}" for e in engines
    )
    raise PresetError(
        f"spec.backend {backend!r}: no engine found on this machine (looked for {looked}); install one, or name its "
        f"executable in {ENGINES_SETTING} ({backend}=/path/to/it), or give spec.local.command"
    )


def render_preset(spec: RuntimeSpec, *, engine: LocalEngine, executable: str) -> PresetLaunch:
    """The argv, readiness path and environment of ``engine`` (run by ``executable``) for ``spec``."""
    try:
        source = parse_source(spec.source)
    except RenderError as exc:
        raise PresetError(str(exc)) from None
    if not engine.needs_source:
        if source.kind is not SourceKind.NONE:
            raise PresetError(
                f"spec.source: the {engine.id} preset does not load a source (it serves the models `ollama pull` "
                "put in OLLAMA_MODELS); leave spec.source unset"
            )
        args = engine.args
        model = ""
    elif source.kind is SourceKind.NONE:
        raise PresetError(f"spec.source: required by backend {spec.backend!r} (an absolute path, or HF://org/name)")
    elif source.kind is SourceKind.PVC:
        raise PresetError(
            f"spec.source: {source.text!r}: pvc:// is Kubernetes mode's; local mode takes an absolute path or HF://"
        )
    elif source.kind is SourceKind.HUGGING_FACE:
        if engine.hf_args is None:
            raise PresetError(
                f"spec.source: {source.text!r}: the {engine.id} engine cannot download from Hugging Face; give the "
                "absolute path of the weights (a .gguf file)"
            )
        args, model = engine.hf_args, source.repo
    else:
        args, model = engine.args, source.path
    values = {"model": model, "name": spec.name}
    sleeping = spec.park_strategy is ParkStrategy.SLEEP
    argv = [executable, *(["-m", engine.module] if engine.module else []), *_fill(args, values)]
    if sleeping:
        argv += list(engine.sleep_args)
    env = {k: _fill((v,), values)[0] for k, v in engine.env.items()}
    if sleeping:
        env.update(engine.sleep_env)
    return PresetLaunch(engine=engine, argv=argv, readiness_path=spec.readiness_path or engine.readiness_path, env=env)


def _fill(args: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Substitute ``{model}`` and ``{name}`` (``{port}`` stays for the actuator)."""
    out = []
    for arg in args:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out
