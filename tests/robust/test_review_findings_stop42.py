"""Findings of the 2026-12-06 break-it review (stop 42), docs/bad_inputs.md §19."""
from __future__ import annotations

import hashlib
import os
import json
import shutil
from pathlib import Path

import pytest

from robust_helpers import make_song
from yue2_core.artifacts import load_song, save_song, seal_result
from yue2_core.errors import ArtifactError


def _tampered(src: Path, dst: Path, name: str, edit) -> Path:
    """A copy of song `src` with `edit` applied to its JSON file `name`, the manifest and the seal recomputed (so
    the check after them is reached)."""
    shutil.copytree(src, dst)
    doc = json.loads((dst / name).read_text("utf-8"))
    edit(doc)
    text = json.dumps(doc)
    (dst / name).write_text(text, "utf-8")
    result = json.loads((dst / "result.json").read_text("utf-8"))
    if name != "result.json":
        result["artifacts"][name] = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "bytes": len(text.encode())}
    (dst / "result.json").write_text(json.dumps(seal_result(result)), "utf-8")
    return dst


@pytest.mark.parametrize("where", ["config", "result"])
def test_a_cfg_scale_past_2_to_the_64_is_read_as_a_number(tmp_path, where):
    """config.json cfg_scale / result.json semantic.cfg_scale = 2**70 (an integer numpy cannot hold) made
    np.isfinite raise TypeError: a traceback from render, inspect and Load Song. Now it is a number like any other,
    and one too large for a float is refused by name."""
    song = save_song(make_song(), tmp_path / "song")

    def set_cfg(value):
        if where == "config":
            return "config.json", lambda doc: doc.__setitem__("cfg_scale", value)
        return "result.json", lambda doc: doc["semantic"].__setitem__("cfg_scale", value)

    load_song(_tampered(song, tmp_path / "big", *set_cfg(2 ** 70)))  # finite as a float: loads
    with pytest.raises(ArtifactError, match="cfg_scale must be a finite number"):
        load_song(_tampered(song, tmp_path / "huge", *set_cfg(10 ** 400)))


@pytest.mark.parametrize("loras", [True, 5, -0.5])
def test_an_edit_of_a_song_whose_weights_record_is_malformed_is_refused_by_name(tmp_path, loras):
    """Regenerate / Continue (engine) of a song directory whose config.json says `"weights": {"loras": true}`: it
    loaded, and the edit ended in `TypeError: 'bool' object is not iterable` once the music was made. Now refused
    before any work, as render and Load Song refuse it."""
    from yue2_core.edit import as_parent
    from yue2_core.errors import AdapterError
    song = save_song(make_song(), tmp_path / "song")
    bad = _tampered(song, tmp_path / "bad", "config.json",
                    lambda doc: doc.setdefault("weights", {}).__setitem__("loras", loras))
    with pytest.raises(AdapterError, match="`loras` must be a list of adapter entries"):
        as_parent(bad)


def test_an_output_deeper_inside_a_batch_folder_is_refused(tmp_path):
    """`generate --output B/ID/take` (or `batch --output B/ID/x`) made B/ID inside the batch folder B: a running
    batch then could not save song ID there (its folder existed and was not empty). Only B/x was refused."""
    from robust_helpers import assert_cli_error, run_cli
    from yue2_core.artifacts import batch_folder_above
    from yue2_core.batch.driver import check_output
    batch = tmp_path / "B"
    batch.mkdir()
    (batch / "batch.json").write_text(json.dumps({"settings": {}, "results": []}))
    proc = run_cli("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", "/nonexistent.safetensors",
                   "--output", batch / "s1" / "take")
    assert_cli_error(proc, "is inside a batch output folder")
    assert sorted(os.listdir(batch)) == ["batch.json"]  # no s1/ made
    with pytest.raises(ArtifactError, match="is inside a batch output folder"):
        check_output(batch / "s1" / "more", {"a"}, resume=False)
    # a file named batch.json higher up that is not a batch summary is not ours: no refusal for it
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "batch.json").write_text('{"my": "notes"}')
    assert batch_folder_above(tmp_path / "other" / "songs" / "x") is None
    assert batch_folder_above(batch / "s1" / "take") == batch


def test_an_output_through_a_symlink_into_a_batch_folder_is_refused(tmp_path):
    """`--output songs/take` where `songs` is a symlink to B/ID inside a batch folder B: the folder is made in B/ID
    all the same, but only the path as typed was looked at (review 42)."""
    from yue2_core.artifacts import batch_folder_above
    from yue2_core.batch.driver import check_output
    batch = tmp_path / "B"
    (batch / "s1").mkdir(parents=True)
    (batch / "batch.json").write_text(json.dumps({"settings": {}, "results": []}))
    (tmp_path / "songs").symlink_to(batch / "s1")
    (tmp_path / "elsewhere").mkdir()
    assert batch_folder_above(tmp_path / "songs" / "take") == batch
    with pytest.raises(ArtifactError, match="is inside a batch output folder"):
        check_output(tmp_path / "songs" / "more", {"a"}, resume=False)
    assert batch_folder_above(tmp_path / "elsewhere" / "take") is None


@pytest.mark.parametrize("key, value, words", [
    ("dtype", [1], 'settings.dtype is [1], not one of "bf16", "fp32"'),
    ("dtype", "fp16", 'settings.dtype is "fp16", not one of "bf16", "fp32"'),
    ("lora_int8", 5, 'settings.lora_int8 is 5, not one of "side", "bf16" or null'),
    ("loras", "x", 'settings.loras is "x", not a list of [path, AR strength, NAR strength] entries'),
    ("loras", [["/m/l.safetensors", "1", 1]], "settings.loras is [["),
    ("checkpoint", 5, "settings.checkpoint is 5, not a path (text)"),
    ("vae", 5, "settings.vae is 5, not a path (text) or null"),
])
def test_a_resume_names_each_damaged_weights_setting_and_what_it_accepts(tmp_path, key, value, words):
    """`batch --resume` of a folder whose batch.json settings hold `"dtype": [1]` or `"lora_int8": 5` said
    "not a path or name" (neither field is a path), and `"loras": "x"` said the batch "was made with --lora "x"" —
    as if it were an option to resume with. Each is now named with what the field accepts, as a damaged file."""
    from yue2_core.batch.driver import BatchOptions, _check_resume_settings
    from yue2_core.errors import RequestError
    out = tmp_path / "out"
    (out / "a").mkdir(parents=True)
    made = {"checkpoint": "/m/a.safetensors", "dtype": "bf16", "loras": [["/m/l.safetensors", 1.0, 0.5]],
            "vae": None, "lora_int8": "side"}
    (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": {"steps": 2, **made, key: value}}))
    options = BatchOptions("r.jsonl", str(out), steps=2, resume=True, run=dict(made))
    with pytest.raises(RequestError, match="the file was edited or damaged") as e:
        _check_resume_settings(out, options, {"a"})
    assert words in str(e.value) and "was made with" not in str(e.value), str(e.value)
    (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": {"steps": 2, **made}}))
    _check_resume_settings(out, options, {"a"})  # the record as a command line writes it passes


@pytest.mark.parametrize("tail", ["x" * 3000, "missing.abc"])
def test_a_long_abc_path_is_quoted_by_its_start_and_end(tmp_path, tail):
    """A batch row whose `abc_path` is 5,000 characters long quoted the whole path twice (as given and resolved) in
    its error: 10,000 characters for one row. Now each is cut to its start and end with the length."""
    from yue2_core.batch.requests import read_requests
    value = "deep/" * ((5000 - len(tail)) // 5) + tail
    req = tmp_path / "r.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "abc_path": value}) + "\n", "utf-8")
    items, bad = read_requests(req)
    assert not items and len(bad) == 1
    message = bad[0].message
    assert len(message) < 400, message
    assert message.startswith("line 1: abc_path 'deep/deep/") and f"({len(value):,} characters)" in message, message
    assert tail[-20:] in message  # the end: which file


@pytest.mark.parametrize("seed", ["-1", str(10 ** 23)])
def test_make_synthetic_takes_the_seeds_every_seed_option_takes(tmp_path, seed):
    """`make-synthetic --seed -1` (in ComfyUI -1 means "random") and `--seed 10**23` wrote a checkpoint: its
    weights hash the seed, so each gave one fixed file. Now refused, as generate's and render's --seed, with the
    range; nothing is written."""
    from robust_helpers import assert_cli_error, run_cli
    out = tmp_path / "s.safetensors"
    proc = run_cli("make-synthetic", "--output", out, "--seed", seed)
    assert_cli_error(proc, f"--seed must be an integer in [0, {2 ** 63 - 1}], got {seed}")
    assert not out.exists()


@pytest.mark.parametrize("text", ["\ufeff", "\ufeff \r\n\t", "\ufeff\ufeff\n"])
def test_a_score_of_only_a_byte_order_mark_is_empty(tmp_path, tokenizer, text):
    """An edited score.abc holding only a byte-order mark (an editor saving "nothing" as UTF-8 with BOM) counted as
    a score: `str.strip` keeps U+FEFF, so the song loaded with a BOM warning and the semantic stage got a score of
    one invisible character. A BOM with whitespace is now empty, refused as an empty score is — also as a request's
    score, a Score's text and in the editor's parse."""
    from yue2_core.abc.errors import AbcError
    from yue2_core.abc.parser import parse
    from yue2_core.errors import ScoreError
    from yue2_core.pipeline import Score
    from yue2_core.protocol import SongRequest
    song = save_song(make_song(), tmp_path / "song")
    (song / "score.abc").write_bytes(text.encode("utf-8"))
    with pytest.raises(ScoreError, match=r"the ABC score is empty: .*score.abc was edited to nothing"):
        load_song(song, tokenizer)
    with pytest.raises(ScoreError, match="the ABC score is empty or whitespace"):
        SongRequest(style="pop", lyrics="la", abc=text).validate()
    with pytest.raises(ScoreError, match="the ABC score is empty"):
        Score.from_text(text, tokenizer)
    with pytest.raises(AbcError, match="The score is empty; paste a score"):  # was "has no ABC header"
        parse(text)


def test_a_zero_padded_layer_index_is_that_layer_and_a_huge_one_is_named(tmp_path):
    """`layers.00` is read as layer 0: no layout pads its indices (state-dict, PEFT, Comfy, ai-toolkit and HOT
    `yue2.blk.N` names all print the plain integer), the module is named `model.layers.0…` everywhere after, and a
    file holding both `layers.0` and `layers.00` of one module is refused as two spellings of it — so it is left
    as it is. What was wrong: an index of 5,000 digits reached int(), whose "Exceeds the limit (4300 digits) … use
    sys.set_int_max_str_digits()" became the message, after the 5,000-character key quoted whole."""
    from safetensors.torch import load_file, save_file
    from yue2_core.errors import AdapterError
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    tensors = load_file(str(write_adapter("aitk", tmp_path / "a.safetensors", dims)))

    def saved(name, edit):
        path = tmp_path / name
        save_file({k: v.clone() for k, v in edit(tensors).items()}, str(path))
        return str(path)
    padded = saved("pad.safetensors", lambda t: {k.replace(".layers.0.", ".layers.00."): v for k, v in t.items()})
    assert read_adapter(padded, dims).modules("ar") == read_adapter(str(tmp_path / "a.safetensors"), dims).modules("ar")
    both = saved("both.safetensors", lambda t: {**t, **{k.replace(".layers.0.", ".layers.00."): v
                                                         for k, v in t.items() if ".layers.0." in k}})
    with pytest.raises(AdapterError, match="two spellings of one module"):
        read_adapter(both, dims)
    huge = saved("huge.safetensors", lambda t: {k.replace(".layers.0.", ".layers." + "1" * 5000 + "."): v
                                                for k, v in t.items()})
    with pytest.raises(AdapterError, match=r"layer index 1{12}… \(5,000 digits\) is no layer of any model") as e:
        read_adapter(huge, dims)
    assert len(str(e.value)) < 400 and "set_int_max_str_digits" not in str(e.value), str(e.value)
