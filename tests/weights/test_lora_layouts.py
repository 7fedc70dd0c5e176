"""Every published YuE2 LoRA layout read into the canonical form (yue2_core/weights/lora/layouts.py;
weights_and_lora.md §1). Files are built here with safetensors on the `tiny` geometry (hidden 256, 2 q / 1 kv heads of
128, ffn 512, 2 layers → qkv rows 512, gate_up rows 1024) and, for a few keys, on the release geometry."""
import json
import math
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from yue2_core.errors import AdapterError
from yue2_core.layers import ModelDims
from yue2_core.weights.lora.layouts import RELEASE_DIMS, describe_adapter, read_adapter, unmatched_note
from yue2_core.weights.lora.layouts_keys import module_shape
from yue2_core.weights.lora.model import BiasDiff, Diff, Kron, LowRank, Replace
from yue2_core.weights.synthetic import get_profile

_P = get_profile("tiny")
TINY = ModelDims(hidden=_P.hidden, layers=_P.layers, heads=_P.heads, kv_heads=_P.kv_heads, head_dim=_P.head_dim,
                 ffn=_P.ffn, vocab=_P.vocab)
H, Q, KV, F = 256, 256, 128, 512  # tiny: hidden, q rows, kv rows, ffn
SPLIT_OUT = {"q_proj": Q, "k_proj": KV, "v_proj": KV, "o_proj": H, "gate_proj": F, "up_proj": F, "down_proj": H}
SPLIT_IN = {"q_proj": H, "k_proj": H, "v_proj": H, "o_proj": Q, "gate_proj": H, "up_proj": H, "down_proj": F}
GROUP = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
         "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
SUPPORTED = "Supported YuE2 adapter layouts"


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def rnd(gen, *shape, dtype=torch.float32):
    return (torch.randn(*shape, generator=gen) * 0.1).to(dtype)


def write(path, tensors, metadata=None):
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(path), metadata=metadata)
    return str(path)


def dense(adapter, dims=TINY):
    """(expert, module) → the full-module ΔW in fp64 (patches summed onto their row slices; replacements as is)."""
    out = {}
    for p in adapter.patches:
        if isinstance(p.delta, (BiasDiff, Replace)):
            continue
        key = (p.expert, p.module)
        w = out.setdefault(key, torch.zeros(module_shape(p.module, dims), dtype=torch.float64))
        d = p.delta.dense()
        if p.rows:
            w[p.rows[0]:p.rows[0] + p.rows[1]] += d
        else:
            w += d
    return out


def split_factors(gen, rank=4):
    """split factors {proj: (A [r, in], B [out, r])} of one layer, tiny geometry, non-zero B."""
    return {proj: (rnd(gen, rank, SPLIT_IN[proj]), rnd(gen, SPLIT_OUT[proj], rank)) for proj in SPLIT_OUT}


def expected_fused(factors, scale=1.0):
    """(module leaf → ΔW) from split factors: q‖k‖v and gate‖up row blocks (§1.0)."""
    d = {p: scale * (b.double() @ a.double()) for p, (a, b) in factors.items()}
    return {"self_attn.qkv_proj": torch.cat([d["q_proj"], d["k_proj"], d["v_proj"]]),
            "self_attn.o_proj": d["o_proj"], "mlp.gate_up_proj": torch.cat([d["gate_proj"], d["up_proj"]]),
            "mlp.down_proj": d["down_proj"]}


def assert_deltas(adapter, expert, layer, expected, atol=1e-5):
    got = dense(adapter)
    for leaf, w in expected.items():
        g = got[(expert, f"model.layers.{layer}.{leaf}")]
        assert torch.allclose(g, w, atol=atol, rtol=1e-4), (leaf, (g - w).abs().max())


def raises(path, *fragments, dims=TINY):
    with pytest.raises(AdapterError) as exc:
        read_adapter(path, dims)
    for f in fragments:
        assert f in str(exc.value), (f, str(exc.value))
    return str(exc.value)


# ---------------------------------------------------------------------------------------------------------------
# (A) ai-toolkit


def test_ai_toolkit_fused_io_diff_and_scale_one(tmp_path, gen):
    t = {}
    for prefix, expert in (("text_encoders.", "ar"), ("diffusion_model.", "nar")):
        for leaf, (o, i) in {"self_attn.qkv_proj": (512, H), "self_attn.o_proj": (H, Q),
                             "mlp.gate_up_proj": (1024, H), "mlp.down_proj": (H, F)}.items():
            t[f"{prefix}model.layers.1.{leaf}.lora_A.weight"] = rnd(gen, 4, i, dtype=torch.float16)
            t[f"{prefix}model.layers.1.{leaf}.lora_B.weight"] = rnd(gen, o, 4, dtype=torch.float16)
    t["text_encoders.lm_head.lora_A.weight"] = rnd(gen, 2, H)
    t["text_encoders.lm_head.lora_B.weight"] = rnd(gen, TINY.vocab, 2)
    t["diffusion_model.llm2vae.lora_A.weight"] = rnd(gen, 2, H)
    t["diffusion_model.llm2vae.lora_B.weight"] = rnd(gen, 64, 2)
    t["diffusion_model.time_embedder.mlp.0.lora_A.weight"] = rnd(gen, 2, 256)
    t["diffusion_model.time_embedder.mlp.0.lora_B.weight"] = rnd(gen, H, 2)
    t["diffusion_model.vae2llm.diff"] = rnd(gen, H, 64)
    t["diffusion_model.vae2llm.diff_b"] = rnd(gen, H)
    a = read_adapter(write(tmp_path / "aitk.safetensors", t), TINY)
    assert a.layout == "ai-toolkit" and a.scales == [1.0] and a.unmatched == []
    assert a.ranks() == {"ar": [2, 4], "nar": [2, 4]}
    assert a.modules("ar") == ["model.layers.1.mlp.down_proj", "model.layers.1.mlp.gate_up_proj",
                               "model.layers.1.self_attn.o_proj", "model.layers.1.self_attn.qkv_proj", "model.lm_head"]
    assert {"vae2llm", "llm2vae", "time_embedder.mlp.0", "model.layers.1.self_attn.qkv_proj"} <= set(a.modules("nar"))
    qkv = next(p for p in a.patches if p.expert == "ar" and p.module.endswith("qkv_proj"))
    assert qkv.rows is None and isinstance(qkv.delta, LowRank) and qkv.delta.scale == 1.0
    assert torch.equal(qkv.delta.up, t["text_encoders.model.layers.1.self_attn.qkv_proj.lora_B.weight"])
    kinds = {type(p.delta) for p in a.patches if p.module == "vae2llm"}
    assert kinds == {Diff, BiasDiff}


def test_release_geometry_split_rows_and_layer_27(tmp_path, gen):
    t = {}
    for layer in (0, 27):
        for proj, (o, i) in {"q_proj": (2048, 2048), "k_proj": (1024, 2048), "v_proj": (1024, 2048),
                             "gate_proj": (6144, 2048), "up_proj": (6144, 2048)}.items():
            t[f"model.layers.{layer}.nar_{GROUP[proj]}.{proj}.lora_down.weight"] = rnd(gen, 2, i)
            t[f"model.layers.{layer}.nar_{GROUP[proj]}.{proj}.lora_up.weight"] = rnd(gen, o, 2)
    a = read_adapter(write(tmp_path / "full.safetensors", t, {"format": "yue2-lora-v1", "alpha": "4",
                                                               "rank": "2"}), RELEASE_DIMS)
    rows = {(p.module, p.rows) for p in a.patches}
    for layer in (0, 27):
        qkv, gu = f"model.layers.{layer}.self_attn.qkv_proj", f"model.layers.{layer}.mlp.gate_up_proj"
        assert {(qkv, (0, 2048)), (qkv, (2048, 1024)), (qkv, (3072, 1024)), (gu, (0, 6144)),
                (gu, (6144, 6144))} <= rows
    assert a.scales == [2.0] and all(p.expert == "nar" for p in a.patches)
    # the same file does not fit the tiny model: layer 27 and the shapes are named
    raises(tmp_path / "full.safetensors", "layer 27", "2 layers")


# ---------------------------------------------------------------------------------------------------------------
# (B) Comfy-native block-diagonal, HOT fused shared-A, split: one ΔW


def _blockdiag_file(factors, layer_prefix, alpha_scale):
    """Comfy-native fused tensors from split factors: D = [A_q; A_k; A_v], U = blockdiag(B_q, B_k, B_v) and
    .alpha = fused rank (scale 1); alpha_scale (the split file's alpha/rank) baked into U (§1.1 B, §1.3)."""
    t = {}
    for fused, parts in (("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
                         ("mlp.gate_up_proj", ("gate_proj", "up_proj"))):
        downs = [factors[p][0] for p in parts]
        ups = [factors[p][1] * alpha_scale for p in parts]
        t[f"{layer_prefix}{fused}.lora_down.weight"] = torch.cat(downs)
        t[f"{layer_prefix}{fused}.lora_up.weight"] = torch.block_diag(*ups)
        t[f"{layer_prefix}{fused}.alpha"] = torch.tensor(float(sum(d.shape[0] for d in downs)))
    for proj, leaf in (("o_proj", "self_attn.o_proj"), ("down_proj", "mlp.down_proj")):
        t[f"{layer_prefix}{leaf}.lora_down.weight"] = factors[proj][0]
        t[f"{layer_prefix}{leaf}.lora_up.weight"] = factors[proj][1]
        t[f"{layer_prefix}{leaf}.alpha"] = torch.tensor(4.0 * alpha_scale)  # unfused keep their own alpha
    return t


def test_split_blockdiag_and_shared_a_give_the_same_delta(tmp_path, gen):
    factors = split_factors(gen, rank=4)
    # HOT native split, alpha 8 / rank 4 → 2
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    split = {}
    for proj, (a, b) in factors.items():
        split[f"yue2.blk.1.nar_{names[proj]}.lora_A.weight"] = a.to(torch.bfloat16).float()
        split[f"yue2.blk.1.nar_{names[proj]}.lora_B.weight"] = b.to(torch.bfloat16).float()
    factors = {p: (split[f"yue2.blk.1.nar_{n}.lora_A.weight"], split[f"yue2.blk.1.nar_{n}.lora_B.weight"])
               for p, n in names.items()}
    s = write(tmp_path / "split.safetensors", split, {"format": "yue2-nar-lora-v1", "rank": "4", "alpha": "8",
                                                      "yue2_adapter_layout": "native_split_v1", "steps": "100"})
    a_split = read_adapter(s, TINY)
    assert a_split.layout == "hot-step-split" and a_split.scales == [2.0]
    assert {p.expert for p in a_split.patches} == {"nar"}
    expected = expected_fused(factors, scale=2.0)
    assert_deltas(a_split, "nar", 1, expected)

    bd = write(tmp_path / "bd.safetensors", _blockdiag_file(factors, "diffusion_model.model.layers.1.", 2.0),
               {"format": "comfyui-native-lora", "source_format": "yue2-lora-v1", "yue2_lora_branch": "ar+nar"})
    a_bd = read_adapter(bd, TINY)
    assert a_bd.layout == "comfy-native" and a_bd.scales == [1.0, 2.0]  # fused: alpha = 3r; o/down: own alpha
    qkv = next(p for p in a_bd.patches if p.module.endswith("qkv_proj"))
    assert qkv.rows is None and qkv.delta.rank == 12 and qkv.expert == "nar"
    assert_deltas(a_bd, "nar", 1, expected)

    # HOT fused shared-A: one A per site, B rows = the stacked split B's of a shared-A split file
    shared_a = factors["q_proj"][0]
    shared = {"diffusion_model.model.layers.1.self_attn.qkv_proj.lora_A.weight": shared_a,
              "diffusion_model.model.layers.1.self_attn.qkv_proj.lora_B.weight":
                  torch.cat([factors[p][1] for p in ("q_proj", "k_proj", "v_proj")])}
    a_sh = read_adapter(write(tmp_path / "sh.safetensors", shared, {"format": "yue2-aitk-fused-lora-v1",
                                                                    "rank": "4", "alpha": "8"}), TINY)
    dup = {}  # its split form: A duplicated, B sliced per site (§1.1 D)
    for p, n in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
        dup[f"yue2.blk.1.nar_{n}.lora_A.weight"] = shared_a
        dup[f"yue2.blk.1.nar_{n}.lora_B.weight"] = factors[p][1]
    a_dup = read_adapter(write(tmp_path / "dup.safetensors", dup, {"format": "yue2-nar-lora-v1", "rank": "4",
                                                                   "alpha": "8"}), TINY)
    assert a_sh.layout == "hot-step-fused" and a_sh.patches[0].rows is None and a_sh.patches[0].delta.rank == 4
    leaf = "model.layers.1.self_attn.qkv_proj"
    assert torch.allclose(dense(a_sh)[("nar", leaf)], dense(a_dup)[("nar", leaf)], atol=1e-6)


def test_mothersuperior_comfyui_branch_decides_the_expert(tmp_path, gen):
    factors = split_factors(gen, rank=2)
    t = {k: v for k, v in _blockdiag_file(factors, "text_encoders.model.layers.0.", 1.0).items()
         if not k.endswith(".alpha")}
    meta = {"format": "pt", "layout": "qkv_proj/gate_up_proj block-diagonal 3r", "base_model": "m-a-p/YuE2-3B",
            "scale": "1.0"}
    nar = read_adapter(write(tmp_path / "nar.safetensors", t, {**meta, "yue2_lora_branch": "nar"}), TINY)
    assert nar.layout == "mothersuperior-comfyui"
    assert {p.expert for p in nar.patches} == {"nar"}  # text_encoders. keys, but branch=nar → the NAR (§1.1)
    assert nar.scales == [1.0] and "metadata scale" in nar.scale_rule
    assert_deltas(nar, "nar", 0, expected_fused(factors))
    ar = read_adapter(write(tmp_path / "ar.safetensors", t, {**meta, "yue2_lora_branch": "ar"}), TINY)
    assert {p.expert for p in ar.patches} == {"ar"}


# ---------------------------------------------------------------------------------------------------------------
# (C) FL per-branch files with companion


def _fl_files(tmp_path, gen):
    ar, nar = {}, {}
    for proj in ("q_proj", "up_proj"):
        ar[f"model.layers.0.{GROUP[proj]}.{proj}.lora_down.weight"] = rnd(gen, 4, H)
        ar[f"model.layers.0.{GROUP[proj]}.{proj}.lora_up.weight"] = rnd(gen, SPLIT_OUT[proj], 4)
    nar["model.layers.1.nar_self_attn.k_proj.lora_down.weight"] = rnd(gen, 4, H)
    nar["model.layers.1.nar_self_attn.k_proj.lora_up.weight"] = rnd(gen, KV, 4)
    nar["model.layers.1.nar_mlp.down_proj.lora_down.weight"] = rnd(gen, 4, F)
    nar["model.layers.1.nar_mlp.down_proj.lora_up.weight"] = rnd(gen, H, 4)
    for m, shape in (("vae2llm", (H, 64)), ("llm2vae", (64, H))):
        nar[f"{m}.diff"], nar[f"{m}.diff_b"] = rnd(gen, *shape), rnd(gen, shape[0])
    os.makedirs(tmp_path / "sub", exist_ok=True)
    write(tmp_path / "sub" / "x-nar.safetensors", nar, {"format": "fl-yue2-lora-v1", "branch": "nar", "rank": "4"})
    return write(tmp_path / "x-ar.safetensors", ar, {"format": "fl-yue2-lora-v1", "branch": "ar", "rank": "4",
                                                    "acoustic_adapter": "sub/x-nar.safetensors"})


def test_fl_reads_the_companion(tmp_path, gen):
    a = read_adapter(_fl_files(tmp_path, gen), TINY)
    assert a.layout == "fl" and a.scales == [1.0] and len(a.files) == 2
    assert a.files[1].endswith(os.path.join("sub", "x-nar.safetensors"))
    got = {(p.expert, p.module, p.rows, type(p.delta)) for p in a.patches}
    assert ("ar", "model.layers.0.self_attn.qkv_proj", (0, Q), LowRank) in got
    assert ("ar", "model.layers.0.mlp.gate_up_proj", (F, F), LowRank) in got
    assert ("nar", "model.layers.1.self_attn.qkv_proj", (Q, KV), LowRank) in got
    assert ("nar", "model.layers.1.mlp.down_proj", None, LowRank) in got
    assert ("nar", "llm2vae", None, BiasDiff) in got and ("nar", "vae2llm", None, Diff) in got


def test_fl_missing_companion_names_the_path(tmp_path, gen):
    path = _fl_files(tmp_path, gen)
    os.remove(tmp_path / "sub" / "x-nar.safetensors")
    raises(path, "acoustic_adapter", os.path.join("sub", "x-nar.safetensors"), "does not exist")


def test_fl_without_branch_is_refused(tmp_path, gen):
    p = write(tmp_path / "f.safetensors", {"model.layers.0.self_attn.q_proj.lora_down.weight": rnd(gen, 2, H),
                                           "model.layers.0.self_attn.q_proj.lora_up.weight": rnd(gen, Q, 2)},
              {"format": "fl-yue2-lora-v1"})
    raises(p, "branch=ar or branch=nar")


# ---------------------------------------------------------------------------------------------------------------
# (D) HOT-Step split: branch from the format; (E) LoKr


def test_hot_split_plain_names_follow_the_format(tmp_path, gen):
    t = {"yue2.blk.0.attn_output.lora_A.weight": rnd(gen, 4, Q),
         "yue2.blk.0.attn_output.lora_B.weight": rnd(gen, H, 4)}
    nar = read_adapter(write(tmp_path / "n.safetensors", t, {"format": "yue2-nar-lora-v1", "rank": "4",
                                                             "alpha": "4"}), TINY)
    ar = read_adapter(write(tmp_path / "a.safetensors", t, {"format": "yue2-ar-lora-v1", "rank": "4",
                                                            "alpha": "2"}), TINY)
    assert [p.expert for p in nar.patches] == ["nar"] and [p.expert for p in ar.patches] == ["ar"]
    assert ar.scales == [0.5] and ar.patches[0].module == "model.layers.0.self_attn.o_proj"


def test_lokr_full_rank_ignores_inf_alpha(tmp_path, gen):
    w1, w2 = rnd(gen, 8, 4, dtype=torch.float16), rnd(gen, 64, 64, dtype=torch.float16)
    t = {"text_encoders.model.layers.0.self_attn.qkv_proj.lokr_w1": w1,
         "text_encoders.model.layers.0.self_attn.qkv_proj.lokr_w2": w2,
         "text_encoders.model.layers.0.self_attn.qkv_proj.alpha": torch.tensor(9999999999.0).half()}
    assert math.isinf(t["text_encoders.model.layers.0.self_attn.qkv_proj.alpha"].item())
    a = read_adapter(write(tmp_path / "lokr.safetensors", t), TINY)
    p = a.patches[0]
    assert a.layout == "lokr" and isinstance(p.delta, Kron) and p.delta.scale == 1.0 and p.rows is None
    assert p.expert == "ar" and torch.allclose(p.delta.dense(), torch.kron(w1.double(), w2.double()))
    assert "alpha ignored" in a.scale_rule


def test_lokr_factorised_uses_alpha_over_dim_and_hot_metadata(tmp_path, gen):
    w1, w2a, w2b = rnd(gen, 8, 4), rnd(gen, 64, 3), rnd(gen, 3, 64)
    t = {"diffusion_model.model.layers.1.mlp.down_proj.lokr_w1": rnd(gen, 4, 8),  # [4·64, 8·64] = [256, 512]
         "diffusion_model.model.layers.1.mlp.down_proj.lokr_w2_a": w2a,
         "diffusion_model.model.layers.1.mlp.down_proj.lokr_w2_b": w2b,
         "diffusion_model.model.layers.1.mlp.down_proj.alpha": torch.tensor(6.0)}
    a = read_adapter(write(tmp_path / "l.safetensors", t), TINY)
    assert a.patches[0].delta.scale == 2.0 and a.patches[0].module == "model.layers.1.mlp.down_proj"
    # HOT LoKr on a split site (attn_q rows), alpha from metadata, dim checked against lokr_dim
    hot = {"yue2.blk.0.attn_q.lokr_w1": w1[:4], "yue2.blk.0.attn_q.lokr_w2_a": w2a, "yue2.blk.0.attn_q.lokr_w2_b": w2b}
    meta = {"format": "yue2-nar-lokr-v1", "alpha": "1.5", "lokr_dim": "3"}
    h = read_adapter(write(tmp_path / "h.safetensors", hot, meta), TINY)
    p = h.patches[0]
    assert h.layout == "hot-step-lokr" and p.expert == "nar" and p.rows == (0, Q) and p.delta.scale == 0.5
    want = torch.kron(w1[:4].double(), w2a.double() @ w2b.double()) * 0.5
    assert torch.allclose(p.delta.dense(), want, atol=1e-6)
    raises(write(tmp_path / "h2.safetensors", hot, {**meta, "lokr_dim": "5"}), "lokr_dim 5", "dim 3")
    t2 = {**hot, "yue2.blk.0.attn_q.lokr_t2": rnd(gen, 3, 3)}
    raises(write(tmp_path / "t2.safetensors", t2, meta), "Tucker", SUPPORTED)
    bad = {**hot, "yue2.blk.0.attn_q.lokr_w1": rnd(gen, 3, 4)}
    raises(write(tmp_path / "b.safetensors", bad, meta), "kron(w1 [3, 4]", "[256, 256]")


# ---------------------------------------------------------------------------------------------------------------
# (F) Mothersuperior raw AR / NAR joint / .pt


def _ms_nar(gen, layers=2, rank=2):
    t = {}
    for layer in range(layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            t[f"layers.{layer}.nar_{GROUP[proj]}.{proj}.lora_A"] = rnd(gen, rank, SPLIT_IN[proj])
            t[f"layers.{layer}.nar_{GROUP[proj]}.{proj}.lora_B"] = rnd(gen, SPLIT_OUT[proj], rank)
    t["vae2llm.weight"], t["vae2llm.bias"] = rnd(gen, H, 64), rnd(gen, H)
    t["llm2vae.weight"], t["llm2vae.bias"] = rnd(gen, 64, H), rnd(gen, 64)
    return t


def test_mothersuperior_raw_ar(tmp_path, gen):
    factors = split_factors(gen, rank=4)
    t = {}
    for proj, (a, b) in factors.items():
        t[f"layers.1.{GROUP[proj]}.{proj}.lora_A"], t[f"layers.1.{GROUP[proj]}.{proj}.lora_B"] = a, b
    meta = {"format": "pt", "base_model": "m-a-p/YuE2-3B", "intended_cot": "full",
            "delta": "AR branch: W += lora_B @ lora_A", "lora_scale": "1.0", "rank": "4"}
    a = read_adapter(write(tmp_path / "ms.safetensors", t, meta), TINY)
    assert a.layout == "mothersuperior-raw" and {p.expert for p in a.patches} == {"ar"}
    assert a.scales == [1.0] and "lora_scale" in a.scale_rule
    assert_deltas(a, "ar", 1, expected_fused(factors))
    a2 = read_adapter(write(tmp_path / "ms2.safetensors", t, {**meta, "lora_scale": "0.5"}), TINY)
    assert_deltas(a2, "ar", 1, expected_fused(factors, 0.5))


def test_mothersuperior_nar_joint_replacements_and_pt_order(tmp_path, gen):
    t = _ms_nar(gen)
    meta = {"format": "pt", "rank": "2"}
    a = read_adapter(write(tmp_path / "nar.safetensors", t, meta), TINY)
    assert a.layout == "mothersuperior-raw" and a.replacements() == ["nar:llm2vae", "nar:vae2llm"]
    rep = next(p for p in a.patches if p.module == "vae2llm")
    assert isinstance(rep.delta, Replace) and torch.equal(rep.delta.bias, t["vae2llm.bias"])
    assert {p.expert for p in a.patches} == {"nar"} and a.unmatched == []
    # the .pt dict: [A, B] per projection, layer-major, q k v o gate up down
    order = ("nar_self_attn.q_proj", "nar_self_attn.k_proj", "nar_self_attn.v_proj", "nar_self_attn.o_proj",
             "nar_mlp.gate_proj", "nar_mlp.up_proj", "nar_mlp.down_proj")
    lora = [t[f"layers.{layer}.{n}.lora_{ab}"] for layer in range(2) for n in order for ab in "AB"]
    io = {m: {"weight": t[f"{m}.weight"], "bias": t[f"{m}.bias"]} for m in ("vae2llm", "llm2vae")}
    torch.save({"lora": lora, "rank": 2, "io": io}, tmp_path / "nar_lora_joint_v4.pt")
    pt = read_adapter(str(tmp_path / "nar_lora_joint_v4.pt"), TINY)
    assert pt.layout == "mothersuperior-pt"
    da, dp = dense(a), dense(pt)
    assert da.keys() == dp.keys() and all(torch.equal(da[k], dp[k]) for k in da)
    assert pt.replacements() == a.replacements()
    # k and gate swapped in the list: their B shapes differ ([128, r] vs [512, r]) → refused, never misapplied
    swapped = list(lora)
    swapped[2:4], swapped[8:10] = lora[8:10], lora[2:4]
    torch.save({"lora": swapped, "rank": 2, "io": io}, tmp_path / "bad.pt")
    raises(str(tmp_path / "bad.pt"), "shape mismatch", "layers.0.nar_")


def test_pt_needing_unrestricted_pickle_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"lora": Evil()}, f, protocol=2)
    raises(str(tmp_path / "evil.pt"), "weights-only", "never unpickle")


# ---------------------------------------------------------------------------------------------------------------
# (G) Starnodes, (H) PEFT


def test_starnodes_metadata_alpha_and_io_targets(tmp_path, gen):
    t = {"model.layers.0.nar_self_attn.q_proj.lora_down.weight": rnd(gen, 4, H),
         "model.layers.0.nar_self_attn.q_proj.lora_up.weight": rnd(gen, Q, 4),
         "llm2vae.lora_down.weight": rnd(gen, 4, H), "llm2vae.lora_up.weight": rnd(gen, 64, 4),
         "time_embedder.mlp.2.lora_down.weight": rnd(gen, 4, H),
         "time_embedder.mlp.2.lora_up.weight": rnd(gen, H, 4)}
    a = read_adapter(write(tmp_path / "s.safetensors", t, {"format": "yue2-lora-v1", "alpha": "8", "rank": "4",
                                                           "target_preset": "nar_attn_mlp_proj"}), TINY)
    assert a.layout == "starnodes" and a.scales == [2.0] and a.scale_rule == "metadata alpha / rank"
    assert set(a.modules("nar")) == {"model.layers.0.self_attn.qkv_proj", "llm2vae", "time_embedder.mlp.2"}
    raises(write(tmp_path / "r.safetensors", t, {"format": "yue2-lora-v1", "alpha": "8", "rank": "3"}),
           "rank 4", "rank 3")


def _peft_dir(tmp_path, gen, cfg, spelling=".lora_A.weight"):
    d = tmp_path / "peft"
    d.mkdir(exist_ok=True)
    b_spelling = spelling.replace("lora_A", "lora_B")
    t = {f"base_model.model.model.layers.0.nar_self_attn.q_proj{spelling}": rnd(gen, 4, H),
         f"base_model.model.model.layers.0.nar_self_attn.q_proj{b_spelling}": rnd(gen, Q, 4),
         f"base_model.model.model.layers.1.mlp.down_proj{spelling}": rnd(gen, 4, F),
         f"base_model.model.model.layers.1.mlp.down_proj{b_spelling}": rnd(gen, H, 4)}
    write(d / "adapter_model.safetensors", t, {"format": "pt"})
    (d / "adapter_config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return str(d)


BASE_CFG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "down_proj"],
            "base_model_name_or_path": "m-a-p/YuE2-3B"}


@pytest.mark.parametrize("spelling", [".lora_A.weight", ".lora_A.default.weight", ".lora_A.prod.weight"])
def test_peft_folder_sidecar_scale_and_spellings(tmp_path, gen, spelling):
    a = read_adapter(_peft_dir(tmp_path, gen, BASE_CFG, spelling), TINY)
    assert a.layout == "peft" and a.scales == [2.0] and "lora_alpha / r" in a.scale_rule
    assert any(f.endswith("adapter_config.json") for f in a.files)
    assert {(p.expert, p.module, p.rows) for p in a.patches} == {
        ("nar", "model.layers.0.self_attn.qkv_proj", (0, Q)), ("ar", "model.layers.1.mlp.down_proj", None)}


def test_peft_rslora_and_patterns(tmp_path, gen):
    a = read_adapter(_peft_dir(tmp_path, gen, {**BASE_CFG, "use_rslora": True}), TINY)
    assert a.scales == [4.0]  # 8 / √4
    cfg = {**BASE_CFG, "r": 8, "rank_pattern": {"q_proj": 4, "down_proj": 4}, "alpha_pattern": {"down_proj": 2}}
    b = read_adapter(_peft_dir(tmp_path, gen, cfg), TINY)
    assert {p.module: p.delta.scale for p in b.patches} == {"model.layers.0.self_attn.qkv_proj": 2.0,
                                                             "model.layers.1.mlp.down_proj": 0.5}
    raises(_peft_dir(tmp_path, gen, {**BASE_CFG, "r": 8}), "r = 8", "rank 4")
    # a file with the sidecar beside it reads it too
    c = read_adapter(os.path.join(_peft_dir(tmp_path, gen, BASE_CFG), "adapter_model.safetensors"), TINY)
    assert c.scales == [2.0]


@pytest.mark.parametrize("cfg,fragments", [
    ({**BASE_CFG, "use_dora": True}, ("DoRA", SUPPORTED)),
    ({**BASE_CFG, "fan_in_fan_out": True}, ("fan_in_fan_out", SUPPORTED)),
    ("{not json", ("not a readable JSON",)),
    ([1, 2], ("expected a JSON object",)),
    ({**BASE_CFG, "r": 0}, ('"r" must be a positive integer',)),
    ({**BASE_CFG, "r": "4"}, ('"r" must be a positive integer',)),
    ({**BASE_CFG, "lora_alpha": -1}, ('"lora_alpha"',)),
    ({**BASE_CFG, "use_rslora": "yes"}, ('"use_rslora" must be true or false',)),
    ({**BASE_CFG, "peft_type": "LOHA"}, ("LOHA",)),
    ({**BASE_CFG, "rank_pattern": {"q_proj": 0}}, ("rank_pattern",)),
])
def test_peft_refusals_and_bad_config(tmp_path, gen, cfg, fragments):
    raises(_peft_dir(tmp_path, gen, cfg), *fragments)


# ---------------------------------------------------------------------------------------------------------------
# the scale precedence rule


def test_scale_precedence_alpha_tensor_then_metadata_then_sidecar_then_one(tmp_path, gen):
    t = {"model.layers.0.self_attn.o_proj.lora_A.weight": rnd(gen, 4, Q),
         "model.layers.0.self_attn.o_proj.lora_B.weight": rnd(gen, H, 4),
         "model.layers.0.self_attn.o_proj.alpha": torch.tensor(1.0),
         "model.layers.0.mlp.down_proj.lora_A.weight": rnd(gen, 4, F),
         "model.layers.0.mlp.down_proj.lora_B.weight": rnd(gen, H, 4)}
    d = tmp_path / "prec"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({**BASE_CFG, "lora_alpha": 12}))

    def scales(meta):
        a = read_adapter(write(d / "adapter_model.safetensors", t, meta), TINY)
        return {p.module.rsplit(".", 1)[-1]: p.delta.scale for p in a.patches}, a.scale_rule

    got, rule = scales({"alpha": "8", "rank": "4"})  # .alpha wins on o_proj, metadata on down_proj
    assert got == {"o_proj": 0.25, "down_proj": 2.0} and "module .alpha / rank" in rule
    got, rule = scales({})  # no metadata alpha: the sidecar
    assert got == {"o_proj": 0.25, "down_proj": 3.0} and "adapter_config.json" in rule
    os.remove(d / "adapter_config.json")
    got, rule = scales({})  # nothing: 1
    assert got == {"o_proj": 0.25, "down_proj": 1.0} and "1 (no alpha)" in rule


# ---------------------------------------------------------------------------------------------------------------
# refusals and bad input


@pytest.mark.parametrize("extra,meta,fragment", [
    ({"diffusion_model.model.layers.0.self_attn.o_proj.dora_scale": (1, Q)}, None, "DoRA"),
    ({"diffusion_model.model.layers.0.self_attn.o_proj.lora_magnitude_vector": (Q,)}, None, "lora_magnitude_vector"),
    ({"diffusion_model.model.layers.0.self_attn.o_proj.lora_magnitude_vector.weight": (Q,)}, None, "DoRA"),
    ({"diffusion_model.model.layers.0.self_attn.o_proj.hada_w1_a": (H, 2)}, None, "LoHa"),
    ({"diffusion_model.model.layers.0.self_attn.o_proj.lora_mid.weight": (2, 2)}, None, "lora_mid"),
    ({}, {"format": "yue2-artist-ar-v1", "scale": "1", "companion_sha256": "ab", "manifest": "manifest.json"},
     "artist bundle"),
    ({}, {"conceptmod": "conceptmod-yue2-routed-particle-ar-v1"}, "particle slider"),
    ({}, {"format": "yue2-nar-lora-v1", "hot_step.param_method": "1"}, "param_method"),
])
def test_refused_layouts(tmp_path, gen, extra, meta, fragment):
    t = {"diffusion_model.model.layers.0.self_attn.o_proj.lora_A.weight": rnd(gen, 2, Q),
         "diffusion_model.model.layers.0.self_attn.o_proj.lora_B.weight": rnd(gen, H, 2)}
    t.update({k: rnd(gen, *s) for k, s in extra.items()})
    raises(write(tmp_path / "r.safetensors", t, meta), fragment, "not supported", SUPPORTED)


def test_not_safetensors_truncated_and_empty(tmp_path, gen):
    (tmp_path / "junk.safetensors").write_bytes(b"hello, this is not a tensor file at all")
    raises(str(tmp_path / "junk.safetensors"), "not a safetensors file")
    good = write(tmp_path / "g.safetensors", {"diffusion_model.vae2llm.diff": rnd(gen, H, 64)})
    data = open(good, "rb").read()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 100])
    raises(str(tmp_path / "cut.safetensors"), "truncated")
    raises(write(tmp_path / "e.safetensors", {}), "holds no tensors")
    raises(str(tmp_path / "nope.safetensors"), "not found")


def test_sdxl_lora_is_not_a_yue2_adapter(tmp_path, gen):
    t = {"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": rnd(gen, 4, 320),
         "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": rnd(gen, 320, 4),
         "lora_unet_down_blocks_0_attentions_0_proj_in.alpha": torch.tensor(4.0),
         "lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": rnd(gen, 4, 768)}
    raises(write(tmp_path / "sdxl.safetensors", t), "not a YuE2 adapter", "SDXL", SUPPORTED)


@pytest.mark.parametrize("key,shape,fragments", [
    ("text_encoders.model.layers.0.self_attn.qkv_proj.lora_B.weight", (4096, 2),
     ("shape mismatch", "qkv_proj.lora_B.weight", "expected [512, 2]", "found [4096, 2]")),
    ("text_encoders.model.layers.0.self_attn.qkv_proj.lora_B.weight", (512, 3),
     ("ranks disagree", "qkv_proj.lora_A.weight", "qkv_proj.lora_B.weight")),
    ("text_encoders.model.layers.2.self_attn.qkv_proj.lora_A.weight", (2, H), ("layer 2", "2 layers")),
])
def test_shapes_ranks_and_layers(tmp_path, gen, key, shape, fragments):
    t = {"text_encoders.model.layers.0.self_attn.qkv_proj.lora_A.weight": rnd(gen, 2, H),
         "text_encoders.model.layers.0.self_attn.qkv_proj.lora_B.weight": rnd(gen, 512, 2)}
    t[key] = rnd(gen, *shape)
    if "layers.2" in key:
        t[key.replace("lora_A", "lora_B")] = rnd(gen, 512, 2)
    raises(write(tmp_path / "x.safetensors", t), *fragments)


def test_missing_half_nan_and_lonely_alpha(tmp_path, gen):
    base = "diffusion_model.model.layers.0.mlp.down_proj"
    raises(write(tmp_path / "m.safetensors", {f"{base}.lora_A.weight": rnd(gen, 2, F)}),
           f"{base}.lora_A.weight has no up", "needs both")
    nan = rnd(gen, H, 2)
    nan[3, 1] = float("nan")
    raises(write(tmp_path / "n.safetensors", {f"{base}.lora_A.weight": rnd(gen, 2, F), f"{base}.lora_B.weight": nan}),
           f"{base}.lora_B.weight", "NaN or inf")
    inf_alpha = {f"{base}.lora_A.weight": rnd(gen, 2, F), f"{base}.lora_B.weight": rnd(gen, H, 2),
                 f"{base}.alpha": torch.tensor(float("inf"))}
    raises(write(tmp_path / "i.safetensors", inf_alpha), f"{base}.alpha", "not finite")
    raises(write(tmp_path / "a.safetensors", {f"{base}.alpha": torch.tensor(2.0)}), "alpha with no lora_A")


def test_partial_match_lists_unmatched_and_describe(tmp_path, gen):
    t = {"diffusion_model.model.layers.0.self_attn.o_proj.lora_A.weight": rnd(gen, 2, Q),
         "diffusion_model.model.layers.0.self_attn.o_proj.lora_B.weight": rnd(gen, H, 2),
         "diffusion_model.model.layers.0.self_attn.rotary.lora_A.weight": rnd(gen, 2, 4),
         "diffusion_model.something_else": rnd(gen, 3)}
    a = read_adapter(write(tmp_path / "p.safetensors", t), TINY)
    assert a.unmatched == ["diffusion_model.model.layers.0.self_attn.rotary.lora_A.weight",
                           "diffusion_model.something_else"]
    text = describe_adapter(a)
    for fragment in ("layout ai-toolkit", "p.safetensors", "scale rule: 1 (no alpha); value(s): 1",
                     "AR: not patched", "NAR: 1 patches on 1 modules; rank(s) 2; 1 LoRA",
                     "attention o: 1 modules", "replacements (full strength unless strength 0): none",
                     "unmatched keys: 2", "  diffusion_model.something_else",
                     "  diffusion_model.model.layers.0.self_attn.rotary.lora_A.weight"):
        assert fragment in text, (fragment, text)
    note = unmatched_note(a)  # the warning generate / batch / the LoRA node show (before: silence)
    assert note.startswith(f"LoRA {a.path}: 2 keys name no YuE2 module and are NOT applied: ") and \
        "diffusion_model.something_else" in note
    assert unmatched_note(read_adapter(write(tmp_path / "ok.safetensors", {
        k: v for k, v in t.items() if "o_proj" in k}), TINY)) is None
    only_unmatched = {k: v for k, v in t.items() if "o_proj" not in k}
    raises(write(tmp_path / "u.safetensors", only_unmatched), "none of its 2 keys names a YuE2 module")


def test_duplicate_spellings_of_one_module(tmp_path, gen):
    t = {"text_encoders.lm_head.lora_A.weight": rnd(gen, 2, H),
         "text_encoders.lm_head.lora_B.weight": rnd(gen, TINY.vocab, 2),
         "text_encoders.model.lm_head.lora_A.weight": rnd(gen, 2, H),
         "text_encoders.model.lm_head.lora_B.weight": rnd(gen, TINY.vocab, 2)}
    raises(write(tmp_path / "d.safetensors", t), "two spellings", "model.lm_head")


def test_describe_full_report_with_replacements(tmp_path, gen):
    a = read_adapter(write(tmp_path / "nar.safetensors", _ms_nar(gen), {"format": "pt", "rank": "2"}), TINY)
    text = describe_adapter(a)
    assert "layout mothersuperior-raw" in text and "replacements (full strength unless strength 0): " \
        "nar:llm2vae, nar:vae2llm" in text
    assert "NAR: 16 patches on 10 modules; rank(s) 2; 14 LoRA, 2 replace" in text, text
    assert "attention qkv: 2 modules" in text and "io: 2 modules (llm2vae, vae2llm)" in text
    assert "unmatched keys: 0" in text


def test_unlabelled_vendor_names_and_flat_pt(tmp_path, gen):
    t = {"model.layers.1.self_attn.v_proj.lora_A.weight": rnd(gen, 2, H),
         "model.layers.1.self_attn.v_proj.lora_B.weight": rnd(gen, KV, 2),
         "model.layers.1.nar_mlp.gate_proj.lora_A.weight": rnd(gen, 2, H),
         "model.layers.1.nar_mlp.gate_proj.lora_B.weight": rnd(gen, F, 2)}
    a = read_adapter(write(tmp_path / "u.safetensors", t), TINY)
    assert a.layout == "unlabelled"
    assert {(p.expert, p.module, p.rows) for p in a.patches} == {  # plain vendor names: AR; nar_*: NAR
        ("ar", "model.layers.1.self_attn.qkv_proj", (Q + KV, KV)), ("nar", "model.layers.1.mlp.gate_up_proj", (0, F))}
    torch.save(t, tmp_path / "u.pt")  # a flat {name: tensor} .pt reads the same
    b = read_adapter(str(tmp_path / "u.pt"), TINY)
    assert b.layout == "unlabelled" and all(torch.equal(x, dense(b)[k]) for k, x in dense(a).items())
    torch.save([1, 2, 3], tmp_path / "list.pt")
    raises(str(tmp_path / "list.pt"), "{name: tensor}")
    ints = {**t, "model.layers.1.self_attn.v_proj.lora_A.weight": torch.ones(2, H, dtype=torch.int32)}
    raises(write(tmp_path / "i.safetensors", ints), "v_proj.lora_A.weight has dtype torch.int32")


def test_a_torch_or_raw_pickle_named_safetensors_is_an_adapter_error(tmp_path):
    """Break-it finding: torch.load hands a PATH ending in .safetensors to the safetensors reader, so a torch .pt
    renamed .safetensors raised SafetensorError ("header too large") as a traceback; the file is now read from an
    open file object and every reader failure is an AdapterError naming the file."""
    import pickle
    pt = tmp_path / "p.safetensors"
    torch.save({"a": torch.zeros(2)}, pt)
    raises(pt, str(pt), "not a YuE2 adapter")  # read as a torch file: its one key names no YuE2 module
    raw = tmp_path / "raw.safetensors"
    raw.write_bytes(pickle.dumps({"a": 1}))
    raises(raw, str(raw))


def test_a_whole_checkpoint_given_as_an_adapter_is_named(tmp_path):
    """Break-it finding: `--lora` with the base checkpoint said "norm diffs … are not supported"; it says what the
    file is and where it belongs (the tokenizer tensor or the VAE tree give a checkpoint away)."""
    t = {"text_encoders.model.norm.weight": torch.ones(H), "text_encoders.yue2_tokenizer_json": torch.zeros(
        8, dtype=torch.uint8)}
    raises(write(tmp_path / "ckpt.safetensors", t), "is a whole YuE2 checkpoint", "--checkpoint")
    t = {"model.diffusion_model.model.norm.weight": torch.ones(H), "vae.decoder.layers.0.weight_v": torch.ones(2)}
    raises(write(tmp_path / "ckpt2.safetensors", t), "is a whole YuE2 checkpoint")


def test_layer_index_in_other_scripts_digits_is_unmatched(tmp_path, gen):
    """A layer index written in non-ASCII digits ("layers.١." — Arabic-Indic one) names no module: Python's int()
    and the regex digit class take it as layer 1, so it was applied to layer 1; now it is listed as unmatched."""
    t = {"diffusion_model.model.layers.0.self_attn.o_proj.lora_A.weight": rnd(gen, 2, Q),
         "diffusion_model.model.layers.0.self_attn.o_proj.lora_B.weight": rnd(gen, H, 2),
         "diffusion_model.model.layers.\u0661.self_attn.o_proj.lora_A.weight": rnd(gen, 2, Q),
         "diffusion_model.model.layers.\u0661.self_attn.o_proj.lora_B.weight": rnd(gen, H, 2)}
    a = read_adapter(write(tmp_path / "digits.safetensors", t), TINY)
    assert sorted(a.unmatched) == sorted(k for k in t if "\u0661" in k)
    assert [p.module for p in a.patches] == ["model.layers.0.self_attn.o_proj"]


@pytest.mark.parametrize("down,up", [(".lora.down.weight", ".lora.up.weight"), ("_lora.down.weight", "_lora.up.weight"),
                                     (".lora_linear_layer.down.weight", ".lora_linear_layer.up.weight")])
def test_diffusers_pair_spellings_read_as_lora_a_b(tmp_path, gen, down, up):
    """ComfyUI's load_lora reads these B/A spellings too (§2); own-weights review, stop 49: such a file was
    "not a YuE2 adapter — none of its keys names a YuE2 module"."""
    f = split_factors(gen)
    a, b = rnd(gen, 4, H), rnd(gen, Q + 2 * KV, 4)
    t = {"diffusion_model.model.layers.1.self_attn.qkv_proj" + down: a,
         "diffusion_model.model.layers.1.self_attn.qkv_proj" + up: b,
         "text_encoders.model.layers.0.mlp.down_proj" + down: f["down_proj"][0],
         "text_encoders.model.layers.0.mlp.down_proj" + up: f["down_proj"][1]}
    ad = read_adapter(write(tmp_path / "d.safetensors", t), TINY)
    got = dense(ad)
    assert set(got) == {("nar", "model.layers.1.self_attn.qkv_proj"), ("ar", "model.layers.0.mlp.down_proj")}
    assert torch.allclose(got[("nar", "model.layers.1.self_attn.qkv_proj")], b.double() @ a.double(), atol=1e-6)
    assert_deltas(ad, "ar", 0, {"mlp.down_proj": expected_fused(f)["mlp.down_proj"]})


def test_kohya_names_comfy_fused_are_the_nar_te_the_ar(tmp_path, gen):
    """`lora_unet_<path with _>` is what stock ComfyUI maps onto diffusion_model.<path> (the NAR); `lora_te_` the
    text-encoder side (the AR). alpha/rank scales (own-weights review, stop 49: refused as "an image-model LoRA such
    as SDXL")."""
    a, b = rnd(gen, 4, H), rnd(gen, Q + 2 * KV, 4)
    a2, b2 = rnd(gen, 4, Q), rnd(gen, H, 4)
    t = {"lora_unet_model_layers_1_self_attn_qkv_proj.lora_down.weight": a,
         "lora_unet_model_layers_1_self_attn_qkv_proj.lora_up.weight": b,
         "lora_unet_model_layers_1_self_attn_qkv_proj.alpha": torch.tensor(8.0),
         "lora_te_model_layers_0_self_attn_o_proj.lora_down.weight": a2,
         "lora_te_model_layers_0_self_attn_o_proj.lora_up.weight": b2,
         "lora_unet_llm2vae.lora_down.weight": rnd(gen, 4, H), "lora_unet_llm2vae.lora_up.weight": rnd(gen, 64, 4),
         "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": rnd(gen, 4, 320)}
    ad = read_adapter(write(tmp_path / "k.safetensors", t), TINY)
    assert ad.layout == "kohya"
    got = dense(ad)
    assert set(got) == {("nar", "model.layers.1.self_attn.qkv_proj"), ("ar", "model.layers.0.self_attn.o_proj"),
                        ("nar", "llm2vae")}
    assert torch.allclose(got[("nar", "model.layers.1.self_attn.qkv_proj")], 2.0 * (b.double() @ a.double()),
                          atol=1e-6)
    assert torch.allclose(got[("ar", "model.layers.0.self_attn.o_proj")], b2.double() @ a2.double(), atol=1e-6)
    assert ad.unmatched == ["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"]


def test_kohya_names_vendor_split_follow_the_vendor_rule(tmp_path, gen):
    """Trainers of the vendor model write its names under lora_unet_: plain self_attn/mlp are the AR's, nar_* the
    NAR's, split q/k/v and gate/up land on their rows; o_proj alone says nothing and is refused."""
    f = split_factors(gen)
    t = {}
    for proj in ("q_proj", "v_proj", "o_proj"):
        t[f"lora_unet_model_layers_0_self_attn_{proj}.lora_down.weight"] = f[proj][0]
        t[f"lora_unet_model_layers_0_self_attn_{proj}.lora_up.weight"] = f[proj][1]
    t["lora_unet_model_layers_1_nar_mlp_up_proj.lora_down.weight"] = f["up_proj"][0]
    t["lora_unet_model_layers_1_nar_mlp_up_proj.lora_up.weight"] = f["up_proj"][1]
    ad = read_adapter(write(tmp_path / "v.safetensors", t), TINY)
    assert {(p.expert, p.module, p.rows) for p in ad.patches} == {
        ("ar", "model.layers.0.self_attn.qkv_proj", (0, Q)), ("ar", "model.layers.0.self_attn.qkv_proj", (Q + KV, KV)),
        ("ar", "model.layers.0.self_attn.o_proj", None), ("nar", "model.layers.1.mlp.gate_up_proj", (F, F))}
    o_only = {k: v for k, v in t.items() if "o_proj" in k}
    raises(write(tmp_path / "o.safetensors", o_only), "o_proj, down_proj", "text_encoders.model.layers.N",
           "diffusion_model.model.layers.N")


def test_kohya_keys_are_named_as_the_file_spells_them(tmp_path, gen):
    """Diff review, stop 49: a kohya key and another key of the same tensor (`lora_te_` and `lora_te1_`, or the
    dotted spelling) came to one name and one of them was dropped without a word; messages, `unmatched` and
    Patch.keys named the dotted key the reader made (`diffusion_model.model.layers.0.…`), which the file does not
    hold. Now the pair is refused as two spellings of one module, and every key named is the file's."""
    a, b = rnd(gen, 4, H), rnd(gen, Q + 2 * KV, 4)
    k = "lora_unet_model_layers_0_self_attn_qkv_proj"
    for other in ("diffusion_model.model.layers.0.self_attn.qkv_proj", "lora_te1_model_layers_0_self_attn_qkv_proj"):
        if other.startswith("lora_te1_"):
            k = "lora_te_model_layers_0_self_attn_qkv_proj"
        t = {f"{k}.lora_down.weight": a, f"{k}.lora_up.weight": b,
             f"{other}.lora_down.weight": a, f"{other}.lora_up.weight": b}
        raises(write(tmp_path / "twice.safetensors", t), f"{k}.lora_down.weight", f"{other}.lora_down.weight",
               "two spellings of one module")
    k = "lora_unet_model_layers_0_self_attn_qkv_proj"
    t = {f"{k}.lora_down.weight": rnd(gen, 4, H + 1), f"{k}.lora_up.weight": b}
    msg = raises(write(tmp_path / "shape.safetensors", t), f"shape mismatch for {k}.lora_down.weight (A of nar:")
    assert "diffusion_model.model.layers.0.self_attn.qkv_proj.lora_down" not in msg, msg
    t = {f"{k}.lora_down.weight": a, f"{k}.lora_up.weight": b, f"{k}.lora_mystery.weight": a}
    ad = read_adapter(write(tmp_path / "ok.safetensors", t), TINY)
    assert [p.keys for p in ad.patches] == [(f"{k}.lora_down.weight", f"{k}.lora_up.weight")]
    assert ad.unmatched == [f"{k}.lora_mystery.weight"]


def test_kohya_unet_keys_spelled_alike_go_to_the_nar_beside_te_keys(tmp_path, gen):
    """Stop-49 leftover: a kohya file whose lora_unet_ keys name only o_proj / down_proj (spelled alike by both
    experts) was refused even beside lora_te_ keys. Two prefixes are ComfyUI's split (te = the AR, unet = the NAR; a
    vendor-model trainer writes one prefix), so those keys now go to the NAR; alone they are still refused."""
    a, b = rnd(gen, 4, Q), rnd(gen, H, 4)
    a2, b2 = rnd(gen, 4, F), rnd(gen, H, 4)
    t = {"lora_unet_model_layers_1_self_attn_o_proj.lora_down.weight": a,
         "lora_unet_model_layers_1_self_attn_o_proj.lora_up.weight": b,
         "lora_te_model_layers_0_mlp_down_proj.lora_down.weight": a2,
         "lora_te_model_layers_0_mlp_down_proj.lora_up.weight": b2}
    ad = read_adapter(write(tmp_path / "two.safetensors", t), TINY)
    got = dense(ad)
    assert set(got) == {("nar", "model.layers.1.self_attn.o_proj"), ("ar", "model.layers.0.mlp.down_proj")}
    assert torch.allclose(got[("nar", "model.layers.1.self_attn.o_proj")], b.double() @ a.double(), atol=1e-6)
    unet_only = {k: v for k, v in t.items() if k.startswith("lora_unet_")}
    raises(write(tmp_path / "one.safetensors", unet_only), "o_proj, down_proj", "diffusion_model.model.layers.N")
