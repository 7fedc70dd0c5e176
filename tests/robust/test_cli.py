"""Catalogue rows: the command line (docs/bad_inputs.md §5). `python -m yue2_core …` runs as a subprocess; every bad
input ends with exit status 2 and one `error: …` line on stderr, never a Python traceback, and — where it matters —
before any checkpoint is read (the checkpoint given is deliberately missing)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from robust_helpers import REPO, assert_cli_error, cli_inprocess, copy, make_song, run_cli, snapshot
from synthetic_cache import tokenizers_built_once
from yue2_core.artifacts import save_song

NO_CKPT = "/nonexistent/yue2.safetensors"  # reaching the checkpoint would print "checkpoint not found"


@pytest.fixture(scope="module", autouse=True)
def _one_tokenizer():
    """The in-process loads of the tiny model parse its embedded tokenizer once (`tokenizers_built_once`)."""
    with tokenizers_built_once():
        yield


def gen(tmp_path, *extra, output=None):
    return run_cli("generate", "--style", "pop", "--lyrics", "la la", "--offline", "--checkpoint", NO_CKPT,
                   "--output", output or tmp_path / "out", *extra)


def test_cli_output_exists_not_empty(tmp_path):
    out = tmp_path / "song"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = gen(tmp_path, output=out)
    assert_cli_error(proc, f"output directory {out} exists and is not empty")
    assert (out / "keep.txt").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    old = save_song(make_song(), tmp_path / "old")
    before = snapshot(old)
    proc = run_cli("render", old, "--offline", "--checkpoint", NO_CKPT, "--output", old)
    assert_cli_error(proc, "exists and is not empty")
    assert snapshot(old) == before


def main_inprocess(capsys, *args) -> tuple[int, str]:
    """`yue2_core.__main__.main(args)` in this process: (exit status, stderr). Used for the variants of a row whose
    representative input already runs as a subprocess (saves a torch import per case)."""
    from yue2_core.__main__ import main
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exit_:  # argparse
        rc = exit_.code
    return rc, capsys.readouterr().err


BAD_NUMBERS = [
    (("--seed", str(2 ** 63)), "seed must be an integer in [0, 2^63−1]"),
    (("--max-seconds", "-3"), "max duration must be > 0 seconds"),
    (("--max-seconds", "nan"), "max duration must be a finite number"),
    (("--max-seconds", "1e400"), "max duration must be a finite number"),
    (("--max-abc-tokens", "0"), "max ABC tokens must be a positive integer"),
    (("--cfg-scale", "25"), "cfg_scale must be a finite number in [0, 20]"),
    (("--steps", "0"), "--steps must be between 1 and 1000"),
]


def test_cli_bad_numbers_refused_before_loading(tmp_path, capsys):
    assert_cli_error(gen(tmp_path, "--seed", "-1"), "seed must be an integer in [0, 2^63−1]")
    assert_cli_error(gen(tmp_path, "--max-seconds", "0"), "max duration must be > 0 seconds")
    for args, phrase in BAD_NUMBERS:
        rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics", "x", "--offline", "--checkpoint",
                                 NO_CKPT, "--output", tmp_path / "out", *args)
        assert rc == 2 and phrase in err and "checkpoint not found" not in err, (args, err)
    assert not (tmp_path / "out").exists()


def test_cli_bad_request_text_refused(tmp_path, capsys):
    empty = tmp_path / "empty.abc"
    empty.write_text("  \n")
    song = tmp_path / "song.abc"
    song.write_text((Path(__file__).resolve().parents[1] / "abc" / "corpus" / "song.abc").read_text())
    assert_cli_error(gen(tmp_path, "--abc-file", empty), "the ABC score is empty or whitespace")
    assert_cli_error(gen(tmp_path, output=tmp_path / "CON"), "reserved device name on Windows")
    proc = gen(tmp_path, "--cot", "maybe")  # argparse: usage + error, exit 2, no traceback
    assert proc.returncode == 2 and "invalid choice: 'maybe'" in proc.stderr and "Traceback" not in proc.stderr
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9\n")
    base = ("generate", "--style", "pop", "--offline", "--checkpoint", NO_CKPT)
    for args, phrase in [(("--lyrics", "x", "--abc-file", song, "--cot", "off"), "off mode has no score"),
                         (("--lyrics-file", tmp_path / "missing.txt"), "cannot read the lyrics file"),
                         (("--lyrics-file", bad), "cannot read the lyrics file"),
                         (("--lyrics", "x"), f"checkpoint not found: {NO_CKPT}")]:  # a good request gets this far
        rc, err = main_inprocess(capsys, *base, *args, "--output", tmp_path / "out")
        assert rc == 2 and phrase in err, (args, err)


def test_cli_inspect_bad_checkpoints(micro_paths, tmp_path, monkeypatch, capsys):
    """The first input as a subprocess, the others in this process (`cli_inprocess`)."""
    def cli(*args):
        return cli_inprocess(monkeypatch, capsys, *args)
    text = tmp_path / "notes.safetensors"
    text.write_text("hello" * 100)
    assert_cli_error(run_cli("inspect", text), "not a safetensors file")
    blob = Path(micro_paths["int8"]).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(blob[: len(blob) // 3])
    assert_cli_error(cli("inspect", cut), "the file is truncated")
    from safetensors.torch import save_file
    import torch
    other = tmp_path / "sdxl.safetensors"
    save_file({"conditioner.embedders.0.weight": torch.zeros(2)}, str(other))
    assert_cli_error(cli("inspect", other), "is not a YuE2 all-in-one checkpoint")
    from robust_helpers import patch_tensor
    from yue2_core.weights.checkpoint import TOKENIZER_KEY
    tok = copy(micro_paths["int8"], tmp_path / "tok.safetensors")
    patch_tensor(tok, TOKENIZER_KEY, lambda t: torch.full_like(t, 0xFF))
    assert_cli_error(cli("inspect", tok), "the embedded tokenizer blob is not UTF-8")
    proc = cli("inspect", tmp_path / "missing.safetensors")
    assert_cli_error(proc, "checkpoint not found")
    assert "--checkpoint" not in proc.stderr and "inspect takes the path of" in proc.stderr  # no option it lacks
    (tmp_path / "empty folder").mkdir()  # a folder can be a song too: the refusal says why it is not one either
    assert_cli_error(cli("inspect", tmp_path / "empty folder"), "as a song folder: it holds no result.json")


def test_cli_double_extension_inspects(micro_paths, tmp_path):
    path = copy(micro_paths["int8"], tmp_path / "yue2_3b_int8_convrot.safetensors.safetensors")
    proc = run_cli("inspect", path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["format"] == "int8" and report["synthetic"] is True and report["quantized_modules"] == 21


def test_cli_render_damaged_song_refused(micro_paths, tmp_path):
    song = save_song(make_song(), tmp_path / "song")
    damaged = Path(shutil.copytree(song, tmp_path / "damaged"))
    data = bytearray((damaged / "semantic.npy").read_bytes())
    data[-1] ^= 1  # same size, other content: the hash check
    (damaged / "semantic.npy").write_bytes(bytes(data))
    proc = run_cli("render", damaged, "--offline", "--checkpoint", micro_paths["bf16"], "--output",
                   tmp_path / "again")
    assert_cli_error(proc, "semantic.npy does not match its sha256 in result.json")
    assert not (tmp_path / "again").exists()


def test_cli_render_refuses_a_song_of_another_model(tmp_path, tiny_paths, micro_paths, monkeypatch, capsys):
    """Review finding: `render` with a checkpoint of other dimensions used to write a song from the wrong model.
    (`generate` as a subprocess, `render` in this process.)"""
    song = tmp_path / "song"
    made = run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics", "la", "--cot", "off",
                   "--max-seconds", "0.2", "--steps", "1", "--device", "cpu", "--output", song)
    assert made.returncode == 0, made.stderr[-2000:]
    assert_cli_error(cli_inprocess(monkeypatch, capsys, "render", song, "--checkpoint", micro_paths["bf16"], "--steps",
                                   "1", "--device", "cpu", "--output", tmp_path / "again"),
                     "made with a different model")
    assert not (tmp_path / "again").exists()


def test_cli_takes_a_bom_file_and_any_folder_name(tmp_path, tiny_paths):
    """Review findings: a UTF-8 byte-order mark in a text file is kept and warned about, as the vendor's CLI reads the
    file (issue 20 item 1; it was dropped silently), and an output folder whose name is not a valid song id
    (spaces, accents) is fine: the song id falls back to "song"."""
    style = tmp_path / "style.txt"
    style.write_bytes("\ufeffsmooth jazz".encode("utf-8"))
    out = tmp_path / "my söng"
    proc = run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--style-file", style, "--lyrics", "la",
                   "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device", "cpu", "--output", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    request = json.loads((out / "request.json").read_text())
    assert request["style"] == "\ufeffsmooth jazz" and request["id"] == "song"
    assert "byte-order mark (U+FEFF): it is kept" in proc.stderr


def test_decode_of_no_frames_is_a_request_error(tiny_paths):
    import pytest
    import torch

    from yue2_core.errors import RequestError
    from yue2_core.pipeline import YuE2Engine, decode
    eng = YuE2Engine.load(tiny_paths["bf16"], device="cpu", parts=("vae",))
    with pytest.raises(RequestError, match="no frames"):
        decode(eng.vae, torch.zeros(0, 64))


def test_cli_render_keeps_the_songs_budget_and_finds_a_relative_checkpoint(tmp_path, tiny_paths, monkeypatch,
                                                                           capsys):
    """New-user review: a song made with `--checkpoint models/x.safetensors` (relative) re-renders from any folder
    (config.json records the absolute path), and `render --seed` samples at most the song's own music budget.
    (`generate` as a subprocess, `render` in this process.)"""
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    shutil.copyfile(tiny_paths["bf16"], work / "models" / "x.safetensors")
    made = run_cli("generate", "--checkpoint", "models/x.safetensors", "--style", "pop", "--lyrics", "la", "--cot",
                   "off", "--max-seconds", "0.4", "--steps", "1", "--device", "cpu", "--offline", "--output", "song",
                   cwd=work)
    assert made.returncode == 0, made.stderr[-2000:]
    recorded = json.loads((work / "song" / "config.json").read_text())["checkpoint"]["path"]
    assert recorded == str(work / "models" / "x.safetensors")
    # $YUE2_CHECKPOINT naming another file does not override the song's own (new-user finding), and says so
    again = cli_inprocess(monkeypatch, capsys, "render", work / "song", "--seed", "9", "--steps", "1", "--device",
                          "cpu", "--offline", "--output", tmp_path / "again", cwd=tmp_path,
                          extra_env={"YUE2_CHECKPOINT": tiny_paths["int8"]})
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"checkpoint: {work / 'models' / 'x.safetensors'} (recorded in the song's config.json)" in again.stderr
    assert "not $YUE2_CHECKPOINT" in again.stderr
    assert json.loads(again.stdout)["semantic_tokens"] <= 10


def test_cli_render_records_its_own_settings_not_the_parents(tmp_path, tiny_paths, monkeypatch, capsys):
    """Break-it finding: a render's config.json copied the parent's dtype, device and music sampling although the
    render used others; it records what this run used (and the parent it came from). (`generate` as a subprocess,
    `render` in this process.)"""
    made = run_cli("generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics", "la", "--cot", "off",
                   "--max-seconds", "0.4", "--steps", "1", "--device", "cpu", "--dtype", "fp32", "--offline",
                   "--output", tmp_path / "song")
    assert made.returncode == 0, made.stderr[-2000:]
    parent = json.loads((tmp_path / "song" / "config.json").read_text())
    assert parent["model_dtype"] == "float32" and parent["semantic_sampling"]["max_tokens"] == 10
    again = cli_inprocess(monkeypatch, capsys, "render", tmp_path / "song", "--seed", "9", "--max-seconds", "0.2",
                          "--steps", "2", "--device", "cpu", "--offline", "--output", tmp_path / "again")
    assert again.returncode == 0, again.stderr[-2000:]
    child = json.loads((tmp_path / "again" / "config.json").read_text())
    assert child["model_dtype"] == "bfloat16" and child["device"] == "cpu" and child["ode_steps"] == 2
    assert child["semantic_sampling"]["max_tokens"] == 5
    assert child["rendered_from"] == str(tmp_path / "song")


def test_a_config_json_with_nan_or_bad_settings_is_refused_at_load(tmp_path, tiny_paths, monkeypatch, capsys):
    """Break-it finding: NaN (json.loads accepts it) or an unknown solver / dtype in an edited config.json (its
    sha256 updated too) was carried into a re-render, which then failed at save after the work; now the folder is
    refused when it is read, naming the key. (The song is made by `generate` in this process.)"""
    import hashlib
    import pytest
    from yue2_core.artifacts import load_song
    from yue2_core.errors import ArtifactError
    made = cli_inprocess(monkeypatch, capsys, "generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop",
                         "--lyrics", "la", "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device", "cpu",
                         "--offline", "--output", tmp_path / "s")
    assert made.returncode == 0, made.stderr[-2000:]
    song = tmp_path / "s"
    good = (song / "config.json").read_text()
    load_song(song)

    def edit(text):
        (song / "config.json").write_text(text)
        result = json.loads((song / "result.json").read_text())
        data = (song / "config.json").read_bytes()
        result["artifacts"]["config.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        (song / "result.json").write_text(json.dumps(result))
    cfg = json.loads(good)
    for key, value, words in (("cfg_scale", "NaN", "NaN"), ("ode_method", '"euler"', "midpoint or ab2"),
                              ("model_dtype", '"int4"', "bfloat16"), ("ode_steps", "0", "integer"),
                              ("semantic_sampling", '"all"', "an object"), ("vae_decode", '"tiles"', "halo_crop")):
        edit(json.dumps({**cfg, key: "@"}).replace('"@"', value))
        with pytest.raises(ArtifactError, match="config.json") as e:
            load_song(song)
        assert words in str(e.value) and (key in str(e.value) or value in str(e.value)), str(e.value)
    edit(json.dumps({**cfg, "ode_steps": None, "semantic_sampling": None}))  # null = not recorded (nodes'
    load_song(song)                                                              # tokens-only songs)
    edit(good)
    load_song(song)


def test_a_checkpoint_path_that_exists_but_is_not_a_file_is_named(tmp_path, monkeypatch):
    """Before: --checkpoint /dev/null (or a FIFO) said "checkpoint not found" although the path exists."""
    import pytest
    from yue2_core.errors import CheckpointError
    from yue2_core.weights.locate import find_checkpoint
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in (("/dev/null", "a character device"), (str(fifo), "a FIFO")):
        with pytest.raises(CheckpointError, match=f"is {kind}.*not a file") as err:
            find_checkpoint(path, download=False)
        assert "not found" not in str(err.value)
        monkeypatch.setenv("YUE2_CHECKPOINT", path)
        with pytest.raises(CheckpointError, match=f"points to {kind}"):
            find_checkpoint(None, download=False)


def test_an_unreachable_hub_fails_fast_naming_offline_and_a_local_file(tmp_path, monkeypatch):
    """New-user finding: without network the hub client retried for ~23 s before "download failed", and the message
    neither named --offline nor the synthetic file song.sh had written into ./models. The hub is probed first (one
    connect); the message names --offline, --max-seconds and the file found in ./models."""
    import time
    import pytest
    import huggingface_hub
    from yue2_core.errors import CheckpointError
    from yue2_core.weights import locate
    for var in ("YUE2_CHECKPOINT", "HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(locate, "comfy_checkpoint_dirs", lambda: [])
    monkeypatch.setattr(locate, "hf_vendor_snapshot", lambda: None)
    import socket
    with socket.socket() as free:  # a port nothing listens on: bound, then closed (the connect is refused at once)
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")

    def no_download(*a, **k):
        raise AssertionError("the client was asked to download from an unreachable hub")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "yue2_tiny_bf16.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        locate.find_checkpoint(None, download=True)
    msg = str(e.value)
    assert time.perf_counter() - t0 < 10
    assert f"cannot reach 127.0.0.1:{port}" in msg and "--offline" in msg and "--max-seconds" in msg, msg
    assert "--checkpoint models/yue2_tiny_bf16.safetensors" in msg.split("Found here:")[1], msg
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # behind a proxy: no direct probe, the client
    with pytest.raises(CheckpointError, match="the client was asked"):  # is asked (it knows the proxy)
        locate.find_checkpoint(None, download=True)


def test_no_checkpoint_message_names_song_sh_file_first_and_counts_the_rest(tmp_path, monkeypatch):
    """New-user finding: the hint listed the first two files of models/ by name (hiding the one scripts/song.sh
    writes) and suggested make-synthetic onto that file, which exists (the command would refuse). Now song.sh's file
    comes first, at most four are named with how many more, and the make-synthetic step is left out."""
    from yue2_core.errors import CheckpointError
    from yue2_core.weights import locate
    monkeypatch.delenv("YUE2_CHECKPOINT", raising=False)
    monkeypatch.setattr(locate, "comfy_checkpoint_dirs", lambda: [])
    monkeypatch.setattr(locate, "hf_vendor_snapshot", lambda: None)
    (tmp_path / "models").mkdir()
    for name in ("a", "b", "c", "d", "e", "yue2_tiny_bf16"):
        (tmp_path / "models" / f"{name}.safetensors").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        locate.find_checkpoint(None, download=False)
    msg = str(e.value)
    found = msg.split("Found here:")[1]
    assert found.startswith(" --checkpoint models/yue2_tiny_bf16.safetensors, --checkpoint models/a."), msg
    assert "(and 2 more in models/)" in found and "make-synthetic" not in msg, msg
    (tmp_path / "models" / "yue2_tiny_bf16.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        locate.find_checkpoint(None, download=False)
    assert "make-synthetic --output models/yue2_tiny_bf16.safetensors" in str(e.value)
    assert "(and 1 more in models/)" in str(e.value)


def test_no_checkpoint_message_gives_a_download_link_and_where_the_cli_looks(tmp_path, monkeypatch):
    """New-user finding (review 42): the link was the file's web page (huggingface.co/…/blob/…: curl or wget fetch
    HTML), $YUE2_CHECKPOINT went unnamed, and "put it in ComfyUI/models/checkpoints" did nothing for a standalone
    clone (that folder is searched only from ComfyUI/custom_nodes or with $COMFYUI_PATH)."""
    from yue2_core.errors import CheckpointError
    from yue2_core.weights import locate
    monkeypatch.delenv("YUE2_CHECKPOINT", raising=False)
    monkeypatch.setattr(locate, "comfy_checkpoint_dirs", lambda: [])
    monkeypatch.setattr(locate, "hf_vendor_snapshot", lambda: None)
    monkeypatch.chdir(tmp_path)
    for explicit in (None, str(tmp_path / "missing.safetensors")):
        with pytest.raises(CheckpointError) as e:
            locate.find_checkpoint(explicit, download=False)
        msg = str(e.value)
        url = "https://huggingface.co/Comfy-Org/YuE2/resolve/main/checkpoints/yue2_3b_int8_convrot.safetensors"
        assert f"curl -L -o yue2_3b_int8_convrot.safetensors {url}," in msg and "/blob/" not in msg, msg
        assert "YUE2_CHECKPOINT=PATH" in msg and "only when this pack sits in ComfyUI/custom_nodes" in msg, msg
    from yue2_core.__main__ import build_parser
    for command in ("generate", "render", "batch"):  # --help: a vendor folder is accepted too; the download's size
        sub = build_parser()._subparsers._group_actions[0].choices[command]
        text = next(a.help for a in sub._actions if "--checkpoint" in a.option_strings)
        assert "m-a-p/YuE2-3B folder" in text and "3.7 GB" in text and "custom_nodes" in text, (command, text)


def test_cli_inspect_says_when_the_score_was_edited(tmp_path, monkeypatch, capsys):
    """New-user finding: the summary of an edited song said only "files verified"; the edit is named there too.
    (The unedited song inspected as a subprocess, the edited one in this process.)"""
    song = save_song(make_song(), tmp_path / "song")
    plain = run_cli("inspect", song)
    assert plain.returncode == 0 and "edited" not in plain.stderr, plain.stderr[-2000:]
    score = Path(song) / "score.abc"
    score.write_text(score.read_text("utf-8").replace("M:4/4", "M:3/4"), "utf-8")
    proc = cli_inprocess(monkeypatch, capsys, "inspect", song)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["score_edited"] is True
    assert "score.abc edited since the song was made" in proc.stderr


def test_cli_inspect_tells_the_songs_own_edit_from_its_parents(tmp_path, tiny_paths, capsys):
    """Review finding (stop 40): `inspect` of a song rendered from an edited score.abc printed `"score_edited": false`
    and `"lineage": {"score_edited": true}` — two meanings under one name, read as a contradiction. The song's own
    (its score.abc edited after it was saved) keeps the top-level name; `render` records the parent's as
    `lineage.parent_score_edited` (a song saved before shows its old `score_edited` under that name) and the summary
    says it in words."""
    from yue2_core.__main__ import main
    song = save_song(make_song(frames=4), tmp_path / "song")
    score = Path(song) / "score.abc"
    score.write_text(score.read_text("utf-8").replace("M:4/4", "M:3/4"), "utf-8")
    rc, err = main_inprocess(capsys, "render", song, "--checkpoint", tiny_paths["bf16"], "--max-seconds", "0.12",
                             "--steps", "1", "--device", "cpu", "--offline", "--output", tmp_path / "child")
    assert rc == 0 and "score.abc was edited: sampling new music tokens for it" in err, err[-2000:]

    def inspect(folder):
        assert main(["inspect", str(folder)]) == 0
        out = capsys.readouterr()
        return json.loads(out.out), out.err
    child, err = inspect(tmp_path / "child")
    assert child["score_edited"] is False and child["lineage"]["parent_score_edited"] is True, child
    assert "score_edited" not in child["lineage"]
    assert f"rendered from {Path(song).absolute()}, whose edited score.abc it sampled its music for" in err, err
    assert "score.abc edited since the song was made" not in err
    old = save_song(make_song(), tmp_path / "old", lineage={"parent": str(song), "score_edited": True})
    report, _ = inspect(old)  # render's record before the rename
    assert report["lineage"] == {"parent": str(song), "parent_score_edited": True}, report["lineage"]


def test_cli_inspect_song_folder_and_batch_folder(tiny_paths, tmp_path, monkeypatch, capsys):
    """inspect of a song folder describes the song from its verified files (new-user/break-it finding: it said
    "config.json is the config of another model"); a damaged file is named; a batch output folder (inspect or
    render) points to its per-id song subfolders. The first inspect as a subprocess, generate and the others in this
    process (`cli_inprocess`)."""
    def cli(*args):
        return cli_inprocess(monkeypatch, capsys, *args)
    song = tmp_path / "song"
    made = cli("generate", "--checkpoint", tiny_paths["bf16"], "--style", "pop", "--lyrics", "la", "--cot", "off",
               "--max-seconds", "0.2", "--steps", "1", "--device", "cpu", "--output", song)
    assert made.returncode == 0, made.stderr[-2000:]
    proc = run_cli("inspect", song)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["kind"] == "song" and report["request"]["style"] == "pop" and report["request"]["cot"] == "off"
    assert report["music_frames"] == 5 and "audio.flac" in report["files"] and report["abc_tokens"] == 0
    assert "files verified against result.json" in proc.stderr
    shutil.copytree(song, tmp_path / "renamed")  # the summary names the folder (it said the request id, 'song')
    renamed = json.loads(cli("inspect", tmp_path / "renamed").stdout)["summary"]
    assert renamed.startswith(f"song 'renamed' (request id {report['request']['id']!r}): "), renamed
    batch = tmp_path / "batch"
    batch.mkdir()
    (batch / "batch.json").write_text("{}")
    shutil.copytree(song, batch / "a1")
    assert_cli_error(cli("inspect", batch),
                     f"each song is the subfolder named by its request id, e.g. {batch / 'a1'}")
    assert_cli_error(cli("render", batch, "--checkpoint", tiny_paths["bf16"], "--device", "cpu", "--output",
                         tmp_path / "again"), "it is a batch output folder (batch.json)")
    with open(song / "semantic.npy", "ab") as f:
        f.write(b"x")
    assert_cli_error(cli("inspect", song), "semantic.npy is")


def test_cli_inspect_of_a_damaged_adapter_blames_the_file_not_the_geometry(tmp_path):
    """Break-it finding: inspect wrapped every adapter refusal (NaN factors, int factors) as "does not fit the release
    geometry … pass --model", sending the user to --model when the file itself is broken."""
    import torch
    from safetensors.torch import save_file
    bad = tmp_path / "nan.safetensors"
    save_file({"diffusion_model.layers.0.self_attn.q_proj.lora_A.weight": torch.full((4, 2048), float("nan")),
               "diffusion_model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(2048, 4)}, str(bad))
    proc = run_cli("inspect", bad)
    assert_cli_error(proc, "looks like a LoRA adapter but is refused")
    assert "NaN" in proc.stderr and "--model" not in proc.stderr, proc.stderr[-2000:]


def test_cli_inspect_names_the_kind_and_the_fault(tmp_path, monkeypatch, capsys):
    """Second break-it review: inspect's "file vs geometry" choice was a keyword search (a cut-off or rank-mismatched
    adapter got the --model hint, a layer out of range did not); a VAE with NaN was "neither a checkpoint, a VAE nor
    an adapter"; an adapter whose product overflows printed a normal report that `generate` then refused. The first
    input as a subprocess, the others in this process (`cli_inprocess`)."""
    import torch
    from safetensors.torch import load_file, save_file
    from yue2_core.weights.synthetic_vae import write_vae
    key = "diffusion_model.layers.{}.self_attn.q_proj.lora_{}.weight"

    def adapter(name, layer=0, a=(4, 2048), b=(2048, 4), fill=0.01):
        path = tmp_path / name
        save_file({key.format(layer, "A"): torch.full(a, fill), key.format(layer, "B"): torch.full(b, fill)},
                  str(path))
        return path
    ranks = run_cli("inspect", adapter("ranks.safetensors", b=(2048, 3)))
    assert_cli_error(ranks, "looks like a LoRA adapter but is refused")
    assert "ranks disagree" in ranks.stderr and "--model" not in ranks.stderr
    deep = cli_inprocess(monkeypatch, capsys, "inspect", adapter("deep.safetensors", layer=99))
    assert_cli_error(deep, "does not fit the release geometry")
    assert "--model" in deep.stderr
    hot = cli_inprocess(monkeypatch, capsys, "inspect", adapter("hot.safetensors", fill=1e20))
    assert_cli_error(hot, "looks like a LoRA adapter but is refused")
    assert "beyond" in hot.stderr
    vae = write_vae(str(tmp_path / "vae.safetensors"), layout="vendor-file")
    tensors = load_file(vae)
    name = next(k for k in tensors if k.endswith("bias"))
    tensors[name][0] = float("nan")
    save_file(tensors, vae)
    assert_cli_error(cli_inprocess(monkeypatch, capsys, "inspect", vae), "is a YuE2 VAE decoder that is refused")


def test_cli_empty_paths_are_refused_not_taken_as_absent(tmp_path, monkeypatch, capsys):
    """`--abc-file "$UNSET"` made the model write its own lead sheet, `--lyrics-file ""` made an empty song and
    `--checkpoint ""` fell through to the checkpoint search (break-it review, stop 32). The first input runs as a
    subprocess, the others in this process (`cli_inprocess`)."""
    def cli(*args):
        return cli_inprocess(monkeypatch, capsys, *args)
    for option in ("--abc-file", "--style-file", "--lyrics-file", "--checkpoint"):
        args = ["generate", "--output", tmp_path / "o", "--offline", option, ""]
        args += [] if option == "--style-file" else ["--style", "pop"]
        args += [] if option == "--lyrics-file" else ["--lyrics", "la"]
        proc = run_cli(*args, timeout=60) if option == "--abc-file" else cli(*args)
        assert_cli_error(proc, f"argument {option}: '' names no")
    proc = cli("inspect", tmp_path, "--model", " ")
    assert_cli_error(proc, "argument --model: ' ' names no checkpoint file")
    proc = cli("batch", tmp_path / "r.jsonl", "--output", tmp_path / "b", "--checkpoint", "")
    assert_cli_error(proc, "argument --checkpoint: '' names no checkpoint file")
    assert_cli_error(cli("render", "", "--output", tmp_path / "o"), "argument song: '' names no song")
    assert_cli_error(cli("inspect", ""), "argument PATH: '' names no file or folder")
    assert_cli_error(cli("batch", "", "--output", tmp_path / "b"), "argument requests: '' names no")
    req = tmp_path / "r.jsonl"
    req.write_text('{"id": "a", "style": "pop", "lyrics": "la"}\n')
    proc = cli("batch", req, "--output", "", "--checkpoint", tmp_path / "none.safetensors")
    assert_cli_error(proc, "--output '' names no folder")


def test_cli_melody_mode_score_with_chords_is_named(tmp_path, monkeypatch, capsys):
    """Break-it finding (stop 38): `--cot melody --abc-file` with a score holding chord symbols said nothing — the
    melody mode asks for a chord-free lead sheet and the vendor does not strip a given score's chords. The warning
    comes with the score check, before the checkpoint is looked for; with cot full, or the chords stripped, none.
    (The first input as a subprocess, the others in this process.)"""
    from yue2_core.abc.tools import strip_chords
    text = (REPO / "examples" / "text2music_lead_sheet.abc").read_text(encoding="utf-8")
    with_chords, without = tmp_path / "chords.abc", tmp_path / "melody.abc"
    with_chords.write_text(text, encoding="utf-8")
    without.write_text(strip_chords(text), encoding="utf-8")
    phrase = 'the score has 16 chord symbols, but cot is "melody"'
    proc = gen(tmp_path, "--cot", "melody", "--abc-file", with_chords, "--max-seconds", "60")
    assert_cli_error(proc, "checkpoint not found")
    assert phrase in proc.stderr
    for args in (("--cot", "full", "--abc-file", with_chords), ("--cot", "melody", "--abc-file", without)):
        proc = cli_inprocess(monkeypatch, capsys, "generate", "--style", "pop", "--lyrics", "la la", "--offline",
                             "--checkpoint", NO_CKPT, "--output", tmp_path / "out", *args, "--max-seconds", "60")
        assert_cli_error(proc, "checkpoint not found")
        assert "chord symbol" not in proc.stderr, proc.stderr


def test_cli_usage_mistakes_are_one_line_naming_the_subcommand(tmp_path, capsys):
    """New-user review 43: a mistyped option (`--max-second 5`) was reported by the top-level parser — its usage,
    then "unrecognized arguments" without the subcommand or the option meant; `--cot ful` and a missing `--output`
    printed ten lines of usage before the error. Now each is one line from the subcommand's parser that names the
    closest option and where the accepted ones are listed."""
    proc = gen(tmp_path, "--max-second", "5")
    assert_cli_error(proc, "python -m yue2_core generate: error: unrecognized arguments: --max-second 5 (did you "
                           "mean --max-seconds?); python -m yue2_core generate --help lists what is accepted")
    assert proc.stderr.count("\n") == 1 and "usage:" not in proc.stderr, proc.stderr
    cases = [
        (("generate", "--check", NO_CKPT, "--output", tmp_path / "a"), "(did you mean --checkpoint?)"),
        (("generate", "--cot", "ful", "--output", tmp_path / "a"),
         "generate: error: argument --cot: invalid choice: 'ful' (choose from 'full', 'melody', 'off'); "),
        (("generate", "--style", "pop"), "generate: error: the following arguments are required: --output; "),
        (("batch", "x.jsonl", "--output", tmp_path / "b", "--max-batchs", "2"), "(did you mean --max-batch?)"),
        (("render", tmp_path, "surplus", "--output", tmp_path / "c"),
         "render: error: unrecognized arguments: surplus;"),
        (("genrate",), "python -m yue2_core: error: argument command: invalid choice: 'genrate'"),
    ]
    for args, phrase in cases:
        rc, err = main_inprocess(capsys, *args)
        assert rc == 2 and phrase in err and err.count("\n") == 1 and "usage:" not in err, (args, err)
        assert err.rstrip().endswith("--help lists what is accepted"), err


def test_cli_text_file_errors_say_what_the_path_is(tmp_path, capsys):
    """New-user review 43: a missing `--lyrics-file` and a folder given as one both read "it is not a regular file (or
    does not exist)". Now the message says which, with the full path of a missing file (relative paths are taken
    from where the command runs)."""
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics-file", "no_such_lyrics.txt", "--offline",
                             "--checkpoint", NO_CKPT, "--output", tmp_path / "a")
    assert rc == 2 and err == (f"error: cannot read the lyrics file no_such_lyrics.txt: no such file "
                               f"({Path.cwd() / 'no_such_lyrics.txt'}); give the path of a UTF-8 text file\n"), err
    rc, err = main_inprocess(capsys, "generate", "--style-file", tmp_path, "--lyrics", "la", "--offline",
                             "--checkpoint", NO_CKPT, "--output", tmp_path / "b")
    assert rc == 2 and f"cannot read the style file {tmp_path}: it is a directory, not a regular file" in err, err


def test_cli_render_of_a_folder_of_songs_or_a_file_says_what_to_give(tmp_path, capsys):
    """New-user review 43: `render out --output out/v2` (the folder the songs are in) was refused as "--output out/v2
    is inside the song folder out" — out is no song; and `render x.safetensors` said only "no result.json". Now the
    folder of songs names the songs in it, a file or another folder says what a song folder is."""
    out = tmp_path / "out"
    for name in ("b_song", "a_song"):
        save_song(make_song(), out / name)
    rc, err = main_inprocess(capsys, "render", out, "--checkpoint", NO_CKPT, "--output", out / "v2")
    assert rc == 2 and err == (f"error: {out} is not a song directory (no result.json); it holds song folders, "
                               f"give one of them: {out / 'a_song'}, {out / 'b_song'}\n"), err
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"x")
    rc, err = main_inprocess(capsys, "render", weights, "--checkpoint", NO_CKPT, "--output", tmp_path / "v3")
    assert rc == 2 and err.endswith("no result.json); give the folder generate or render wrote, the one holding "
                                    "result.json, not a file\n"), err
    rc, err = main_inprocess(capsys, "render", out / "a_song", "--checkpoint", NO_CKPT, "--output", out / "a_song/v")
    assert rc == 2 and "is inside the song folder" in err, err  # a real song folder: still refused as before
