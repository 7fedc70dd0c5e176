"""YuE2 Renderer (semantic tokens → audio latents, the NAR expert) and YuE2 VAE Decode (latents → 48 kHz stereo)."""
from __future__ import annotations

import comfy.model_management as mm
import torch
from comfy_api.latest import io

from yue2_core.constants import FRAMES_PER_SECOND, HOP, ODE_STEPS, SAMPLE_RATE, VAE_CORE_FRAMES, VAE_HALO_FRAMES
from yue2_core.pipeline import decode, render
from yue2_core.protocol import SEED_MAX

from . import memory, records, types
from .progress import StageProgress, check_cancel, check_switches, log, user_errors
from .batch import TakeBatch, decode_batch, latent_frames, padded_audio, padded_latent

MIN_CORE = 32  # smallest VAE tile core (frames) worth running; the halo adds 2 × 16


class YuE2Renderer(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2Renderer",
            display_name="YuE2 Renderer",
            category=types.CATEGORY,
            description="The NAR expert: renders semantic music tokens into audio latents by flow matching "
                        "(explicit midpoint ODE, the reference solver). Output is ComfyUI's audio LATENT "
                        "[1, 64, frames] at 25 frames per second, for YuE2 VAE Decode. A batch of candidate takes "
                        "(Composer candidates > 1) is rendered take by take into [N, 64, longest], zero-padded, "
                        "with each take's length recorded for VAE Decode and YuE2 Pick Take.",
            inputs=[
                types.Model.Input("model", tooltip="From YuE2 Checkpoint Loader (the one that composed the tokens)."),
                types.Tokens.Input("tokens", tooltip="From YuE2 Composer (one song or a batch of takes) or YuE2 "
                                                     "Load Song."),
                io.Int.Input("steps", default=ODE_STEPS, min=1, max=200,
                             tooltip="How many refinement steps turn the tokens into sound (midpoint ODE steps, "
                                     "2 model evaluations each): fewer render faster but rougher, more cost time "
                                     f"for little gain. Default {ODE_STEPS}, the release's."),
                io.Int.Input("seed", default=-1, min=-1, max=SEED_MAX,
                             tooltip="Noise seed of the render. −1 = the seed the tokens were sampled with (the "
                                     "reference; for a batch, each take's own seed). Another value gives another "
                                     "take of the same music tokens (for a batch: take i uses seed + i)."),
            ],
            outputs=[io.Latent.Output("latent", display_name="latent",
                                      tooltip="Audio latent {samples [1, 64, frames], type 'audio'}, 25 frames per "
                                              "second; [N, 64, longest] zero-padded for a batch of takes.")],
        )

    @classmethod
    def execute(cls, model, tokens, steps, seed) -> io.NodeOutput:
        check_switches(model.device)
        if isinstance(tokens, TakeBatch):
            return _render_batch(model, tokens, steps, seed)
        model.check_tokens(tokens)
        frames = len(tokens.codes)
        if frames == 0:
            raise ValueError("the tokens hold no music (the Composer produced 0 music tokens); raise max_seconds "
                             "or compose again")
        progress = StageProgress("YuE2 Renderer")
        need = memory.render(model.dims, model.dtype, len(tokens.prefix), frames, model.device.type == "cuda")
        progress.start("render", steps,
                       f"rendering {frames} frames ({frames / FRAMES_PER_SECOND:.2f} s) in {steps} ODE steps")
        with user_errors():
            ar, nar = model.load(("ar", "nar"), need)
            latents = render(ar, nar, tokens, steps, None if seed < 0 else seed, progress)
            del ar, nar
        mm.soft_empty_cache()
        check_cancel()
        samples = latents.T.unsqueeze(0).float().contiguous().cpu()  # [T, 64] → [1, 64, T]
        used_seed = tokens.seed if seed < 0 else seed
        record = {"steps": steps, "seed": used_seed, "checkpoint": model.info.to_dict(),
                  "weights": model.weights_record()}
        return io.NodeOutput({"samples": samples, "type": "audio", "downscale_ratio_temporal": HOP,
                              "yue2_render": records.stamp(record, samples, tokens)})


def _render_batch(model, batch: TakeBatch, steps: int, seed: int) -> io.NodeOutput:
    """Each take rendered on its own (take i: its own seed at −1, else seed + i), padded into one LATENT batch."""
    for t in batch.takes:
        model.check_tokens(t)
    n = len(batch)
    seeds = [int(t.seed) if seed < 0 else (seed + i) % (SEED_MAX + 1) for i, t in enumerate(batch.takes)]
    progress = StageProgress("YuE2 Renderer")
    on_cuda = model.device.type == "cuda"
    need = max(memory.render(model.dims, model.dtype, len(t.prefix), len(t.codes), on_cuda) for t in batch.takes)
    latents = []
    with user_errors():
        ar, nar = model.load(("ar", "nar"), need)
        for i, (t, s) in enumerate(zip(batch.takes, seeds)):
            frames = len(t.codes)
            progress.start("render", steps, f"rendering take {i + 1}/{n}: {frames} frames "
                                            f"({frames / FRAMES_PER_SECOND:.2f} s) in {steps} ODE steps, seed {s}")
            latents.append(render(ar, nar, t, steps, s, progress))
        del ar, nar
    mm.soft_empty_cache()
    check_cancel()
    latent = padded_latent(latents, steps, seeds, {"checkpoint": model.info.to_dict(),
                                                   "weights": model.weights_record(),
                                                   "tokens_sha256s": [records.tokens_digest(t) for t in batch.takes]})
    latent["yue2_render"] = records.stamp(latent["yue2_render"], latent["samples"])
    return io.NodeOutput(latent)


def _latent_samples(latent, channels: int) -> torch.Tensor:
    """samples [B, channels, T] of a LATENT dict, or ValueError naming what arrived instead."""
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(samples, torch.Tensor):
        keys = f" with keys {sorted(latent)}" if isinstance(latent, dict) else ""
        raise TypeError(f"YuE2 VAE Decode needs a LATENT dict with a 'samples' tensor; got "
                        f"{type(latent).__name__}{keys}")
    if samples.ndim != 3 or samples.shape[1] != channels or samples.shape[2] < 1:
        kind = ("an image latent (B, C, H, W)" if samples.ndim == 4 else
                "a video latent" if samples.ndim == 5 else f"a {samples.ndim}-D tensor")
        raise ValueError(f"YuE2 VAE Decode needs an audio latent of shape [B, {channels}, frames] (25 frames per "
                         f"second, from YuE2 Renderer or YuE2 Load Song); got samples of shape "
                         f"{list(samples.shape)} — {kind if samples.ndim != 3 else f'{samples.shape[1]} channels'}"
                         f"{' (type ' + repr(latent.get('type')) + ')' if latent.get('type') else ''}.")
    if not torch.isfinite(samples).all():
        raise ValueError("the latent contains NaN or infinite values; render it again")
    return samples


def _note_foreign_latent(latent: dict, model, decoder: dict) -> None:
    """A console warning when the latent was not rendered by YuE2 (no render record: an empty or another model's
    64-channel audio latent decodes to noise) or was rendered with another checkpoint than `decoder`
    (`records.decoded_by` of `model`)."""
    record = latent.get("yue2_render")
    if not isinstance(record, dict):
        log.warning("YuE2 VAE Decode: the latent carries no YuE2 render record (it did not come from YuE2 Renderer, "
                    "Load Song, Regenerate or Continue — e.g. an empty latent or another model's audio latent): it "
                    "is decoded as YuE2 latents anyway")
    elif isinstance(record.get("checkpoint"), dict) and not records.same_checkpoint(decoder, record["checkpoint"]):
        log.warning(f"YuE2 VAE Decode: the latent was rendered with {record['checkpoint'].get('path', '?')}, and is "
                    f"decoded by the VAE of {model.info.path} (another checkpoint file)")


def tile_core(vae_cfg, frames: int, device: torch.device) -> int:
    """Core frames per halo-crop tile: the reference 1024, fewer when the device's free memory cannot hold one
    tile's activations (multiples of 32, at least 32). Halo crop makes the result independent of the core size."""
    per_frame = memory.vae_bytes_per_frame(vae_cfg)
    free = mm.get_free_memory(device) - memory.vae_fixed_bytes(vae_cfg)
    fits = int(free * 0.9) // per_frame - 2 * VAE_HALO_FRAMES
    core = min(VAE_CORE_FRAMES, frames, max(MIN_CORE, fits // MIN_CORE * MIN_CORE))
    return max(1, core)


class YuE2VAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2VAEDecode",
            display_name="YuE2 VAE Decode",
            category=types.CATEGORY,
            description="Decodes YuE2 audio latents into 48 kHz stereo exactly like the reference: 1920 samples per "
                        "frame minus 64, clamped to [−1, 1], in halo-cropped tiles sized to the free device memory "
                        "(seam-free). Output is ComfyUI's AUDIO for Save/Preview Audio or YuE2 Save Song. A batch "
                        "of takes is decoded take by take over each one's own frames (never the padding) and "
                        "zero-padded to the longest; YuE2 Pick Take cuts a take back to its length.",
            inputs=[
                types.Model.Input("model", tooltip="From YuE2 Checkpoint Loader."),
                io.Latent.Input("latent", tooltip="Audio latent [B, 64, frames] (25 frames per second) from YuE2 "
                                                  "Renderer or YuE2 Load Song."),
            ],
            outputs=[io.Audio.Output("audio", display_name="audio",
                                     tooltip="{waveform [B, 2, 1920·frames − 64 samples], sample_rate 48000}, "
                                             "values in [−1, 1].")],
        )

    @classmethod
    def execute(cls, model, latent) -> io.NodeOutput:
        with user_errors():  # a vendor folder without a VAE and no VAE Loader: said before anything is read
            cfg = model.decoder_config()
        samples = _latent_samples(latent, cfg.latent_dim)
        batch, _, frames = samples.shape
        lengths = latent_frames(latent, batch, frames)  # a batch of takes: each decoded over its own frames
        progress = StageProgress("YuE2 VAE Decode")
        need = memory.vae_tile(cfg, frames, VAE_CORE_FRAMES, VAE_HALO_FRAMES)
        progress.start("decode", batch, f"decoding {batch} × {frames} frames to 48 kHz stereo")
        with user_errors():
            (vae,) = model.load(("vae",), need)
            core = tile_core(cfg, frames, vae.device)
            waves = decode_batch(lambda one, vae=vae: decode(vae, one, core=core, progress=progress), samples, lengths)
            del vae
        mm.soft_empty_cache()
        check_cancel()
        decoder = records.decoded_by(model.info)
        _note_foreign_latent(latent, model, decoder)
        # Save Song records the VAE that decoded, and checks it against the latent's checkpoint
        vae_record = {"yue2_vae": model.weights_record()["vae"], "yue2_decoded_by": decoder}
        if "yue2_frames" in latent:
            audio = padded_audio(waves)
            return io.NodeOutput({**audio, **vae_record, **records.stamp_audio(audio["waveform"], latent["samples"])})
        waveform = torch.stack(waves).float().cpu()
        return io.NodeOutput({"waveform": waveform, "sample_rate": SAMPLE_RATE, **vae_record,
                              **records.stamp_audio(waveform, latent["samples"])})  # Save Song: the decode of it
