"""Inputs found by the adversarial review (each was a hang, a raw exception or a silent change before the fix)."""
import json
import time

import pytest
import torch

from robust_helpers import assert_cli_error, cli_inprocess, copy, make_song, patch_tensor, run_cli, signal_when
from yue2_core.errors import ArtifactError, BudgetError, NumericalError, RequestError


def test_engraving_refuses_huge_bars_fast():
    from yue2_core.abc import service
    head = "X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=120\nV: Vocal clef=treble name=\"Vocal Melody\" snm=\"Vocal\"\n" \
           "V: Ins clef=treble name=\"Ins Melody\" snm=\"Inst.\"\nK:C\n"
    text = head + "V: Vocal\n" + "C" * 9000 + "|\nV: Ins\nC32|\n"
    t0 = time.perf_counter()
    out = service.analyze({"abc": text, "engrave": True})
    assert time.perf_counter() - t0 < 10
    assert out["svg"] is None and "at most 48 per bar" in out["svg_error"]


def test_long_cut_text_refused_fast():
    from yue2_core.edit import resolve_cut
    t0 = time.perf_counter()
    with pytest.raises(RequestError, match="at most 64 characters"):
        resolve_cut("9" * 30000 + "x", 100)
    with pytest.raises(RequestError, match="at most 64 characters"):
        resolve_cut("token " + "9" * 5000, 100)
    assert time.perf_counter() - t0 < 1


def test_nan_ar_weight_raises_numerical_error(tiny_paths, tmp_path):
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import SongRequest
    path = copy(tiny_paths["bf16"], tmp_path / "nan.safetensors")
    patch_tensor(path, "text_encoders.model.layers.0.input_layernorm.weight", lambda t: t * float("nan"))
    engine = YuE2Engine.load(path, device="cpu")
    with pytest.raises(NumericalError, match="NaN logits"):
        engine.generate(SongRequest("pop", "la", cot="off"), Budgets(max_seconds=1))


def test_text_over_the_cap_refused():
    from yue2_core.protocol import SongRequest
    with pytest.raises(BudgetError, match="at most 200,000 characters"):
        SongRequest("x" * 200_001, "la").validate()
    with pytest.raises(BudgetError, match="at most 200,000 characters"):
        SongRequest("s", "l", abc="X" * 200_001).validate()


def test_tampered_request_json_refused(tmp_path):
    from yue2_core.artifacts import load_song, save_song
    root = save_song(make_song(), tmp_path / "song")
    req = json.loads((root / "request.json").read_text())
    req["style"] = ["x"]
    data = json.dumps(req).encode()
    (root / "request.json").write_bytes(data)
    res = json.loads((root / "result.json").read_text())
    import hashlib
    res["artifacts"]["request.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (root / "result.json").write_text(json.dumps(res))
    with pytest.raises(ArtifactError, match="request.json is not a valid request: style must be text"):
        load_song(root)


def test_malformed_checkpoint_entry_refused():
    from yue2_core.edit import CheckpointMismatch, check_checkpoint
    with pytest.raises(CheckpointMismatch, match="malformed 'checkpoint' entry"):
        check_checkpoint("/etc/passwd")


def test_cli_special_files_and_devices(tmp_path, monkeypatch, capsys):
    """The first input as a subprocess, the others in this process (`cli_inprocess`)."""
    def cli(*args):
        return cli_inprocess(monkeypatch, capsys, *args)
    assert_cli_error(run_cli("generate", "--lyrics-file", "/dev/zero", "--output", tmp_path / "a", "--offline"),
                     "not a regular file")
    assert_cli_error(cli("generate", "--device", "bogus", "--output", tmp_path / "b", "--offline"),
                     "is not a device name")
    if not torch.cuda.is_available():
        assert_cli_error(cli("generate", "--device", "cuda", "--output", tmp_path / "c", "--offline"),
                         "no CUDA GPU is available")
    assert_cli_error(cli("generate", "--output", "/dev/null/x", "--offline"), "is not a writable folder")
    assert_cli_error(cli("make-synthetic", "--output", tmp_path), "is a folder")


def test_cli_review_round_3(tmp_path, tiny_paths, monkeypatch, capsys):
    """Second adversarial review: options that one of two sources silently won, abbreviations, a numbered CPU, an
    output name the file system refuses, a symbolic link as output, make-synthetic over an existing file. The first
    input and the make-synthetic run as subprocesses, the others in this process (`cli_inprocess`)."""
    def cli(*args):
        return cli_inprocess(monkeypatch, capsys, *args)
    ck = tiny_paths["bf16"]
    assert_cli_error(run_cli("generate", "--style", "pop", "--style-file", ck, "--output", tmp_path / "a"),
                     "not allowed with argument --style")
    assert_cli_error(cli("generate", "--lyrics", "la", "--lyrics-file", ck, "--output", tmp_path / "a"),
                     "not allowed with argument --lyrics")
    assert_cli_error(cli("generate", "--check", ck, "--output", tmp_path / "a"), "unrecognized arguments")
    assert_cli_error(cli("generate", "--device", "cpu:1", "--output", tmp_path / "a"), "no numbered devices")
    # cpu:0 too (before: accepted here, then the safetensors reader refused it and the checkpoint was blamed)
    assert_cli_error(cli("generate", "--device", "cpu:0", "--output", tmp_path / "a"), "no numbered devices")
    assert_cli_error(cli("generate", "--output", tmp_path / ("a" * 300)), "File name too long")
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    assert_cli_error(cli("generate", "--output", tmp_path / "link"), "symbolic link")
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    assert_cli_error(cli("make-synthetic", "--output", keep), "unless --force")
    assert keep.read_text() == "mine"
    assert run_cli("make-synthetic", "--output", keep, "--force").returncode == 0
    assert keep.stat().st_size > 1000


def test_cli_sigterm_cleans_up_like_ctrl_c(tmp_path, tiny_paths):
    """SIGTERM (kill, timeout, a service stop) during a song: exit 130 with 'cancelled', no song folder and no
    hidden partial folder."""
    import os
    import signal
    import subprocess
    import sys

    from robust_helpers import REPO
    out = tmp_path / "songs" / "s"
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "yue2_core", "generate", "--checkpoint", tiny_paths["bf16"],
                             "--style", "pop", "--lyrics", "la la", "--cot", "off", "--max-seconds", "60",
                             "--device", "cpu", "--output", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    err = signal_when(proc, "[semantic]", signal.SIGTERM)
    assert proc.returncode == 130, err[-2000:]
    assert "cancelled" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("songs/.*"))


def _rewrite(root, name, data: bytes):
    """Replace a song file and record its new hash and size in result.json (a consistent tampering)."""
    import hashlib
    (root / name).write_bytes(data)
    res = json.loads((root / "result.json").read_text())
    res["artifacts"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (root / "result.json").write_text(json.dumps(res))


@pytest.mark.parametrize("key,value", [("render_seed", "abc"), ("render_seed", None), ("render_seed", 2 ** 70),
                                       ("render_seed", 1e30), ("ode_steps", 10 ** 8), ("ode_steps", "32")])
def test_tampered_config_values_refused_before_work(tmp_path, key, value):
    """Review finding: these gave int()/overflow tracebacks or hung (ode_steps 10^8 built a 10^8-element list)."""
    from yue2_core.artifacts import save_song
    from yue2_core.edit import as_parent
    root = save_song(make_song(), tmp_path / "song")
    config = json.loads((root / "config.json").read_text())
    config[key] = value
    _rewrite(root, "config.json", json.dumps(config).encode())
    t0 = time.perf_counter()
    with pytest.raises(ArtifactError, match=f"config.json {key} must be an integer"):
        as_parent(root)
    assert time.perf_counter() - t0 < 5


def test_song_files_with_lying_sizes_refused(tmp_path):
    """A .npy whose header claims 10^12 entries (hash-consistent) and a file larger than result.json says: clear
    ArtifactErrors, no allocation of the claimed size and no whole-file read."""
    import io

    import numpy as np

    from yue2_core.artifacts import load_song, save_song
    root = save_song(make_song(), tmp_path / "song")
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i4", "fortran_order": False, "shape": (10 ** 12,)})
    _rewrite(root, "semantic.npy", buf.getvalue() + b"\0" * 64)
    with pytest.raises(ArtifactError, match=r"semantic.npy is not a readable .npy array \(its header describes"):
        load_song(root)
    root = save_song(make_song(), tmp_path / "song2")
    data = (root / "audio.flac").read_bytes()  # cut short: other samples (bytes appended after the last frame
    (root / "audio.flac").write_bytes(data[:-100])  # decode to the saved samples: a "tagged" file, accepted)
    with pytest.raises(ArtifactError, match=r"audio.flac is .* bytes but result.json lists"):
        load_song(root)
