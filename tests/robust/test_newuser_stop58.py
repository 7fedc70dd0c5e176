"""Found by the stop-58 new-user review (docs/bad_inputs.md §64), a musician at the command line: `--max-seconds 1:30`
was told to "write it in ASCII" (it was), a Regenerate cut "1:05" got no hint of the seconds it means, `render --seed`
with the song's own seed said "new seed: sampling new music tokens" and made the same song again, and the last lines
of a song made with the synthetic weights named an audio file to play without saying again that it is noise (nor did
`inspect` of that song)."""
from __future__ import annotations

import json

import pytest

from robust_helpers import cli_inprocess, run_cli
from synthetic_cache import tokenizers_built_once
from test_cli import main_inprocess


@pytest.fixture(scope="module", autouse=True)
def _one_tokenizer():
    with tokenizers_built_once():
        yield


@pytest.mark.parametrize("typed, means", [("1:30", "90"), ("0:45.5", "45.5"), ("2m", "120"), ("90s", "90"),
                                          ("1m30s", "90"), ("3 min", "180")])
@pytest.mark.parametrize("command", ["generate", "render", "batch"])
def test_max_seconds_written_as_a_time_says_the_seconds_it_means(tmp_path, capsys, command, typed, means):
    first = {"generate": ["--style", "x", "--lyrics", "y"], "render": ["song"], "batch": ["requests.jsonl"]}[command]
    rc, err = main_inprocess(capsys, command, *first, "--max-seconds", typed, "--output", tmp_path / "out")
    assert rc == 2 and (f"argument --max-seconds: {typed!r} is not a number of seconds: give the length in seconds, "
                        f"{means} for {typed}") in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, typed", [("--max-seconds", "1,5"), ("--max-seconds", "abc"),
                                           ("--max-seconds", "1:75"), ("--cfg-scale", "1,5")])
def test_other_non_numbers_say_what_a_number_is_written_like(tmp_path, capsys, option, typed):
    rc, err = main_inprocess(capsys, "generate", "--style", "x", "--lyrics", "y", option, typed,
                             "--output", tmp_path / "out")
    assert rc == 2 and f"{typed!r} is not a number: write a plain decimal with a point, e.g. 30, 2.5 or 1e-3 " \
        "(ASCII digits 0-9; no comma, unit, underscore or other scripts' digits)" in err, err


def test_a_cut_written_as_a_time_says_the_seconds_to_write():
    from yue2_core.edit import resolve_cut
    from yue2_core.errors import RequestError
    for typed, write in (("1:05", "65s"), ("2 min", "120s"), (" 0:07.5 ", "7.5s")):
        with pytest.raises(RequestError, match=f'; for {typed.strip()} write "{write}"$'):
            resolve_cut(typed, 5000)
    with pytest.raises(RequestError) as caught:  # no clock, no hint
        resolve_cut("bar 3x", 5000)
    assert "write" not in str(caught.value)
    assert resolve_cut("65s", 5000).token == resolve_cut(65, 5000).token == 1625  # what the hint says works


def test_render_with_the_songs_own_seed_says_it_is_the_same_song_and_synthetic_songs_say_noise_last(
        tmp_path, tiny_paths, monkeypatch, capsys):
    made = run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics", "la", "--cot", "off",
                   "--seed", "5", "--max-seconds", "0.4", "--steps", "1", "--device", "cpu", "--offline",
                   "--output", tmp_path / "song")
    assert made.returncode == 0, made.stderr[-2000:]
    synthetic = ("NOTE: made with SYNTHETIC random weights — this audio is noise-like, not music (README, \"Read this "
                 "first\")")
    assert made.stderr.rstrip().splitlines()[-3:] == [
        synthetic, f"song folder: {tmp_path / 'song'}", f"audio: {tmp_path / 'song' / 'audio.flac'}"], made.stderr
    same = cli_inprocess(monkeypatch, capsys, "render", tmp_path / "song", "--seed", "5", "--steps", "1", "--device",
                         "cpu", "--offline", "--output", tmp_path / "same")
    assert same.returncode == 0, same.stderr[-2000:]
    assert ("note: --seed 5 is this song's own seed: sampling its music tokens again gives the song's own tokens "
            "where it was made (the same device and weights); another --seed gives new music") in same.stderr
    assert "new seed: sampling" not in same.stderr
    assert (tmp_path / "same" / "semantic.npy").read_bytes() == (tmp_path / "song" / "semantic.npy").read_bytes()
    other = cli_inprocess(monkeypatch, capsys, "render", tmp_path / "song", "--seed", "6", "--steps", "1", "--device",
                          "cpu", "--offline", "--output", tmp_path / "other")
    assert other.returncode == 0 and "new seed: sampling new music tokens" in other.stderr, other.stderr[-2000:]
    assert other.stderr.rstrip().splitlines()[-3] == synthetic
    for folder in ("song", "other"):  # a synthetic song found later: inspect says it is noise (it said nothing)
        seen = cli_inprocess(monkeypatch, capsys, "inspect", tmp_path / folder)
        report = json.loads(seen.stdout)
        assert seen.returncode == 0 and report["synthetic_weights"] is True, seen.stderr[-2000:]
        assert report["summary"].endswith("; made with SYNTHETIC random weights: its audio is noise-like, not music")
        assert seen.stderr.strip() == report["summary"]


def _instrumental(lead_sheet: str) -> str:
    from yue2_core.abc.tools import silence_vocal
    return silence_vocal(lead_sheet)


def test_empty_lyrics_under_a_silenced_score_get_no_not_an_instrumental_note(tmp_path, tiny_paths, monkeypatch,
                                                                               capsys):
    """The note told a user who had done what it advises (`--lyrics "" --abc-file` of a score whose Vocal voice is
    rests) to use an instrumental score; it stays for a score that sings, and for no score."""
    from robust_helpers import REPO
    from yue2_core.protocol import SongRequest
    sung = (REPO / "examples" / "text2music_lead_sheet.abc").read_text("utf-8")
    silent = _instrumental(sung)
    (tmp_path / "instrumental.abc").write_text(silent, "utf-8")
    note = "lyrics are empty: this is NOT an instrumental switch"
    assert not any(note in w for w in SongRequest("rock", "", abc=silent).input_warnings())
    assert not any(note in w for w in SongRequest("rock", "").input_warnings(silent))  # the Composer's score input
    assert any(note in w for w in SongRequest("rock", "", abc=sung).input_warnings())
    assert any(note in w for w in SongRequest("rock", "").input_warnings())
    assert any(note in w for w in SongRequest("rock", "").input_warnings("X:1\nnot a score"))
    made = cli_inprocess(monkeypatch, capsys, "generate", "--checkpoint", tiny_paths["bf16"], "--style", "rock",
                         "--lyrics", "", "--abc-file", tmp_path / "instrumental.abc", "--max-seconds", "0.2",
                         "--steps", "1", "--device", "cpu", "--offline", "--output", tmp_path / "song")
    assert made.returncode == 0, made.stderr[-2000:]
    assert note not in made.stderr, made.stderr
    warnings = json.loads((tmp_path / "song" / "result.json").read_text())["warnings"]
    assert not any(note in w for w in warnings), warnings
