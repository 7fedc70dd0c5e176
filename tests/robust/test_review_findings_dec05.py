"""The findings of the 2026-12-05 reviews (docs/bad_inputs.md §14): a new user on a fresh clone, and a tester with
hostile input — numbers past Python's digit cap in JSON, absurd nesting, a LoKr pair that multiplies to 40 GB, an
output name too long for the save's hidden sibling, symbolic-link loops, a malformed HF_ENDPOINT, and the messages
that left a user without a next step."""
from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from robust_helpers import assert_cli_error, make_song, run_cli
from yue2_core.errors import (AdapterError, AdapterGeometryError, ArtifactError, CheckpointError, RequestError,
                              TokenizerError)

HUGE = "1" + "0" * 5000  # past Python's 4,300-digit cap for int(str)


def _safetensors_with_header(path: Path, header_text: str) -> Path:
    raw = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    return path


# ---------------------------------------------------------------------------------------------- hostile numbers

def test_a_huge_integer_in_a_safetensors_header_is_not_a_checkpoint_and_is_skipped_in_a_folder(tmp_path):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.locate import yue2_files
    bad = _safetensors_with_header(tmp_path / "bad.safetensors",
                                   '{"a":{"dtype":"F32","shape":[' + HUGE + '],"data_offsets":[0,4]}}')
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        inspect_checkpoint(str(bad))
    assert yue2_files(tmp_path) == []  # the folder scan skips it instead of crashing


@pytest.mark.parametrize("text, words", [('{"model": {"x": ' + HUGE + '}}', "a number too long to read"),
                                         ("[" * 100000 + "]" * 100000, "not valid JSON")],
                         ids=["huge-integer", "deep-nesting"])
def test_an_embedded_tokenizer_that_is_not_json_is_named(text, words):
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    with pytest.raises(TokenizerError, match=words):
        YuE2Tokenizer(text)


def test_a_huge_integer_in_an_adapter_or_vae_config_is_named(tmp_path):
    from yue2_core.weights.lora.layouts_io import read_sidecar
    from yue2_core.weights.vae_files import open_vae
    cfg = tmp_path / "adapter_config.json"
    cfg.write_text('{"r": 4, "lora_alpha": ' + HUGE + "}")
    with pytest.raises(AdapterError, match="not a readable JSON file"):
        read_sidecar(str(cfg))
    vae = tmp_path / "vae"
    vae.mkdir()
    (vae / "config.json").write_text('{"model_type": "yue2_vae", "x": ' + HUGE + "}")
    with pytest.raises(CheckpointError, match="config.json holds a number too long to read"):  # stop 46
        open_vae(str(vae))


def test_a_lokr_pair_that_cannot_fit_the_module_is_refused_before_its_product(tmp_path):
    """100,000 × 1 by 1 × 100,000 (800 kB of file) multiplied to 40 GB before its shape was checked."""
    from yue2_core.layers import ModelDims
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.synthetic import get_profile
    p = get_profile("tiny")
    tiny = ModelDims(hidden=p.hidden, layers=p.layers, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                     ffn=p.ffn, vocab=p.vocab)
    o = "diffusion_model.model.layers.0.self_attn.o_proj"
    path = tmp_path / "lokr.safetensors"
    save_file({f"{o}.lokr_w1_a": torch.randn(100000, 1), f"{o}.lokr_w1_b": torch.randn(1, 100000),
               f"{o}.lokr_w2": torch.randn(1, 1)}, str(path))
    t0 = time.perf_counter()
    with pytest.raises(AdapterGeometryError, match="does not divide the module"):
        read_adapter(str(path), tiny)
    assert time.perf_counter() - t0 < 5


def test_the_editor_refuses_a_huge_integer_max_seconds():
    from yue2_core.abc.service import analyze
    out = analyze({"abc": "X:1\n", "max_seconds": int(HUGE[:400])})
    assert "'max_seconds' must be a positive number" in out["error"] and "internal error" not in out["error"]


def test_a_gemv_table_file_of_gigabytes_is_not_read(tmp_path, monkeypatch):
    from yue2_core.fast import gemv
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(64 * 2 ** 20)  # sparse: no disk used
    gemv._tables_from.cache_clear()
    with pytest.raises(RequestError, match="a table is a few kB"):
        gemv._tables_from(str(big))


# ---------------------------------------------------------------------------------------------- paths and folders

def test_an_output_name_too_long_for_the_save_is_refused_before_loading(tmp_path):
    """238–255-byte names passed the checks; the song was computed and the save's hidden sibling
    `.NAME.XXXXXXXX.partial` (18 bytes more) failed. Nothing is created."""
    out = tmp_path / ("x" * 240)
    proc = run_cli("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", "/nonexistent.safetensors",
                   "--output", out)
    assert_cli_error(proc, "bytes: the save first writes it as a hidden sibling")
    assert "at most 237 bytes" in proc.stderr and "checkpoint" not in proc.stderr.split("error:")[1][:60]
    assert sorted(os.listdir(tmp_path)) == []


def test_a_refused_run_leaves_no_new_folders(tmp_path):
    """The output claim made the missing parents; a run refused after it (a bad seed) left them behind."""
    proc = run_cli("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", "/nonexistent.safetensors",
                   "--seed", "-1", "--output", tmp_path / "q1" / "q2" / "song")
    assert_cli_error(proc, "seed")
    assert not (tmp_path / "q1").exists()
    (tmp_path / "keep").mkdir()  # a parent that existed before stays
    proc = run_cli("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", "/nonexistent.safetensors",
                   "--seed", "-1", "--output", tmp_path / "keep" / "new" / "song")
    assert_cli_error(proc, "seed")
    assert (tmp_path / "keep").is_dir() and os.listdir(tmp_path / "keep") == []


def test_generate_into_a_batch_folder_is_refused(tmp_path):
    """A running batch lost the song whose folder another `generate --output B/<id>` had taken."""
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "batch.json").write_text("{}")
    proc = run_cli("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", "/nonexistent.safetensors",
                   "--output", tmp_path / "B" / "b")
    assert_cli_error(proc, "is inside a batch output folder")
    assert sorted(os.listdir(tmp_path / "B")) == ["batch.json"]


def test_a_batch_score_path_that_loops_fails_its_row(tmp_path):
    from yue2_core.batch.requests import read_score_file
    os.symlink("loop", tmp_path / "loop.abc")
    os.symlink("loop.abc", tmp_path / "loop")
    with pytest.raises(RequestError, match="symbolic-link loop"):
        read_score_file("loop.abc", tmp_path)


def test_a_malformed_hf_endpoint_is_named(monkeypatch):
    from yue2_core.weights import locate
    for var in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    for value in ("https://huggingface.co:99999", "http://[::1", "https://hf.co:abc"):
        monkeypatch.setenv("HF_ENDPOINT", value)
        why = locate._hub_unreachable(timeout=1)
        assert why is not None and "HF_ENDPOINT" in why and value in why, why


def test_a_vae_link_to_nothing_and_a_song_folder_as_checkpoint_are_named(tmp_path):
    from yue2_core.weights.vae_files import open_vae
    from yue2_core.weights.vendor import read_config
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    with pytest.raises(CheckpointError, match="symbolic link to nothing"):
        open_vae(str(tmp_path / "a"))
    song = tmp_path / "song"
    song.mkdir()
    (song / "config.json").write_text('{"protocol": "yue2-native-v1"}')
    (song / "result.json").write_text("{}")
    with pytest.raises(CheckpointError, match="is a song folder .* render"):
        read_config(song)


@pytest.mark.parametrize("strength", ["٣", "1_0", " 1"])
def test_lora_strengths_are_plain_ascii_numbers(tmp_path, strength):
    import argparse
    from yue2_core.__main__ import parse_lora
    f = tmp_path / "a.safetensors"
    f.write_bytes(b"")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a number"):
        parse_lora(f"{f}:{strength}")
    assert parse_lora(f"{f}:0.5:-1e-1")[1:] == (0.5, -0.1)


# ---------------------------------------------------------------------------------------------- said, not silent

def test_batch_says_when_a_rows_min_tokens_is_lowered(tmp_path):
    from yue2_core.batch.requests import budget_notes, parse_row
    row = {"id": "a", "style": "pop", "lyrics": "x", "semantic_sampling": {"min_tokens": 300},
           "abc_sampling": {"min_tokens": 100}}
    item = parse_row(row, 1, tmp_path, max_seconds=1, max_abc_tokens=8)
    notes = budget_notes(item)
    assert any("semantic_sampling.min_tokens 300" in n and "--max-seconds" in n for n in notes), notes
    assert any("abc_sampling.min_tokens 100" in n and "lowered to 8" in n for n in notes), notes
    assert budget_notes(parse_row(row, 1, tmp_path)) == []


def test_a_literal_backslash_n_in_lyrics_is_said():
    from yue2_core.protocol import SongRequest
    notes = SongRequest("pop", r"[verse]\nhello\n[chorus]\nla").input_warnings()
    assert any("two characters \\n" in n and "--lyrics-file" in n for n in notes), notes
    assert not any("\\n" in n for n in SongRequest("pop", "[verse]\nhello").input_warnings())


def test_crlf_in_a_score_is_said_once():
    from yue2_core.protocol import score_notes
    notes = score_notes("X:1\r\nL:1/16\r\nM:4/4\r\nK:C\r\n")
    assert sum("CR" in n for n in notes) == 1, notes


def test_the_same_lora_twice_is_said(tmp_path):
    from types import SimpleNamespace
    from yue2_core.weights.lora.apply import Applied, repeat_notes
    f = tmp_path / "a.safetensors"
    f.write_bytes(b"x")
    ad = SimpleNamespace(path=str(f), files=[str(f)], scale_rule="1 (no alpha)", scales=[1.0])
    notes = repeat_notes([Applied(ad, 1.0, 1.0), Applied(ad, 0.5, 0.0)])
    assert notes == [f"the LoRA {f} is given 2 times: its strengths add up (AR ×1.5, NAR ×1)"], notes
    assert repeat_notes([Applied(ad, 1.0, 1.0)]) == []


def test_a_changed_request_or_missing_score_says_what_to_do(tmp_path):
    from yue2_core.artifacts import load_song, save_song
    root = save_song(make_song(), tmp_path / "s")
    req = json.loads((root / "request.json").read_text())
    req["style"] = "rock"
    (root / "request.json").write_text(json.dumps(req))
    with pytest.raises(ArtifactError, match="generate --abc-file .*score.abc"):
        load_song(root)
    root2 = save_song(make_song(), tmp_path / "t")
    (root2 / "score.abc").unlink()
    with pytest.raises(ArtifactError, match="plan.json"):
        load_song(root2)


def test_render_names_the_recorded_checkpoint_that_is_gone(tmp_path):
    from yue2_core.artifacts import save_song
    song = make_song()
    gone = tmp_path / "moved.safetensors"
    song = replace(song, settings={**song.settings, "checkpoint": {"path": str(gone), "format": "bf16"}})
    root = save_song(song, tmp_path / "s")
    proc = run_cli("render", root, "--output", tmp_path / "r", "--offline", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"({gone}) is gone" in proc.stderr and "pass --checkpoint with that model's file" in proc.stderr, \
        proc.stderr[-2000:]
