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
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY_INT8), "tiny", "int8")
    out = in_host(AUTO_LORA.replace("WORK", repr(str(tmp_path))), ckpts)
    assert out["base"] and out["ar_only"] and not out["lora"], out
    assert out["roots"] == ["nar", "nar:bf16"] and out["reads"] == 2, out
    assert out["rec_base"] == "w8a8" and out["rec_ar_only"] == "w8a8" and out["rec_lora"] is None, out


LOAD_SONG_NOTES = r'''
import torch
from yue2_nodes import loader, songs
from yue2_core import nar as N
from yue2_core.fast import w8a8
from yue2_core.weights.lora import synthetic as S
from yue2_core.weights.lora.layouts import read_adapter
from yue2_core.weights.lora.apply import Applied
folder_paths.set_output_directory(OUTPUT)


def notes(model):
    return {name: [line for line in songs.YuE2LoadSong.execute(model, name).ui["text"][0].splitlines()
                   if "NAR multiplied" in line] for name in ("plain_00001", "w8a8_00001")}


model = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]
out = {"cpu": notes(model)}
N.w8a8_pays = lambda device=None: True  # a Hopper GPU: auto keeps the codes (nar.prepare_linears)
w8a8.available = lambda: True
hopper = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]
hopper.device = torch.device("cuda", 0)  # the compute device Load Song's note asks of (nothing is read onto it)
out["hopper"] = notes(hopper)
path = S.write_adapter("ms-raw-nar", os.path.join(WORK, "ms.safetensors"), hopper.dims, rank=2, seed=2)
out["hopper_nar_lora"] = notes(hopper.derive(adapter=Applied(read_adapter(str(path), hopper.dims), 1.0, 1.0)))
print("RESULT " + json.dumps(out))
'''


def test_load_song_notes_another_nar_arithmetic(in_host, tmp_path, older_song):
    """Load Song notes, in the command line `render`'s words (`song_weights.nar_linears_note`), a song whose NAR
    multiplied otherwise (config.json "weights"."nar_linears") than the model output's will (`YuE2Model.nar_linears`:
    W8A8 for the int8 file on a Hopper GPU under auto, bf16 layers on the CPU and for adapters reaching the NAR);
    none where they agree (stop-53 review: it said nothing, only the command line's `render` did)."""
    from yue2_core.__main__ import main
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY_INT8), "tiny", "int8")
    songs = tmp_path / "output" / "yue2"
    assert main(["generate", "--style", "pop", "--lyrics", "la", "--max-seconds", "1", "--max-abc-tokens", "8",
                 "--steps", "2", "--device", "cpu", "--offline", "--checkpoint", str(ckpts / TINY_INT8),
                 "--output", str(songs / "plain_00001")]) == 0
    older_song(songs / "plain_00001", songs / "w8a8_00001", lambda c: c["weights"].update(nar_linears="w8a8"))
    out = in_host(LOAD_SONG_NOTES.replace("OUTPUT", repr(str(tmp_path / "output")))
                  .replace("WORK", repr(str(tmp_path))), ckpts)
    for model in ("cpu", "hopper_nar_lora"):
        assert out[model]["plain_00001"] == [], out
        [note] = out[model]["w8a8_00001"]
        assert note.startswith("note: this song's NAR multiplied with W8A8 products") and \
            "the model output renders with bf16 layers" in note and "set YUE2_NAR_LINEARS=w8a8" in note, out
    assert out["hopper"]["w8a8_00001"] == [], out
    [note] = out["hopper"]["plain_00001"]
    assert "multiplied with bf16 layers; the model output renders with W8A8 products" in note and \
        "set YUE2_NAR_LINEARS=bf16" in note, out


FIRST_LORA = r'''
from yue2_nodes import loader
from yue2_nodes import model as ym
from yue2_core.weights.lora import synthetic as S
from yue2_core.weights.lora.layouts import read_adapter
from yue2_core.weights.lora.apply import Applied
reads = []
real = ym.load_nar
ym.load_nar = lambda *a, **k: reads.append(1) or real(*a, **k)
ym.YuE2Model._root_keeps_int8 = lambda self: True  # an int8 file's NAR on a Hopper GPU, auto: the root is W8A8
model = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]
path = S.write_adapter("ms-raw-nar", os.path.join(WORK, "ms.safetensors"), model.dims, rank=2, seed=2)
lora = model.derive(adapter=Applied(read_adapter(str(path), model.dims), 1.0, 1.0))
lora.patcher("nar")
print("RESULT " + json.dumps({"reads": len(reads), "roots": sorted(model.root._patchers)}))
'''


def test_a_lora_model_never_reads_the_w8a8_root_nar(in_host, tmp_path):
    """A workflow whose only model has NAR adapters reads the NAR once, straight into the bf16 root: it never reads
    (1.4 GB) and prepares the W8A8 root it would not use."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY_INT8), "tiny", "int8")
    out = in_host(FIRST_LORA.replace("WORK", repr(str(tmp_path))), ckpts)
    assert out == {"reads": 1, "roots": ["nar:bf16"]}, out
