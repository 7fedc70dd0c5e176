"""Issue #20 item 18: what the CI host can test of the pack next to ComfyUI's built-in YuE2 nodes.

ComfyUI 0.3.75 (the CI host) has no built-in YuE2 nodes (they arrive with ComfyUI ≥ 0.36, comfyui_builtin.md §7),
so this checks the two connections docs/comfyui.md promises through the stock types they travel in:
- our Renderer's LATENT is the stock audio latent ({"samples": [B, 64, F], "type": "audio",
  "downscale_ratio_temporal": 1920}, the form EmptyYuE2LatentAudio makes) and wires into the stock VAE Decode Audio;
- a plain STRING (the built-in SheetSage2 / Generate ABC text is one) wires into our Composer's `abc_text`, and the
  Composer reads it as the score.
"""
from __future__ import annotations

from pathlib import Path

import torch

HOP = 1920  # comfyui_builtin.md §7: temporal_downscale_ratio of latent_formats.YuE2


def _output_types(info: dict) -> list[str]:
    return list(info["output"])


def _input_type(info: dict, name: str) -> str:
    for group in ("required", "optional"):
        spec = info["input"].get(group, {}).get(name)
        if spec is not None:
            return spec[0]
    raise AssertionError(f"{info['name']} has no input {name}")


def test_our_latent_wires_into_the_stock_vae_decode_audio(comfy):
    info = comfy.object_info()
    assert "VAEDecodeAudio" in info, "the host's stock audio decoder"
    renderer = info["YuE2Renderer"]
    assert "LATENT" in _output_types(renderer)
    assert _input_type(info["VAEDecodeAudio"], "samples") == "LATENT"


def test_our_latent_has_the_stock_audio_latent_form():
    from yue2_core.constants import FRAMES_PER_SECOND, SAMPLE_RATE
    from yue2_core.constants import HOP as OUR_HOP  # what nodes/render.py writes as downscale_ratio_temporal
    assert OUR_HOP == HOP and SAMPLE_RATE / HOP == FRAMES_PER_SECOND == 25
    source = Path(__file__).resolve().parents[2] / "nodes" / "render.py"
    text = source.read_text()
    # the dict the Renderer returns (nodes/render.py): the keys and the [T, 64] → [1, 64, T] layout
    assert '{"samples": samples, "type": "audio", "downscale_ratio_temporal": HOP' in text
    latents = torch.randn(7, 64)
    samples = latents.T.unsqueeze(0).float().contiguous()
    assert samples.shape == (1, 64, 7) and samples.dtype == torch.float32


def test_a_plain_string_wires_into_the_composers_abc_text(comfy):
    info = comfy.object_info()
    composer = info["YuE2Composer"]
    assert _input_type(composer, "abc_text") == "STRING"
    strings = [name for name, node in info.items() if node.get("output") == ["STRING"] and
               name.startswith("Primitive")]
    assert strings, "the host has a stock STRING primitive node"
