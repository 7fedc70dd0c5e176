"""YuE2 Save Song given audio that is not the decode of its latent (stop-47 leftover, docs/bad_inputs.md §31):
ComfyUI's own AudioAdjustVolume between YuE2 VAE Decode and Save Song. Saving such audio is legitimate (a gain, an
effect), so it is saved as given — and the song records it (config.json audio_source "given"): Regenerate makes the
part it keeps again from the latent instead of splicing the processed audio to an unprocessed new part, and Load
Song says so. The same audio straight from VAE Decode (or through AudioAdjustVolume at 0 dB, which passes it on
unchanged) is the song's own decode."""
from __future__ import annotations

import json

import numpy as np
import soundfile as sf

from nodes_testlib import SCORE_240, TINY, api, by_class, run, saved_dirs, set_inputs, test_sized

LOADER = {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}}
HOP, FADE = 1920, 2400


def _pcm(song_dir):
    return sf.read(str(song_dir / "audio.flac"), dtype="int32")[0]


def _config(song_dir) -> dict:
    return json.loads((song_dir / "config.json").read_text("utf-8"))


def test_processed_audio_is_saved_as_given_and_regenerate_does_not_splice_it(comfy, comfy_server, node_info,
                                                                            checkpoints):
    entry = run(comfy, {
        "1": LOADER, "2": {"class_type": "PrimitiveString", "inputs": {"value": SCORE_240}},
        "3": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "pop", "lyrics": "[verse]\nla la",
                                                       "cot": "full", "seed": 7, "max_seconds": 2.0,
                                                       "abc_text": ["2", 0]}},
        "4": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["3", 1], "steps": 8, "seed": -1}},
        "5": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["4", 0]}},
        "6": {"class_type": "AudioAdjustVolume", "inputs": {"audio": ["5", 0], "volume": -6}},
        "7": {"class_type": "AudioAdjustVolume", "inputs": {"audio": ["5", 0], "volume": 0}},
        "8": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["3", 1], "latent": ["4", 0], "audio": ["5", 0],
                                                       "name": "given_plain"}},
        "9": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["3", 1], "latent": ["4", 0], "audio": ["6", 0],
                                                       "name": "given_quiet"}},
        "10": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["3", 1], "latent": ["4", 0], "audio": ["7", 0],
                                                        "name": "given_zero_db"}}})
    dirs = {d.name.rsplit("_", 1)[0]: d for d in saved_dirs(entry, comfy_server.output_dir)}
    plain, quiet, zero = dirs["given_plain"], dirs["given_quiet"], dirs["given_zero_db"]
    assert _config(plain)["audio_source"] == "decoded" and _config(zero)["audio_source"] == "decoded"
    assert _config(quiet)["audio_source"] == "given"
    text = entry["outputs"]["9"]["text"][0]
    assert "warning: the audio is saved as given, not as this song's own decode: it did not come straight from a " \
           "YuE2 VAE Decode" in text, text
    assert "saved as given" not in entry["outputs"]["8"]["text"][0] + entry["outputs"]["10"]["text"][0]
    a, q = _pcm(plain), _pcm(quiet)
    assert a.shape == q.shape and not np.array_equal(a, q)  # the processed audio itself is what was saved

    loaded = run(comfy, {"1": LOADER, "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0],
                                                                                    "song": quiet.name}},
                         "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}})
    assert "note: its audio.flac was saved as given" in loaded["outputs"]["2"]["text"][0]

    prompt = test_sized(api("yue2_regenerate_from_bar", node_info))
    set_inputs(prompt, "YuE2LoadSong", song=quiet.name)
    set_inputs(prompt, "YuE2Regenerate", cut="bar 2", seed=5)
    (regen,) = by_class(prompt, "YuE2Regenerate")
    entry = run(comfy, prompt)
    (child,) = saved_dirs(entry, comfy_server.output_dir)
    report = entry["outputs"][regen]["text"][0]
    assert "the song's audio.flac was saved as given" in report, report
    e = 25 * HOP  # bar 2 at 240 BPM: token 25
    kept = _pcm(child)[:e - FADE]
    assert np.array_equal(kept, a[:e - FADE]), "the kept part is the latent's decode (the plain song's samples)"
    assert not np.array_equal(kept, q[:e - FADE])  # … not the processed audio spliced to an unprocessed new part
    assert "audio_source" not in _config(child)  # the child's audio is its own


def test_a_picked_take_is_saved_as_its_own_decode(comfy, comfy_server, node_info, checkpoints):
    """The shipped four-candidates workflow (VAE Decode of the batch → Pick Take → Save Song): Pick Take stamps the
    take's audio for the take's latent, so the saved take is "decoded", with no given-audio warning."""
    prompt = test_sized(api("yue2_four_candidates", node_info))
    set_inputs(prompt, "YuE2Composer", seed=11, style="pop", lyrics="[verse]\nla la")
    set_inputs(prompt, "YuE2PickTake", index=2)
    set_inputs(prompt, "YuE2SaveSong", name="given_take")
    (save,) = by_class(prompt, "YuE2SaveSong")
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert _config(song_dir)["audio_source"] == "decoded"
    assert "saved as given" not in entry["outputs"][save]["text"][0], entry["outputs"][save]["text"][0]
