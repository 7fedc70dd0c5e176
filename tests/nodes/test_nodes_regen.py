"""YuE2 Regenerate and YuE2 Continue against the real server, on the tiny checkpoint and a 2-second parent song made
from a 4-bar score at 240 BPM (one bar = 1 s = 25 tokens, so "bar 2" is token 25):

- the shipped regenerate-from-bar workflow (Load Song → ABC Editor → Regenerate) keeps the parent's codes before the
  cut bit-identical (the child's semantic.npy against the parent's), its audio.flac samples identical up to the
  crossfade, and saves the lineage; with an edited score the new part follows the new score and the kept part
  stays;
- the shipped continue workflow keeps every parent code and sample up to the crossfade at the parent's end, stays
  inside the context, and states the maximum continuation; asking for more than fits is refused with that maximum;
- bad input reaches the user as the engine's message before any weights are loaded: a cut outside the song, in the
  prefix, a bar the score does not have, a song from another checkpoint.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from nodes_testlib import (MICRO, SCORE_240, TINY, TINY_INT8, api, by_class, codes, run, run_error, saved_dirs,
                           set_inputs, test_sized)

CONTEXT = 24576
FADE = 2400  # 0.05 s at 48 kHz
HOP = 1920
SCORE = SCORE_240
EDITED = SCORE.replace('"G"g16e16|', '"Em"b16g16|')  # bar 2 rewritten: regenerate from bar 2 follows it
LOADER = {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}}


def pcm(song_dir):
    return sf.read(str(song_dir / "audio.flac"), dtype="int32")[0]  # the exact 24-bit samples


def lineage(song_dir) -> dict:
    return json.loads((song_dir / "result.json").read_text())["lineage"]


@pytest.fixture(scope="module")
def parent(comfy, comfy_server, checkpoints):
    """A 2 s song (50 tokens) composed for SCORE, rendered in 8 steps and saved."""
    entry = run(comfy, {
        "1": LOADER, "2": {"class_type": "PrimitiveString", "inputs": {"value": SCORE}},
        "3": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "pop", "lyrics": "[verse]\nla la",
                                                       "cot": "full", "seed": 7, "max_seconds": 2.0,
                                                       "abc_text": ["2", 0]}},
        "4": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["3", 1], "steps": 8, "seed": -1}},
        "5": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["4", 0]}},
        "6": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["3", 1], "latent": ["4", 0], "audio": ["5", 0],
                                                       "name": "regen_parent"}}})
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert len(codes(song_dir)) == 50
    assert json.loads((song_dir / "config.json").read_text())["checkpoint"]["dims"]["vocab"] == 184704
    return song_dir


def _regen_prompt(node_info, parent, **inputs) -> dict:
    prompt = test_sized(api("yue2_regenerate_from_bar", node_info))
    set_inputs(prompt, "YuE2LoadSong", song=parent.name)
    set_inputs(prompt, "YuE2Regenerate", **{"cut": "bar 2", "seed": 5, **inputs})
    return prompt


def _child(comfy, comfy_server, prompt):
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    return entry, song_dir


def test_regenerate_from_bar_keeps_everything_before_the_cut(comfy, comfy_server, node_info, parent):
    prompt = _regen_prompt(node_info, parent)
    (regen,) = by_class(prompt, "YuE2Regenerate")
    (editor,) = by_class(prompt, "YuE2ABCEditor")
    assert prompt[editor]["inputs"]["abc"] == ""  # the shipped editor passes the song's own score on
    entry, child = _child(comfy, comfy_server, prompt)
    assert child.name == "regen_parent_regen_00001"
    k, e = 25, 25 * HOP  # bar 2 starts at 1.0 s at Q:1/4=240 → token 25, sample 48,000
    old, new = codes(parent), codes(child)
    assert len(new) == 50 and new[:k] == old[:k] and new[k:] != old[k:]
    assert np.array_equal(np.load(child / "latent.npy")[:k], np.load(parent / "latent.npy")[:k])
    a, b = pcm(parent), pcm(child)
    assert b.shape == a.shape == (50 * HOP - 64, 2)
    assert np.array_equal(b[:e - FADE], a[:e - FADE])  # the original's samples up to the crossfade
    assert not np.array_equal(b[e - FADE:e], a[e - FADE:e])  # … then the crossfade into the new render
    got = lineage(child)
    assert {k_: got[k_] for k_ in ("operation", "parent", "cut_requested", "cut_token", "cut_seconds", "cut_bar",
                                   "cut_sample", "seed", "parent_seed", "render_seed", "crossfade_s",
                                   "score_changed", "kept_frames")} == {
        "operation": "regenerate", "parent": f"yue2/{parent.name}", "cut_requested": "bar 2", "cut_token": 25,
        "cut_seconds": 1.0, "cut_bar": 2, "cut_sample": 48000, "seed": 5, "parent_seed": 7, "render_seed": 7,
        "crossfade_s": 0.05, "score_changed": False, "kept_frames": 25}
    config = json.loads((child / "config.json").read_text())
    assert config["edit"]["cut_token"] == 25 and config["render_seed"] == 7 and config["checkpoint"]["format"] == "bf16"
    report = entry["outputs"][regen]["text"][0]
    assert report.startswith(f"- regenerated yue2/{parent.name} from bar 2 = 1.00 s (token 25, bar 2)")
    assert f"saved yue2/{child.name}" in report
    (preview,) = by_class(prompt, "PreviewAny")
    assert entry["outputs"][preview]["text"] == [report]
    assert entry["outputs"][regen]["audio"] == [{"filename": "audio.flac", "subfolder": f"yue2/{child.name}",
                                                 "type": "output"}]
    # the child is a normal song: Load Song reads it back (hashes verified)
    reloaded = run(comfy, {"1": LOADER, "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0],
                                                                                        "song": child.name}},
                           "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}})
    assert reloaded["outputs"]["2"]["text"][0].startswith(f"yue2/{child.name}: 50 frames = 2.00 s")


def test_regenerate_under_an_edited_score(comfy, comfy_server, node_info, parent):
    prompt = _regen_prompt(node_info, parent, cut="1s", seed=-1)  # −1: keep the song's seed
    set_inputs(prompt, "YuE2ABCEditor", abc=EDITED)
    _, child = _child(comfy, comfy_server, prompt)
    assert codes(child)[:25] == codes(parent)[:25] and codes(child)[25:] != codes(parent)[25:]
    assert np.array_equal(pcm(child)[:25 * HOP - FADE], pcm(parent)[:25 * HOP - FADE])
    assert (child / "score.abc").read_text() == EDITED
    assert np.load(child / "prefix.npy").tolist() != np.load(parent / "prefix.npy").tolist()  # the new score
    got = lineage(child)
    assert got["score_changed"] is True and got["seed"] == 7 and got["cut_requested"] == "1s"


def test_a_cot_off_song_goes_through_the_shipped_regenerate_workflow(comfy, comfy_server, node_info):
    """Review, stop 44: a song of yue2_text_to_song_off in yue2_regenerate_from_bar (Load Song → ABC Editor →
    Regenerate, the editor's box empty) stopped at the editor ("the ABC score is empty … Type a lead sheet"), and a
    lead sheet typed there was refused by Regenerate (a cot-off song takes no new score): the workflow could not
    edit such a song without rewiring. The editor now passes the empty cot-off score on, and Regenerate keeps the
    song's own (no) score."""
    entry = run(comfy, test_sized(api("yue2_text_to_song_off", node_info), max_seconds=2.0))
    (off_song,) = saved_dirs(entry, comfy_server.output_dir)
    prompt = _regen_prompt(node_info, off_song, cut="1s")
    entry, child = _child(comfy, comfy_server, prompt)
    assert codes(child)[:25] == codes(off_song)[:25] and not (child / "score.abc").exists()
    assert lineage(child)["score_changed"] is False
    (editor,) = by_class(prompt, "YuE2ABCEditor")
    assert "input score: none (cot off" in entry["outputs"][editor]["text"][0]
    # a lead sheet typed into the box is still refused, by Regenerate, saying why
    set_inputs(prompt, "YuE2ABCEditor", abc=SCORE)
    node, _, message = run_error(comfy, prompt)
    assert node == "YuE2Regenerate" and "made with cot='off' and has no score" in message


def test_continue_keeps_the_song_and_states_the_maximum(comfy, comfy_server, node_info, parent):
    prompt = test_sized(api("yue2_continue", node_info))
    set_inputs(prompt, "YuE2LoadSong", song=parent.name)
    set_inputs(prompt, "YuE2Continue", extra_seconds=1.0, seed=4)
    (cont,) = by_class(prompt, "YuE2Continue")
    entry, child = _child(comfy, comfy_server, prompt)
    assert child.name == "regen_parent_cont_00001"
    old, new = codes(parent), codes(child)
    assert len(new) == 75 and new[:50] == old
    end = 50 * HOP - 64  # the parent's last sample: the crossfade ends there
    a, b = pcm(parent), pcm(child)
    assert b.shape == (75 * HOP - 64, 2) and np.array_equal(b[:end - FADE], a[:end - FADE])
    prefix = len(np.load(child / "prefix.npy"))
    assert prefix + len(new) <= CONTEXT
    most = (CONTEXT - prefix - 50) / 25
    got = lineage(child)
    assert got["operation"] == "continue" and got["added_seconds"] == 1.0
    assert got["max_continuation_seconds"] == most and got["cut_token"] == 50
    report = entry["outputs"][cont]["text"][0]
    assert f"maximum continuation that fits the {CONTEXT}-token context: {most:.2f} s (prompt {prefix} + song 50 " \
           "tokens)" in report
    assert f"prompt + music = {prefix + 75} of {CONTEXT} tokens" in report
    # one token more than fits is refused before anything loads, saying the maximum
    set_inputs(prompt, "YuE2Continue", extra_seconds=most + 0.04)
    node, kind, message = run_error(comfy, prompt)
    assert (node, kind) == ("YuE2Continue", "ValueError")
    assert f"so at most {most:.2f} s of continuation are possible" in message
    assert f"prompt {prefix} + song 50 tokens leave {CONTEXT - prefix - 50} tokens" in message


def _edit_error(comfy, parent, model: str = TINY, **regen) -> tuple[str, str]:
    """(node type, message) of a Regenerate that must fail; the song is loaded with the tiny model."""
    prompt = {"1": LOADER, "9": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": model}},
              "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": parent.name}},
              "3": {"class_type": "YuE2Regenerate", "inputs": {"model": ["9", 0], "song": ["2", 3], "cut": "bar 2",
                                                               "seed": 5, "crossfade_s": 0.05, "name": "bad",
                                                               **regen}}}
    with pytest.raises(Exception) as err:
        comfy.run(prompt, timeout=240)
    error = next(m[1] for m in err.value.body["status"]["messages"] if m[0] == "execution_error")
    trace = "".join(error["traceback"])
    assert "yue2_core" not in trace and "torch/" not in trace, trace
    return error["node_type"], error["exception_message"]


RANGE = "choose a cut inside the music: 0.04 … 1.96 s (tokens 1 … 49 of 50, 25 per second), or bars 2 … 2 of the score"


@pytest.mark.parametrize("cut, expected", [
    ("bar 9", "bar 9 is not in the score (bars 1 … 4)"),
    ("0s", "the cut 0 s (token 0) lies at or before the start of the music (that is the prompt/prefix"),
    ("bar 1", "the cut bar 1 (starts at 0.00 s, token 0) lies at or before the start of the music"),
    ("2.5", "the cut 2.5 s (token 62) lies at or past the end of the music (2.00 s)"),
    ("soon", "cannot read the cut 'soon'"),
])
def test_bad_cuts_name_the_valid_range(comfy, parent, cut, expected):
    node, message = _edit_error(comfy, parent, cut=cut)
    assert node == "YuE2Regenerate" and expected in message
    if cut != "soon":
        assert RANGE in message


def test_a_song_from_another_checkpoint_is_refused(comfy, parent):
    node, message = _edit_error(comfy, parent, MICRO)
    assert node == "YuE2Regenerate"
    assert "this song was made with a different model" in message and "vocab 184704 (song) vs 1024 (loaded)" in message
    assert "Load the checkpoint it was made with" in message


def test_a_copy_saved_from_load_song_keeps_its_render_record_and_can_be_edited(comfy, comfy_server, node_info,
                                                                               parent):
    """Break-it finding (stop 38): Load Song → Save Song (its tokens and latent) saved ode_steps, render_seed and
    checkpoint as null, and Regenerate / Continue then refused the copy with a message that read as damage. Load
    Song's latent carries the song's render record now, so the copy records it and can be edited."""
    entry = run(comfy, {"1": LOADER, "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0],
                                                                                   "song": parent.name}},
                        "3": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "latent": ["2", 2],
                                                                       "name": "regen_copy"}}})
    (copy,) = saved_dirs(entry, comfy_server.output_dir)
    before, after = (json.loads((d / "config.json").read_text()) for d in (parent, copy))
    for key in ("ode_steps", "render_seed", "checkpoint", "ode_method"):
        assert after[key] == before[key] and after[key] is not None, key
    _, child = _child(comfy, comfy_server, _regen_prompt(node_info, copy))
    assert codes(child)[:25] == codes(copy)[:25]


def test_a_changed_latent_and_another_models_decode_are_said_at_save(comfy, comfy_server, parent):
    """Break-it findings (stop 39): (1) a latent changed after the render (LatentMultiply between Load Song or the
    Renderer and Save Song) kept its render record, so the saved song claimed a render it did not hold and an edit
    jumped at the cut — the record now carries a digest of its samples, and Save Song drops a record that no longer
    matches, saying so; (2) audio decoded by another checkpoint's VAE was saved without a word; (3) Load Song with
    another checkpoint file than the song's said nothing (the edit nodes and the command line did)."""
    loader = {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY_INT8}}
    entry = run(comfy, {
        "1": loader, "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": parent.name}},
        "3": {"class_type": "LatentMultiply", "inputs": {"samples": ["2", 2], "multiplier": 10.0}},
        "4": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "latent": ["3", 0],
                                                       "name": "regen_changed"}},
        "5": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["2", 2]}},
        "6": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "latent": ["2", 2], "audio": ["5", 0],
                                                       "name": "regen_mixed"}}})
    loaded = entry["outputs"]["2"]["text"][0]
    assert "note: the song was made with the bf16 file of this model and is now run with the int8 file" in loaded
    changed, mixed = (comfy_server.output_dir / entry["outputs"][n]["song_dir"][0] for n in ("4", "6"))
    assert "warning: the latent was changed after YuE2 rendered it" in entry["outputs"]["4"]["text"][0]
    config = json.loads((changed / "config.json").read_text())
    assert config["ode_steps"] is None and config["render_seed"] is None  # no record that would not describe it
    assert np.allclose(np.load(changed / "latent.npy"), 10 * np.load(parent / "latent.npy"), rtol=1e-6)
    text = entry["outputs"]["6"]["text"][0]
    assert "warning: the audio was decoded by the VAE of" in text and TINY_INT8 in text, text
    assert json.loads((mixed / "config.json").read_text())["checkpoint"]["path"].endswith(TINY)
