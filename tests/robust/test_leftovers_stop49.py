"""Leftovers of the stop-48 reviews, fixed in stop 49 (docs/bad_inputs.md §35): `batch --ray` rows checked against
this process's file-size limit (the driver writes their folders) before Ray is imported; a used-up disk quota
said before any work by the output claim's synced write; a LoRA whose expert cannot be told says so."""
from __future__ import annotations

import errno
import io
import json
import math
import os
import runpy
import shlex
from pathlib import Path

import pytest

from test_cli import main_inprocess
from yue2_core.artifacts import song_bytes_bound
from yue2_core.errors import DiskFullError

LIMIT = 100 * 1024  # bytes: `ulimit -f 100`


def _requests(tmp_path, *rows) -> str:
    path = tmp_path / "req.jsonl"
    path.write_text("".join(json.dumps({"id": i, "style": "pop", "lyrics": "la", "cot": "off", "seed": n}) + "\n"
                            for n, i in enumerate(rows, 1)), "utf-8")
    return str(path)


class _Runner:
    """The driver's runner interface (`ray_runner.RayRunner`'s `prepare` / `songs` / `settings`) without Ray: it
    records whether the driver got as far as the workers."""
    settings: dict = {}

    def __init__(self):
        self.calls = []

    def prepare(self):
        self.calls.append("prepare")  # RayRunner.prepare is where Ray is imported and the cluster joined
        return None, False

    def songs(self, todo, out, **kw):
        self.calls.append("songs")
        return iter(())


def test_ray_rows_past_the_file_size_limit_are_refused_before_ray(tmp_path, monkeypatch, tiny_paths):
    """Was: `batch --ray` skipped the `ulimit -f` check ("the workers' limits are theirs"), yet the DRIVER writes
    every song folder from the bytes the workers send back (`RayRunner._store`): each row was computed on the
    cluster, then failed at its save with "File too large". Now a --ray row is refused at validate as a local one,
    before the runner is prepared (Ray imported, workers placed)."""
    import yue2_core.artifacts as artifacts
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.synthetic_tokenizer import tokenizer_json
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    monkeypatch.setattr(artifacts, "file_size_limit", lambda: LIMIT)
    runner, stream, out = _Runner(), io.StringIO(), tmp_path / "album"
    run_batch(BatchOptions(_requests(tmp_path, "a", "b"), str(out), max_seconds=2.0),
              tokenizer=YuE2Tokenizer(tokenizer_json().decode("utf-8")),
              dims=inspect_checkpoint(tiny_paths["bf16"]).dims, engine_factory=None, runner=runner, stream=stream)
    text, largest = stream.getvalue(), song_bytes_bound(50)[0]
    for n, row in ((1, "a"), (2, "b")):
        assert (f"line {n} ({row}): this process's file-size limit (`ulimit -f` 100: 102,400 bytes) is below what "
                f"row '{row}' needs: its audio.flac (50 music tokens = 2 s of 48 kHz stereo 24-bit FLAC) can take up "
                f"to {largest:,} bytes") in text, text
    assert "nothing ran: every row failed before any work" in text, text
    assert runner.calls == [] and not out.exists(), runner.calls


@pytest.mark.parametrize("call,code", [("fsync", errno.EDQUOT), ("pwrite", errno.ENOSPC)])
def test_a_full_quota_or_disk_is_said_before_any_work(tmp_path, capsys, monkeypatch, call, code):
    """Was: a used-up disk quota (EDQUOT; NFS reports it only when the data is synced) showed at the first save,
    after the song was computed — the free-space note reads statvfs, which knows no quota. The output claim's small
    lock-file write (`reserve_output`) is now synced and is the early write probe: a full quota or disk there is a
    DiskFullError before the checkpoint is even looked for, saying which and what to do; nothing is left behind."""
    import yue2_core.artifacts as artifacts
    real = getattr(os, call)

    def full(fd, *a):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).endswith(".yue2-lock"):
            raise OSError(code, os.strerror(code))
        return real(fd, *a)
    monkeypatch.setattr(artifacts.os, call, full)
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics", "la", "--checkpoint",
                             "/nonexistent/yue2.safetensors", "--offline", "--output", tmp_path / "out" / "song")
    why = ("your disk quota there is used up, so no song could be saved there; free space (`quota -s` shows the "
           "quota)" if code == errno.EDQUOT else "its disk is full, so no song could be saved there; free space")
    assert rc == 2 and (f"error: cannot write into {tmp_path / 'out'} ({os.strerror(code)}): {why}, or give the "
                        "output directory a place on another disk (nothing was computed)") in err, err
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # no lock file, no parent folder made for it
    with pytest.raises(DiskFullError, match="batch folder a place on another disk"):
        artifacts.reserve_output(tmp_path / "album", "batch folder", inside_ok=True)


def test_a_lora_whose_expert_cannot_be_told_says_so(tmp_path, capsys):
    """Was: a Mothersuperior ComfyUI fused NAR file (`text_encoders.` keys; only its metadata yue2_lora_branch=nar
    says NAR) with its metadata stripped was read as Comfy-native and patched the AR without a word. Both experts'
    layers have the same shapes, so nothing in the file tells: it still goes to the AR (the ComfyUI meaning of
    `text_encoders.`), with a warning saying the expert cannot be told and the one-line command that puts the
    metadata back; the command's file goes to the NAR. Files whose names tell (`diffusion_model.`, `nar_`, an
    `.alpha`, a metadata branch) get no note; `inspect` shows it first."""
    from safetensors.torch import load_file, save_file
    from yue2_core.cli.inspect_cmd import _inspect_other
    from yue2_core.weights.lora.layouts import adapter_notes, read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    for layout in ("ms-fused-nar", "comfy-native", "aitk", "starnodes", "fl-nar", "hot-split-nar"):
        path = write_adapter(layout, tmp_path / f"{layout}.safetensors", dims)
        assert adapter_notes(read_adapter(str(path), dims)) == [], layout
        stripped = tmp_path / f"{layout}-Bob's $HOME.safetensors"  # the command's quotes hold (diff review, stop 49)
        save_file(load_file(path), stripped)
        adapter = read_adapter(str(stripped), dims)
        if layout != "ms-fused-nar":  # (HOT-Step's and Starnodes' lost alpha has its own note: stop 51, §40c)
            assert [n for n in adapter.notes if "its scale cannot be read" not in n] == [], (layout, adapter.notes)
            continue
        assert {p.expert for p in adapter.patches} == {"ar"}
        [note] = adapter_notes(adapter)
        assert note.startswith(f"LoRA {stripped}: which expert it is for cannot be told — it has only "
                               "`text_encoders.` lora_down/lora_up keys, no alpha and no metadata"), note
        assert "It is applied to the AR" in note and "no strength or option moves it to the NAR" in note, note
        assert _inspect_other(str(stripped), dims)[0]["report"].startswith(f"warning: {note}\n"), "inspect's report"
        command = shlex.split(note.split("put the metadata back with ", 1)[1].split(" and load ", 1)[0])
        assert command[:2] == ["python", "-c"], command
        script = tmp_path / "put_back.py"  # the command as a shell gives it to `python -c`, run in this interpreter
        script.write_text(command[2])  # (no second interpreter's start)
        runpy.run_path(str(script), run_name="__main__")
        fixed = read_adapter(str(tmp_path / f"nar-{stripped.name}"), dims)
        assert {p.expert for p in fixed.patches} == {"nar"} and fixed.notes == [], fixed.notes


def _node_module(name: str):
    """nodes/<name>.py alone (records and inputs import only torch and the standard library; the nodes package
    needs ComfyUI)."""
    import importlib.util
    from robust_helpers import REPO
    spec = importlib.util.spec_from_file_location(f"yue2_node_{name}", REPO / "nodes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_save_song_sees_an_in_place_change_of_one_sample():
    """Was: the AUDIO stamp fingerprinted ≈ 8,192 evenly spaced values, so an in-place change of under ≈ 50 ms of
    a song (one value between two probed ones here) passed as YuE2's own decode, and Save Song recorded the edited
    audio as "decoded". The fingerprint now hashes every value (≈ 0.09 s for a 4-minute song)."""
    import torch
    records = _node_module("records")
    wave = torch.randn(1, 2, 10 * 48_000, generator=torch.Generator().manual_seed(0))
    audio = {"waveform": wave, "sample_rate": 48_000, **records.stamp_audio(wave, None)}
    assert records.audio_of_latent(audio, None) is None
    stride = wave.numel() // 8192  # the earlier probe's spacing: a value it never read
    wave.view(-1)[stride + 1] += 1e-3
    assert records.audio_of_latent(audio, None) == ("it was changed after YuE2 made it (by a node between YuE2 VAE "
                                                    "Decode and Save Song)")


def test_a_file_system_that_cannot_sync_files_still_claims_and_saves(tmp_path, monkeypatch):
    """Diff review, stop 49: the claim's lock-file write is synced (the early quota probe), and a file system whose
    fsync answers EINVAL / ENOTSUP (some FUSE and network ones) refused every run with "writing … failed (Invalid
    argument)"; the save failed the same way after the song. Such a sync is skipped as a folder's already was
    (`fsync_folder`); the claim and the save go through."""
    import yue2_core.artifacts as artifacts

    def no_sync(fd):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    monkeypatch.setattr(os, "fsync", no_sync)
    with artifacts.reserve_output(tmp_path / "out" / "song") as claim:
        assert claim.lock is not None and claim.lock.exists()
        artifacts.write_song_dir(tmp_path / "out" / "song", {"a.txt": b"x"}, {"status": "complete"})
    assert (tmp_path / "out" / "song" / "a.txt").read_bytes() == b"x"


def test_a_lora_whose_metadata_names_the_other_expert_says_so(tmp_path):
    """Diff review, stop 49: a Mothersuperior ComfyUI fused NAR file that lost only `format=pt` (it keeps
    yue2_lora_branch=nar) went to the AR by its `text_encoders.` keys without a word — the expert note took the
    branch as saying the expert. It still goes where the keys say, with a note naming the metadata that disagrees."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from yue2_core.weights.lora.layouts import adapter_notes, read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    path = write_adapter("ms-fused-nar", tmp_path / "nar.safetensors", dims)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["yue2_lora_branch"] == "nar", meta
    save_file(load_file(path), tmp_path / "no-format.safetensors", {k: v for k, v in meta.items() if k != "format"})
    adapter = read_adapter(str(tmp_path / "no-format.safetensors"), dims)
    assert {p.expert for p in adapter.patches} == {"ar"}
    assert adapter_notes(adapter) == [f"LoRA {tmp_path / 'no-format.safetensors'}: its metadata says "
                                      "yue2_lora_branch=nar, but its keys name the AR (their text_encoders. / "
                                      "diffusion_model. prefixes), where it is applied; if it is a NAR file, the "
                                      "metadata format=pt (Mothersuperior's ComfyUI files) makes yue2_lora_branch=nar "
                                      "decide"]
    assert adapter_notes(read_adapter(str(path), dims)) == []  # the file as written: the metadata decides


@pytest.mark.parametrize("call,code", [("open", errno.ENOSPC), ("mkdir", errno.EDQUOT)])
def test_no_room_for_the_claim_file_or_its_folder_is_said_before_any_work(tmp_path, monkeypatch, call, code):
    """Diff review, stop 49: a disk with no inode left (ENOSPC at the lock file's creation) or a quota used up when
    the output's new parent folder is made skipped the claim without a word — the song was computed and its save
    failed. Both are the claim's DiskFullError now; the folders it made are removed."""
    import yue2_core.artifacts as artifacts
    real = getattr(os, call)

    def full(path, *a, **kw):
        if call == "mkdir" or str(path).endswith(".yue2-lock"):
            raise OSError(code, os.strerror(code))
        return real(path, *a, **kw)
    monkeypatch.setattr(os, call, full)
    with pytest.raises(DiskFullError) as exc:
        artifacts.reserve_output(tmp_path / "new" / "deeper" / "song")
    want = "your disk quota there is used up" if code == errno.EDQUOT else "its disk is full"
    where = tmp_path / "new" / "deeper" if call == "open" else tmp_path  # the claim's folder / the one that exists
    assert str(exc.value).startswith(f"cannot write into {where} ({os.strerror(code)}): {want}, so no song could be "
                                     "saved there"), exc.value
    monkeypatch.setattr(os, call, real)
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_continue_min_extra_seconds_between_auto_and_zero_is_refused():
    """Node-inputs review (stop 49): Continue's `min_extra_seconds` −0.5 was taken as −1 (auto) without a word; the
    node now reads it through `inputs.number(..., auto=-1)`, which refuses anything in (−1, 0), NaN and ±inf, keeps
    −1 and turns −0.0 into 0.0."""
    number = _node_module("inputs").number
    auto = dict(auto=-1.0, auto_means="auto: min(extra_seconds, 8 s)")
    for bad in (-0.5, -1e-9, float("nan"), float("inf"), "2", None, True):
        with pytest.raises(ValueError, match=r"^min_extra_seconds must be a number in \[0, 983\.04\], or -1 "
                                             r"\(auto: min\(extra_seconds, 8 s\)\); got "):
            number("min_extra_seconds", bad, 0.0, 983.04, **auto)
    assert number("min_extra_seconds", -1, 0.0, 983.04, **auto) == -1.0
    zero = number("min_extra_seconds", -0.0, 0.0, 983.04, **auto)
    assert zero == 0.0 and math.copysign(1.0, zero) == 1.0
    assert number("min_extra_seconds", 2, 0.0, 983.04, **auto) == 2.0
    source = (Path(__file__).resolve().parents[2] / "nodes" / "edit_nodes.py").read_text()
    assert 'inputs.number("min_extra_seconds", min_extra_seconds, 0.0, MAX_EXTRA_SECONDS, auto=-1.0' in source
