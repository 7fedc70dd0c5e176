"""Findings of the 2026-12-06 break-it review (stop 43), docs/bad_inputs.md §20: files that change under a running
command (the checkpoint, a LoRA, a song folder's files)."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from yue2_core.errors import AdapterError, CheckpointError


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def other_tiny(ckpt_dir) -> str:
    """A second tiny bf16 checkpoint: the same layout and size, other weights (seed 5)."""
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    path = ckpt_dir / "yue2_tiny_bf16_seed5.safetensors"
    if not path.exists():
        write_synthetic_checkpoint(str(path), profile="tiny", fmt="bf16", seed=5)
    return str(path)


def _after_ar_load(monkeypatch, action) -> None:
    """Run `action()` right after the engine has read the AR expert (while the checkpoint is still loading)."""
    import yue2_core.weights.checkpoint as ck
    real = ck.load_ar

    def load_ar(*args, **kwargs):
        out = real(*args, **kwargs)
        action()
        return out
    monkeypatch.setattr(ck, "load_ar", load_ar)


def test_a_lora_replaced_while_the_checkpoint_loads_is_recorded_as_the_file_applied(tmp_path, tiny_paths,
                                                                                    monkeypatch):
    """`generate --lora L` (or render, batch): L read, then replaced on disk (a trainer saving its next step under
    the same name) while the checkpoint's parts loaded. The song recorded the new file's sha256 beside the old file's
    weights, so `render` of it applied the new file without a word. Now the record is taken when the file is read."""
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    first = write_adapter("aitk", tmp_path / "first.safetensors", dims, seed=1)
    second = write_adapter("aitk", tmp_path / "second.safetensors", dims, seed=2)
    lora = tmp_path / "lora.safetensors"
    shutil.copyfile(first, lora)
    _after_ar_load(monkeypatch, lambda: os.replace(shutil.copyfile(second, tmp_path / "tmp"), lora))
    engine = YuE2Engine.load(tiny_paths["bf16"], device="cpu", loras=[(str(lora), 1.0, 1.0)], warm_up=False)
    (record,) = engine.weights["loras"]
    assert record["sha256"] == _sha(first) != _sha(lora)


def test_a_lora_changed_while_it_is_read_is_refused(tmp_path, tiny_paths, monkeypatch):
    """Replaced between its read and its record: neither file's hash is known to match the weights read."""
    import yue2_core.weights.lora.layouts as layouts
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    lora = write_adapter("aitk", tmp_path / "lora.safetensors", dims, seed=1)
    second = write_adapter("aitk", tmp_path / "second.safetensors", dims, seed=2)
    real = layouts.read_adapter

    def read_adapter(*args, **kwargs):
        out = real(*args, **kwargs)
        os.replace(second, lora)
        return out
    monkeypatch.setattr(layouts, "read_adapter", read_adapter)
    with pytest.raises(AdapterError, match="changed on disk while it was being read"):
        YuE2Engine.load(tiny_paths["bf16"], device="cpu", loras=[(str(lora), 1.0, 1.0)], warm_up=False)


def test_a_checkpoint_replaced_while_its_parts_load_is_refused(tmp_path, tiny_paths, other_tiny, monkeypatch):
    """The CLI engine read the AR from one file and the NAR / VAE from the file put at its path meanwhile, and made
    a song of the mix (the nodes refuse it: `_root_patcher`). Now refused once the parts are read."""
    from yue2_core.pipeline import YuE2Engine
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(tiny_paths["bf16"], ckpt)
    _after_ar_load(monkeypatch, lambda: os.replace(shutil.copyfile(other_tiny, tmp_path / "tmp"), ckpt))
    with pytest.raises(CheckpointError, match="changed on disk while it was being loaded .* may come from two files"):
        YuE2Engine.load(str(ckpt), device="cpu", warm_up=False)


def test_the_checkpoint_a_song_records_is_the_file_loaded(tmp_path, tiny_paths, other_tiny):
    """`generate` took the checkpoint's sample hash when it saved the song: a file put at the checkpoint's path while
    the song was made (minutes with real weights) was recorded as the one used, so `render` used it without the
    "not the file this song was made with" warning. Now the sample is taken at load."""
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.checkpoint import content_sample
    ckpt = tmp_path / "model.safetensors"
    shutil.copyfile(tiny_paths["bf16"], ckpt)
    loaded = content_sample(str(ckpt))
    engine = YuE2Engine.load(str(ckpt), device="cpu", parts=("ar",), warm_up=False)
    os.replace(shutil.copyfile(other_tiny, tmp_path / "tmp"), ckpt)
    assert content_sample(str(ckpt)) != loaded
    assert engine.info.to_dict()["sample_sha256"] == loaded
