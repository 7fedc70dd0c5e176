"""What the YuE2 nodes stamp on the LATENT and AUDIO dicts they output, and what YuE2 Save Song checks of them.

A LATENT's "yue2_render" record (ODE steps, render seed, method, checkpoint, weights) says how its samples were
rendered; ComfyUI's own latent nodes (LatentMultiply, latent blends, …) copy the dict with its keys and change the
samples, so the record also holds a digest of the samples it describes ("samples_sha256"): Save Song keeps the record
only while the samples still match it. An AUDIO from YuE2 VAE Decode says which checkpoint's VAE decoded it
("yue2_decoded_by": that checkpoint's path and sample hash), so Save Song can say when the latent was rendered with
one checkpoint and decoded with another. (Break-it review, stop 39: both went unnoticed and the saved song described
a render it did not hold.)
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import torch

CHANGED = "changed after the render"  # a digest that matches no samples: the record no longer describes them


def samples_digest(samples: torch.Tensor) -> str:
    """sha256 over the shape and the float32 values of a LATENT's samples ([B, 64, frames]) or of a waveform ([B,
    channels, samples]); any dtype or device."""
    t = samples.detach().to("cpu", torch.float32).contiguous()
    h = hashlib.sha256(repr(tuple(t.shape)).encode())
    h.update(t.reshape(-1).numpy())  # the values' bytes (a contiguous buffer: no copy of them)
    return h.hexdigest()


def stamp(record: dict, samples: torch.Tensor, tokens=None) -> dict:
    """`record` with the digest of `samples`, the samples it describes, and of the music `tokens` they were rendered
    from (`tokens_digest`), when given."""
    return {**record, "samples_sha256": samples_digest(samples),
            **({"tokens_sha256": tokens_digest(tokens)} if tokens is not None else {})}


def tokens_digest(tokens) -> str:
    """sha256 over the music codes and the prefix of a SemanticTokens: what its render depends on. A render record
    holds it ("tokens_sha256"; "tokens_sha256s" per take of a batch) so that Save Song and Pick Take can tell a
    latent rendered from other tokens of the same length (another Composer's, take's or song's: break-it review,
    stop 51 — such a song was saved with a latent.npy that is not the render of its semantic.npy)."""
    h = hashlib.sha256()
    for part in (tokens.codes, tokens.prefix):
        values = np.asarray(part, dtype=np.int64).reshape(-1)
        h.update(f"{values.size}:".encode())
        h.update(values.tobytes())
    return h.hexdigest()


def other_tokens(record: dict | None, tokens) -> bool:
    """Whether the render record says its samples were rendered from other music tokens than `tokens` (False when it
    says nothing about them: a record of an older pack version, or made by other code)."""
    digest = record.get("tokens_sha256") if isinstance(record, dict) else None
    return isinstance(digest, str) and digest != tokens_digest(tokens)


OTHER_TOKENS = ("the latent was rendered from other music tokens than the ones connected to `tokens` (the same "
                "length, but other codes or another prompt: another Composer's, another take's or another song's)")


def restamp(latent: dict, samples_out: torch.Tensor) -> dict:
    """The render record of a latent cut from `latent` (YuE2 Pick Take): the digest of `samples_out`, or `CHANGED`
    when `latent`'s own samples no longer match its record (changed before the pick)."""
    record = dict(latent.get("yue2_render") or {})
    digest = record.get("samples_sha256")
    if digest is not None and digest != samples_digest(latent["samples"]):
        record["samples_sha256"] = CHANGED
    else:
        record["samples_sha256"] = samples_digest(samples_out)
    return record


def render_record(latent) -> tuple[dict | None, str | None]:
    """(the latent's render record, None), or (None, why it is not used): no record, or samples that no longer
    match the record's digest. A record without a digest (made by other code) is taken as it is."""
    record = latent.get("yue2_render") if isinstance(latent, dict) else None
    if not (isinstance(record, dict) and record.get("seed") is not None):
        return None, ("the latent carries no YuE2 render record (ODE steps, render seed): the song is saved without "
                      "one, and YuE2 Regenerate / Continue will refuse it (they keep the original's noise); connect "
                      "the latent of a YuE2 Renderer, Load Song, Regenerate or Continue")
    digest = record.get("samples_sha256")
    if digest is not None and digest != samples_digest(latent["samples"]):
        return None, ("the latent was changed after YuE2 rendered it (by a node between the Renderer and Save Song, "
                      "e.g. a latent multiply or blend), so its render record (ODE steps, render seed) no longer "
                      "describes it: the song is saved without one — its latent.npy is what you connected, and "
                      "YuE2 Regenerate / Continue will refuse it, as rendering again would not give these latents; "
                      "save the Renderer's latent itself to keep a song you can edit")
    return record, None


def identity(checkpoint: dict) -> dict:
    """The part of a checkpoint record (`CheckpointInfo.to_dict`, config.json "checkpoint") that names the file:
    its path, and its sample hash for an all-in-one file."""
    return {k: checkpoint[k] for k in ("path", "sample_sha256") if k in checkpoint}


def decoded_by(info) -> dict:
    """What a YuE2 VAE Decode stamps on its AUDIO as "yue2_decoded_by": the `identity` of the checkpoint whose VAE
    decoded it. `info`: the model's CheckpointInfo."""
    return identity(info.to_dict())


def same_checkpoint(a: dict, b: dict) -> bool:
    """Whether two checkpoint records ({"path", "sample_sha256"?, …}) name the same file: by sample hash when both
    have one, else by the file (or vendor folder) name — a song saved on another machine or before an install moved
    names the same model by another path."""
    if a.get("sample_sha256") and b.get("sample_sha256"):
        return a["sample_sha256"] == b["sample_sha256"]
    name = lambda record: os.path.basename(os.path.normpath(str(record.get("path", ""))))  # noqa: E731
    return name(a) == name(b)


def decoder_warning(record: dict | None, audio) -> str | None:
    """A warning when `audio` was decoded by the VAE of another checkpoint than the one `record` (a latent's render
    record) rendered with; None when they agree or either is unknown."""
    by = audio.get("yue2_decoded_by") if isinstance(audio, dict) else None
    rendered = record.get("checkpoint") if isinstance(record, dict) else None
    if not (isinstance(by, dict) and isinstance(rendered, dict)) or same_checkpoint(by, rendered):
        return None
    return (f"the audio was decoded by the VAE of {by.get('path', '?')}, but the latent was rendered with "
            f"{rendered.get('path', '?')} (another checkpoint file): the song records the latter, so YuE2 "
            "Regenerate / Continue will join this audio before the cut to audio decoded by the edit model's VAE "
            "after it; decode with the model that rendered the latent to keep the song consistent")


def _probe(t: torch.Tensor) -> str:
    """The fingerprint of a waveform: sha256 of its shape and of every value (float32; `samples_digest`). An audio
    node changing the samples in place changes it, however little it changes: the ≈ 8,192 evenly spaced values of
    the earlier probe let an in-place edit under ≈ 50 ms of a 3.6-minute song pass as unchanged (stop-48 review).
    All 92 MB of a 4-minute stereo song hash in ≈ 0.09 s on a CPU with SHA extensions (0.17 s with blake2b)."""
    return samples_digest(t)


def stamp_audio(waveform: torch.Tensor, latent_samples: torch.Tensor | None) -> dict:
    """What a YuE2 node that makes an AUDIO for a LATENT (VAE Decode, Regenerate, Continue, Pick Take) puts on the
    AUDIO dict: "yue2_audio" = the waveform tensor itself with a fingerprint of its values (`_probe`), and the digest
    of the latent samples it is the audio of (`samples_digest`). Save Song then knows whether the audio it is given
    is still that audio (`audio_of_latent`): an audio node makes a new tensor (ComfyUI's AudioAdjustVolume, …) or
    changes this one in place (the fingerprint), and another latent has other samples. (ComfyUI runs nodes in
    inference mode, whose tensors keep no version counter to tell an in-place change.)"""
    return {"yue2_audio": {"waveform": waveform, "probe": _probe(waveform),
                           "latent_sha256": None if latent_samples is None else samples_digest(latent_samples)}}


def audio_of_latent(audio, latent) -> str | None:
    """None when `audio` is, unchanged, the audio a YuE2 node made for `latent`'s samples (`stamp_audio`; with no
    latent connected, the audio unchanged is enough); else why not — Save Song then records the audio as "given"
    (config.json "audio_source"), not the song's own decode."""
    stamp = audio.get("yue2_audio") if isinstance(audio, dict) else None
    if not isinstance(stamp, dict):
        return ("it did not come straight from a YuE2 VAE Decode, Regenerate, Continue or Pick Take (an audio "
                "node made it, or it was loaded from a file)")
    wave = audio.get("waveform")
    if not (isinstance(wave, torch.Tensor) and wave is stamp.get("waveform") and _probe(wave) == stamp.get("probe")):
        return "it was changed after YuE2 made it (by a node between YuE2 VAE Decode and Save Song)"
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if latent is not None and not (isinstance(samples, torch.Tensor)
                                   and samples_digest(samples) == stamp.get("latent_sha256")):
        return "it was decoded from another latent than the one connected to Save Song"
    return None


def picked_audio_stamp(audio: dict, latent, picked_wave: torch.Tensor, picked_latent) -> dict:
    """Pick Take's stamp for one take of a batch AUDIO: tied to the picked latent's samples when the batch audio is
    still the batch latent's (`audio_of_latent`), else none (Save Song then records the take's audio as given)."""
    if audio_of_latent(audio, latent) is not None:
        return {}
    samples = picked_latent.get("samples") if isinstance(picked_latent, dict) else None
    return stamp_audio(picked_wave, samples if isinstance(samples, torch.Tensor) else None)


__all__ = ["stamp_audio", "audio_of_latent", "picked_audio_stamp", "samples_digest", "stamp", "restamp",
           "render_record", "tokens_digest", "other_tokens", "OTHER_TOKENS", "identity", "decoded_by",
           "same_checkpoint", "decoder_warning", "CHANGED"]
