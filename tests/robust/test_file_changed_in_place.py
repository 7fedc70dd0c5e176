"""Issue 20 item 6: a checkpoint (or a VAE / adapter file) truncated or overwritten in place after loading must not
crash the process (it gave SIGBUS: the weights were views of the file's memory map). Run in a child process, since a
SIGBUS would end pytest itself."""
from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import sys, torch
    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.vae_files import open_vae
    from yue2_core.pipeline import YuE2Engine, decode
    ckpt, vae_dir = sys.argv[1], sys.argv[2]  # ckpt: a private copy of the tiny bf16 file (seed 0)
    write_vae(vae_dir, layout="vendor-folder", variant="legacy", profile="tiny", seed=1)
    eng = YuE2Engine.load(ckpt, device="cpu")
    other = open_vae(vae_dir).load("cpu")
    with open(ckpt, "r+b") as f:
        f.truncate(1000)
    with open(vae_dir + "/model.safetensors", "r+b") as f:
        f.truncate(1000)
    cache = eng.ar.new_cache(1, 16)
    logits = eng.ar.prefill(torch.tensor([[1, 2, 3]]), cache)
    audio = decode(eng.vae, torch.zeros(4, 64)), decode(other, torch.zeros(4, 64))
    print("alive", bool(torch.isfinite(logits.float()).all()))
""")


def test_weights_do_not_depend_on_the_file_after_loading(tmp_path):
    from synthetic_cache import synthetic_copy
    ckpt = synthetic_copy(tmp_path / "c.safetensors", "tiny", "bf16", seed=0)  # the child truncates it
    proc = subprocess.run([sys.executable, "-c", CHILD, ckpt, str(tmp_path / "vae")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode} (-7 = SIGBUS): {proc.stderr[-2000:]}"
    assert "alive True" in proc.stdout


def test_a_bf16_tensor_relabelled_f16_is_refused(tmp_path):
    """Issue 20 item 12: same bytes, header says F16 instead of BF16 → refused by name, not rendered."""
    import json
    import struct

    import pytest

    from yue2_core.errors import CheckpointError
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from synthetic_cache import synthetic_copy
    path = tmp_path / "c.safetensors"
    synthetic_copy(str(path), "tiny", "bf16", seed=0)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    key = "text_encoders.model.layers.0.mlp.down_proj.weight"
    assert header[key]["dtype"] == "BF16"
    header[key]["dtype"] = "F16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))  # same header length: the data offsets stay valid
    assert len(text) == n
    path.write_bytes(raw[:8] + text + raw[8 + n:])
    with pytest.raises(CheckpointError, match=f"{key} is F16, but the YuE2 release stores every AR float tensor as BF16"):
        inspect_checkpoint(str(path))
