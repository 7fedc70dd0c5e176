"""Found by the stop-54 diff review (docs/bad_inputs.md §51): the refusals that stop 54 added for users' LoRAs and
VAE folders, checked against what real files carry. A PEFT LoRA on lm_head (with the untrained base copy PEFT's
default save_embedding_layers writes beside it) was refused as modules_to_save; PEFT's trained biases were called
modules_to_save; and no check of a VAE config.json's decoder settings ran on the releases' own config.json, which
spells them `decoder_config`."""
from __future__ import annotations

import json
import os

import pytest
import torch

from yue2_core.errors import AdapterError, CheckpointError
from yue2_core.weights.lora.layouts import adapter_notes, read_adapter
from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
from test_review_findings_stop54 import _peft_with  # noqa: E402 — the same tiny PEFT folder with extras

TINY = profile_dims("tiny")


def test_a_peft_lora_on_lm_head_with_peft_s_copy_of_its_base_weight_loads(tmp_path):
    """A PEFT LoRA whose target_modules include lm_head: PEFT's default save_embedding_layers="auto" then also saves
    the wrapped head's frozen base weight, `base_model.model.lm_head.base_layer.weight` — nothing trained. Stop 54
    refused the adapter as "a PEFT adapter with modules_to_save" (before, and now again, it loads: the lm_head LoRA
    applied, the base copy listed as not applied). A trained module (modules_to_save) is still refused."""
    g = torch.Generator().manual_seed(0)
    head = {"base_model.model.lm_head.lora_A.weight": torch.randn(4, TINY.hidden, generator=g) * 0.01,
            "base_model.model.lm_head.lora_B.weight": torch.randn(TINY.vocab, 4, generator=g) * 0.01,
            "base_model.model.lm_head.base_layer.weight": torch.randn(TINY.vocab, TINY.hidden, generator=g) * 0.01}
    plain = read_adapter(str(write_adapter("peft", tmp_path / "plain", TINY)), TINY)
    folder = _peft_with(tmp_path, head, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"])
    adapter = read_adapter(folder, TINY)
    assert len(adapter.patches) == len(plain.patches) + 1
    assert [p.expert for p in adapter.patches if p.module == "model.lm_head"] == ["ar"]
    assert adapter.unmatched == ["base_model.model.lm_head.base_layer.weight"]
    assert any("base_model.model.lm_head.base_layer.weight" in n for n in adapter_notes(adapter))
    trained = {"base_model.model.lm_head.modules_to_save.default.weight": torch.randn(8, TINY.hidden) * 0.01}
    with pytest.raises(AdapterError, match=r"modules_to_save .*lm_head \(base_model\.model\.lm_head\.modules_to_"):
        read_adapter(_peft_with(tmp_path / "m", trained, modules_to_save=["lm_head"]), TINY)


def test_a_peft_lora_trained_with_biases_is_refused_as_such(tmp_path):
    """PEFT's bias="all" saves every trained bias (`…vae2llm.base_layer.bias` of a wrapped module, `….bias` of
    another): stop 54 refused it as "a PEFT adapter with modules_to_save (whole trained modules …)", which the file
    has none of. Now the refusal names bias "all" / "lora_only" and bias "none", PEFT's default."""
    bias = {"base_model.model.vae2llm.base_layer.bias": torch.randn(TINY.hidden) * 0.01}
    with pytest.raises(AdapterError) as err:
        read_adapter(_peft_with(tmp_path, bias, bias="all"), TINY)
    text = str(err.value)
    assert "modules_to_save" not in text, text
    assert ('a PEFT LoRA trained with bias="all" or "lora_only" (trained biases of the model saved beside its LoRA '
            "pairs: vae2llm (base_model.model.vae2llm.base_layer.bias))") in text, text
    assert "adapter_config.json bias 'all'" in text and 'save it with bias "none"' in text, text


def _release_spelling(config: dict) -> dict:
    """`config` (synthetic_vae.vae_config) as the vendor's YuE2VAEConfig saves it: encoder_config / decoder_config
    (its to_dict keys) and the HF fields, as m-a-p/YuE2-Vae's config.json has them."""
    out = {k: v for k, v in config.items() if k not in ("encoder", "decoder")}
    out.update(encoder_config=config["encoder"], decoder_config=config["decoder"], architectures=["YuE2VAE"],
               dtype="float32", auto_map={"AutoConfig": "modeling_vae.YuE2VAEConfig",
                                          "AutoModel": "modeling_vae.YuE2VAE"})
    return out


def test_a_vae_config_in_the_releases_spelling_is_checked(tmp_path):
    """The releases' config.json gives the decoder settings as `decoder_config` (strides [2, 2, 4, 4, 5, 6] in
    encoder order); only `decoder` was read, so neither the stop-54 strides-order check nor the stop-38 settings
    check ran on a real folder: a config stating another order, or a final tanh, was read without a word. Now both
    read `decoder_config` (and `decoder`), name the key the file uses, and the release's own config still loads."""
    from yue2_core.weights.synthetic_vae import vae_config, vae_tensors, write_vendor_folder
    from yue2_core.weights.vae_files import open_vae
    tensors = vae_tensors("tiny", "standard")
    good = _release_spelling(vae_config("tiny", "standard"))
    assert good["decoder_config"]["strides"] == [2, 2, 4, 4, 5, 6]
    vae = open_vae(write_vendor_folder(str(tmp_path / "release"), tensors, good))
    assert [s for _, _, s in vae.config.blocks] == [6, 5, 4, 4, 2, 2]
    reordered = json.loads(json.dumps(good))
    reordered["decoder_config"]["strides"] = [2, 2, 4, 4, 6, 5]
    with pytest.raises(CheckpointError, match=r"config.json decoder_config.strides \[2, 2, 4, 4, 6, 5\] .* disagree "
                                              r"with the weights, whose transposed convolutions have strides "
                                              r"6·5·4·4·2·2"):
        open_vae(write_vendor_folder(str(tmp_path / "reordered"), tensors, reordered))
    tanh = json.loads(json.dumps(good))
    tanh["decoder_config"]["final_tanh"] = True
    with pytest.raises(CheckpointError, match=r"config.json decoder_config.final_tanh is true; this decoder "
                                              r"implements final_tanh = false"):
        open_vae(write_vendor_folder(str(tmp_path / "tanh"), tensors, tanh))
    assert os.path.isfile(tmp_path / "release" / "config.json")
