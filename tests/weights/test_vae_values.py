"""A custom VAE whose decoder values would decode to NaN audio is refused when it is opened, naming the file and the
tensor (yue2_core.weights.vae_files.check_values) — before, the AR and NAR stages ran a whole song and the VAE
decode then failed with "download the checkpoint again"."""
from __future__ import annotations

import os

import pytest
from safetensors.torch import save_file

from yue2_core.errors import CheckpointError
from yue2_core.weights import vae_files
from yue2_core.weights.checkpoint import file_identity
from yue2_core.weights.synthetic_vae import VAE, vae_config, vae_tensors, write_vendor_folder
from yue2_core.weights.vae_files import VAEFile, open_vae

KEY = "decoder.layers.6.layers.1.weight_v"  # the last stride block's transposed conv (weight norm over dim 0)


def _write(tmp_path, layout: str, tensors: dict) -> str:
    if layout == "vendor-folder":
        return write_vendor_folder(str(tmp_path / "vae"), tensors, vae_config())
    out = str(tmp_path / "vae.safetensors")
    save_file({(VAE + k if layout == "comfy-prefixed" else k): v.contiguous() for k, v in tensors.items()}, out)
    return out


def _damaged(how: str) -> dict:
    t = dict(vae_tensors("tiny", encoder=False))
    v = t[KEY].clone()
    if how == "nan":
        v[0, 0, 0] = float("nan")
    elif how == "inf":
        v[-1, -1, -1] = float("-inf")
    elif how == "zero-channel":
        v[1] = 0
    elif how == "zero":
        v.zero_()
    t[KEY] = v
    return t


@pytest.mark.parametrize("layout", ["vendor-folder", "vendor-file", "comfy-prefixed"])
@pytest.mark.parametrize("how, message", [
    ("nan", "holds NaN/inf \\(1 of its 64 values\\) — the file is damaged"),
    ("inf", "holds NaN/inf \\(1 of its 64 values\\)"),
    ("zero-channel", "is all zero for 1 of its 4 channels along dim 0 \\(e.g. channel 1\\): its norm is 0, so weight "
                     "norm g·v/‖v‖ divides 0/0"),
    ("zero", "is all zero for 4 of its 4 channels along dim 0 \\(e.g. channel 0\\)"),
])
def test_damaged_vae_refused_at_open(tmp_path, layout, how, message):
    path = _write(tmp_path, layout, _damaged(how))
    name = ("vae." if layout == "comfy-prefixed" else "") + KEY
    with pytest.raises(CheckpointError, match=f"VAE {path}: {name} {message}"):
        open_vae(path)


def test_intact_vae_checked_once_then_loads(tmp_path, monkeypatch):
    path = _write(tmp_path, "vendor-file", dict(vae_tensors("tiny", encoder=False)))
    vae = open_vae(path)
    calls = []
    monkeypatch.setattr(vae_files, "check_values", lambda *a, **k: calls.append(a))
    open_vae(path)  # the same file version: its values are not read again
    vae.load()
    assert calls == []


def test_load_checks_a_vae_file_not_opened_by_open_vae(tmp_path):
    """`VAEFile.load` checks the loaded values itself when the file version was never checked (a VAEFile built from
    another VAEFile's fields, a file replaced by one with the same key)."""
    good = _write(tmp_path, "vendor-file", dict(vae_tensors("tiny", encoder=False)))
    vae = open_vae(good)
    bad = str(tmp_path / "bad.safetensors")
    save_file({k: v.contiguous() for k, v in _damaged("nan").items()}, bad)
    other = VAEFile(**{**vae.__dict__, "path": bad, "weights": (bad,),
                       "key": ((os.path.abspath(bad), *file_identity(bad)),),
                       "sources": {k: (bad, k) for k in vae.sources}})
    with pytest.raises(CheckpointError, match=f"VAE {bad}: {KEY} holds NaN/inf"):
        other.load()


@pytest.mark.parametrize("how, message", [("nan", "holds NaN/inf"), ("zero", "is all zero for")])
def test_damaged_vae_inside_the_checkpoint_refused_at_load(tmp_path, how, message):
    """Break-it finding (stop 38): the all-in-one checkpoint's own `vae.decoder.*` was not value-checked, so a NaN
    or an all-zero weight_v there let the lead sheet, the music tokens and the render all run before the VAE decode
    failed. `YuE2Engine.load` now refuses it, naming the file and the tensor, as it does a separate VAE file."""
    import torch
    from safetensors import safe_open
    from yue2_core.errors import DamagedWeightsError
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    good = str(tmp_path / "good.safetensors")
    write_synthetic_checkpoint(good, profile="micro", fmt="bf16", seed=0)
    with safe_open(good, "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    v = tensors[VAE + KEY].clone()
    if how == "nan":
        v.view(-1)[0] = float("nan")
    else:
        v.zero_()
    bad = str(tmp_path / "bad.safetensors")
    save_file({**tensors, VAE + KEY: v}, bad, metadata=meta)
    with pytest.raises(DamagedWeightsError, match=f"VAE {bad}: vae.{KEY} {message}"):
        YuE2Engine.load(bad, device="cpu", dtype=torch.float32, parts=("vae",))
    engine = YuE2Engine.load(good, device="cpu", dtype=torch.float32, parts=("vae",))  # the intact file loads
    assert engine.vae is not None


def test_a_damaged_copy_over_a_checked_vae_is_checked_again(tmp_path, monkeypatch):
    """The value check's cache keys on `stat_identity` (ctime included), not the lenient `file_identity` that
    tells "changed on disk": a same-size copy with its time kept (`cp -p`) whose sampled bytes happen to match —
    a damaged tensor between the samples — is checked again, so a NaN there is refused, not decoded to NaN audio."""
    import shutil
    import time
    from yue2_core.weights import checkpoint
    monkeypatch.setattr(checkpoint, "SAMPLE_CHUNKS", 1)  # the sample sees only the header: the tensor lies past it
    path = _write(tmp_path, "vendor-file", dict(vae_tensors("tiny", encoder=False)))
    open_vae(path)
    bad = str(tmp_path / "bad.safetensors")
    save_file({k: v.contiguous() for k, v in _damaged("nan").items()}, bad)
    st = os.stat(path)
    assert os.path.getsize(bad) == st.st_size
    time.sleep(0.05)
    shutil.copyfile(bad, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    sample = checkpoint.content_sample(path)
    assert vae_files._file_key([path])[0][1:] == (st.st_size, st.st_mtime_ns, st.st_ino, sample)  # no "change"
    with pytest.raises(CheckpointError, match=f"{KEY} holds NaN/inf"):
        open_vae(path)
