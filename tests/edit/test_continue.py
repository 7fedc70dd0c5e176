"""Continue a song: every original code kept, the original samples kept up to the crossfade at its end, and the
context never exceeded — asking for more than fits names the maximum."""
from dataclasses import replace

import pytest
import torch

import yue2_core.edit as edit
from yue2_core.constants import CONTEXT, HOP, SAMPLE_RATE
from yue2_core.errors import BudgetError, RequestError

FADE = round(0.05 * SAMPLE_RATE)


def test_continue_keeps_the_whole_original(engine, parent):
    child, lineage = edit.continue_song(engine, parent, 1.0, seed=4)
    n0, end = 60, 60 * HOP - 64  # the parent's last sample: the crossfade ends there
    assert child.tokens.codes[:n0] == parent.tokens.codes and len(child.tokens.codes) == n0 + 25
    assert torch.equal(child.latents[:n0], parent.latents)
    assert torch.equal(child.audio[:, :end - FADE], parent.audio[:, :end - FADE])
    assert child.audio.shape == (2, 85 * HOP - 64)
    assert lineage["operation"] == "continue" and lineage["cut_token"] == n0 and lineage["cut_sample"] == end
    assert lineage["added_seconds"] == 1.0 and lineage["seed"] == 4 and lineage["cut_bar"] == 3
    assert lineage["max_continuation_seconds"] == edit.max_continuation_seconds(engine, parent)
    # the end token was blocked for the whole (short) continuation: min_tokens = n0 + 25
    assert child.settings["semantic_sampling"]["min_tokens"] == 85 == child.settings["semantic_sampling"]["max_tokens"]
    assert len(child.tokens.prefix) + len(child.tokens.codes) <= CONTEXT


def _fake_long_parent(engine, parent, room: int):
    """The parent's prompt with codes filling the context up to `room` free tokens (no media: only the budget is
    checked, which happens before any generation)."""
    prefix = parent.tokens.prefix
    codes = [7] * (CONTEXT - len(prefix) - room)
    tokens = replace(parent.tokens, codes=codes)
    return (parent.score, tokens, None, None, parent.request, parent.settings)


def test_continuation_beyond_the_context_states_the_maximum(engine, parent):
    song = _fake_long_parent(engine, parent, room=10)
    assert edit.max_continuation_seconds(engine, song) == 10 / 25
    with pytest.raises(BudgetError, match=r"at most 0\.40 s of continuation are possible"):
        edit.continue_song(engine, song, 1.0)
    full = _fake_long_parent(engine, parent, room=0)
    with pytest.raises(BudgetError, match=r"at most 0\.00 s .*already fills the context"):
        edit.continue_song(engine, full, 0.04)
    # the real parent: the maximum is (24,576 − prompt − 60) / 25 s, and one token more is refused
    most = (CONTEXT - len(parent.tokens.prefix) - 60) / 25
    assert edit.max_continuation_seconds(engine, parent) == most
    with pytest.raises(BudgetError, match=f"at most {most:.2f} s"):
        edit.continue_song(engine, parent, most + 0.04)
    for bad in (0, -1.0, float("inf"), "1"):
        with pytest.raises(RequestError, match="extra seconds"):
            edit.continue_song(engine, parent, bad)


def test_continuation_up_to_the_maximum_fills_but_never_exceeds(engine, parent, monkeypatch):
    """With the context narrowed to prompt + song + 8 tokens, the largest continuation (0.32 s) runs and ends exactly
    at the context; 0.36 s is refused. (The decoders still check the real 24,576 limit themselves.)"""
    small = len(parent.tokens.prefix) + 60 + 8
    monkeypatch.setattr(edit, "CONTEXT", small)
    assert edit.max_continuation_seconds(engine, parent) == 8 / 25
    with pytest.raises(BudgetError, match=r"at most 0\.32 s"):
        edit.continue_song(engine, parent, 0.36)
    child, lineage = edit.continue_song(engine, parent, 0.32, seed=8, crossfade_s=0.01)
    assert len(child.tokens.prefix) + len(child.tokens.codes) == small
    assert child.tokens.codes[:60] == parent.tokens.codes and lineage["frames"] == 68
    end = 60 * HOP - 64
    assert torch.equal(child.audio[:, :end - 480], parent.audio[:, :end - 480])


def test_continue_keeps_the_parents_ode_method(engine, parent, monkeypatch):
    """A song rendered with the opt-in AB2 solver is continued with AB2 (and its steps), and says so in its
    settings; before, the child silently went back to the midpoint solver. A method the engine does not know is an
    ArtifactError before any work."""
    import yue2_core.fast as fast
    from yue2_core.errors import ArtifactError
    from yue2_core.nar import render as portable_render
    seen = []

    def spy(*args, noise=None, method="midpoint"):
        seen.append(method)
        return portable_render(*args, noise=noise, method=method)
    monkeypatch.setattr(fast, "select_render", lambda nar: spy)
    ab2 = replace(parent, settings={**parent.settings, "ode_method": "ab2", "ode_steps": 4})
    child, _ = edit.continue_song(engine, ab2, 0.2, seed=4)
    assert seen == ["ab2"]
    assert child.settings["ode_method"] == "ab2" and child.settings["ode_steps"] == 4
    bad = replace(parent, settings={**parent.settings, "ode_method": "euler"})
    with pytest.raises(ArtifactError, match="ode_method must be one of midpoint, ab2, got 'euler'"):
        edit.continue_song(engine, bad, 0.2)
    assert seen == ["ab2"]


def test_continue_by_less_than_half_a_frame_says_it_is_rounded_up(engine, parent):
    """Break-it finding (stop 38): continue_song(…, 0.001) silently added a whole frame (0.04 s), where generate
    prints a note for the same --max-seconds."""
    child, lineage = edit.continue_song(engine, parent, 0.001, seed=4)
    assert len(child.tokens.codes) == 61 and lineage["extra_seconds_requested"] == 0.001
    assert any("less than half a frame: rounded up to one frame (0.04 s)" in w for w in child.warnings), child.warnings
    child, _ = edit.continue_song(engine, parent, 0.04, seed=4)
    assert not any("half a frame" in w for w in child.warnings)


def test_the_child_records_the_weights_of_this_run(engine, parent):
    """Break-it finding (stop 38): Regenerate/Continue copied the parent's config.json "weights" (LoRAs, VAE file)
    into the child, so a child made with a LoRA recorded none (and the reverse), and Load Song rebuilt the wrong
    model. The child records the weights of the run now, with a note when they differ from the parent's."""
    child, _ = edit.continue_song(engine, parent, 0.2, seed=4)
    assert child.settings["weights"] == engine.weights and not any("the original was made with" in w
                                                                   for w in child.warnings)
    other = {"loras": [{"file": "mine.safetensors", "sha256": "ab" * 32, "strength_ar": 1.0, "strength_nar": 0.5}],
             "vae": None}
    parts = {"ar": engine.ar, "nar": engine.nar, "vae": engine.vae, "tokenizer": engine.tokenizer,
             "info": engine.info, "weights": other}
    child, _ = edit.continue_song(parts, parent, 0.2, seed=4)
    assert child.settings["weights"] == other
    assert any("the original was made with no LoRA and the checkpoint's VAE and this run uses LoRA "
               "mine.safetensors and the checkpoint's VAE" in w for w in child.warnings), child.warnings
    # review (stop 41): the way the LoRAs went onto int8 layers (the nodes: side; the command line may merge them
    # into bf16 under YUE2_LORA_INT8=bf16) is said when the original records another one
    merged = replace(parent, settings={**parent.settings, "weights": {**other, "lora_int8": "bf16"}})
    child, _ = edit.continue_song({**parts, "weights": {**other, "lora_int8": "side"}}, merged, 0.2, seed=4)
    assert child.settings["weights"]["lora_int8"] == "side"
    assert any("the original's LoRAs went onto int8 layers as bf16 (YUE2_LORA_INT8), this run's as side" in w
               for w in child.warnings), child.warnings
    child, _ = edit.continue_song({**parts, "weights": {**other, "lora_int8": "bf16"}}, merged, 0.2, seed=4)
    assert not any("went onto int8 layers" in w for w in child.warnings), child.warnings


def test_a_song_whose_audio_does_not_fit_its_frames_is_decoded_again(engine, parent):
    """Break-it finding (stop 39): YuE2 Save Song stores any 48 kHz stereo audio it is given (a LoadAudio of another
    file, with a warning), and Regenerate / Continue of that song then stopped with "the song's audio is [2, N],
    expected …" and no way on. The kept part is now decoded again from the latents, with a note: the child equals
    the child of the same song saved without audio."""
    foreign = torch.zeros(2, 480_000)
    odd = (parent.score, parent.tokens, parent.latents, foreign, parent.request, parent.settings)
    bare = (parent.score, parent.tokens, parent.latents, None, parent.request, parent.settings)
    child, _ = edit.continue_song(engine, odd, 0.2, seed=4)
    assert any("the song's audio is [2, 480000] (channels, samples), not the [2, 115136] its 60 frames decode to"
               in w for w in child.warnings), child.warnings
    reference, _ = edit.continue_song(engine, bare, 0.2, seed=4)
    assert torch.equal(child.audio, reference.audio) and not any("channels, samples" in w for w in reference.warnings)
    mono, _ = edit.regenerate(engine, (*odd[:3], foreign[:1, :115_136], *odd[4:]), 1.0, seed=4)
    assert any("[1, 115136]" in w for w in mono.warnings), mono.warnings
