"""Found by the stop-52 break-it review (docs/bad_inputs.md §41): `comfy_quant` markers that lie about the tensor
beside them — a ConvRot group other than the one the codes were made in, a value given twice, a marker on a norm."""
from __future__ import annotations

import json

import pytest
import torch

from robust_helpers import rewrite
from test_cli import main_inprocess
from yue2_core.errors import CheckpointError
from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar
from yue2_core.weights.quant import parse_marker, quantize

AR = "text_encoders.model."
NAR = "model.diffusion_model."
DOWN = AR + "layers.0.mlp.down_proj.comfy_quant"


def _marker(value: dict | bytes) -> torch.Tensor:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return torch.tensor(list(raw), dtype=torch.uint8)


def _release(group: int = 256) -> dict:
    return {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}


def test_a_marker_whose_group_disagrees_with_the_files_is_refused(micro_paths, tmp_path, capsys):
    """One marker edited from 256 to 64 (a power of 4 that divides the layer's 512 columns, so every earlier check
    passed): the codes made in groups of 256 were read in groups of 64 — other weights — and the int8 self-check
    passed too, since it builds its reference with the marker's group: `inspect` and `load_ar` took the file without
    a word. Now refused at inspect (and `inspect FILE` exits 2 with one error line) naming the marker, its group and
    the file's. A smaller group on a layer the usual one does not fit (vae2llm, 64 input columns, quantized in groups
    of 64) still loads."""
    lie = tmp_path / "group64.safetensors"
    rewrite(micro_paths["int8"], lie, lambda t, m: t.__setitem__(DOWN, _marker(_release(64))))
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(str(lie))
    text = str(err.value)
    assert text.startswith(f"{DOWN}: convrot_groupsize 64, but 20 of the file's 21 quantization markers say 256")
    assert "512 input columns" in text and "damaged or edited marker" in text, text
    rc, stderr = main_inprocess(capsys, "inspect", lie)
    assert rc == 2 and f"{DOWN}: convrot_groupsize 64" in stderr and "Traceback" not in stderr, stderr

    def narrow(t, m):  # a quantizer that also took vae2llm, whose 64 columns cannot hold a 256-group
        q, s = quantize(t[NAR + "vae2llm.weight"].float(), 64)
        t[NAR + "vae2llm.weight"], t[NAR + "vae2llm.weight_scale"] = q, s
        t[NAR + "vae2llm.comfy_quant"] = _marker(_release(64))
    ok = tmp_path / "vae2llm64.safetensors"
    rewrite(micro_paths["int8"], ok, narrow)
    info = inspect_checkpoint(str(ok))
    assert info.quant_nar["vae2llm"] == 64 and info.quant_ar["model.layers.0.mlp.down_proj"] == 256
    assert load_ar(info) is not None  # and its self-check passes


@pytest.mark.parametrize("raw, said", [
    (b'{"format": "int4_tensorwise", "format": "int8_tensorwise", "convrot": true}', "names 'format' twice"),
    (b'{"format": "int8_tensorwise", "convrot": true, "convrot": false}', "names 'convrot' twice"),
    (json.dumps({**_release(), "params": {"convrot": False}}).encode(),
     'gives convrot twice, true at its top level and false under "params"'),
    (json.dumps({**_release(256), "params": {"convrot_groupsize": 64}}).encode(),
     'gives convrot_groupsize twice, 256 at its top level and 64 under "params"'),
    (json.dumps({**_release(), "params": {"convrot": 1}}).encode(),
     'gives convrot twice, true at its top level and 1 under "params"'),
], ids=["format-twice", "convrot-twice", "convrot-params", "group-params", "convrot-1-params"])
def test_a_marker_giving_a_value_twice_is_refused(raw, said):
    """A marker naming a key twice was read with the last value (json.loads), and one giving `convrot` /
    `convrot_groupsize` both at its top level and under `params` with other values was read with the top level's —
    ComfyUI reads either place (comfyui_builtin.md §9.1), so another reader could take the other value: int4 codes
    read as int8, or codes made in groups of 64 read in 256. Refused, naming the key and both values; the same value
    in both places is one statement and still reads."""
    with pytest.raises(CheckpointError) as err:
        parse_marker(raw, DOWN)
    assert str(err.value).startswith(f"{DOWN}: the comfy_quant marker {said}"), str(err.value)
    assert '{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}' in str(err.value)
    same = {**_release(64), "params": {"convrot": True, "convrot_groupsize": 64}}
    assert parse_marker(json.dumps(same).encode(), DOWN) == 64


def test_a_marker_giving_a_value_twice_is_named_by_inspect(micro_paths, tmp_path):
    """The same through a file: the error names the marker tensor (was: the file loaded)."""
    path = tmp_path / "dup.safetensors"
    raw = b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 64, "convrot_groupsize": 256}'
    rewrite(micro_paths["int8"], path, lambda t, m: t.__setitem__(DOWN, _marker(raw)))
    with pytest.raises(CheckpointError, match=rf"^{DOWN}: the comfy_quant marker names 'convrot_groupsize' twice"):
        inspect_checkpoint(str(path))


@pytest.mark.parametrize("weight", ["bf16", "int8"])
def test_a_marker_beside_a_norm_says_what_a_marker_may_sit_beside(micro_paths, tmp_path, weight):
    """A marker on `input_layernorm` (beside its BF16 [256] weight, or with that weight made I8 codes and given a
    scale): refused as before, now with the reason — a norm is never quantized, only [out, in] weights of linear
    and embedding layers are. Was, for the int8 norm, a self-contradicting `shape mismatch for
    ….input_layernorm.weight_scale: expected [256, 1] (one scale per row of the int8 weight [256]), got [256, 1]`,
    and for the BF16 one `… needs .weight (I8); found BF16`, which asked for int8 codes on a norm."""
    norm = AR + "layers.0.input_layernorm."

    def edit(t, m):
        t[norm + "comfy_quant"] = _marker(_release())
        if weight == "int8":
            t[norm + "weight"] = torch.full((256,), 127, dtype=torch.int8)
            t[norm + "weight_scale"] = torch.full((256, 1), 1 / 127)
    path = tmp_path / f"norm_{weight}.safetensors"
    rewrite(micro_paths["int8"], path, edit)
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(str(path))
    text = str(err.value)
    dtype = "BF16" if weight == "bf16" else "I8"
    assert text.startswith(f"{norm}comfy_quant: a quantization marker beside {norm}weight, which is {dtype} [256]: "
                           "only [out, in] weights of linear and embedding layers are int8 ConvRot codes"), text
    assert "never a norm" in text and "shape mismatch" not in text


def test_every_variable_the_test_script_exports_is_known_to_the_switch_check(monkeypatch):
    """scripts/test.sh exports YUE2_* variables for the tests (the host, the browser, the GPU image's Triton …); the
    switch check warns about any YUE2_ name it does not know, and the CLI tests assert a clean stderr. Stop 52: the
    new YUE2_TRITON_GPU_IMAGE was unknown, and 11 CLI tests failed in CI on that warning. Every exported name (and
    every one assigned then exported) must be known."""
    import re
    from pathlib import Path
    from yue2_core import switch_check
    text = (Path(__file__).resolve().parents[2] / "scripts" / "test.sh").read_text(encoding="utf-8")
    names = set(re.findall(r"export (YUE2_[A-Z0-9_]+)", text))
    assert "YUE2_TRITON_GPU_IMAGE" in names and len(names) >= 8, names
    for name in list(__import__("os").environ):
        if name.startswith("YUE2_"):
            monkeypatch.delenv(name)
    for name in names:
        monkeypatch.setenv(name, "1")
    warned = [w for w in switch_check.check_environment(None) if "not a switch of this pack" in w]
    assert not warned, warned
