"""Batches of candidate takes between the nodes: pure torch + yue2_core, no ComfyUI imports (the tests load this file
on its own).

A YUE2_TOKENS socket carries either one SemanticTokens or a `TakeBatch` of N. ComfyUI batches are rectangular but
takes differ in length, so the Renderer zero-pads LATENT to [N, 64, T_max] and records each take's frames in
"yue2_frames"; VAE Decode decodes every take over its own frames only (the padding never reaches the VAE, so each
take's audio is exactly what it would be alone) and zero-pads AUDIO to [N, 2, S_max] with "yue2_samples"; YuE2 Pick
Take cuts take i back to its own length. Stock nodes that receive the padded batch (Save Audio, Preview Audio) see
silence after a shorter take's end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from yue2_core.artifacts import expected_samples
from yue2_core.candidates import Take, score_length
from yue2_core.constants import FRAMES_PER_SECOND, HOP, LATENT_DIM, SAMPLE_RATE

_SINGLE_FIELDS = ("codes", "prefix", "score", "request", "seed", "cfg_scale", "sampling", "ended", "timing",
                  "seconds", "truncated")


@dataclass
class TakeBatch:
    """N candidate takes on a YUE2_TOKENS socket: `takes[i]` is take i's SemanticTokens (seed `seeds[i]`).

    Reading a single-song field (`.codes`, `.score`, …) raises a ValueError that names YuE2 Pick Take, so any node
    written for one song refuses a batch clearly instead of failing somewhere inside."""

    takes: list
    seeds: list
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.takes)

    def message(self) -> str:
        n = len(self.takes)
        return (f"these tokens are a batch of {n} candidate takes (YuE2 Composer candidates = {n}, seeds "
                f"{self.seeds[0]} … {self.seeds[-1]}); this node takes one song: choose a take with YuE2 Pick Take "
                "first (its index is 0-based)")


def _refuse(name):
    def get(self):
        # a plain ValueError: ComfyUI names an exception by its module, and a class of the pack's own showed the user
        # "/…/custom_nodes/ComfyUI-YuE2.nodes.batch.BatchNotPicked" as the error's type (review, stop 44)
        raise ValueError(self.message())
    return property(get)


for _name in _SINGLE_FIELDS:
    setattr(TakeBatch, _name, _refuse(_name))


def as_takes(tokens) -> list:
    """The takes of a YUE2_TOKENS value: a TakeBatch's list, or [tokens] for one song."""
    return list(tokens.takes) if isinstance(tokens, TakeBatch) else [tokens]


# ---------------------------------------------------------------------------------------------------------------------
# batches through LATENT / AUDIO
# ---------------------------------------------------------------------------------------------------------------------

def padded_latent(latents: list[torch.Tensor], steps: int, seeds: list[int], extra: dict) -> dict:
    """[T_i, 64] latents → LATENT [N, 64, T_max] zero-padded, with "yue2_frames" and the per-take render seeds."""
    longest = max(l.shape[0] for l in latents)
    samples = torch.zeros(len(latents), LATENT_DIM, longest, dtype=torch.float32)
    for i, l in enumerate(latents):
        samples[i, :, :l.shape[0]] = l.T.float().cpu()
    return {"samples": samples, "type": "audio", "downscale_ratio_temporal": HOP,
            "yue2_frames": [int(l.shape[0]) for l in latents],
            "yue2_render": {"steps": steps, "seeds": list(seeds), **extra}}


def latent_frames(latent: dict, batch: int, width: int) -> list[int]:
    """Each item's true frame count: "yue2_frames" when present (a batch of takes), else the full width."""
    if batch < 1:  # break-it review, stop 53: a [0, 64, T] latent reached torch.stack ("non-empty TensorList")
        raise ValueError(f"the latent holds no items (its samples are [0, …, {width}]): nothing to decode or pick; a "
                         "YuE2 latent is [B, 64, frames] with B ≥ 1, from YuE2 Renderer or YuE2 Load Song")
    frames = latent.get("yue2_frames") if isinstance(latent, dict) else None
    if frames is None:
        return [width] * batch
    if (not isinstance(frames, (list, tuple)) or len(frames) != batch
            or not all(type(f) is int and 1 <= f <= width for f in frames)):
        raise ValueError(f"the latent's yue2_frames {frames!r} does not describe its {batch} item(s) of up to "
                         f"{width} frames")
    return list(frames)


def padded_audio(waves: list[torch.Tensor]) -> dict:
    """[2, S_i] waveforms → AUDIO [N, 2, S_max] zero-padded, with "yue2_samples" when the lengths differ or N > 1."""
    longest = max(w.shape[-1] for w in waves)
    out = torch.zeros(len(waves), waves[0].shape[0], longest, dtype=torch.float32)
    for i, w in enumerate(waves):
        out[i, :, :w.shape[-1]] = w.float().cpu()
    audio = {"waveform": out, "sample_rate": SAMPLE_RATE}
    if len(waves) > 1:
        audio["yue2_samples"] = [int(w.shape[-1]) for w in waves]
    return audio


# ---------------------------------------------------------------------------------------------------------------------
# YuE2 Pick Take
# ---------------------------------------------------------------------------------------------------------------------

def take_reports(takes: list, audio_samples: list[int | None]) -> list[dict]:
    """The engine's Take.report() for every take (no audio in memory is needed: only its length is read)."""
    reports = []
    for i, (t, samples) in enumerate(zip(takes, audio_samples)):
        frames = len(t.codes)
        score_s, note = score_length(t.score)
        seconds = frames / FRAMES_PER_SECOND
        length = samples if samples is not None else expected_samples(frames)  # a shape only: no memory
        song = SimpleNamespace(audio=torch.empty((2, length), device="meta"))
        take = Take(i, int(t.seed), song, bool(t.ended), frames, seconds, score_s,
                    None if score_s is None else score_s / seconds, note)
        reports.append(take.report())
    return reports


def describe_take(rep: dict) -> str:
    """One line of the takes report."""
    end = "ended on its end token" if rep["ended"] else "hit the max_seconds budget"
    note = (rep.get("score_note") or "no score").split(";")[0][:90]
    ratio = (f"score {rep['score_seconds']:.2f} s, score/audio {rep['score_to_audio']:.2f}"
             if rep["score_to_audio"] is not None else f"score/audio n/a ({note})")
    return (f"take {rep['index']}: seed {rep['seed']} · {rep['seconds']:.2f} s ({rep['tokens']} tokens, "
            f"{rep['audio_seconds']:.2f} s audio) · {end} · {ratio}")




def decode_batch(decode_one, samples: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """`decode_one([1, 64, T])` → [2, samples] for every item over its own frames (never the padding)."""
    return [decode_one(item[:, :length].unsqueeze(0)) for item, length in zip(samples, lengths)]


def pick_audio(audio: dict, index: int, samples: int) -> dict:
    """Item `index` of an AUDIO batch, cut to `samples`."""
    return {"waveform": audio["waveform"][index:index + 1, :, :samples].clone(), "sample_rate": SAMPLE_RATE,
            **{k: audio[k] for k in ("yue2_vae", "yue2_decoded_by") if k in audio}}


def pick_latent_samples(samples: torch.Tensor, index: int, frames: int) -> torch.Tensor:
    """Item `index` of a LATENT batch, cut to `frames`: [1, 64, frames]."""
    return samples[index:index + 1, :, :frames].clone()
