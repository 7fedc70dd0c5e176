"""Stop 53: the int8 file's NAR is W8A8 by default on Hopper GPUs (YUE2_NAR_LINEARS=auto). A model with adapters that
reach the NAR must not patch that W8A8 root (fp32 side deltas beside every product, ≈ 0.8 s a song for rank 64):
its NAR comes from a second root with bf16 layers, which the adapters patch merged, as before; the model without
adapters and one whose adapters leave the NAR keep the W8A8 root; each song records what its NAR used. No GPU here:
the first NAR read is marked for W8A8 as `nar.prepare_linears` marks it on a Hopper GPU."""
from __future__ import annotations

from nodes_testlib import TINY_INT8

AUTO_LORA = r'''
from yue2_nodes import loader
from yue2_nodes import model as ym
from yue2_core import nar as N
from yue2_core.weights.lora import synthetic as S
from yue2_core.weights.lora.layouts import read_adapter
from yue2_core.weights.lora.apply import Applied
calls = []
real = ym.load_nar


def marked(*args, **kwargs):
    m = real(*args, **kwargs)
    if not calls:
        N.int8_linears(m)  # the first NAR read: the W8A8 root, as prepare_linears leaves it with auto on Hopper
    calls.append(1)
    return m


ym.load_nar = marked
model = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]
base = model.patcher("nar")
path = S.write_adapter("ms-raw-nar", os.path.join(WORK, "ms.safetensors"), model.dims, rank=2, seed=2)
adapter = read_adapter(str(path), model.dims)
lora = model.derive(adapter=Applied(adapter, 1.0, 1.0))
ar_only = model.derive(adapter=Applied(adapter, 1.0, 0.0))
out = {"base": N.keeps_w8a8(base.model.engine_module),
       "lora": N.keeps_w8a8(lora.patcher("nar").model.engine_module),
       "ar_only": N.keeps_w8a8(ar_only.patcher("nar").model.engine_module),
       "roots": sorted(model.root._patchers), "reads": len(calls),
       "rec_base": model.weights_record().get("nar_linears"), "rec_lora": lora.weights_record().get("nar_linears"),
       "rec_ar_only": ar_only.weights_record().get("nar_linears")}
print("RESULT " + json.dumps(out))
'''


def test_adapters_on_the_nar_take_a_bf16_root_under_auto(in_host, tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_copy
    synthetic_copy(str(ckpts / TINY_INT8), "tiny", "int8")
    out = in_host(AUTO_LORA.replace("WORK", repr(str(tmp_path))), ckpts)
    assert out["base"] and out["ar_only"] and not out["lora"], out
    assert out["roots"] == ["nar", "nar:bf16"] and out["reads"] == 2, out
    assert out["rec_base"] == "w8a8" and out["rec_ar_only"] == "w8a8" and out["rec_lora"] is None, out
