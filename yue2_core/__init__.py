"""yue2_core — a framework-free (torch only) engine for the YuE2-3B song model.

Style + lyrics → ABC lead sheet → semantic codec tokens → flow-matched VAE latents → 48 kHz stereo audio.
Import what you need from the submodules, or use the lazy names here:

    from yue2_core import YuE2Engine, SongRequest, Budgets
    engine = YuE2Engine.load("yue2_3b_int8_convrot.safetensors")
    song = engine.generate(SongRequest(style="indie pop", lyrics="[Verse]\\n..."), Budgets(max_seconds=60))

The package itself imports nothing heavy, so `yue2_core.abc` (score tools) works without torch.
"""
__version__ = "0.1.0"

_LAZY = {
    "YuE2Engine": "pipeline", "Budgets": "pipeline", "Score": "pipeline", "SemanticTokens": "pipeline",
    "Song": "pipeline", "SongRequest": "protocol", "Sampling": "protocol", "ABC_PRESET": "protocol",
    "SEMANTIC_PRESET": "protocol", "inspect_checkpoint": "weights.checkpoint", "save_song": "artifacts",
    "load_song": "artifacts", "YuE2Error": "errors", "regenerate": "edit", "continue_song": "edit",
    "candidates": "candidates",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'yue2_core' has no attribute {name!r}")
