"""Findings of the stop-54 own-weights break-it review, docs/bad_inputs.md §49: users' adapters, VAE decoders and
vendor folders that loaded and gave another model, another song length or a misleading refusal. Every file is
written by the project's synthetic writers and then changed as a real file could be."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from robust_helpers import rewrite
from yue2_core.errors import AdapterError, CheckpointError
from yue2_core.weights.checkpoint import inspect_checkpoint
from yue2_core.weights.lora.layouts import RELEASE_DIMS, adapter_notes, read_adapter
from yue2_core.weights.lora.synthetic import profile_dims, write_adapter

TINY = profile_dims("tiny")
_SPLIT = {"q_proj": (2048, 2048), "k_proj": (1024, 2048), "v_proj": (1024, 2048), "o_proj": (2048, 2048),
          "gate_proj": (6144, 2048), "up_proj": (6144, 2048), "down_proj": (2048, 6144)}


def _qwen3_peft(folder, base: str) -> str:
    """A PEFT LoRA as PEFT saves one for Qwen/Qwen3-1.7B (hidden 2048, 16/8 heads of 128, ffn 6144 — the YuE2 AR's
    geometry): `base_model.model.model.layers.N.{self_attn,mlp}.<proj>` pairs on layers 0 and 27, and its config."""
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for n in (0, 27):
        for proj, (out_f, in_f) in _SPLIT.items():
            stem = f"base_model.model.model.layers.{n}.{'self_attn' if proj[0] in 'qkvo' else 'mlp'}.{proj}"
            tensors[stem + ".lora_A.weight"] = torch.randn(2, in_f, generator=g) * 0.01
            tensors[stem + ".lora_B.weight"] = torch.randn(out_f, 2, generator=g) * 0.01
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "task_type": "CAUSAL_LM", "target_modules": list(_SPLIT),
              "base_model_name_or_path": base}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return str(folder)


def test_a_peft_lora_of_a_qwen3_text_model_is_refused(tmp_path):
    """A Qwen3-1.7B text LoRA has the YuE2 AR's layer names (the vendor's q_proj … down_proj) and shapes, so it was
    applied to the AR without a word — `adapter_config.json` said base_model_name_or_path "Qwen/Qwen3-1.7B". Now that
    field (or a metadata `base_model`) naming another model family refuses it; YuE2's own name, a local folder or a
    hash still read."""
    with pytest.raises(AdapterError, match=r"made for another model — its adapter_config.json "
                                           r"base_model_name_or_path is 'Qwen/Qwen3-1.7B' \(qwen\), not YuE2"):
        read_adapter(_qwen3_peft(tmp_path / "qwen", "Qwen/Qwen3-1.7B"), RELEASE_DIMS)
    for ok in ("m-a-p/YuE2-3B", "/data/models/finetune-7", "/root/.cache/hf/models--m-a-p--YuE2-3B/snapshots/ab12"):
        adapter = read_adapter(_qwen3_peft(tmp_path / "ok", ok), RELEASE_DIMS)
        assert {p.expert for p in adapter.patches} == {"ar"} and len(adapter.patches) == 14
    plain = str(tmp_path / "qwen_meta.safetensors")
    rewrite(str(tmp_path / "ok" / "adapter_model.safetensors"), plain,
            lambda t, m: m.update({"base_model": "meta-llama/Llama-3.2-1B"}))
    with pytest.raises(AdapterError, match=r"its metadata base_model is 'meta-llama/Llama-3.2-1B' \(llama\)"):
        read_adapter(plain, RELEASE_DIMS)


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "olora", "corda", "loftq"])
def test_a_peft_lora_initialised_against_a_changed_base_is_refused(tmp_path, init):
    """PiSSA / OLoRA / CorDA (and LoftQ) move part of each weight into the adapter when PEFT initialises it and train
    against what is left: applied to YuE2's own weights such an adapter adds that part a second time. It was applied
    as a plain LoRA; now refused, naming PEFT's conversion (which saves init_lora_weights true, still read)."""
    folder = write_adapter("peft", tmp_path / "p", TINY)
    config = json.loads((folder / "adapter_config.json").read_text())
    for value, refused in ((init, True), (True, False), ("gaussian", False), ("eva", False)):
        (folder / "adapter_config.json").write_text(json.dumps({**config, "init_lora_weights": value}))
        if refused:
            with pytest.raises(AdapterError, match=f"init_lora_weights='{init}' .*path_initial_model_for_weight_"):
                read_adapter(str(folder), TINY)
        else:
            assert read_adapter(str(folder), TINY).scales == [2.0]


def test_a_renamed_peft_file_without_its_config_warns_that_its_alpha_is_lost(tmp_path):
    """PEFT keeps lora_alpha only in adapter_config.json, read for a folder or beside adapter_model.safetensors: the
    usual ComfyUI move — adapter_model.safetensors renamed into the loras folder — applied it at scale 1 (here half
    its trained strength: lora_alpha 8, r 4) without a word. Now a warning says so and how to apply it as trained."""
    folder = write_adapter("peft", tmp_path / "p", TINY)
    assert read_adapter(str(folder), TINY).scales == [2.0] and not adapter_notes(read_adapter(str(folder), TINY))
    renamed = tmp_path / "loras" / "my_song_lora.safetensors"
    renamed.parent.mkdir()
    shutil.copy(folder / "adapter_model.safetensors", renamed)
    adapter = read_adapter(str(renamed), TINY)
    assert adapter.scales == [1.0]
    (note,) = adapter_notes(adapter)
    assert "its scale cannot be read" in note and "lora_alpha" in note and "adapter_config.json" in note
    assert "applied at scale 1 (as if alpha = rank; rank 4)" in note and "strength 2 plays it as trained" in note
    fixed = tmp_path / "loras" / "with-alpha-my_song_lora.safetensors"
    save_file(load_file(str(renamed)), str(fixed), {"rank": "4", "alpha": "8"})  # what the note's command writes
    assert read_adapter(str(fixed), TINY).scales == [2.0]


def _reorder_strides(tensors: dict, prefix: str = "") -> None:
    """Give decoder blocks 2 and 6 strides 2 and 5 (kernels 4 and 10) instead of 5 and 2: 6·2·4·4·2·5, still 1920."""
    g = torch.Generator().manual_seed(1)
    for block, stride in ((2, 2), (6, 5)):
        key = f"{prefix}decoder.layers.{block}.layers.1.weight_v"
        c_in, c_out, _ = tensors[key].shape
        tensors[key] = (torch.randn(c_in, c_out, 2 * stride, generator=g) * 0.1).to(tensors[key].dtype)


def test_a_vae_whose_strides_come_in_another_order_is_refused(tmp_path, nano_path):
    """A decoder whose strides multiply to 1920 in another order (6·2·4·4·2·5) decodes T frames to 1920·T − 1
    samples, not the song format's 1920·T − 64: `--vae` / the VAE Loader took it and wrote songs of another length
    (47,999 samples for 25 frames) that Save Song, the edits and takes measure against 1920·T − 64; a folder whose
    config.json states another order than its weights, and a checkpoint with such a VAE of its own, were read too.
    Now each is refused when opened."""
    from yue2_core.weights.synthetic_vae import vae_config, vae_tensors, write_vendor_folder
    from yue2_core.weights.vae_files import open_vae
    tensors = vae_tensors("tiny", "legacy")
    _reorder_strides(tensors)
    with pytest.raises(CheckpointError, match=r"strides 6·2·4·4·2·5 \(in decoding order\) make 1920 samples per "
                                              r"latent frame, but in this order they decode T frames to 1920·T − 1 "
                                              r"samples; YuE2 songs are 1920·T − 64"):
        open_vae(write_vendor_folder(str(tmp_path / "reordered"), tensors, vae_config("tiny", "legacy")))
    config = vae_config("tiny", "legacy")
    config["decoder"]["strides"] = [2, 2, 4, 4, 6, 5]
    with pytest.raises(CheckpointError, match=r"decoder.strides \[2, 2, 4, 4, 6, 5\] .* disagree with the weights, "
                                              r"whose transposed convolutions have strides 6·5·4·4·2·2"):
        open_vae(write_vendor_folder(str(tmp_path / "config"), vae_tensors("tiny", "legacy"), config))
    ckpt = rewrite(nano_path, tmp_path / "ckpt.safetensors", lambda t, m: _reorder_strides(t, "vae."))
    with pytest.raises(CheckpointError, match=r"VAE decoder's strides 6·2·4·4·2·5 .* decode T latent frames to "
                                              r"1920·T − 1 samples; YuE2 songs are 1920·T − 64"):
        inspect_checkpoint(ckpt)


def test_a_vendor_folder_missing_a_shard_left_out_of_its_index_names_the_shard(tmp_path):
    """A shard deleted and dropped from model.safetensors.index.json (a hand-edited index, a partial re-download):
    the refusal said only `the weights have no model.layers.0.* tensors` (or `N vendor tensors missing`), nothing of
    the file. Now it adds the weights files weights_manifest.json lists that were not read."""
    from synthetic_cache import cached_checkpoint
    from yue2_core.weights.synthetic_vendor import write_vendor_folder
    folder = tmp_path / "YuE2-3B"
    write_vendor_folder(cached_checkpoint("tiny", "bf16"), str(folder), max_shard_bytes=20_000_000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[1]
    (folder / lost).unlink()
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != lost}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(folder)
    assert (f"weights_manifest.json lists 1 weights file that model.safetensors.index.json does not name: {lost} "
            "(missing)") in str(err.value), str(err.value)


# ---- stop-54 leftovers: PEFT parts the pack does not apply, a module under two naming schemes, a file at two scales


def _peft_with(tmp_path, extra: dict, **config) -> str:
    """The synthetic tiny PEFT folder with `extra` tensors added to adapter_model.safetensors and `config` fields
    added to adapter_config.json."""
    folder = write_adapter("peft", tmp_path / "p", TINY)
    weights = folder / "adapter_model.safetensors"
    save_file({**load_file(str(weights)), **extra}, str(weights))
    cfg = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    return str(folder)


def test_a_peft_lora_with_lora_bias_is_refused(tmp_path):
    """PEFT's `lora_bias=True` gives each LoRA's B a bias: the adapter adds (B·A·x + b)·scale, and YuE2's attention
    and MLP Linears have no bias to carry b. The `…lora_B.bias` tensors were listed as "keys that name no YuE2 module"
    (they do name one) and left out: another model than the one trained. Now refused, naming lora_bias and what is
    read (lora_bias false, PEFT's default) — with adapter_config.json, and with the weights file renamed out of its
    folder (no config, only the bias keys)."""
    stem = "base_model.model.model.layers.0.self_attn.q_proj"
    bias = {f"{stem}.lora_B.bias": torch.full((2 * 128,), 0.01)}  # q rows: heads · head_dim
    folder = _peft_with(tmp_path, bias, lora_bias=True)
    with pytest.raises(AdapterError, match=rf"lora_bias.*{stem}\.lora_B\.bias.*lora_bias false"):
        read_adapter(folder, TINY)
    renamed = tmp_path / "my_lora.safetensors"
    shutil.copy(os.path.join(folder, "adapter_model.safetensors"), renamed)
    with pytest.raises(AdapterError, match=rf"lora_bias.*{stem}\.lora_B\.bias"):
        read_adapter(str(renamed), TINY)
    (tmp_path / "p" / "adapter_config.json").write_text(  # the flag alone: its biases were lost with the file
        json.dumps({**json.loads((tmp_path / "p" / "adapter_config.json").read_text()), "lora_bias": True}))
    save_file({k: v for k, v in load_file(os.path.join(folder, "adapter_model.safetensors")).items()
               if not k.endswith(".bias")}, os.path.join(folder, "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match=r"adapter_config.json lora_bias: true"):
        read_adapter(folder, TINY)


@pytest.mark.parametrize("key, module", [
    ("base_model.model.model.norm.weight", "model.norm"),
    # the refusal comes before any shape is read: a few rows stand for the [vocab, hidden] head
    ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head"),
])
def test_a_peft_lora_with_modules_to_save_is_refused(tmp_path, key, module):
    """PEFT's `modules_to_save` stores whole trained modules (an lm_head, embed_tokens, a final norm) beside the
    LoRA pairs, as full `…<module>.weight` tensors (or under `.modules_to_save.<adapter>.`): they were listed as
    unmatched and the LoRA applied without them — another model than the one trained. Now refused, naming the
    module and saying the pack applies low-rank adapters only."""
    folder = _peft_with(tmp_path, {key: torch.randn(8, TINY.hidden) * 0.01}, modules_to_save=[module.split(".")[-1]])
    with pytest.raises(AdapterError, match=rf"modules_to_save.*{re.escape(module)} \({re.escape(key)}\).*low-rank "
                                           r"adapters only"):
        read_adapter(folder, TINY)


def test_one_module_under_two_naming_schemes_names_both_keys(tmp_path):
    """One module as `lora_A`/`lora_B` and again as `lora_down`/`lora_up` (or a kohya name) was refused with "an
    adapter holds one of each (one PEFT adapter name per file)", which fits neither file. Now the message says the
    module is given twice under two naming schemes and names both keys; two PEFT adapter names keep their message."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, TINY.hidden, generator=g), torch.randn(TINY.hidden, 4, generator=g)
    stem = "diffusion_model.model.layers.0.self_attn.o_proj"
    path = str(tmp_path / "both.safetensors")
    save_file({f"{stem}.lora_A.weight": a, f"{stem}.lora_B.weight": b, f"{stem}.lora_down.weight": a.clone(),
               f"{stem}.lora_up.weight": b.clone()}, path)
    with pytest.raises(AdapterError, match=rf"{stem} is given twice, under two naming schemes: {stem}\.lora_A\."
                                           rf"weight \(lora_A/lora_B\) and {stem}\.lora_down\.weight "
                                           r"\(lora_down/lora_up\)"):
        read_adapter(path, TINY)
    kohya = "lora_unet_model_layers_0_self_attn_q_proj"
    dotted = "model.layers.0.self_attn.q_proj"
    save_file({f"{kohya}.lora_down.weight": a, f"{kohya}.lora_up.weight": b,
               f"{dotted}.lora_A.weight": a.clone(), f"{dotted}.lora_B.weight": b.clone()}, path)
    with pytest.raises(AdapterError, match=rf"module {dotted} is given twice, under two naming schemes: ") as err:
        read_adapter(path, TINY)
    assert f"{kohya}.lora_down.weight (lora_down/lora_up)" in str(err.value), str(err.value)
    assert f"{dotted}.lora_A.weight (lora_A/lora_B)" in str(err.value), str(err.value)
    save_file({f"{stem}.lora_A.default.weight": a, f"{stem}.lora_B.default.weight": b,
               f"{stem}.lora_A.style.weight": a.clone(), f"{stem}.lora_B.style.weight": b.clone()}, path)
    with pytest.raises(AdapterError, match=r"one PEFT adapter name per file"):
        read_adapter(path, TINY)


def test_a_peft_folder_stacked_with_its_renamed_weights_says_each_scale(tmp_path):
    """A PEFT folder (lora_alpha 8, r 4: scale 2) and a renamed copy of its adapter_model.safetensors (no config:
    scale 1) are the same weights file, so the repeat note said "its strengths add up (AR ×2, …)" — but the two
    apply at different scales, the sum is 1·2 + 1·1 = 3 times B·A, not 2 × the folder's. Now the note says what
    each entry applies at and what they add up to."""
    from yue2_core.weights.lora.apply import Applied, repeat_notes
    folder = write_adapter("peft", tmp_path / "p", TINY)
    copy = tmp_path / "loras" / "copy.safetensors"
    copy.parent.mkdir()
    shutil.copy(folder / "adapter_model.safetensors", copy)
    whole, renamed = read_adapter(str(folder), TINY), read_adapter(str(copy), TINY)
    (note,) = repeat_notes([Applied(whole, 1.0, 0.5), Applied(renamed, 1.0, 1.0)])
    assert "read at different scales" in note and "its strengths add up (AR" not in note, note
    assert f"{folder} at scale 2 (adapter_config.json lora_alpha / r)" in note, note
    assert f"{copy} at scale 1 (no alpha)" in note, note
    assert "B·A adds up to AR ×3 (1·2 + 1·1), NAR ×2 (0.5·2 + 1·1)" in note, note
    (same,) = repeat_notes([Applied(whole, 1.0, 0.5), Applied(read_adapter(str(folder), TINY), 1.0, 1.0)])
    assert same.endswith("its strengths add up (AR ×2, NAR ×1.5)"), same


def test_a_lora_safetensors_beside_its_adapter_config_reads_the_alpha(tmp_path):
    """Published YuE2 adapters ship folders of `lora.safetensors` + adapter_config.json (weights_and_lora.md §1.1 H,
    monsterovich's adapter-ar-179: alpha 48 over r 32). ComfyUI's LoRA dropdown lists the file, not the folder: given
    so, the sidecar was not read and the adapter played at r / alpha of its strength (with a note that blamed the
    name). Now the sidecar beside a `lora.safetensors` is read as beside `adapter_model.safetensors`; and a sidecar
    spelling the two numbers `rank` / `alpha` (no PEFT `r`) is read for them instead of refused."""
    folder = write_adapter("peft", tmp_path / "p", TINY)
    os.replace(folder / "adapter_model.safetensors", folder / "lora.safetensors")
    adapter = read_adapter(str(folder / "lora.safetensors"), TINY)
    assert adapter.scales == [2.0] and not adapter_notes(adapter)  # lora_alpha 8 over r 4
    assert any(f.endswith("adapter_config.json") for f in adapter.files)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["rank"], cfg["alpha"] = cfg.pop("r"), cfg.pop("lora_alpha") * 3
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    assert read_adapter(str(folder / "lora.safetensors"), TINY).scales == [6.0]
    other = tmp_path / "q"
    other.mkdir()
    shutil.copy(folder / "lora.safetensors", other / "mine.safetensors")  # another name: no sidecar read
    shutil.copy(folder / "adapter_config.json", other / "adapter_config.json")
    assert read_adapter(str(other / "mine.safetensors"), TINY).scales == [1.0]
