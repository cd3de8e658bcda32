"""The size of a model's weights on this machine (the I/O behind ``domain.manifests.with_estimate``): a model that
declares no ``spec.gpu.memory`` and whose ``spec.source`` is a local file or folder of weights gets an estimate from
their size, shown as estimated. Anything else (a URL, a Hugging Face id, a path this scheduler cannot see, as in
Kubernetes mode) has none: the model then takes a whole device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flexinfer_scheduler.domain.manifests import SpecFacts, spec_facts, with_estimate

#: the files that hold weights (a folder's other files, tokenizers and configs, are not counted)
WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth")


def local_weights_size(source: str | None) -> int | None:
    """Bytes of the weights at ``source`` (an absolute path or ``file://`` URL: a weights file, or a folder whose
    top-level weight files are summed); None when there is no such local file."""
    if not source:
        return None
    text = source.removeprefix("file://")
    path = Path(text)
    if not path.is_absolute():
        return None
    try:
        if path.is_file():
            return path.stat().st_size if path.suffix.lower() in WEIGHT_SUFFIXES else None
        if path.is_dir():
            sizes = [p.stat().st_size for p in path.iterdir() if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES]
            return sum(sizes) if sizes else None
    except OSError:
        return None
    return None


def facts_of(manifest: dict[str, Any] | str) -> SpecFacts:
    """A manifest's facts as both stores load them: with ``memory`` estimated from local weights when undeclared."""
    facts = spec_facts(manifest)
    if facts.memory is not None:
        return facts
    return with_estimate(facts, local_weights_size(facts.source))
