"""Leftovers of the stop-45 break-it reviews, fixed in stop 46 (docs/bad_inputs.md §25): JSON with an integer past
Python's 4,300-digit cap called "not valid JSON", batch.json's rename not synced to disk, a control character at the
end of a header line reported twice, and the busy-CPU note counting the host's cores under an affinity limit."""
from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

import pytest

from yue2_core.errors import (AdapterError, ArtifactError, CheckpointError, TokenizerError, YuE2Error,
                              json_number_too_long)

HUGE = "1" + "0" * 5000  # past Python's 4,300-digit cap for int(str)
TOO_LONG = "a number too long to read: an integer of more than 4,300 digits"


# ---------------------------------------------------------------------------------------------- numbers too long

def _tokenizer(tmp_path: Path):
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    YuE2Tokenizer('{"model": {"x": ' + HUGE + "}}")


def _vae_config(tmp_path: Path):
    from yue2_core.weights.vae_files import open_vae
    (tmp_path / "config.json").write_text('{"model_type": "yue2_vae", "x": ' + HUGE + "}")
    open_vae(str(tmp_path))


def _vendor_config(tmp_path: Path):
    from yue2_core.weights.vendor import read_config
    (tmp_path / "config.json").write_text('{"model_type": "yue2", "x": ' + HUGE + "}")
    read_config(str(tmp_path))


def _safetensors_header(tmp_path: Path):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    raw = ('{"a":{"dtype":"F32","shape":[' + HUGE + '],"data_offsets":[0,4]}}').encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    inspect_checkpoint(str(tmp_path / "x.safetensors"))


def _quant_marker(tmp_path: Path):
    from yue2_core.weights.quant import parse_marker
    parse_marker(('{"format": "int8_tensorwise", "convrot_groupsize": ' + HUGE + "}").encode(), "w.comfy_quant")


def _adapter_config(tmp_path: Path):
    from yue2_core.weights.lora.layouts_io import read_sidecar
    (tmp_path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": ' + HUGE + "}")
    read_sidecar(str(tmp_path / "adapter_config.json"))


def _song_result(tmp_path: Path):
    from yue2_core.artifacts import load_song
    (tmp_path / "result.json").write_text('{"seed": ' + HUGE + "}")
    load_song(tmp_path)


@pytest.mark.parametrize("read, kind, words", [
    (_tokenizer, TokenizerError, "the embedded tokenizer JSON holds"),
    (_vae_config, CheckpointError, "config.json: config.json holds"),
    (_vendor_config, CheckpointError, "config.json holds"),
    (_safetensors_header, CheckpointError, "not a safetensors file (its header holds"),
    (_quant_marker, CheckpointError, "w.comfy_quant: the comfy_quant marker holds"),
    (_adapter_config, AdapterError, "not a readable JSON file ("),
    (_song_result, ArtifactError, "result.json is damaged or not a song result: it holds"),
], ids=["tokenizer", "vae-config", "vendor-config", "safetensors-header", "quant-marker", "adapter-config",
        "song-result"])
def test_an_integer_past_the_digit_cap_is_named_not_called_invalid_json(tmp_path, read, kind, words):
    """An integer of 5,000 digits is valid JSON, but json.loads raises ValueError("Exceeds the limit (4300 digits) for
    integer string conversion … use sys.set_int_max_str_digits()"): it was reported as "not valid JSON", "cannot be
    read as JSON (ValueError)" or with Python's advice to change an interpreter setting. Now what is wrong is said."""
    with pytest.raises(kind) as caught:
        read(tmp_path)
    message = str(caught.value)
    assert words in message and TOO_LONG in message, message
    assert "not valid JSON" not in message and "set_int_max_str_digits" not in message, message


def test_json_number_too_long_names_only_the_digit_cap():
    """The helper answers for Python's int-string limit only: JSON syntax errors, bad UTF-8 and others stay theirs."""
    for text in ("1" * 4301, "[" + HUGE + "]", '{"a": -' + HUGE + "}"):
        with pytest.raises(ValueError) as caught:
            json.loads(text)
        assert json_number_too_long(caught.value) == TOO_LONG
    for bad in (b'{"a": 1', b"\xff{}", b"[1,]"):
        with pytest.raises(ValueError) as caught:
            json.loads(bad.decode("utf-8"))
        assert json_number_too_long(caught.value) is None
    assert json.loads("1" * 4300) and json.loads("1." + "0" * 5000) == 1.0  # at the cap, and floats: read as before
    assert json_number_too_long(YuE2Error("integer string conversion")) is None


# ---------------------------------------------------------------------------------------------- batch.json on disk

def test_batch_json_and_its_rename_are_synced_to_disk(tmp_path, monkeypatch):
    """batch.json was written to a temporary file, fsynced and renamed into place, but the folder was not synced
    after the rename: a crash soon after could lose the new batch.json although its data was on disk. Now the folder
    is fsynced after the rename (`artifacts.fsync_folder`), as a saved song's; a file system that cannot sync a
    folder (EINVAL) still writes it."""
    from yue2_core.batch.summary import BatchSummary, load_summary

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync folder" if os.path.isdir(path) else "fsync file", path))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    summary = BatchSummary({"requests": "songs.jsonl"})
    summary.add(1, "song1", "complete")
    assert summary.write(tmp_path) == tmp_path / "batch.json"
    assert [kind for kind, _ in events] == ["fsync file", "replace", "fsync folder"], events  # was: no folder sync
    assert events[1][1] == str(tmp_path / "batch.json") and events[2][1] == str(tmp_path)

    def no_folder_sync(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_folder_sync)
    summary.add(2, "song2", "failed", stage="render", error="boom")
    summary.write(tmp_path)
    assert load_summary(tmp_path)["failed"] == 1 and sorted(os.listdir(tmp_path)) == ["batch.json"]


# ---------------------------------------------------------------------------------------------- ABC header lines

HEAD = ('X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=88\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
        'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:C\n')
SCORE = HEAD + '% verse\nV: Vocal\n"C"C16E16|"G"D32|\nV: Ins\nC,32|G,,32|\n'


@pytest.mark.parametrize("number", range(1, 14))
@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x7f", "\x1b\x00"], ids=["NUL", "ESC", "DEL", "ESC+NUL"])
def test_a_control_character_ending_a_line_is_one_finding(number, char):
    """`M:4/4<ESC>` (an editor's bad save, a paste from a terminal): the rules read the control character as a
    space, so besides the control-character error came "Write M:4/4 without spaces" (X:, T:, L:, K:, a section
    comment and a V: selector alike). Now control characters that end a line are dropped before the rules: one
    finding, at the first of them."""
    from yue2_core.abc import validate
    lines = SCORE.split("\n")
    column = len(lines[number - 1]) + 1
    lines[number - 1] += char
    issues = validate("\n".join(lines))
    assert [(i.code, i.line, i.column) for i in issues] == [("control-character", number, column)], issues


# ---------------------------------------------------------------------------------------------- the busy-CPU note

@pytest.mark.parametrize("affinity, load, share, said", [
    ({0, 1}, 3.0, 1.0, "the 2 cores this process may use 100% busy"), ({0, 1}, 3.0, 0.1, None),
    ({0, 1}, 1.5, 0.0, None), (None, 3.0, None, None), (None, 70.0, None, "load 70.0 on 64 cores")])
def test_the_busy_cpu_note_counts_the_cores_this_process_may_use(monkeypatch, capsys, affinity, load, share, said):
    """Under `taskset -c 0,1` or a cpuset on a 64-core host, the note counted os.cpu_count() (64) and stayed quiet at
    load 3 on the 2 cores the run may use. Now the cores of os.sched_getaffinity are looked at: since stop 47 their
    own /proc/stat counters (`_busy_share`, tests/robust/test_leftovers_stop47.py), not the host-wide load; without
    it (macOS, Windows) the host's os.cpu_count() is used, as before."""
    import yue2_core.cli.busy_cpu as cli
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(cli, "_busy_share", lambda cpus: share)
    if affinity is None:
        monkeypatch.delattr(cli.os, "sched_getaffinity", raising=False)
    else:
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: set(affinity), raising=False)
    cli._note_busy_cpu()
    err = capsys.readouterr().err
    assert (said in err and err.startswith("NOTE: this CPU is busy")) if said else err == "", err
