"""Adapter values that break the model are refused when the adapter is read or stacked, naming the file and what is
accepted; NaN the model still produces names the user's own weights before the checkpoint (CPU, tiny synthetic
model). Findings: a huge or underflowing PEFT lora_alpha, LoRA factors whose product overflows, the same file twice
(strength past ±5), non-finite messages that blamed only the checkpoint."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from yue2_core.__main__ import main
from yue2_core.errors import AdapterError, NumericalError
from yue2_core.pipeline import Budgets, YuE2Engine, decode
from yue2_core.protocol import SongRequest
from yue2_core.weights import checkpoint
from yue2_core.weights.checkpoint import inspect_checkpoint
from yue2_core.weights.lora import synthetic as lora_synth
from yue2_core.weights.lora.apply import Applied, check_stack, plan_expert
from yue2_core.weights.lora.layouts import read_adapter
from yue2_core.weights.own import blame, mark
from synthetic_cache import synthetic_link

SMALL = ["--max-seconds", "1", "--max-abc-tokens", "8", "--steps", "2", "--device", "cpu", "--offline"]
DOWN = "model.layers.0.mlp.down_proj"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter_values")
    ckpt = root / "tiny_bf16.safetensors"
    synthetic_link(str(ckpt), "tiny", "bf16", seed=0)
    dims = inspect_checkpoint(str(ckpt)).dims
    lora = lora_synth.write_adapter("aitk", root / "aitk.safetensors", dims, rank=4, seed=1)
    tensors = load_file(str(lora))

    def filled(name, value):  # every factor `value`: each finite, the product rank·value² per weight
        save_file({k: torch.full(v.shape, value) for k, v in tensors.items()}, str(root / name))
        return root / name

    return {"root": root, "ckpt": ckpt, "dims": dims, "lora": lora,
            "overflow": filled("overflow.safetensors", 1e30),  # 4e60: not finite in fp32
            "nan": filled("nan.safetensors", 1e18),  # 4e36: finite, but NaN logits / latents
            "half": filled("half.safetensors", 7e18)}  # 1.96e38: finite alone, inf when two are stacked


def _run(*args) -> int:
    try:
        return main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code


@pytest.fixture
def no_weights_read(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the weights were read before the adapters were checked")
    monkeypatch.setattr(checkpoint, "load_ar", refuse)
    monkeypatch.setattr(checkpoint, "load_nar", refuse)


# ------------------------------------------------------------------------------- PEFT alpha (finding 3)

def _peft(tmp_path, config: str) -> str:
    d = tmp_path / "peft"
    d.mkdir(exist_ok=True)
    g = torch.Generator().manual_seed(0)
    save_file({"base_model.model.model.layers.1.mlp.down_proj.lora_A.weight": torch.randn(4, 512, generator=g),
               "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight": torch.randn(256, 4, generator=g)},
              str(d / "adapter_model.safetensors"))
    (d / "adapter_config.json").write_text(config)
    return str(d)


@pytest.mark.parametrize("alpha, extra, message", [
    ("9" * 400, "", '"lora_alpha" must be a positive finite number; found 9{20}…9{8} \\(400 characters\\)'),
    ("-" + "9" * 400, "", '"lora_alpha" must be a positive finite number; found -9{19}…'),
    ("8", ', "alpha_pattern": {"down_proj": ' + "9" * 400 + "}",
     '"alpha_pattern" must map module names to a positive finite number'),
])
def test_huge_integer_alpha_is_an_adapter_error(files, tmp_path, alpha, extra, message):
    """Before: OverflowError from math.isfinite on a 400-digit int."""
    path = _peft(tmp_path, f'{{"peft_type": "LORA", "r": 4, "lora_alpha": {alpha}{extra}}}')
    with pytest.raises(AdapterError, match=message):
        read_adapter(path, files["dims"])


@pytest.mark.parametrize("alpha, extra, scale", [
    ("5e-324", "", "scale 0 \\(adapter_config.json lora_alpha / r\\)"),
    ("1e-323", ', "use_rslora": true', "scale 4.94066e-324 \\(adapter_config.json lora_alpha / √r \\(rslora\\)\\)"),
    ("8", ', "alpha_pattern": {"down_proj": 1e-320}', "scale 2.49997e-321 \\(adapter_config.json lora_alpha / r\\)"),
])
def test_alpha_that_underflows_the_scale_is_refused(files, tmp_path, alpha, extra, scale):
    """Before: the scale underflowed to 0 (or a denormal) and the adapter silently changed nothing."""
    path = _peft(tmp_path, f'{{"peft_type": "LORA", "r": 4, "lora_alpha": {alpha}{extra}}}')
    with pytest.raises(AdapterError, match=f"{scale} is too small: \\|scale\\| must be at least 1e-12, or the "
                                           "adapter changes nothing"):
        read_adapter(path, files["dims"])


def test_metadata_alpha_that_underflows_is_refused(files, tmp_path):
    t = {f"text_encoders.{DOWN}.lora_A.weight": torch.randn(4, 512), f"text_encoders.{DOWN}.lora_B.weight":
         torch.randn(256, 4)}
    save_file(t, str(tmp_path / "m.safetensors"), {"format": "yue2-ar-lora-v1", "alpha": "5e-324"})
    with pytest.raises(AdapterError, match="scale 0 \\(metadata alpha / rank\\) is too small"):
        read_adapter(str(tmp_path / "m.safetensors"), files["dims"])


# ------------------------------------------------------------------ overflowing factors (finding 4a)

def test_factors_whose_product_overflows_are_refused_before_loading(files, no_weights_read):
    """Before: the whole AR phase ran and ended in "NaN logits … download the checkpoint again"."""
    for strengths in ((1.0, 1.0), (0.0, 1.0)):
        with pytest.raises(AdapterError, match=f"the LoRA {files['overflow']} would add up to 4e\\+60 to "
                                               f"(AR|NAR) {DOWN} \\(weight; overflow.safetensors ×1; largest from "
                                               ".*lora_A.weight.*\\): beyond 3.39e\\+38, the largest bf16 value"):
            YuE2Engine.load(files["ckpt"], device="cpu", loras=[(files["overflow"], *strengths)], warm_up=False)


def test_two_adapters_that_overflow_together_are_named(files):
    a = Applied(read_adapter(files["half"], files["dims"]))
    check_stack([a])  # 1.96e38 alone: finite
    copy = files["root"] / "half_copy.safetensors"
    save_file({k: v * 1.0 for k, v in load_file(str(files["half"])).items()}, str(copy), {"copy": "1"})
    b = Applied(read_adapter(copy, files["dims"]), 1.0, 0.0)
    with pytest.raises(AdapterError, match=f"the LoRA {files['half']} \\+ {copy} would add up to 3.92e\\+38 to AR "
                                           f"{DOWN} \\(weight; half.safetensors ×1, half_copy.safetensors ×1"):
        check_stack([a, b])
    check_stack([a, Applied(b.adapter, 0.0, 0.0)])  # strength 0: the adapter is off


def test_plan_expert_refuses_an_overflowing_adapter(files):
    """The nodes apply adapters through plan_expert (ComfyUI weight patches): the same check runs there."""
    from yue2_core.weights.checkpoint import load_ar
    ar = load_ar(inspect_checkpoint(files["ckpt"]), "cpu", torch.bfloat16)
    with pytest.raises(AdapterError, match="would add up to 4e\\+60 to AR"):
        plan_expert(ar, [Applied(read_adapter(files["overflow"], files["dims"]))], "ar")


# ------------------------------------------------------------- non-finite messages (finding 4b)

def test_nan_logits_and_latents_name_the_applied_lora(files):
    """Before: "the AR weights look damaged — download the checkpoint again" with the adapter the real cause."""
    request = SongRequest(style="pop", lyrics="la la", seed=5)
    budgets = Budgets(max_seconds=1, max_abc_tokens=8)
    engine = YuE2Engine.load(files["ckpt"], device="cpu", loras=[(files["nan"], 1.0, 1.0)], warm_up=False)
    with pytest.raises(NumericalError) as err:
        engine.generate(request, budgets, steps=2)
    assert str(err.value) == (
        f"the model produced NaN logits (or no allowed token has a finite score): the AR weights look damaged — the "
        f"LoRA {files['nan']} (AR ×1) is applied to them: a damaged adapter or too high a strength gives this — try "
        "without it or at a lower strength; if it happens without it, download the checkpoint again")
    engine = YuE2Engine.load(files["ckpt"], device="cpu", loras=[(files["nan"], 0.0, 1.0)], warm_up=False)
    with pytest.raises(NumericalError, match=f"flow matching produced non-finite latents \\(NaN/inf\\): the NAR "
                                             f"weights look damaged — the LoRA {files['nan']} \\(NAR ×1\\) is "
                                             "applied to them"):
        engine.generate(request, budgets, steps=2)


def test_non_finite_audio_names_the_vae_file(tmp_path):
    """pipeline.decode names the VAE file a decoder came from (`VAEFile.load` marks it); without own weights the
    message is unchanged."""
    from yue2_core.vae import VAEDecoder
    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.vae_files import open_vae
    path = write_vae(str(tmp_path / "vae.safetensors"), layout="vendor-file")
    vae = open_vae(path).load()

    def nan_audio(lat, **kw):
        return torch.full((1, 2, 1920 * lat.shape[-1] - 64), float("nan"))

    vae.decode_tiled = nan_audio
    with pytest.raises(NumericalError, match=f"the VAE weights look damaged — they come from the VAE file "
                                             f"{tmp_path / 'vae.safetensors'} \\(used instead of the checkpoint's\\)"):
        decode(vae, torch.zeros(3, 64))
    plain = VAEDecoder(vae.cfg)
    plain.decode_tiled = nan_audio
    with pytest.raises(NumericalError, match="the VAE weights look damaged — download the checkpoint again$"):
        decode(plain, torch.zeros(3, 64))


def test_fast_path_messages_name_the_adapters_too(monkeypatch):
    """The CUDA decoders and renderers raise their own NumericalError texts; the pipeline stages rewrite them the
    same way (the render names the AR's adapters too: its keys and values feed the NAR)."""
    from types import SimpleNamespace

    from yue2_core import fast, pipeline
    from yue2_core.pipeline import SemanticTokens

    def failing(text):
        def run(*a, **k):
            raise NumericalError(text)
        return lambda module: run

    ar = SimpleNamespace(dims=SimpleNamespace(vocab=200_000), yue2_own_weights=(("lora", "/a.safetensors", "ar", 2.0),))
    nar = SimpleNamespace(yue2_own_weights=(("lora", "/b.safetensors", "nar", 1.0),))
    monkeypatch.setattr(fast, "select_generate", failing("the model produced NaN logits: the AR weights look damaged "
                                                         "— download the checkpoint again"))
    with pytest.raises(NumericalError, match="^the model produced NaN logits: the AR weights look damaged — the LoRA "
                                             "/a.safetensors \\(AR ×2\\) is applied to them: .*; if it happens "
                                             "without it, download the checkpoint again$"):
        pipeline._phase(ar, [1], None, 0, "abc")
    monkeypatch.setattr(fast, "select_render", failing("non-finite latents: the NAR weights look damaged — download "
                                                       "the checkpoint again"))
    tokens = SemanticTokens(codes=[1, 2], prefix=[1], score=None, request={}, seed=0, cfg_scale=1.0, sampling={},
                            ended=True)
    with pytest.raises(NumericalError, match="the LoRAs /a.safetensors \\(AR ×2\\), /b.safetensors \\(NAR ×1\\) "
                                             "are applied to them"):
        pipeline.render(ar, nar, tokens, steps=2)


def test_blame_names_every_adapter_once():
    ar, nar = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    mark(ar, [("lora", "/a.safetensors", "ar", 5.0), ("lora", "/b.safetensors", "ar", -1.5)])
    mark(nar, [("lora", "/a.safetensors", "nar", 1.0)])
    text = blame("flow matching produced non-finite latents: the NAR weights look damaged — download the "
                 "checkpoint again", ar, nar)
    assert text == ("flow matching produced non-finite latents: the NAR weights look damaged — the LoRAs "
                    "/a.safetensors (AR ×5, NAR ×1), /b.safetensors (AR ×-1.5) are applied to them: a damaged adapter "
                    "or too high a strength gives this — try without them or at a lower strength; if it happens "
                    "without them, download the checkpoint again")
    assert blame(text, ar) == text  # already named: unchanged
    assert blame("x — download the checkpoint again", torch.nn.Linear(1, 1)) == "x — download the checkpoint again"
    # the nodes state each load's adapters (`replace`): a later load without them names none
    mark(ar, [("lora", "/c.safetensors", "ar", 2.0)], replace=True)
    assert "/c.safetensors (AR ×2)" in blame("x — download the checkpoint again", ar)
    assert "/a.safetensors" not in blame("x — download the checkpoint again", ar)
    mark(ar, [], replace=True)
    assert blame("x — download the checkpoint again", ar) == "x — download the checkpoint again"


# ----------------------------------------------------------------- the same file twice (finding 5)

def test_same_file_twice_is_refused_on_the_command_line(files, capsys, no_weights_read):
    """Before: `--lora a:5 --lora a:5` stacked silently (×10, past the ±5 limit; 20 copies ×100). Now the strengths
    one file brings to an expert must add up within ±5."""
    out = files["root"] / "never"
    rc = _run("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", files["ckpt"], *SMALL,
              "--output", out, "--lora", f"{files['lora']}:5", "--lora", f"{files['lora']}:5:-1")
    err = capsys.readouterr().err
    assert rc != 0 and not out.exists()
    assert (f"the LoRA {files['lora']} reaches the AR 2 times ({files['lora']} ×5 + {files['lora']} ×5: the same "
            "weights file); strengths of the same file add up to 10, beyond the 5 limit of one entry") in err


def test_same_file_within_the_limit_or_on_separate_experts_is_accepted(files):
    """Second break-it review: the first rule refused `a:2:0 + a:0:-1` (no expert gets the file twice) and songs
    recorded with the same file twice within the limit could no longer be re-rendered."""
    a = read_adapter(files["lora"], files["dims"])
    check_stack([Applied(a, 2.0, 0.0), Applied(a, 0.0, -1.0)])  # one entry per expert
    check_stack([Applied(a, 1.0, 1.0), Applied(a, 1.0, 1.0)])  # ×2 on both: within ±5, as an old song recorded it
    check_stack([Applied(a, 5.0, 0.0), Applied(a, -5.0, 0.0)])  # they cancel: the same patch, strengths add
    with pytest.raises(AdapterError, match="reaches the NAR 2 times .* add up to -6"):
        check_stack([Applied(a, 0.0, -3.0), Applied(a, 1.0, -3.0)])


def test_same_bytes_under_another_name_and_nodes_path(files, tmp_path):
    copy = tmp_path / "renamed.safetensors"
    shutil.copy(files["lora"], copy)
    a = Applied(read_adapter(files["lora"], files["dims"]), 3.0, 1.0)
    b = Applied(read_adapter(copy, files["dims"]), 3.0, 0.5)
    with pytest.raises(AdapterError, match=f"the LoRA {files['lora']} reaches the AR 2 times .* add up to 6"):
        check_stack([a, b])
    from yue2_core.weights.checkpoint import load_nar
    nar = load_nar(inspect_checkpoint(files["ckpt"]), "cpu", torch.bfloat16)
    plan_expert(nar, [a, b], "nar")  # NAR: 1 + 0.5, within the limit
    with pytest.raises(AdapterError, match="reaches the NAR 2 times"):
        plan_expert(nar, [a, Applied(b.adapter, 0.0, 4.5)], "nar")  # the nodes' path
    other = lora_synth.write_adapter("aitk", tmp_path / "other.safetensors", files["dims"], rank=4, seed=2)
    check_stack([a, Applied(read_adapter(other, files["dims"]), 5.0, 5.0)])  # two different adapters stack


def test_peft_folders_sharing_a_config_are_not_the_same_adapter(files, tmp_path):
    config = json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8})
    (tmp_path / "one").mkdir()
    first = _peft(tmp_path / "one", config)
    g = torch.Generator().manual_seed(9)
    second = tmp_path / "two"
    second.mkdir()
    save_file({"base_model.model.model.layers.1.mlp.down_proj.lora_A.weight": torch.randn(4, 512, generator=g),
               "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight": torch.randn(256, 4, generator=g)},
              str(second / "adapter_model.safetensors"))
    (second / "adapter_config.json").write_text(config)
    check_stack([Applied(read_adapter(first, files["dims"])), Applied(read_adapter(str(second), files["dims"]))])


def test_only_adapters_that_patch_an_expert_are_named_for_it(files, tmp_path):
    """Second break-it review: an AR-only adapter was named as a cause of the NAR's non-finite latents."""
    from yue2_core.weights.own import carried
    ar_only = lora_synth.write_adapter("ms-fused-ar", tmp_path / "ar_only.safetensors", files["dims"], rank=4)
    assert not [p for p in read_adapter(str(ar_only), files["dims"]).patches if p.expert == "nar"]
    engine = YuE2Engine.load(files["ckpt"], device="cpu", loras=[(str(ar_only), 1.0, 1.0), (files["nan"], 0.0, 1.0)],
                             parts=("ar", "nar"), warm_up=False)
    assert [str(e[1]) for e in carried(engine.nar)] == [str(files["nan"])]
    assert [str(e[1]) for e in carried(engine.ar)] == [str(ar_only)]
