"""Socket types of the pack.

    YUE2_MODEL   nodes.model.YuE2Model: checkpoint info, tokenizer and one ModelPatcher per part (AR, NAR, VAE)
    YUE2_SCORE   yue2_core.pipeline.Score: ABC text + the exact ids the music stage reads + cot + seed + source
    YUE2_TOKENS  yue2_core.pipeline.SemanticTokens: semantic codes (25 per second) + the prefix/score they were sampled
                 after + seed + sampling settings + whether the stage ended on its end token

Stock types: LATENT {"samples": [B, 64, T] float32, "type": "audio", "downscale_ratio_temporal": 1920} (T frames at
25 per second) and AUDIO {"waveform": [B, 2, samples] float32, "sample_rate": 48000}.

AUDIO_UI is not data: it is the frontend's audio player widget (ComfyUI's Save/Preview Audio nodes get it from the
frontend). A node that returns {"audio": [...]} in its ui must have it, or the frontend fails to show the result.
"""
from comfy_api.latest import io

Model = io.Custom("YUE2_MODEL")
Score = io.Custom("YUE2_SCORE")
Tokens = io.Custom("YUE2_TOKENS")
AudioPlayer = io.Custom("AUDIO_UI")

CATEGORY = "audio/YuE2"

# Units shared by the tooltips.
FRAMES = "frames (25 per second)"
SAMPLES = "samples (48 kHz)"
