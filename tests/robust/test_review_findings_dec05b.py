"""The findings of the second 2026-12-05 reviews (docs/bad_inputs.md §15): a new user on a fresh clone, and a tester
with hostile input — ODE step counts the engine took unchecked until after the AR phases, a re-render of a spliced
song that differed without a word, a missing music budget, an unusable $COMFYUI_PATH, other scripts' digits in a
cut, a pretty-printed request file."""
from __future__ import annotations

import json
import shutil

import pytest

from robust_helpers import assert_cli_error, run_cli
from yue2_core.errors import ArtifactError, CheckpointError, RequestError

TINY_BUDGET = dict(max_seconds=0.2, max_abc_tokens=4)


def _main(capsys, *args) -> tuple[int, str]:
    from yue2_core.__main__ import main
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exit_:
        rc = exit_.code
    return rc, capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ ODE steps, seeds

@pytest.mark.parametrize("steps", [0, -1, 1001, 10 ** 9, 2.5, True, "32"])
def test_engine_refuses_a_bad_step_count_before_any_model_work(tiny_engine, steps):
    """steps=0 was a ZeroDivisionError, 10⁹ a hang building the timestep list, 1001 a song computed and then
    refused by the save — all after the lead sheet and the music tokens were sampled."""
    from yue2_core import candidates as cand
    from yue2_core.pipeline import Budgets
    from yue2_core.protocol import SongRequest
    calls = []
    req = SongRequest(style="pop", lyrics="la", seed=5)
    with pytest.raises(RequestError, match=r"steps .* must be an integer in \[1, 1000\]"):
        tiny_engine.generate(req, Budgets(**TINY_BUDGET), steps=steps, progress=lambda *a: calls.append(a))
    with pytest.raises(RequestError, match=r"steps .* must be an integer in \[1, 1000\]"):
        cand.candidates(tiny_engine, req, 2, Budgets(**TINY_BUDGET), steps=steps,
                        progress=lambda *a: calls.append(a))
    assert calls == []  # nothing ran


def test_candidates_refuse_a_bare_integer_as_seeds(tiny_engine):
    from yue2_core import candidates as cand
    from yue2_core.protocol import SongRequest
    with pytest.raises(RequestError, match="seeds must be a list of 2 integers"):
        cand.candidates(tiny_engine, SongRequest(style="pop", lyrics="la", seed=5), 2, seeds=5)


# ----------------------------------------------------------------------------------------------- render of a song

@pytest.fixture(scope="module")
def songs(tiny_engine, tmp_path_factory):
    """A 1 s song and its regeneration from 0.5 s, saved."""
    from yue2_core.artifacts import save_song
    from yue2_core.edit import regenerate
    from yue2_core.pipeline import Budgets
    from yue2_core.protocol import SongRequest
    root = tmp_path_factory.mktemp("edited")
    song = tiny_engine.generate(SongRequest(style="pop", lyrics="la la", seed=5, cot="off"),
                                Budgets(max_seconds=1, max_abc_tokens=4), steps=1)
    base = save_song(song, root / "base")
    regen, lineage = regenerate(tiny_engine, str(base), 0.5, seed=3)
    return {"root": root, "base": base, "regen": save_song(regen, root / "regen", lineage=lineage)}


def test_render_of_a_regenerated_song_says_the_audio_before_the_cut_will_differ(songs, capsys):
    rc, err = _main(capsys, "render", songs["regen"], "--device", "cpu", "--offline", "--output",
                    songs["root"] / "regen_again")
    assert rc == 0, err
    assert f"warning: this song was made by regenerate of {songs['base']}" in err, err
    assert "up to 0.48 s and crossfades" in err and "the audio before the cut will differ" in err, err  # 12 frames
    rc, err = _main(capsys, "render", songs["base"], "--device", "cpu", "--offline", "--output",
                    songs["root"] / "base_again")
    assert rc == 0 and "was made by" not in err, err


def _resealed(src, dst, edit):
    from yue2_core.artifacts import seal_result
    shutil.copytree(src, dst)
    result = json.loads((dst / "result.json").read_text())
    edit(result["semantic"])
    (dst / "result.json").write_text(json.dumps(seal_result(result)))
    return dst


def test_a_missing_music_budget_is_said_and_a_malformed_one_refused(songs, capsys):
    """render --seed of a song whose result.json records no semantic.sampling fell back to 9,000 tokens without a
    word; a sampling of "x" was taken as missing."""
    from yue2_core.artifacts import load_song
    none = _resealed(songs["base"], songs["root"] / "no_budget", lambda s: s.pop("sampling"))
    bad = _resealed(songs["base"], songs["root"] / "bad_budget", lambda s: s.__setitem__("sampling", "x"))
    huge = _resealed(songs["base"], songs["root"] / "huge_budget",
                     lambda s: s["sampling"].__setitem__("max_tokens", 10 ** 9))
    for folder in (bad, huge):
        with pytest.raises(ArtifactError, match="semantic.sampling must be an object with max_tokens"):
            load_song(folder)
    rc, err = _main(capsys, "render", none, "--seed", "9", "--max-seconds", "0.2", "--device", "cpu", "--offline",
                    "--output", songs["root"] / "none_given")
    assert rc == 0 and "records no music budget" not in err, err  # --max-seconds given: nothing to say
    import yue2_core.__main__ as cli
    assert cli._render_seconds(None, load_song(none).tokens.sampling) is None  # the case the note is printed for


def test_render_prints_the_note_when_no_budget_is_recorded(songs, capsys, monkeypatch):
    """The note itself (the sampling is cut short: a 9,000-token budget would take minutes on a CPU)."""
    none = songs["root"] / "no_budget_2"
    _resealed(songs["base"], none, lambda s: s.pop("sampling"))

    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr("yue2_core.pipeline.semantic", stop)
    rc, err = _main(capsys, "render", none, "--seed", "9", "--device", "cpu", "--offline", "--output",
                    songs["root"] / "none_note")
    assert rc == 130 and "note: the song records no music budget" in err and "9,000 tokens (360 s)" in err, err


# ----------------------------------------------------------------------------------------- environment and paths

def test_an_unusable_comfyui_path_is_named(monkeypatch, tmp_path):
    from yue2_core.weights.locate import comfy_checkpoint_dirs
    monkeypatch.setenv("COMFYUI_PATH", str(tmp_path / ("a" * 300)))
    with pytest.raises(CheckpointError, match=r"COMFYUI_PATH=.*\(\d+ characters\) cannot be searched .*File name "
                                              r"too long.*fix or unset it"):
        comfy_checkpoint_dirs()
    monkeypatch.setenv("COMFYUI_PATH", str(tmp_path / "missing"))
    assert all("missing" not in str(d) for d in comfy_checkpoint_dirs())  # absent: simply not searched


def test_make_synthetic_into_a_name_too_long(tmp_path):
    proc = run_cli("make-synthetic", "--output", tmp_path / ("a" * 300) / "x.safetensors", timeout=120)
    assert_cli_error(proc, "cannot use this path (File name too long)")


@pytest.mark.parametrize("cut", ["token ١٢", "٣s", "bar ３", "t\u00a012"])
def test_a_cut_takes_ascii_digits_only(cut):
    from yue2_core.edit import _parse_cut
    with pytest.raises(RequestError, match="cannot read the cut"):
        _parse_cut(cut)


# ------------------------------------------------------------------------------------------------- request files

@pytest.mark.parametrize("doc,phrase", [
    ([{"id": "a", "style": "pop", "lyrics": "la"}, {"id": "b", "style": "pop", "lyrics": "la"}],
     "one JSON list spread over"),
    ({"id": "a", "style": "pop", "lyrics": "la"}, "one JSON object spread over")])
def test_a_pretty_printed_request_file_is_one_message_before_any_folder(tmp_path, tiny_paths, doc, phrase):
    req = tmp_path / "req.json"
    req.write_text(json.dumps(doc, indent=2))
    out = tmp_path / "out"
    proc = run_cli("batch", req, "--checkpoint", tiny_paths["bf16"], "--offline", "--device", "cpu",
                   "--output", out, timeout=120)
    assert_cli_error(proc, phrase)
    assert "not JSONL" in proc.stderr and "line 2 is not JSON" not in proc.stderr and not out.exists()
