"""A model without ``spec.gpu.memory`` whose weights are a local file or folder gets an estimate from their size,
shown as estimated; anything else takes a whole device."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer_scheduler.adapters.weights import facts_of, local_weights_size
from flexinfer_scheduler.domain.manifests import ESTIMATE_FLOOR, estimate_memory

MiB = 1 << 20


def manifest(source: str | None, memory: str | None = None) -> dict[str, object]:
    gpu: dict[str, object] = {"shared": "card"}
    if memory is not None:
        gpu["memory"] = memory
    spec: dict[str, object] = {"gpu": gpu}
    if source is not None:
        spec["source"] = source
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "m"}, "spec": spec}


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as out:
        out.truncate(size)  # a sparse file: the size without the disk
    return path


def test_a_gguf_file_is_estimated_from_its_size(tmp_path: Path) -> None:
    weights = sparse(tmp_path / "model.Q4_K_M.gguf", 4_000 * MiB)
    facts = facts_of(manifest(str(weights)))
    assert facts.memory_estimated and facts.memory == estimate_memory(4_000 * MiB) == int(4_800 * MiB) + ESTIMATE_FLOOR
    assert facts_of(manifest(f"file://{weights}")).memory == facts.memory


def test_a_folder_sums_its_weight_files_only(tmp_path: Path) -> None:
    sparse(tmp_path / "model-00001-of-00002.safetensors", 3_000 * MiB)
    sparse(tmp_path / "model-00002-of-00002.safetensors", 1_000 * MiB)
    (tmp_path / "tokenizer.json").write_text("{}" * 1000)
    assert local_weights_size(str(tmp_path)) == 4_000 * MiB


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(None, id="no-source"),
        pytest.param("hf://Qwen/Qwen3-8B", id="a-hugging-face-id"),
        pytest.param("relative/model.gguf", id="a-relative-path"),
        pytest.param("/nonexistent/model.gguf", id="a-path-this-machine-does-not-have"),
    ],
)
def test_no_local_weights_no_estimate(source: str | None) -> None:
    facts = facts_of(manifest(source))
    assert facts.memory is None and not facts.memory_estimated  # a whole device in a group with a capacity


def test_a_declared_memory_wins_over_the_estimate(tmp_path: Path) -> None:
    weights = sparse(tmp_path / "model.gguf", 4_000 * MiB)
    facts = facts_of(manifest(str(weights), memory="6Gi"))
    assert facts.memory == 6 << 30 and not facts.memory_estimated


def test_a_file_that_is_not_weights_is_not_counted(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x" * 100)
    assert local_weights_size(str(tmp_path / "notes.txt")) is None
    assert local_weights_size(str(tmp_path)) is None
