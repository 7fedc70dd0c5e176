"""ComfyUI's `--novram` (VRAMState.NO_VRAM) and the YuE2 parts, in the installed host's python with the pack loaded as
ComfyUI loads it, no server (the VRAM state is process-wide).

Under NO_VRAM `comfy.model_management.load_models_gpu` gives every model 0.1 bytes of VRAM even with
`force_full_load=True`, and a ModelPatcher then moves none of the modules without ComfyUI's cast-on-the-fly ops — all
of the YuE2 parts' — while it records the model as loaded on the GPU: every song ran on the CPU without a word
(new-user review, stop 41; shown on an H100 in stop 42, docs/experiments/gpu_nodes_novram_h100_2026-12-06.json).
`nodes.model.load_whole` finishes such a load. This host has no GPU, so the harness makes ComfyUI take its GPU branch
for the CPU device (`is_device_cpu` answering False, the only change to ComfyUI) and checks ComfyUI's own accounting:
loaded bytes against the model's size, before and after. The GPU machine's check of the same path with real placement:
tests/nodes/gpu_nodes_check.py --novram."""
from __future__ import annotations

from nodes_testlib import TINY

HARNESS = r'''
import torch
import comfy.model_management as mm
import comfy.model_patcher
from yue2_nodes import loader
from yue2_nodes import model as ym
out = {}
mm.vram_state = mm.VRAMState.NO_VRAM
mm.is_device_cpu = lambda device: False  # ComfyUI's GPU branch of load_models_gpu for this host's only device

# ComfyUI alone: what load_models_gpu leaves (the case load_whole finishes)
holder = ym.PART_CLASSES["vae"]("vae", torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)),
                                torch.device("cpu"))
plain = comfy.model_patcher.ModelPatcher(holder, load_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                                         size=mm.module_size(holder))
mm.load_models_gpu([plain], memory_required=0, force_full_load=True)
out["comfy alone"] = [plain.loaded_size(), plain.model_size()]
ym.load_whole(plain)
out["finished"] = [plain.loaded_size(), plain.model_size()]
ym.load_whole(plain)  # already whole: nothing moves
out["again"] = plain.loaded_size()
mm.unload_all_models()

# ComfyUI unloads a whole part partially under memory pressure (free_memory -> LoadedModel.model_unload(bytes)), then
# the next stage reloads it: ComfyUI's --novram load leaves it partial with model_lowvram False (review 42)
holder = ym.PART_CLASSES["vae"]("vae", torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]),
                                torch.device("cpu"))
squeezed = comfy.model_patcher.ModelPatcher(holder, load_device=torch.device("cpu"),
                                            offload_device=torch.device("cpu"), size=mm.module_size(holder))
mm.load_models_gpu([squeezed], memory_required=0, force_full_load=True)
ym.load_whole(squeezed)
mm.current_loaded_models[0].model_unload(3 * mm.module_size(holder) // 8)
out["squeezed"] = [squeezed.loaded_size(), squeezed.model.model_lowvram]
mm.load_models_gpu([squeezed], memory_required=0, force_full_load=True)
ym.load_whole(squeezed)
out["reloaded"] = [squeezed.loaded_size(), squeezed.model_size(), squeezed.model.model_lowvram,
                   [m.model is squeezed for m in mm.current_loaded_models]]
mm.unload_all_models()

# the nodes' path: YuE2Model.load of each part, then a stage that uses them
model = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]  # the one file there
loaded = {}
for part in ("ar", "nar", "vae"):
    model.load((part,), 0)
    p = model.patcher(part)
    loaded[part] = [p.loaded_size(), p.model_size()]
out["parts"] = loaded
print("RESULT " + json.dumps(out))
'''


def test_novram_loads_each_part_whole(in_host, tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY), "tiny", "bf16")
    out = in_host(HARNESS, ckpts)
    loaded, size = out["comfy alone"]
    assert size > 0 and loaded < size, f"ComfyUI now loads whole under --novram ({out}); load_whole may be dropped"
    assert out["finished"] == [size, size] and out["again"] == size
    assert 0 < out["squeezed"][0] and out["squeezed"][1], out  # ComfyUI's partial unload happened
    loaded, size, lowvram, listed = out["reloaded"]
    assert loaded == size and lowvram is False and listed == [True], out
    for part, (loaded, size) in out["parts"].items():
        assert size > 0 and loaded == size, (part, loaded, size)
