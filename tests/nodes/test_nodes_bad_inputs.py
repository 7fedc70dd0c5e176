"""Bad input gives a clear message (from ComfyUI's validation, or the node's error in the history) and never a
traceback from inside torch or the engine."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from nodes_testlib import MICRO, TINY, VALID_ABC, rejected, run, saved_dirs

LOADER = {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}}


def _traceback_of(comfy, prompt) -> tuple[str, str, str]:
    """(node type, exception type, message) of a failing prompt; asserts the traceback stays in the pack's nodes."""
    with pytest.raises(Exception) as err:
        comfy.run(prompt, timeout=240)
    entry = err.value.body
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    trace = "".join(error["traceback"])
    assert "yue2_core" not in trace and "torch/" not in trace, trace
    return error["node_type"], error["exception_type"], error["exception_message"]


def composer(**inputs) -> dict:
    base = {"model": ["1", 0], "style": "pop", "lyrics": "[verse]\nla la", "cot": "full", "seed": 1,
            "max_seconds": 1.0, "max_abc_tokens": 8}
    return {"class_type": "YuE2Composer", "inputs": {**base, **inputs}}


def preview(source) -> dict:
    return {"class_type": "PreviewAny", "inputs": {"source": source}}


def test_missing_checkpoint_says_where_to_put_which_file(comfy, comfy_server, checkpoints):
    body = rejected(comfy, {"1": {"class_type": "YuE2CheckpointLoader",
                                  "inputs": {"ckpt_name": "yue2_3b_int8_convrot.safetensors"}},
                            "2": preview(["1", 1])})
    message = str(body["node_errors"]["1"])
    assert "custom_validation_failed" in message
    assert "Download yue2_3b_int8_convrot.safetensors" in message
    assert ("https://huggingface.co/Comfy-Org/YuE2/resolve/main/checkpoints/yue2_3b_int8_convrot.safetensors"
            in message)
    assert str(comfy_server.models_dir) in message and TINY in message


def test_a_non_yue2_checkpoint_gets_the_engine_message(comfy, comfy_server, checkpoints):
    path = comfy_server.models_dir / "some_sd_model.safetensors"
    save_file({"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4, 4),
               "first_stage_model.decoder.conv_in.weight": torch.zeros(2, 2)}, str(path))
    node, kind, message = _traceback_of(comfy, {"1": {"class_type": "YuE2CheckpointLoader",
                                                      "inputs": {"ckpt_name": path.name}}, "2": preview(["1", 1])})
    assert node == "YuE2CheckpointLoader" and kind == "ValueError"
    assert "some_sd_model.safetensors is not a YuE2 all-in-one checkpoint" in message
    assert "yue2_3b_int8_convrot.safetensors" in message


@pytest.fixture(scope="module")
def tokens_song(comfy, comfy_server, checkpoints) -> str:
    """A song saved right after composing (tokens only: no latent, no audio) from a given ABC text."""
    entry = run(comfy, {"1": LOADER, "2": {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}},
                        "3": composer(abc_text=["2", 0]),
                        "4": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["3", 1], "name": "tokens_only"}}})
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert sorted(p.name for p in song_dir.iterdir()) == ["abc_tokens.npy", "config.json", "plan.json",
                                                          "plan_manifest.json", "prefix.npy", "request.json",
                                                          "result.json", "score.abc", "semantic.npy"]
    assert "no audio" in entry["outputs"]["4"]["text"][0]
    return song_dir.name


def test_tokens_from_one_model_into_another_name_the_mismatch(comfy, tokens_song):
    prompt = {"1": LOADER, "2": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": MICRO}},
              "3": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": tokens_song}},
              "4": {"class_type": "YuE2Renderer", "inputs": {"model": ["2", 0], "tokens": ["3", 1], "steps": 8,
                                                             "seed": -1}},
              "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["3", 1], "name": "x", "latent": ["4", 0]}}}
    node, _, message = _traceback_of(comfy, prompt)
    assert node == "YuE2Renderer"
    assert "vocabulary has 1024 rows" in message and "embed_tokens is [1024, 256]" in message
    assert "made with another model" in message


def test_missing_parts_block_what_needs_them(comfy, tokens_song):
    """A song saved without latents, and a 'score only' Composer, block the nodes that would need the missing output
    (ComfyUI's ExecutionBlocker: the frontend shows the message; the history just shows those nodes did not run)."""
    prompt = {"1": LOADER, "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": tokens_song}},
              "3": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["2", 2]}},
              "4": {"class_type": "PreviewAudio", "inputs": {"audio": ["3", 0]}},
              "5": composer(sample_music=False),
              "6": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["5", 1], "name": "blocked"}}}
    entry = run(comfy, prompt)
    assert "saved without latents" not in str(entry)  # the message goes to the frontend over the websocket
    assert "4" not in entry["outputs"] and "6" not in entry["outputs"]
    assert "music: not sampled" in entry["outputs"]["5"]["text"][0]


def test_a_latent_of_the_wrong_shape_names_the_shape(comfy, checkpoints):
    prompt = {"1": LOADER,
              "2": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
              "3": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["2", 0]}},
              "4": {"class_type": "PreviewAudio", "inputs": {"audio": ["3", 0]}}}
    node, kind, message = _traceback_of(comfy, prompt)
    assert node == "YuE2VAEDecode" and kind == "ValueError"
    assert "[1, 4, 64, 64]" in message and "[B, 64, frames]" in message and "image latent" in message


def test_empty_style_and_lyrics_warn_but_run(comfy, checkpoints):
    entry = run(comfy, {"1": LOADER, "2": composer(style="", lyrics="", sample_music=False),
                        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 3]}}})
    report = entry["outputs"]["2"]["text"][0]
    assert "warning: style is empty" in report
    assert "warning: lyrics are empty: this is NOT an instrumental switch" in report
    assert "music: not sampled" in report


def test_empty_lyrics_under_a_connected_silenced_score_get_no_instrumental_note(comfy, checkpoints):
    """New-user review 58 (docs/bad_inputs.md §64): the Composer told a user whose connected score had a silent Vocal
    voice — the instrumental its note advises — that empty lyrics are not an instrumental switch."""
    from yue2_core.abc.tools import silence_vocal
    silent = silence_vocal(VALID_ABC)
    for abc, noted in ((silent, False), (VALID_ABC, True)):
        entry = run(comfy, {"1": LOADER, "2": composer(lyrics="", abc_text=abc, sample_music=False),
                            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 3]}}})
        report = entry["outputs"]["2"]["text"][0]
        assert ("lyrics are empty: this is NOT an instrumental switch" in report) is noted, report


@pytest.mark.parametrize("seconds", [0.0, -5.0, 984.0])  # the max: the context, 983.04 s
def test_max_seconds_outside_the_widget_range_is_rejected(comfy, seconds):
    body = rejected(comfy, {"1": LOADER, "2": composer(max_seconds=seconds), "3": preview(["2", 3])})
    details = str(body["node_errors"]["2"])
    assert ("value_smaller_than_min" if seconds < 1 else "value_bigger_than_max") in details
    assert "max_seconds" in details


def test_max_seconds_above_what_fits_says_the_maximum(comfy, checkpoints):  # the tiny file in place when run alone
    lyrics = "la la la\n" * 1000  # about 4,000 prompt tokens: less than 900 s of music fit after them
    node, _, message = _traceback_of(comfy, {"1": LOADER, "2": composer(cot="off", lyrics=lyrics,
                                                                           max_seconds=900.0),
                                                "3": preview(["2", 3])})
    assert node == "YuE2Composer"
    assert "max_seconds = 900 s (22500 music tokens) does not fit the 24576-token context" in message
    fits = float(message.split("at most ")[1].split(" s")[0])
    assert 700 < fits < 900 and f"Lower max_seconds to {int(fits)} or less" in message
    # a prompt longer than the context: how long it is and how much to cut (review, stop 44: "at most 0.00 s (0
    # tokens) fit … shorten the lyrics, style or score", with no size to aim for)
    node, _, message = _traceback_of(comfy, {"1": LOADER, "2": composer(cot="off", lyrics="la la la\n" * 7000,
                                                                           max_seconds=10.0),
                                                "3": preview(["2", 3])})
    prompt = int(message.split("the prompt alone is ")[1].split(" tokens")[0].replace(",", ""))
    assert prompt > 24576 and f"by at least {prompt + 25 - 24576:,} tokens" in message, message


@pytest.mark.parametrize("abc, expected", [
    ("", "the ABC score is empty: nothing is connected"),
    (VALID_ABC.replace("M:4/4\n", ""), "score line 3 column 1: The header has no M: line"),
    (VALID_ABC.replace('"G"d16B16|', '"G"d16B16B8|'), "score line 11 column 13: Bar 2 of Vocal lasts 40 unit(s)"),
    (VALID_ABC + "%" + "x" * 120_000 + "\n", "at most 100,000 are accepted"),  # review: 2 MB took 25 s to check
])
def test_the_editor_refuses_an_invalid_score_with_its_line(comfy, abc, expected):
    node, _, message = _traceback_of(comfy, {"1": {"class_type": "YuE2ABCEditor", "inputs": {"abc": abc}},
                                                "2": preview(["1", 1])})
    assert node == "YuE2ABCEditor" and expected in message


def test_an_unpaired_surrogate_in_a_nodes_error_does_not_stop_the_queue(comfy):
    """Break-it review, stop 55: a score holding an unpaired surrogate (a JSON "\\ud800" escape: an API prompt, a
    broken paste) in the ABC Editor was refused with a message quoting `K:C\ud800`; ComfyUI 0.3.75 logs a node's error
    to a stderr that encodes UTF-8 strictly, the write failed, the failure's report printed the error again, and the
    prompt worker thread ended: that prompt never finished and no later prompt ran until ComfyUI was restarted. Now
    every pack node's error carries the escape `\\ud800` instead (nodes/progress.surrogate_safe)."""
    abc = VALID_ABC.replace("K:C", "K:C\ud800")
    with pytest.raises(Exception) as err:
        comfy.run({"1": {"class_type": "YuE2ABCEditor", "inputs": {"abc": abc}}, "2": preview(["1", 1])}, timeout=90)
    entry = getattr(err.value, "body", None)
    assert isinstance(entry, dict) and "status" in entry, err.value  # was: "did not finish within 90 s"
    error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    message = error["exception_message"]
    assert error["node_type"] == "YuE2ABCEditor" and "K:C\\ud800 is not a key the dialect uses" in message, message
    assert "U+D800 is an unpaired surrogate" in message and "\ud800" not in message, message
    entry = run(comfy, {"1": {"class_type": "YuE2ABCEditor", "inputs": {"abc": VALID_ABC}}, "2": preview(["1", 1])},
                timeout=90)  # the queue still runs
    assert entry["status"]["status_str"] == "success", entry["status"]


def test_the_editor_refuses_a_connected_abc_text_past_the_limit(comfy):
    """Stop-49 leftover: a connected abc_text of 438 kB was checked for 5 s and passed on with 200 warnings (the
    100 kB limit covered typed text only); it is now refused by its size, as typed text is."""
    text = {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC + "%" + "x" * 120_000 + "\n"}}
    editor = {"class_type": "YuE2ABCEditor", "inputs": {"abc": "", "abc_text": ["1", 0]}}
    node, _, message = _traceback_of(comfy, {"1": text, "2": editor, "3": preview(["2", 1])})
    assert node == "YuE2ABCEditor" and "the connected abc_text is 120,1" in message, message
    assert "at most 100,000 are accepted" in message, message


def test_conflicting_score_inputs_are_refused(comfy, checkpoints):
    text = {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}}
    editor = {"class_type": "YuE2ABCEditor", "inputs": {"abc": "", "abc_text": ["2", 0]}}
    _, _, message = _traceback_of(comfy, {"1": LOADER, "2": text, "3": editor,
                                          "4": composer(score=["3", 0], abc_text=["2", 0]), "5": preview(["4", 3])})
    assert "both a score and an abc_text are connected" in message
    _, _, message = _traceback_of(comfy, {"1": LOADER, "2": text, "4": composer(cot="off", abc_text=["2", 0]),
                                          "5": preview(["4", 3])})
    assert "cot is off" in message


def test_an_unknown_song_is_rejected_with_the_folder(comfy, comfy_server):
    body = rejected(comfy, {"1": LOADER, "2": {"class_type": "YuE2LoadSong",
                                               "inputs": {"model": ["1", 0], "song": "no_such_song_00001"}},
                            "3": preview(["2", 1])})
    message = str(body["node_errors"]["2"])
    assert "no saved song 'no_such_song_00001'" in message and str(comfy_server.output_dir / "yue2") in message


def test_a_missing_file_is_reported_once(comfy, comfy_server):
    """New-user finding (stop 39): a missing LoRA was reported four times — once per input of YuE2 LoRA (model,
    lora_name, strength_ar, strength_nar) — because its `validate_inputs` took **kwargs, and ComfyUI repeats a custom
    validation failure for every input that function receives (Load Song and the VAE Loader twice). Now once each,
    on the file input."""
    body = rejected(comfy, {
        "1": LOADER, "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": "no_such_song_00001"}},
        "3": {"class_type": "YuE2LoRA", "inputs": {"model": ["1", 0], "lora_name": "no_such_lora.safetensors",
                                                   "strength_ar": 1.0, "strength_nar": 1.0}},
        "4": {"class_type": "YuE2VAELoader", "inputs": {"model": ["1", 0], "vae_name": "no_such_vae/"}},
        "5": preview(["2", 1]), "6": preview(["3", 1]), "7": preview(["4", 1])})
    errors = body["node_errors"]
    for node, name, what in (("2", "song", "no saved song"), ("3", "lora_name", "is not in ComfyUI's loras folder"),
                             ("4", "vae_name", "is not in ComfyUI's vae folder")):
        (error,) = errors[node]["errors"]
        assert error["type"] == "custom_validation_failed" and error["details"].startswith(f"{name} - "), error
        assert what in error["details"], error


def test_a_folder_with_a_checkpoints_name_is_called_a_folder(comfy, comfy_server, checkpoints):
    """Break-it (stop 41): a folder named like a checkpoint file (an archive unpacked under the file's name) was
    reported as missing, with the download advice."""
    (comfy_server.models_dir / "unpacked.safetensors").mkdir(exist_ok=True)
    loader = {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": "unpacked.safetensors"}}
    body = rejected(comfy, {"1": loader, "2": preview(["1", 1])})
    (error,) = body["node_errors"]["1"]["errors"]
    assert error["details"].startswith("ckpt_name - YuE2 checkpoint 'unpacked.safetensors' in "), error
    assert "is a folder, not a checkpoint file" in error["details"] and "Download" not in error["details"], error


def _lora(**inputs) -> dict:
    return {"class_type": "YuE2LoRA", "inputs": {"model": ["1", 0], "lora_name": "x.safetensors", "strength_ar": 1.0,
                                                 "strength_nar": 1.0, **inputs}}


@pytest.mark.parametrize("node, error, expected", [
    # ComfyUI 0.3.75 reads any non-empty string as True for a BOOLEAN (bool("false")): the music was sampled
    (composer(sample_music="false"), "invalid_input_type",
     "sample_music must be true or false (a JSON boolean); got the text 'false', which ComfyUI would read as true"),
    (composer(seed=1.7), "invalid_input_type", "seed must be a whole number in [0, "),  # was cut to 1
    (composer(max_seconds=float("nan")), "invalid_input_type",  # JSON NaN passes ComfyUI's min/max check
     "max_seconds must be a finite number in [1, 983.04]; got NaN"),
    (composer(cfg_scale="nan"), "invalid_input_type", "cfg_scale must be a finite number in [-1, 20]; got NaN"),
    (_lora(strength_nar=float("nan")), "invalid_input_type", "strength_nar must be a finite number in [-5, 5]"),
    # a file dropdown given another JSON value: was "Exception when validating inner node: 'int' object has no
    # attribute 'endswith'" (ComfyUI checks no V3 COMBO against its options)
    ({"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": 5}}, "custom_validation_failed",
     "ckpt_name must be the name of a checkpoint from the list (a text), got 5 (int)"),
    ({"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": ""}}, "custom_validation_failed",
     "ckpt_name is empty: pick a checkpoint from the list"),  # was "'' … is a folder, not a checkpoint file"
    (_lora(lora_name=None), "custom_validation_failed", "lora_name must be the name of a LoRA file from the list"),
    # break-it review 53b: a JSON boolean for a number, anything but a boolean for a BOOLEAN (were read as 1 / false)
    (composer(seed=True), "invalid_input_type",
     "seed must be a whole number in [0, 9,223,372,036,854,775,807]; got true (a JSON boolean), which ComfyUI would "
     "read as 1"),
    (composer(max_seconds=True), "invalid_input_type", "max_seconds must be a number in [1, 983.04]; got true"),
    (composer(sample_music=None), "invalid_input_type",
     "sample_music must be true or false (a JSON boolean); got null, which ComfyUI would read as false"),
    (composer(sample_music=2), "invalid_input_type", "got 2, which ComfyUI would read as true"),
])
def test_values_comfyui_would_misread_are_refused_by_name(comfy, checkpoints, node, error, expected):
    """Bad-inputs section 38: refused at validation (nothing runs), with the input, the value and what is accepted."""
    body = rejected(comfy, {"1": LOADER, "2": node, "3": preview(["2", 0])})
    errors = body["node_errors"]["2"]["errors"]
    assert any(e["type"] == error and expected in e["details"] for e in errors), errors


def test_a_missing_dropdown_and_a_non_text_for_a_text_are_named(comfy, comfy_server, checkpoints):
    """Break-it review 53b. A prompt without a node's file / song dropdown got Python's `validate_inputs() missing 1
    required positional argument: 'ckpt_name'` (an exception in the node's check, which replaced ComfyUI's own
    "Required input is missing"); null, true or an object for a text input were read as the text "None" / "True" /
    "{'a': 1}" — a style "None", a song saved as None_00001. Each is now refused at validation, nothing runs."""
    for class_type, name in (("YuE2CheckpointLoader", "ckpt_name"), ("YuE2LoRA", "lora_name"),
                             ("YuE2VAELoader", "vae_name"), ("YuE2LoadSong", "song")):
        node = {"class_type": class_type, "inputs": {"model": ["9", 0]} if name != "ckpt_name" else {}}
        if name == "lora_name":
            node["inputs"].update(strength_ar=1.0, strength_nar=1.0)
        body = rejected(comfy, {"9": LOADER, "1": node, "2": preview(["1", 1])})
        assert "positional argument" not in str(body), body
        (error,) = body["node_errors"]["1"]["errors"]
        assert (error["type"], error["details"]) == ("required_input_missing", name), error
    body = rejected(comfy, {"1": {"class_type": "YuE2LoadSong", "inputs": {"model": ["9", 0], "song": None}},
                            "9": LOADER, "2": preview(["1", 1])})
    assert "song must be the name of a saved song from the list (a text), got None" in str(body), body
    save = {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": None}}
    for graph, node, text in (
            ({"1": LOADER, "2": composer(), "3": save}, "3",
             "name must be a text (a JSON string); got null, which ComfyUI would read as the text 'None'"),
            ({"1": LOADER, "2": composer(style=True), "3": preview(["2", 3])}, "2",
             "style must be a text (a JSON string); got true, which ComfyUI would read as the text 'True'"),
            ({"1": LOADER, "2": composer(lyrics={"a": 1}), "3": preview(["2", 3])}, "2",
             "lyrics must be a text (a JSON string); got {\"a\": 1}, which ComfyUI would read as the text "
             "\"{'a': 1}\""),
            ({"1": {"class_type": "YuE2ABCEditor", "inputs": {"abc": None}}, "2": preview(["1", 1])}, "1",
             "abc must be a text (a JSON string); got null")):
        body = rejected(comfy, graph)
        errors = body["node_errors"][node]["errors"]
        assert any(e["type"] == "invalid_input_type" and text in e["details"] for e in errors), errors
    assert not list((comfy_server.output_dir / "yue2").glob("None_*"))


def test_a_latent_rendered_from_other_tokens_of_the_same_length_is_refused(comfy, comfy_server, checkpoints):
    """Two Composers of the same length, the latent of one wired beside the tokens of the other (into Save Song, or a
    batch into Pick Take): refused naming the mix-up, nothing saved (was: saved — a song whose latent.npy is not the
    render of its semantic.npy, with that render's seed and steps recorded; only a length mismatch was caught; break-it
    review, stop 51). The render record carries a digest of the tokens it rendered (nodes/records.tokens_digest)."""
    def graph(save_tokens: str, **extra) -> dict:
        render = {"model": ["1", 0], "tokens": ["3", 1], "steps": 2, "seed": -1}
        return {"1": LOADER, "2": composer(seed=1), "3": composer(seed=2),
                "4": {"class_type": "YuE2Renderer", "inputs": render},
                "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": [save_tokens, 1], "latent": ["4", 0],
                                                               "name": "mixed_up"}}, **extra}

    node, kind, message = _traceback_of(comfy, graph("2"))
    assert node == "YuE2SaveSong" and kind == "ValueError"
    assert "rendered from other music tokens than the ones connected to `tokens`" in message
    assert "connect the latent rendered from these tokens" in message and "nothing was saved" in message
    assert not list((comfy_server.output_dir / "yue2").glob("mixed_up_*"))
    (saved,) = saved_dirs(run(comfy, graph("3")), comfy_server.output_dir)  # the tokens it was rendered from: saved
    assert saved.name.startswith("mixed_up_")

    takes = {"class_type": "YuE2PickTake", "inputs": {"tokens": ["6", 1], "latent": ["8", 0], "index": 1}}
    prompt = {"1": LOADER, "6": composer(seed=1, candidates=2), "7": composer(seed=5, candidates=2),
              "8": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["7", 1], "steps": 2,
                                                             "seed": -1}},
              "9": takes, "10": preview(["9", 4])}
    node, kind, message = _traceback_of(comfy, prompt)
    assert node == "YuE2PickTake" and kind == "ValueError"
    assert "latent item 0 was rendered from other music tokens" in message
    takes["inputs"]["tokens"] = ["7", 1]
    assert "picked take 1 (seed 6)" in run(comfy, prompt)["outputs"]["10"]["text"][0]
