"""The shipped workflows: in sync with the node schemas, listed once in ComfyUI's template browser and served, and each
one (converted to an API prompt as the frontend would) runs to success on the tiny synthetic checkpoint and saves a
song whose audio has exactly 1920·frames − 64 samples at 48 kHz."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import soundfile as sf

from comfy_client import PACK_NAME, widget_names
from nodes_testlib import (EXAMPLES, REPO, TINY, TINY_INT8, VALID_ABC, api, by_class, codes, load_example, run,
                           saved_dirs, set_inputs, test_sized)

NAMES = ["yue2_text_to_song_full", "yue2_text_to_song_melody", "yue2_text_to_song_off", "yue2_edit_and_rerender",
         "yue2_load_and_rerender", "yue2_int8_low_vram", "yue2_regenerate_from_bar", "yue2_continue",
         "yue2_four_candidates", "yue2_custom_vae_decoder", "yue2_song_with_lora"]
SAVERS = ("YuE2SaveSong", "YuE2Regenerate", "YuE2Continue")  # the nodes that write a song folder
SONG_FILES = {"score.abc", "abc_tokens.npy", "prefix.npy", "semantic.npy", "latent.npy", "audio.flac", "request.json",
              "config.json", "result.json", "plan.json", "plan_manifest.json"}


def _builder():
    spec = importlib.util.spec_from_file_location("build_workflows", REPO / "workflows" / "build_workflows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_song(song_dir, cot: str = "full") -> int:
    """The saved song is complete and its audio length matches its tokens; returns the frame count."""
    files = {f.name for f in song_dir.iterdir()}
    assert files == (SONG_FILES - {"score.abc"} if cot == "off" else SONG_FILES)
    frames = len(codes(song_dir))
    assert frames > 0
    assert np.load(song_dir / "latent.npy").shape == (frames, 64)
    info = sf.info(str(song_dir / "audio.flac"))
    assert (info.samplerate, info.channels) == (48000, 2)
    assert info.frames == 1920 * frames - 64
    audio, _ = sf.read(str(song_dir / "audio.flac"), dtype="float32")
    assert np.abs(audio).max() <= 1.0
    result = json.loads((song_dir / "result.json").read_text())
    assert result["status"] == "complete" and result["frames"] == frames
    return frames


def test_shipped_files_match_the_node_schemas(node_info):
    built = _builder().build_all(node_info)
    assert sorted(built) == sorted(NAMES)
    assert sorted(p.stem for p in EXAMPLES.glob("*.json")) == sorted(NAMES)
    for name, workflow in built.items():
        shipped = (EXAMPLES / f"{name}.json").read_text(encoding="utf-8")
        assert shipped == _builder().dumps(workflow), (
            f"example_workflows/{name}.json is out of date with the node schemas; regenerate it with "
            f"`python workflows/build_workflows.py --url <a ComfyUI with the pack>`")


def test_templates_are_listed_once_and_served(comfy):
    listed = comfy.get_json("/workflow_templates")[PACK_NAME]
    assert sorted(listed) == sorted(NAMES), "each shipped workflow must appear exactly once in the template browser"
    for name in NAMES:
        served = comfy.get_bytes(f"/api/workflow_templates/{PACK_NAME}/{name}.json")
        assert json.loads(served) == json.loads((EXAMPLES / f"{name}.json").read_text())


@pytest.mark.parametrize("name, promise", [("yue2_four_candidates", "only Pick Take and Save Song run"),
                                           ("yue2_custom_vae_decoder", "the same music tokens and latents"),
                                           ("yue2_song_with_lora", "a strength change gives the same song")])
def test_the_comparing_workflows_keep_their_seed(node_info, name, promise):
    """Review, stop 44: the Composer's seed control was 'randomize', which the frontend applies after every queue
    (setting Comfy.WidgetControlMode, default 'after') — so the run after choosing Pick Take's index composed four new
    takes with a new seed instead of picking among the ones just heard, and a VAE or LoRA strength swapped for a
    comparison came with a different song, against what each workflow's note says."""
    workflow = load_example(name)
    (composer,) = [n for n in workflow["nodes"] if n["type"] == "YuE2Composer"]
    at = 0
    for name, has_control in widget_names(node_info["YuE2Composer"], composer):
        if name == "seed":
            break
        at += 2 if has_control else 1
    assert composer["widgets_values"][at + 1] == "fixed"  # the value after the seed is its control
    (note,) = [n for n in workflow["nodes"] if n["type"] == "Note"]
    assert promise in note["widgets_values"][0] and "fixed" in note["widgets_values"][0]


@pytest.mark.parametrize("name", NAMES)
def test_workflow_converts_with_every_node_known(node_info, name):
    prompt = api(name, node_info)  # raises on node types /object_info does not know
    loaders = [prompt[i]["inputs"]["ckpt_name"] for i in by_class(prompt, "YuE2CheckpointLoader")]
    assert loaders == ["yue2_3b_int8_convrot.safetensors"]
    assert any(by_class(prompt, kind) for kind in SAVERS)


@pytest.fixture(scope="module")
def full_song(comfy, comfy_server, node_info):
    """The text → song (full) workflow run once; its song directory (other tests load it)."""
    entry = run(comfy, test_sized(api("yue2_text_to_song_full", node_info)))
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    return entry, song_dir


def test_text_to_song_full(full_song, node_info):
    entry, song_dir = full_song
    frames = check_song(song_dir)
    prompt = api("yue2_text_to_song_full", node_info)
    (composer,) = by_class(prompt, "YuE2Composer")
    report = entry["outputs"][composer]["text"][0]
    assert "lead sheet: 8 ABC tokens" in report and "hit its budget of 8 tokens" in report
    assert f"music: {frames} tokens = {frames / 25:.2f} s" in report and "tok/s" in report
    # the synthetic checkpoint's random weights run every phase to its budget: said, as the command line says it
    assert ("warning: synthetic (random) weights never end a lead sheet or the music on their own end token, so each "
            "phase runs to its budget: the lead sheet to 8 tokens (`max_abc_tokens`) and the music to 25 tokens "
            "(`max_seconds`)") in report
    (preview,) = by_class(prompt, "PreviewAny")
    assert entry["outputs"][preview]["text"] == [report]  # the report output reaches a stock preview node
    (save,) = by_class(prompt, "YuE2SaveSong")
    audio = entry["outputs"][save]["audio"]
    assert audio == [{"filename": "audio.flac", "subfolder": f"yue2/{song_dir.name}", "type": "output"}]


@pytest.mark.parametrize("name, cot, ckpt", [("yue2_text_to_song_melody", "melody", TINY),
                                             ("yue2_text_to_song_off", "off", TINY),
                                             ("yue2_int8_low_vram", "full", TINY_INT8)])
def test_text_to_song_variants(comfy, comfy_server, node_info, name, cot, ckpt):
    prompt = test_sized(api(name, node_info), ckpt)
    (composer,) = by_class(prompt, "YuE2Composer")
    assert prompt[composer]["inputs"]["cot"] == cot
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    check_song(song_dir, cot)
    report = entry["outputs"][composer]["text"][0]
    if cot == "off":
        assert "lead sheet: none (cot off)" in report and "cfg 1.01 (auto)" in report
    if ckpt == TINY_INT8:
        texts = [entry["outputs"][i]["text"][0] for i in by_class(prompt, "PreviewAny")]
        assert any(t.startswith("YuE2 int8 all-in-one") for t in texts), texts


def test_edit_and_rerender(comfy, comfy_server, node_info):
    prompt = test_sized(api("yue2_edit_and_rerender", node_info))
    set_inputs(prompt, "YuE2ABCEditor", abc=VALID_ABC)
    first, second = by_class(prompt, "YuE2Composer")
    assert prompt[first]["inputs"]["sample_music"] is False and "score" in prompt[second]["inputs"]
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    check_song(song_dir)
    assert (song_dir / "score.abc").read_text() == VALID_ABC
    assert "music: not sampled (`sample_music` off: score only)" in entry["outputs"][first]["text"][0]
    assert "lead sheet: given" in entry["outputs"][second]["text"][0]
    assert "edited text, tokenized" in entry["outputs"][second]["text"][0]


def test_load_and_rerender_reproduces_the_saved_song(comfy, comfy_server, node_info, full_song):
    _, original = full_song
    prompt = test_sized(api("yue2_load_and_rerender", node_info))
    set_inputs(prompt, "YuE2LoadSong", song=original.name)
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert song_dir != original
    check_song(song_dir)
    assert codes(song_dir) == codes(original)
    assert (song_dir / "score.abc").read_bytes() == (original / "score.abc").read_bytes()
    # same tokens, the tokens' own seed (−1) and the same steps: the render and the audio are reproduced exactly
    assert np.array_equal(np.load(song_dir / "latent.npy"), np.load(original / "latent.npy"))
    assert np.array_equal(sf.read(str(song_dir / "audio.flac"))[0], sf.read(str(original / "audio.flac"))[0])
