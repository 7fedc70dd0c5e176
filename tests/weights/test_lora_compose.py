"""Adapters that meet (break-it review, stop 40): a replacement and another entry's deltas on one module give the same
weights in either order; two different replacements of one module, an FL AR file given with its own NAR file, and a
file holding both fused and split keys of one module are refused by name; an entry that patches nothing is said;
model and VAE files given as adapters are named with the option they belong to; `--lora PATH:1:` is a parse error.
Synthetic files on the tiny geometry (yue2_core/weights/lora/synthetic.py); the maths against fp64."""
from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from yue2_core.errors import AdapterError
from yue2_core.weights.lora import synthetic as S
from yue2_core.weights.lora.apply import Applied, SideDelta, check_stack, merge_into, module_items, stack_notes
from yue2_core.weights.lora.layouts import read_adapter
from yue2_core.weights.lora.model import BiasDiff, Diff, LowRank, Replace

DIMS = S.profile_dims("tiny")


def _read(layout, path, **kw):
    return read_adapter(S.write_adapter(layout, path, DIMS, **kw), DIMS)


def test_a_replacement_and_another_entrys_deltas_add_in_either_order(tmp_path):
    """Mothersuperior's NAR joint replaces vae2llm / llm2vae; a Comfy-native file has a .diff / .diff_b on vae2llm and
    a LoRA on llm2vae. Was: whichever came later won (the replacement's copy erased the deltas before it)."""
    ms = _read("ms-raw-nar", tmp_path / "ms.safetensors")
    cn = _read("comfy-native", tmp_path / "cn.safetensors")
    g = torch.Generator().manual_seed(7)
    base = {"vae2llm": torch.randn(DIMS.hidden, DIMS.latent_dim, generator=g) * 0.02,
            "llm2vae": torch.randn(DIMS.latent_dim, DIMS.hidden, generator=g) * 0.02}
    merged = []
    for order in ((ms, cn), (cn, ms)):  # merge_into: the float layers' arithmetic (CLI and ComfyUI's patcher)
        items = module_items([Applied(a, 1.0, 0.7) for a in order], "nar")
        merged.append({**{f"{m}.weight": merge_into(w.clone(), items[m]) for m, w in base.items()},
                       **{f"{m}.bias": merge_into(torch.zeros(w.shape[0]), items[m], bias=True)
                          for m, w in base.items()}})
    assert all(torch.equal(merged[0][k], merged[1][k]) for k in merged[0])
    rep = {p.module: p.delta for p in ms.patches if isinstance(p.delta, Replace)}
    want_w = {m: d.weight.double() for m, d in rep.items()}
    want_b = {m: d.bias.double() for m, d in rep.items()}
    for p in cn.patches:
        if p.module in want_w and isinstance(p.delta, BiasDiff):
            want_b[p.module] += 0.7 * p.delta.delta.double() * p.delta.scale
        elif p.module in want_w:
            want_w[p.module] += 0.7 * p.delta.dense()
    for module in want_w:
        assert torch.allclose(merged[0][f"{module}.weight"].double(), want_w[module], atol=1e-6)
        assert torch.allclose(merged[0][f"{module}.bias"].double(), want_b[module], atol=1e-6)
    # the int8 path (a replaced layer's SideDelta): the replacement plus the deltas, in either order
    x = torch.randn(3, DIMS.hidden, generator=torch.Generator().manual_seed(8))
    outs = []
    for order in ((ms, cn), (cn, ms)):
        items = module_items([Applied(a, 1.0, 0.7) for a in order], "nar")["llm2vae"]
        side = SideDelta.build(items, DIMS.latent_dim, DIMS.hidden)
        outs.append(side.apply(x, lambda: pytest.fail("a replaced layer has no base output")).double())
    want = x.double() @ want_w["llm2vae"].T + want_b["llm2vae"]
    assert torch.allclose(outs[0], outs[1], atol=1e-6) and torch.allclose(outs[0], want, atol=1e-5)
    notes = stack_notes([Applied(cn, 1.0, 0.7), Applied(ms, 1.0, 0.7)])
    assert any(f"{ms.path} replaces NAR vae2llm; the deltas of {cn.path} on it are added to that replacement" in n
               for n in notes), notes
    assert isinstance(next(p for p in cn.patches if p.module == "vae2llm").delta, (Diff, BiasDiff))
    assert isinstance(next(p for p in cn.patches if p.module == "llm2vae").delta, LowRank)


def test_two_different_replacements_of_one_module_are_refused(tmp_path):
    ms = _read("ms-raw-nar", tmp_path / "ms.safetensors")
    other = _read("ms-raw-nar", tmp_path / "other.safetensors", seed=3)
    with pytest.raises(AdapterError) as exc:
        check_stack([Applied(ms, 1.0, 1.0), Applied(other, 1.0, 1.0)])
    message = str(exc.value)
    for fragment in (str(ms.path), str(other.path), "both replace NAR llm2vae", "llm2vae.weight",
                     "different weights", "strength 0"):
        assert fragment in message, (fragment, message)
    check_stack([Applied(ms, 1.0, 1.0), Applied(other, 1.0, 0.0)])  # the other one off on the NAR
    check_stack([Applied(ms, 1.0, 1.0), Applied(ms, 1.0, 0.5)])  # one file twice: the same replacement


def test_an_fl_ar_file_with_its_own_nar_file_as_a_second_lora_is_refused(tmp_path):
    """The FL AR file reads its NAR file (metadata acoustic_adapter); giving that file too applied it twice, and
    strengths 1 + 1 passed the ±5 check of one file."""
    fl = _read("fl", tmp_path / "fl-ar.safetensors")
    nar = read_adapter(str(tmp_path / "fl-nar.safetensors"), DIMS)
    shutil.copyfile(tmp_path / "fl-nar.safetensors", tmp_path / "copy.safetensors")
    copy = read_adapter(str(tmp_path / "copy.safetensors"), DIMS)
    for stack in ([Applied(fl, 1.0, 1.0), Applied(nar, 1.0, 1.0)], [Applied(nar, 1.0, 0.5), Applied(fl, 1.0, 1.0)],
                  [Applied(fl, 1.0, 1.0), Applied(copy, 1.0, 1.0)]):
        with pytest.raises(AdapterError) as exc:
            check_stack(stack)
        message = str(exc.value)
        for fragment in (str(fl.path), str(stack[1 if stack[0].adapter is fl else 0].adapter.path),
                         "reaches the NAR 2 times", "would apply twice", "acoustic_adapter", "NAR strength 0"):
            assert fragment in message, (fragment, message)
    check_stack([Applied(fl, 1.0, 0.0), Applied(nar, 1.0, 1.0)])  # the AR file's NAR off: the NAR file once
    check_stack([Applied(fl, 1.0, 1.0), Applied(fl, 0.5, 0.5)])  # one file twice: allowed, with its note
    assert any("is given 2 times" in n for n in stack_notes([Applied(fl, 1.0, 1.0), Applied(fl, 0.5, 0.5)]))


@pytest.mark.parametrize("fused, split", [("self_attn.qkv_proj", "self_attn.k_proj"),
                                          ("mlp.gate_up_proj", "mlp.up_proj")])
def test_a_file_with_fused_and_split_keys_of_one_module_is_refused(tmp_path, fused, split):
    g = torch.Generator().manual_seed(9)
    out_f, in_f = S.fused_shape(DIMS, fused)
    part_out, _ = S.split_shape(DIMS, split.split(".")[1])
    stem = "text_encoders.model.layers.1."
    t = {f"{stem}{fused}.lora_A.weight": torch.randn(4, in_f, generator=g),
         f"{stem}{fused}.lora_B.weight": torch.randn(out_f, 4, generator=g),
         f"{stem}{split}.lora_A.weight": torch.randn(4, in_f, generator=g),
         f"{stem}{split}.lora_B.weight": torch.randn(part_out, 4, generator=g)}
    path = tmp_path / "both.safetensors"
    save_file(t, str(path))
    with pytest.raises(AdapterError) as exc:
        read_adapter(str(path), DIMS)
    message = str(exc.value)
    for fragment in (f"AR model.layers.1.{fused}", f"{stem}{fused}.lora_A.weight", f"{stem}{split}.lora_A.weight",
                     "would add up"):
        assert fragment in message, (fragment, message)


def test_an_entry_that_patches_nothing_is_said(tmp_path):
    """`--lora NAR_ONLY:1:0` patched nothing and said nothing; the same for an AR-only file at AR strength 0."""
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    ckpt = tmp_path / "micro.safetensors"
    write_synthetic_checkpoint(str(ckpt), "micro", "bf16", seed=0)
    from yue2_core.weights.checkpoint import inspect_checkpoint
    dims = inspect_checkpoint(str(ckpt)).dims
    nar = S.write_adapter("ms-raw-nar", tmp_path / "nar.safetensors", dims)
    ar = S.write_adapter("ms-raw-ar", tmp_path / "ar.safetensors", dims)
    both = S.write_adapter("aitk", tmp_path / "both.safetensors", dims)
    engine = YuE2Engine.load(str(ckpt), device="cpu", parts=("ar",), warm_up=False,
                             loras=[(str(nar), 1.0, 0.0), (str(ar), 0.0, 0.8), (str(both), 1.0, 0.0)])
    notes = "\n".join(engine.notes)
    assert (f"the LoRA {nar} holds only NAR patches (" in notes and "its NAR strength is 0: nothing to patch, this "
            "entry changes nothing (its AR strength ×1 has no AR patch to scale)" in notes), notes
    assert f"the LoRA {ar} holds only AR patches (" in notes and "its AR strength is 0: nothing to patch" in notes
    assert str(both) not in notes  # it patches the AR
    zero = stack_notes([Applied(read_adapter(str(both), dims), 0.0, 0.0)])
    assert zero == [f"the LoRA {both} has strength 0 on both experts: nothing to patch, this entry changes nothing"]


def test_model_and_vae_files_given_as_adapters_say_where_they_belong(tmp_path):
    """A vendor checkpoint folder said "adapter folder …: expected one of adapter_model.safetensors …" (or, for its
    model.safetensors, "norm diffs are not supported"); a VAE folder or file "not a YuE2 adapter"."""
    from yue2_core.weights.synthetic_vae import write_vae
    folder = tmp_path / "YuE2-3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "yue2", "hidden_size": 256}))
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4), "model.layers.0.input_layernorm.weight": torch.ones(4),
               "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4), "lm_head.weight": torch.zeros(8, 4),
               "vae2llm.weight": torch.zeros(4, 2)}, str(folder / "model.safetensors"))
    cases = [(folder, "is a YuE2 model checkpoint folder", "--checkpoint"),
             (folder / "model.safetensors", "is a model checkpoint's weights, not an adapter", "--checkpoint"),
             (write_vae(str(tmp_path / "vae"), layout="vendor-folder", profile="tiny"), "is a YuE2 VAE folder",
              "--vae"),
             (write_vae(str(tmp_path / "v.safetensors"), layout="vendor-file", profile="tiny"), "is a VAE", "--vae"),
             (write_vae(str(tmp_path / "c.safetensors"), layout="comfy-prefixed", profile="tiny"), "is a VAE",
              "--vae")]
    for path, what, option in cases:
        with pytest.raises(AdapterError) as exc:
            read_adapter(str(path), DIMS)
        message = str(exc.value)
        assert message.startswith(str(path)) and what in message and option in message, message
        assert "YuE2 Checkpoint Loader" in message or "YuE2 VAE Loader" in message, message


def test_an_empty_lora_strength_is_a_parse_error(tmp_path):
    from yue2_core.__main__ import parse_lora
    adapter = tmp_path / "a.safetensors"
    adapter.write_bytes(b"")
    for value in (f"{adapter}:1:", f"{adapter}:", f"{adapter}::1"):
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            parse_lora(value)
        message = str(exc.value)
        assert "a strength after ':' is empty" in message and "PATH:AR:NAR" in message, message
    assert parse_lora(f"{adapter}:1:0") == (str(adapter), 1.0, 0.0)


def test_a_layer_past_the_model_says_another_model_size(tmp_path):
    """New-user finding (stop 40): an adapter made for the full-size model read for the tiny one said only "names
    layer 27; the model has 2 layers", without the hint `inspect` gives for the same problem."""
    from safetensors.torch import load_file
    from yue2_core.errors import AdapterGeometryError
    src = S.write_adapter("aitk", tmp_path / "src.safetensors", DIMS, rank=2, seed=1)
    deep = {k.replace("layers.0.", f"layers.{DIMS.layers + 25}."): v for k, v in load_file(str(src)).items()}
    save_file(deep, str(tmp_path / "deep.safetensors"))
    with pytest.raises(AdapterGeometryError, match=f"names layer {DIMS.layers + 25}; the model has {DIMS.layers} "
                                                   "layers .* made for another model size"):
        read_adapter(str(tmp_path / "deep.safetensors"), DIMS)


def test_a_nul_byte_in_the_fl_companion_name_is_an_adapter_error(tmp_path):
    """Break-it (stop 40): an FL file whose metadata acoustic_adapter holds a NUL byte raised `ValueError: embedded
    null byte` from os.path.realpath (`generate --lora`, `inspect FILE --model CKPT`)."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from yue2_core.weights.lora.layouts_io import read_state
    src = S.write_adapter("fl", tmp_path / "fl-ar.safetensors", DIMS)
    with safe_open(str(src), "pt") as f:
        meta = dict(f.metadata())
    bad = tmp_path / "nul.safetensors"
    save_file(load_file(str(src)), str(bad), {**meta, "acoustic_adapter": "a\x00b"})
    with pytest.raises(AdapterError) as exc:
        read_adapter(str(bad), DIMS)
    message = str(exc.value)
    assert "acoustic_adapter='a\\x00b'" in message and "NUL byte" in message and "\n" not in message, message
    assert read_state(str(bad))  # the node's fingerprint does not raise either


def test_copies_and_hard_links_of_one_adapter_say_their_strengths_add(tmp_path):
    """Break-it (stop 40): the "given N times: strengths add up" note grouped by path only, so a copy or a hard link
    under another name stacked in silence (check_unique already grouped them by sha256)."""
    import os
    a = S.write_adapter("aitk", tmp_path / "a.safetensors", DIMS, rank=2)
    shutil.copy(a, tmp_path / "copy.safetensors")
    os.link(a, tmp_path / "link.safetensors")
    other = S.write_adapter("aitk", tmp_path / "other.safetensors", DIMS, rank=2, seed=5)
    stack = [Applied(read_adapter(str(p), DIMS), s, s) for p, s in
             ((a, 1.0), (tmp_path / "copy.safetensors", 0.5), (tmp_path / "link.safetensors", 0.25), (other, 1.0))]
    notes = [n for n in stack_notes(stack) if "given" in n]
    assert notes == [f"the LoRA {a} is given 3 times (also as {tmp_path / 'copy.safetensors'}, "
                     f"{tmp_path / 'link.safetensors'}: the same weights under other names): its strengths add up "
                     "(AR ×1.75, NAR ×1.75)"], notes


def _two_forms(form: str) -> dict:
    """Tensors of one module in two weight-delta forms (`form`), or a LoRA with a bias diff ("lora+diff_b")."""
    g = torch.Generator().manual_seed(11)
    stem = "text_encoders.model.layers.0."
    if form == "lora+diff_b":
        out_f, in_f = S.io_shape(DIMS, "vae2llm")
        return {"diffusion_model.vae2llm.lora_A.weight": torch.randn(2, in_f, generator=g),
                "diffusion_model.vae2llm.lora_B.weight": torch.randn(out_f, 2, generator=g),
                "diffusion_model.vae2llm.diff_b": torch.randn(out_f, generator=g)}
    module, second = form.split("+")
    out_f, in_f = S.fused_shape(DIMS, f"self_attn.{module}") if module in ("qkv_proj", "o_proj") else \
        S.split_shape(DIMS, module)
    key = f"{stem}{'self_attn.' + module}"
    t = {f"{key}.lora_A.weight": torch.randn(2, in_f, generator=g),
         f"{key}.lora_B.weight": torch.randn(out_f, 2, generator=g)}
    if second == "lokr":
        (a, c), (b, d) = S.lokr_factors(out_f), S.lokr_factors(in_f)
        t.update({f"{key}.lokr_w1": torch.randn(a, b, generator=g), f"{key}.lokr_w2": torch.randn(c, d, generator=g)})
    else:
        t[f"{key}.diff"] = torch.randn(out_f, in_f, generator=g) * 0.01
    return t


@pytest.mark.parametrize("form, second_key", [("o_proj+lokr", "o_proj.lokr_w"), ("qkv_proj+diff", "qkv_proj.diff"),
                                              ("q_proj+diff", "q_proj.diff")])
def test_one_module_in_two_delta_forms_is_refused(tmp_path, form, second_key):
    """Break-it (stop 40): a LoRA and a LoKr on one module, a LoRA and a .diff on a fused or a split module, added up
    in silence (only fused + split was refused). A LoRA with a bias diff on one io module stays fine."""
    path = tmp_path / "two.safetensors"
    save_file(_two_forms(form), str(path))
    with pytest.raises(AdapterError) as exc:
        read_adapter(str(path), DIMS)
    message = str(exc.value)
    module = form.split("+")[0]
    assert "AR model.layers.0.self_attn." in message and "would add up" in message, message
    assert f"{module}.lora_A.weight" in message and second_key in message, message
    ok = tmp_path / "ok.safetensors"
    save_file(_two_forms("lora+diff_b"), str(ok))
    kinds = sorted(type(p.delta).__name__ for p in read_adapter(str(ok), DIMS).patches)
    assert kinds == ["BiasDiff", "LowRank"], kinds


def test_read_state_marks_one_bad_folder_entry_and_sees_a_same_size_same_mtime_replacement(tmp_path):
    """Break-it (stop 40): one folder entry whose stat fails (a symlink loop) made the folder's whole state (), so
    a later change of adapter_config.json went unnoticed; a replacement with the same size and a preserved mtime
    (`cp -p`) was not seen at all."""
    import os
    import time
    from yue2_core.weights.lora.layouts_io import read_state
    folder = tmp_path / "peft"
    S.write_adapter("peft", folder, DIMS)
    os.symlink("loop", folder / "loop")
    before = read_state(str(folder))
    assert before[0][1] != () and any(e[0] == "loop" and e[1] == "unreadable" for e in before[0][1]), before
    cfg = folder / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace(" ", "  ") + " ")
    assert read_state(str(folder)) != before
    a = S.write_adapter("aitk", tmp_path / "a.safetensors", DIMS, rank=2, seed=1)
    b = S.write_adapter("aitk", tmp_path / "b.safetensors", DIMS, rank=2, seed=2)
    assert a.stat().st_size == b.stat().st_size and a.read_bytes() != b.read_bytes()
    st = a.stat()
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    first = read_state(str(a))
    time.sleep(0.05)  # past the file system's timestamp tick
    shutil.copy2(b, a)  # cp -p: same inode, same size, the mtime kept
    assert (a.stat().st_size, a.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert read_state(str(a)) != first


def test_a_strength_that_underflows_to_zero_is_too_small(tmp_path):
    """Break-it (stop 40): `--lora X:1e-400` read as 0.0 and said "strength 0 on both experts", while 1e-320 was
    refused as too small."""
    from yue2_core.__main__ import parse_lora
    adapter = tmp_path / "a.safetensors"
    adapter.write_bytes(b"")
    for value, what in ((f"{adapter}:1e-400", "AR strength 1e-400"), (f"{adapter}:1:-2.5e-999", "NAR strength "
                                                                                              "-2.5e-999")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"--lora {what} is too small to change any weight"):
            parse_lora(value)
    assert parse_lora(f"{adapter}:0e-400:0.000") == (str(adapter), 0.0, 0.0)
    assert parse_lora(f"{adapter}:1:1e-3") == (str(adapter), 1.0, 0.001)


def test_a_long_stack_of_one_file_is_refused_in_one_short_line(tmp_path):
    """Break-it (stop 40): 501 entries of one file made the refusal one 15 KB line; it lists 3, the count, the last."""
    from yue2_core.weights.lora.apply import check_unique
    a = S.write_adapter("aitk", tmp_path / "a.safetensors", DIMS, rank=2)
    adapter = read_adapter(str(a), DIMS)
    with pytest.raises(AdapterError) as err:
        check_unique([Applied(adapter, 1.0, 1.0) for _ in range(8)])
    text = str(err.value)
    assert "reaches the AR 8 times" in text and "… 4 more …" in text and len(text) < 1000, text


@pytest.mark.parametrize("delta, key", [("lora", "vae2llm.lora_A"), ("diff", "vae2llm.diff"),
                                        ("diff_b", "vae2llm.diff_b")])
def test_one_file_replacing_and_changing_one_module_is_refused(tmp_path, delta, key):
    """Break-it (stop 41): one file giving NAR vae2llm its full weight (a replacement) and a delta was accepted — the
    delta was added to the replacement (before 2026-12-06 the replacement erased it), though nothing says which
    weight it was trained against. Refused, naming the file, the module and both keys, like the other one-file
    refusals; the same file without the delta reads."""
    from safetensors import safe_open
    plain = S.write_adapter("ms-raw-nar", tmp_path / "ms.safetensors", DIMS)
    with safe_open(str(plain), "pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    out_f, in_f = t["vae2llm.weight"].shape
    g = torch.Generator().manual_seed(12)
    extra = {"lora": {"vae2llm.lora_A": torch.randn(2, in_f, generator=g),
                      "vae2llm.lora_B": torch.randn(out_f, 2, generator=g)},
             "diff": {"vae2llm.diff": torch.randn(out_f, in_f, generator=g) * 0.01},
             "diff_b": {"vae2llm.diff_b": torch.randn(out_f, generator=g) * 0.01}}[delta]
    both = tmp_path / "both.safetensors"
    save_file({**t, **extra}, str(both), meta)
    with pytest.raises(AdapterError) as exc:
        read_adapter(str(both), DIMS)
    message = str(exc.value)
    for fragment in (str(both), "NAR vae2llm", "vae2llm.weight", key, "both a replacement"):
        assert fragment in message, (fragment, message)
    assert "\n" not in message
    kinds = {type(p.delta).__name__ for p in read_adapter(str(plain), DIMS).patches if p.module == "vae2llm"}
    assert kinds == {"Replace"}, kinds


def test_the_old_stacking_rule_is_told_apart_by_order(tmp_path):
    """Review (stop 41): where the rule before 2026-12-06 (each patch in stack order, a replacement erasing the
    deltas before it) gave other weights — a replacement after another entry's deltas on its module; not before
    it, not at strength 0 — which a re-render of an older song then notes (`old_rule_summary`)."""
    from yue2_core.weights.lora.apply import old_rule_summary
    ms = _read("ms-raw-nar", tmp_path / "ms.safetensors")
    cn = _read("comfy-native", tmp_path / "cn.safetensors")
    assert old_rule_summary([Applied(cn), Applied(ms)]) == [
        {"expert": "nar", "replacer": 1, "erased": 0, "modules": ["llm2vae", "vae2llm"], "whole": False}]
    assert old_rule_summary([Applied(ms), Applied(cn)]) == []  # the deltas came after: added under both rules
    assert old_rule_summary([Applied(cn), Applied(ms, 1.0, 0.0)]) == []  # the replacement off
    assert old_rule_summary([Applied(cn, 1.0, 0.0), Applied(ms)]) == []  # the deltas off
