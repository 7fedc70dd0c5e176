"""Socket types of the pack.

    YUE2_MODEL   nodes.model.YuE2Model: checkpoint info, tokenizer and one ModelPatcher per part (AR, NAR, VAE)
    YUE2_SCORE   yue2_core.pipeline.Score: ABC text + the exact ids the music stage reads + cot + seed + source
    YUE2_TOKENS  yue2_core.pipeline.SemanticTokens: semantic codes (25 per second) + the prefix/score they were sampled
                 after + seed + sampling settings + whether the stage ended on its end token — or, from a Composer
                 with candidates > 1, a nodes.takes.TakeBatch of N such takes (seeds seed … seed+N−1). The Renderer
                 renders a batch, YuE2 Pick Take turns it back into one take; a node that needs one song (Save Song)
                 refuses a batch with a message that names Pick Take.
    YUE2_SONG    yue2_core.artifacts.SavedSong: a song folder read back by YuE2 Load Song (score, tokens, latents,
                 settings, path to its audio.flac), for YuE2 Regenerate and YuE2 Continue

Stock types: LATENT {"samples": [B, 64, T] float32, "type": "audio", "downscale_ratio_temporal": 1920} (T frames at
25 per second) and AUDIO {"waveform": [B, 2, samples] float32, "sample_rate": 48000}. A batch of takes of different
lengths is zero-padded to the longest: LATENT then also holds "yue2_frames" [T_i] and AUDIO "yue2_samples"
[1920·T_i − 64]; YuE2 Pick Take cuts the picked take back to its own length.

AUDIO_UI is not data: it is the frontend's audio player widget (ComfyUI's Save/Preview Audio nodes get it from the
frontend). A node that returns {"audio": [...]} in its ui must have it, or the frontend fails to show the result.
"""
from comfy_api.latest import io

Model = io.Custom("YUE2_MODEL")
Score = io.Custom("YUE2_SCORE")
Tokens = io.Custom("YUE2_TOKENS")
Song = io.Custom("YUE2_SONG")
AudioPlayer = io.Custom("AUDIO_UI")

CATEGORY = "audio/YuE2"

# Units shared by the tooltips.
FRAMES = "frames (25 per second)"
SAMPLES = "samples (48 kHz)"

MAX_CANDIDATES = 16  # the Composer's `candidates` limit (the engine allows 64; the node keeps the UI sane)
