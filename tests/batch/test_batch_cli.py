"""`python -m yue2_core batch`: five different requests give the same song folders as five `generate` runs; bad rows
are reported and the others complete; --resume after an interruption redoes only the unfinished (and damaged) songs."""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import ABC_CAP, expected, rows, write_requests  # noqa: E402

from yue2_core.artifacts import UMASK  # noqa: E402

STEPS = "2"


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_batch_equals_generate_runs_and_reports_bad_rows(tmp_path, tiny_ckpt, engine, capsys):
    from yue2_core.__main__ import main
    from yue2_core.artifacts import save_song
    too_long = {"id": "too-long", "style": "x", "lyrics": "y", "cot": "off",
                "semantic_sampling": {"max_tokens": 24570, "min_tokens": 1}}
    req = write_requests(tmp_path / "in", extra=[{"id": "bad", "style": "x", "lyrics": "y", "colour": "red"}, too_long],
                         lines=["{not json"])
    out = tmp_path / "batch"
    rc = main(["batch", str(req), "--output", str(out), "--checkpoint", tiny_ckpt, "--device", "cpu",
               "--steps", STEPS, "--max-abc-tokens", str(ABC_CAP)])
    err = capsys.readouterr().err
    assert rc == 1  # a row failed: non-zero, as the vendor's
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert (summary["complete"], summary["expected"], summary["failed"]) == (5, 8, 3)
    by_id = {r["id"]: r for r in summary["results"]}
    assert "'colour'" in by_id["bad"]["error"] and by_id["bad"]["line"] == 6
    assert "s of music fit" in by_id["too-long"]["error"] and "at most" in by_id["too-long"]["error"]
    assert any(r["id"] is None and "line 8 is not JSON" in r["error"] for r in summary["results"])
    assert "5 of 8 complete, 3 failed" in err and "full-model" in err and "tok/s aggregate" in err
    assert "[short] warning: lyrics are empty: this is NOT an instrumental switch" in err  # new-user review
    # rows run one at a time on the CPU: without --max-batch each song is saved before the next starts
    assert summary["settings"]["max_batch"] == 1 and "songs one at a time, each saved before the next starts" in err
    settings = summary["settings"]  # new-user finding: what made the songs, for a later --resume
    assert (settings["max_abc_tokens"], settings["max_seconds"], settings["device"]) == (ABC_CAP, None, "cpu")
    assert settings["checkpoint"] == os.path.abspath(tiny_ckpt) and settings["loras"] == [] and settings["vae"] is None
    assert sorted(p.name for p in out.iterdir()) == sorted(["batch.json"] + [r["id"] for r in rows()])
    alone = tmp_path / "alone"
    for row in rows():
        request, budgets = expected(row)
        song = engine.generate(request, budgets, steps=int(STEPS))
        single = _files(save_song(song, alone / row["id"]))
        batched = _files(out / row["id"])
        assert single.keys() == batched.keys(), row["id"]
        for name in single:  # timings differ (result.json, plan.json and its manifest); the rest byte for byte
            if name == "plan.json":
                a, b = json.loads(single[name]), json.loads(batched[name])
                a.pop("timing"), b.pop("timing")
                assert a == b, row["id"]
            elif name not in ("result.json", "plan_manifest.json"):
                assert single[name] == batched[name], (row["id"], name)
        result = json.loads(batched["result.json"])
        assert result["status"] == "complete" and result["semantic"]["seed"] == row["seed"]
    assert by_id["off-cfg"]["semantic_tokens"] <= 25 and by_id["short"]["semantic_tokens"] <= 10


def test_resume_redoes_only_unfinished_and_damaged_songs(tmp_path, engine, monkeypatch, capsys):
    from yue2_core import artifacts
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.errors import ArtifactError
    req = write_requests(tmp_path / "in")
    out = tmp_path / "batch"
    ids = [r["id"] for r in rows()]
    saved, real = [], artifacts.save_song

    def interrupted_at_third(song, path, lineage=None):
        saved.append(song.request.id)
        if len(saved) == 3:
            raise KeyboardInterrupt  # what Ctrl-C / SIGTERM raise in the CLI
        return real(song, path, lineage)
    monkeypatch.setattr(artifacts, "save_song", interrupted_at_third)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine)
    with pytest.raises(KeyboardInterrupt):
        run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, max_batch=2), **kw)
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert summary["interrupted"] and (summary["complete"], summary["pending"]) == (2, 3)
    assert sorted(p.name for p in out.iterdir()) == sorted(["batch.json", *ids[:2]])  # nothing half-written
    first_codes = (out / ids[0] / "semantic.npy").read_bytes()
    with open(out / ids[0] / "latent.npy", "ab") as fh:  # damage the first song
        fh.write(b"\0")
    with pytest.raises(ArtifactError, match="add --resume"):
        run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP), **kw)
    saved.clear()
    monkeypatch.setattr(artifacts, "save_song", lambda song, path, lineage=None: (saved.append(song.request.id),
                                                                                   real(song, path, lineage))[1])
    rc = run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, max_batch=2, resume=True), **kw)
    assert rc == 0
    assert sorted(saved) == sorted([ids[0], *ids[2:]])  # the verified second song is not run again
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert (summary["complete"], summary["failed"], summary["pending"]) == (5, 0, 0)
    assert [r["resumed"] for r in summary["results"]] == [False, True, False, False, False]
    kept = summary["results"][1]  # the resumed row keeps what its first run reported (read from its result.json)
    earlier = json.loads((out / ids[1] / "result.json").read_text("utf-8"))
    assert kept["audio_seconds"] == earlier["audio_seconds"] > 0 and kept["semantic_tokens"] == earlier["frames"] > 0
    assert kept["abc_tokens"] == summary["results"][1].get("abc_tokens") == len(  # new-user finding: it was missing
        np.load(out / ids[1] / "abc_tokens.npy")) > 0
    assert kept["timing"] == earlier["timing"] and kept["timing"]
    assert (out / ids[0] / "semantic.npy").read_bytes() == first_codes  # redone: the same song again
    artifacts.load_song(out / ids[0])
    err = capsys.readouterr().err
    assert "redoing" in err and "the damaged folder is kept as" in err
    aside = [p for p in out.iterdir() if p.name.startswith(f".{ids[0]}.set-aside-")]  # set aside, never deleted
    assert len(aside) == 1 and (aside[0] / "latent.npy").read_bytes().endswith(b"\0"), sorted(out.iterdir())
    assert (out / "batch.json").stat().st_mode & 0o044 == 0o044 & ~UMASK  # readable as the song files are


def test_table_gives_long_errors_in_full():
    from yue2_core.batch.summary import BatchSummary
    s = BatchSummary()
    long = "line 2: semantic_sampling: " + "x" * 120 + " the end"
    s.add(1, "ok", "complete", audio_seconds=2.0, semantic_tokens=50, abc_tokens=37)
    s.add(2, "short", "failed", stage="validate", error=long)
    s.add(3, "brief", "failed", stage="validate", error="brief error")
    table = s.table()
    head, _, first = table.splitlines()[:3]
    assert head.split()[4:7] == ["audio", "s", "abc"] and first.split()[4:7] == ["2.00", "37", "50"]
    assert "errors in full:" in table and f"line 2 (short): {long.removeprefix('line 2: ')}" in table
    assert "line 2 (short): line 2:" not in table  # the line named once
    assert "line 3 (brief)" not in table  # an error the table shows whole is not repeated


def test_a_bad_adapter_or_vae_is_refused_before_the_batch_folder_is_made(tmp_path, tiny_ckpt, capsys):
    """Break-it finding: a bad --lora failed only when the engine loaded, after batch.json (3 rows "pending") was
    written, so the same command again needed --resume; now the adapter and VAE files are read before any output."""
    from yue2_core.__main__ import main
    req = write_requests(tmp_path / "in")
    bad = tmp_path / "p.safetensors"
    torch_save = __import__("torch").save
    torch_save({"a": __import__("torch").zeros(2)}, bad)
    text = tmp_path / "vae.safetensors"
    text.write_text("not a VAE")
    for option in (["--lora", str(bad)], ["--vae", str(text)]):
        out = tmp_path / ("out" + option[0])
        rc = main(["batch", str(req), "--output", str(out), "--checkpoint", tiny_ckpt, "--device", "cpu",
                   "--offline", *option])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and option[1] in err, err
        assert not out.exists()


def test_synthetic_music_note_follows_the_rows_budgets(tmp_path, tiny_ckpt, capsys):
    """New-user finding: rows that each set a short music budget still got "each song decodes its whole music budget
    (9,000 tokens …)". The note now names the largest budget among the rows, and is left out when every row is
    short (≤ 10 s). (An output folder with a foreign file stops both runs before any song.)"""
    from yue2_core.__main__ import main
    for extra, expected_note in (([], None), ([{"id": "long", "style": "x", "lyrics": "y", "cot": "off",
                                                 "semantic_sampling": {"max_tokens": 1500, "min_tokens": 1}}],
                                              "whole music budget (up to 1,500 tokens = 60 s")):
        req = write_requests(tmp_path / f"in{len(extra)}", extra=extra)
        out = tmp_path / f"out{len(extra)}"
        out.mkdir()
        (out / "holiday.jpg").write_bytes(b"x")
        rc = main(["batch", str(req), "--output", str(out), "--checkpoint", tiny_ckpt, "--device", "cpu",
                   "--offline", "--resume"])
        err = capsys.readouterr().err
        assert rc == 2 and "holiday.jpg" in err, err
        if expected_note is None:
            assert "never end the music" not in err, err
        else:
            assert expected_note in err, err
    # second break-it review: a missing request file is the error before any note; a file of invalid rows gets none
    rc = main(["batch", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o"), "--checkpoint", tiny_ckpt,
               "--device", "cpu", "--offline"])
    err = capsys.readouterr().err
    assert rc == 2 and "does not exist" in err and "NOTE" not in err, err

