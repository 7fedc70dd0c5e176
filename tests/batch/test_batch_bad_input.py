"""Bad batch input, each refused with a specific message: per row (the others run) or for the whole batch (before
any song runs)."""
import json
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import ABC_CAP, SCORE, rows, write_requests  # noqa: E402

from yue2_core.batch import BatchOptions, check_context, read_requests, run_batch  # noqa: E402
from yue2_core.errors import ArtifactError, RequestError  # noqa: E402


def _errors(tmp_path, lines: list[str]) -> dict:
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    good, bad = read_requests(path)
    return {b.line: b.message for b in bad}, good


def test_bad_rows_each_named(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ok.abc").write_text(SCORE, "utf-8")
    (tmp_path.parent / "outside.abc").write_text(SCORE, "utf-8")
    lines = [
        '{"id": "ok", "style": "pop", "lyrics": "la", "abc_path": "sub/ok.abc"}',
        '{"id": "x", "style": "pop",',                                           # 2 not JSON
        '{"id": "ok", "style": "pop"}',                                          # 3 duplicate id
        '{"id": "../evil", "style": "pop"}',                                     # 4 unsafe id
        '{"id": "CON", "style": "pop"}',                                         # 5 reserved name
        '{"id": "u", "style": "pop", "colour": "red", "eval_pos": 1, "lang": "en"}',  # 6 unknown field
        f'{{"id": "both", "abc": {json.dumps(SCORE)}, "abc_path": "sub/ok.abc"}}',    # 7 abc + abc_path
        '{"id": "out", "abc_path": "../outside.abc"}',                           # 8 outside the tree
        '{"id": "missing", "abc_path": "sub/none.abc"}',                         # 9 missing
        '{"id": "tags", "style": "a", "tags": "b"}',                             # 10 style ≠ tags
        '{"id": "prompt", "style": "a", "lyrics": "b", "prompt": "something else"}',  # 11 prompt mismatch
        '[1, 2]',                                                                # 12 not an object
        '{"id": "samp", "semantic_sampling": {"top_k": 0}}',                     # 13 bad override
        '{"id": "samp2", "abc_sampling": {"colour": 1}}',                        # 14 unknown override
        '{"style": "no id"}',                                                    # 15 no id
        '{"id": "short", "semantic_sampling": {"max_tokens": 50}}',              # 16 max under the preset's min
        '{"id": "OK", "style": "pop"}',                                          # 17 "ok" but for case
        '{"id": "twice", "style": "pop", "style": "rock"}',                      # 18 a field given twice
        '{"id": "big", "seed": 1' + "0" * 5000 + '}',                             # 19 a 5,001-digit number
        "[" * 100000 + "]" * 100000,                                             # 20 nested too deep
    ]
    errors, good = _errors(tmp_path, lines)
    assert [g.id for g in good] == ["ok"] and good[0].request.abc == SCORE
    assert "line 2 is not JSON" in errors[2]
    assert "id 'ok' is already used on line 1" in errors[3]
    assert "not a safe folder name" in errors[4] and "not a safe folder name" in errors[5]
    assert "unknown field(s) 'colour'" in errors[6] and "eval_pos" not in errors[6]
    assert "'abc' and 'abc_path' are both given" in errors[7]
    assert "points outside the request file's folder" in errors[8]
    assert "does not exist" in errors[9]
    assert "'style' and 'tags' are both given and differ" in errors[10]
    assert "'prompt' does not equal" in errors[11]
    assert "not an object" in errors[12]
    assert "semantic_sampling: top_k must be ≥ 1" in errors[13]  # the field named once (not "… semantic sampling:")
    assert "unknown sampling fields ['colour']" in errors[14]
    assert "has no 'id'" in errors[15]
    assert "id 'OK' differs from 'ok' (line 1) only in case" in errors[17]
    assert "field 'style' is given twice" in errors[18]
    assert "a number with thousands of digits" in errors[19]
    assert "nests arrays or objects too deeply" in errors[20]
    assert "min_tokens must be in [0, max_tokens=50], got 200" in errors[16]
    assert "preset's min_tokens is 200" in errors[16] and '"min_tokens": 0, "max_tokens": 50' in errors[16]
    assert len(errors) == 19


def test_matching_prompt_and_metadata_accepted(tmp_path):
    from yue2_core.protocol import SongRequest
    text = SongRequest("a", "b", cot="melody").text()
    errors, good = _errors(tmp_path, [json.dumps({"id": "p", "style": "a", "lyrics": "b", "cot": "melody",
                                                  "prompt": text, "clip_id": 4, "eval_row": 2})])
    assert not errors and good[0].request.cot == "melody"


def test_empty_and_unreadable_request_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n# a comment\n", "utf-8")
    with pytest.raises(RequestError, match="holds no requests"):
        read_requests(tmp_path / "empty.jsonl")
    with pytest.raises(RequestError, match="does not exist"):
        read_requests(tmp_path / "none.jsonl")
    (tmp_path / "latin.jsonl").write_bytes(b'{"id": "a", "style": "caf\xe9"}\n')
    with pytest.raises(RequestError, match="not UTF-8"):
        read_requests(tmp_path / "latin.jsonl")


def test_prompt_plus_budget_over_context_says_the_seconds_that_fit(tmp_path, engine):
    errors, good = _errors(tmp_path, [
        '{"id": "long", "cot": "off", "style": "s", "lyrics": "l", "semantic_sampling": {"max_tokens": 24570}}',
        '{"id": "abc", "style": "s", "lyrics": "l", "abc_sampling": {"max_tokens": 24570, "min_tokens": 1}}'])
    from yue2_core.errors import BudgetError
    with pytest.raises(BudgetError, match=r"at most \d+ music tokens = [\d.]+ s of music fit"):
        check_context(good[0], engine.tokenizer.encode)
    with pytest.raises(BudgetError, match=r"ABC budget \(24570 tokens\) exceeds"):
        check_context(good[1], engine.tokenizer.encode)


def _never():
    raise AssertionError("the engine must not load")


def test_output_with_foreign_files_refused_before_any_work(tmp_path, engine):
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"x")
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    with pytest.raises(ArtifactError, match="holds files that are not this batch's: holiday.jpg"):
        run_batch(BatchOptions(str(req), str(out), resume=True), **kw)
    (out / "holiday.jpg").unlink()
    (out / rows()[0]["id"]).write_text("a file, not a song folder")
    with pytest.raises(ArtifactError, match="not this batch's"):
        run_batch(BatchOptions(str(req), str(out), resume=True), **kw)
    assert sorted(p.name for p in out.iterdir()) == [rows()[0]["id"]]  # nothing written


def test_max_batch_over_budget_names_the_largest_that_fits(tmp_path, engine):
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never, weights_bytes=0)
    with pytest.raises(RequestError) as exc:  # 5 songs: 64 means 5 rows, and fewer fit
        run_batch(BatchOptions(str(req), str(out), max_batch=64, budget_gib=0.001, max_abc_tokens=ABC_CAP), **kw)
    most = int(re.search(r"--max-batch 64 \(the queue's 5 songs\) does not fit: at most (\d+) songs fit",
                         str(exc.value)).group(1))
    assert 1 <= most < 5 and f"use --max-batch {most}" in str(exc.value)
    assert "MiB" in str(exc.value) and "0.000 GiB" not in str(exc.value)  # small sizes in readable units
    assert not out.exists()
    with pytest.raises(AssertionError, match="must not load"):  # more rows than songs: sized for the 5 songs
        run_batch(BatchOptions(str(req), str(out), max_batch=64, budget_gib=0.002, max_abc_tokens=ABC_CAP), **kw)
    assert json.loads((out / "batch.json").read_text("utf-8"))["settings"]["max_batch"] == 5
    import shutil
    shutil.rmtree(out)
    with pytest.raises(RequestError, match="not even one song fits"):
        run_batch(BatchOptions(str(req), str(out), budget_gib=0.001, max_abc_tokens=ABC_CAP),
                  **{**kw, "weights_bytes": 2 ** 30})
    with pytest.raises(AssertionError, match="must not load"):  # the largest that fits is accepted
        run_batch(BatchOptions(str(req), str(out), max_batch=most, budget_gib=0.001, max_abc_tokens=ABC_CAP), **kw)
    assert json.loads((out / "batch.json").read_text("utf-8"))["settings"]["max_batch"] == most


def test_rows_split_at_newlines_only_and_reserved_names(tmp_path):
    """U+2028 / U+2029 / U+0085 inside a JSON string stay in the row (json.dumps(ensure_ascii=False) writes them raw);
    an id naming the summary file and an abc_path with a NUL are that row's errors."""
    lyrics = "line one\u2028line two\u2029para\u0085next"
    lines = [json.dumps({"id": "uni", "style": "pop", "lyrics": lyrics}, ensure_ascii=False),
             '{"id": "batch.json", "style": "pop"}',
             '{"id": "Batch.JSON", "style": "pop"}',
             json.dumps({"id": "nulpath", "abc_path": "a\u0000b"})]
    errors, good = _errors(tmp_path, lines)
    assert [g.id for g in good] == ["uni"] and good[0].request.lyrics == lyrics
    assert "reserved" in errors[2] and "reserved" in errors[3]
    assert "NUL" in errors[4]
    assert len(errors) == 3


def test_resume_never_removes_what_it_should_not(tmp_path, engine):
    """--resume leaves a song whose score.abc the user edited (refused, folder kept) and a symlinked song folder
    (refused, the target untouched); a bad --budget is refused before any folder is touched; a batch.json that
    cannot be written is a clear ArtifactError."""
    from yue2_core.artifacts import save_song
    from batch_data import expected
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    r0 = rows()[1]  # melody-score: a given score
    request, budgets = expected(r0)
    save_song(engine.generate(request, budgets, steps=1), out / r0["id"])
    score = out / r0["id"] / "score.abc"
    score.write_text(score.read_text("utf-8").replace("|", " |"), "utf-8")  # the user's edit
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "audio.flac").write_bytes(b"not audio")
    (out / rows()[2]["id"]).symlink_to(elsewhere, target_is_directory=True)
    r3 = rows()[0]  # break-it finding: a tag editor's change to audio.flac made --resume delete and redo the song
    request3, budgets3 = expected(r3)
    save_song(engine.generate(request3, budgets3, steps=1), out / r3["id"])
    tagged = out / r3["id"] / "audio.flac"
    with open(tagged, "ab") as fh:
        fh.write(b"TAGTAG")
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    with pytest.raises(RequestError, match="--budget must be a positive, finite number"):
        run_batch(BatchOptions(str(req), str(out), resume=True, budget_gib=float("inf"), max_abc_tokens=ABC_CAP), **kw)
    assert score.exists() and (elsewhere / "audio.flac").exists()
    with pytest.raises(AssertionError, match="must not load"):  # the other rows would run
        run_batch(BatchOptions(str(req), str(out), resume=True, max_abc_tokens=ABC_CAP), **kw)
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    by_id = {r["id"]: r for r in summary["results"]}
    assert "score.abc was edited" in by_id[r0["id"]]["error"] and by_id[r0["id"]]["status"] == "failed"
    assert "symbolic link" in by_id[rows()[2]["id"]]["error"]
    # its samples are the saved ones (the manifest's samples_sha256, stop 47): the song verifies as it is, and is
    # kept for what differs (made with --steps 1); a song recording no such hash is refused for the changed audio
    assert "holds a verified song" in by_id[r3["id"]]["error"] and "--steps 1" in by_id[r3["id"]]["error"]
    assert tagged.read_bytes().endswith(b"TAGTAG")  # kept as the user left it
    assert " |" in score.read_text("utf-8") and (elsewhere / "audio.flac").read_bytes() == b"not audio"
    (out / "batch.json").unlink()
    (out / "batch.json").mkdir()  # the summary cannot be written
    with pytest.raises(ArtifactError, match="cannot write .*batch.json.*--resume"):
        run_batch(BatchOptions(str(req), str(out), resume=True, max_abc_tokens=ABC_CAP), **kw)


def test_resume_with_other_caps_names_the_song_settings_and_this_runs(tmp_path, engine):
    """New-user finding: a --resume with another --max-seconds refused every song without saying what differs; the
    refusal names the setting, the song's value and this run's."""
    from yue2_core.artifacts import save_song
    from yue2_core.batch.driver import resume_state
    req = write_requests(tmp_path / "in")
    made = {i.id: i for i in read_requests(req, max_abc_tokens=ABC_CAP)[0]}["off-cfg"]  # music max_tokens 25
    folder = save_song(engine.generate(made.request, made.budgets, steps=1), tmp_path / "out" / "off-cfg")
    assert resume_state(folder, made, 1) == ("done", None)
    capped = {i.id: i for i in read_requests(req, max_seconds=0.4, max_abc_tokens=ABC_CAP)[0]}["off-cfg"]
    state, why = resume_state(folder, capped, 1)
    assert state == "refuse" and "music max_tokens 25 (this run: 10)" in why and "--max-seconds" in why, why


def test_resume_notes_another_nar_arithmetic(tmp_path, engine, capsys):
    """Stop-53 review: a --resume whose NAR multiplies otherwise than the songs in the folder (batch.json
    `settings.nar_linears`, "w8a8" or null, recorded by a batch without Ray) is noted in `render`'s words and runs
    (was: not compared at all); not refused as YUE2_LORA_INT8 is — under auto the arithmetic follows the GPU, as the
    device is not compared either (driver._nar_linears_note). The same arithmetic, an older batch.json without the
    key and a run that records none (Ray: its workers decide) say nothing."""
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    (out / rows()[0]["id"]).mkdir(parents=True)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)

    def resume(settings, run):
        (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": {"steps": 2, **settings}}), "utf-8")
        capsys.readouterr()
        with pytest.raises(AssertionError, match="must not load"):  # past the checks: the rows left run
            run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_abc_tokens=ABC_CAP, run=run), **kw)
        return [line for line in capsys.readouterr().err.splitlines() if "multiplied" in line]
    [note] = resume({"nar_linears": "w8a8"}, {"nar_linears": None})
    assert note.startswith(f"note: the NAR of the songs in {out} (its batch.json) multiplied with W8A8 products") \
        and "this run uses bf16 layers" in note and "set YUE2_NAR_LINEARS=w8a8 on a CUDA device to make the rest" \
        in note, note
    [note] = resume({"nar_linears": None}, {"nar_linears": "w8a8"})
    assert "multiplied with bf16 layers; this run uses W8A8 products" in note and "YUE2_NAR_LINEARS=bf16" in note
    for settings, run in (({"nar_linears": "w8a8"}, {"nar_linears": "w8a8"}), ({"nar_linears": None},
                          {"nar_linears": None}), ({}, {"nar_linears": "w8a8"}), ({"nar_linears": "w8a8"}, {})):
        assert resume(settings, run) == [], (settings, run)


def test_resume_with_other_caps_than_recorded_is_refused_as_a_whole(tmp_path, engine):
    """A --resume whose --max-seconds / --max-abc-tokens differ from the caps batch.json recorded is refused before
    any work (exit 2 in the CLI), naming the recorded caps, as --steps is; a record without caps (older batch.json)
    is not checked; a damaged cap is named."""
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    (out / rows()[0]["id"]).mkdir(parents=True)  # a song of the batch is there: the record matters
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)

    def record(settings):
        (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": settings}), "utf-8")
    record({"steps": 2, "max_seconds": 2.0, "max_abc_tokens": 16})
    with pytest.raises(RequestError, match=r"--max-seconds 2\.0 --max-abc-tokens 16 \(its batch\.json\)"):
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_seconds=3.0, max_abc_tokens=32), **kw)
    with pytest.raises(RequestError, match="no --max-seconds"):
        record({"steps": 2, "max_seconds": None, "max_abc_tokens": 16})
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_seconds=3.0, max_abc_tokens=16), **kw)
    record({"steps": 2, "max_seconds": "2", "max_abc_tokens": 16})
    with pytest.raises(RequestError, match="settings.max_seconds is \"2\""):
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_seconds=2.0, max_abc_tokens=16), **kw)
    # values no command line gives: named as a damaged file, not as options to resume "with" (break-it, stop 32)
    for settings, words in (({"steps": 10 ** 30}, "settings.steps is 1000000000000000000000000000000, outside 1–1000"),
                            ({"steps": 2, "max_seconds": float("nan")}, "settings.max_seconds is NaN, not a positive"),
                            ({"steps": 2, "ode_method": "rk4"}, 'settings.ode_method is "rk4", not one of midpoint'),
                            ({"steps": 2, "checkpoint": 5}, "settings.checkpoint is 5, not a path (text)")):
        record(settings)
        with pytest.raises(RequestError, match="the file was edited or damaged") as e:
            run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_seconds=2.0, max_abc_tokens=16),
                      **kw)
        assert words in str(e.value), str(e.value)
    record({"steps": 2})  # before the caps were recorded: nothing to compare; the rows run (the engine would load)
    with pytest.raises(AssertionError, match="must not load"):
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_seconds=3.0, max_abc_tokens=ABC_CAP),
                  **kw)


def test_resume_with_other_weights_than_recorded_is_refused_as_a_whole(tmp_path, engine):
    """Break-it finding: a --resume with another --checkpoint / --dtype / --lora / --vae than batch.json records
    would finish an album with another model; it is refused before any work, naming what the batch was made with;
    the same weights (or a record without them) pass, and the device may differ."""
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    (out / rows()[0]["id"]).mkdir(parents=True)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    made = {"checkpoint": "/m/a.safetensors", "device": "cuda", "dtype": "bf16",
            "loras": [["/m/l.safetensors", 1.0, 0.5]], "vae": None}
    (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": {"steps": 2, **made}}), "utf-8")

    def resume(**run):
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_abc_tokens=ABC_CAP,
                               run={**made, **run}), **kw)
    for run, words in (({"checkpoint": "/m/b.safetensors"}, "--checkpoint /m/a.safetensors"),
                       ({"dtype": "fp32"}, "--dtype bf16"),
                       ({"loras": []}, "--lora /m/l.safetensors:1:0.5"),
                       ({"loras": [["/m/l.safetensors", 1.0, 1.0]]}, "--lora /m/l.safetensors:1:0.5"),
                       ({"vae": "/m/v.safetensors"}, "no --vae")):
        with pytest.raises(RequestError, match="its batch.json") as e:
            resume(**run)
        assert words in str(e.value), (run, str(e.value))
    with pytest.raises(AssertionError, match="must not load"):  # the same weights on another device: the rows run
        resume(device="cpu")


def test_abc_path_is_read_as_generate_reads_abc_file_and_checked(tmp_path, engine, capsys):
    """Break-it findings: abc_path was read with utf-8-sig and universal newlines (a BOM dropped, CRLF → LF), so the
    batch song differed from `generate --abc-file` on the same file, and no score finding was printed; now the bytes
    are decoded as they are and the row gets generate's score check (dialect, BOM, CR, control characters)."""
    import io
    (tmp_path / "s").mkdir()
    data = b"\xef\xbb\xbf" + SCORE.replace("\n", "\r\n").replace("K:", "K:\x07", 1).encode("utf-8")
    (tmp_path / "s" / "bom.abc").write_bytes(data)
    req = tmp_path / "r.jsonl"
    req.write_text('{"id": "bom", "style": "pop", "lyrics": "la", "abc_path": "s/bom.abc"}\n', "utf-8")
    items, bad = read_requests(req, max_abc_tokens=ABC_CAP)
    assert not bad and items[0].request.abc == data.decode("utf-8")
    stream = io.StringIO()
    with pytest.raises(AssertionError, match="must not load"):
        run_batch(BatchOptions(str(req), str(tmp_path / "out"), max_abc_tokens=ABC_CAP), tokenizer=engine.tokenizer,
                  dims=engine.info.dims, engine_factory=_never, stream=stream)
    said = stream.getvalue()
    assert "[bom] warning: the score starts with a byte-order mark" in said, said
    assert "CRLF (Windows) line endings" in said and "control character U+0007 (BEL)" in said, said


def test_a_users_folder_named_like_an_id_is_never_removed(tmp_path, engine):
    """Break-it finding (data loss): a folder of the user's own files named like a request id, in a folder with no
    batch.json, was called "a batch" and `--resume` deleted it to redo the song. Now: without --resume the message
    says no batch ran there; with it the row is refused and the files stay."""
    from yue2_core.batch.driver import check_output, resume_state
    req = write_requests(tmp_path / "in")
    item = read_requests(req, max_abc_tokens=ABC_CAP)[0][0]
    out = tmp_path / "songs"
    mine = out / item.id
    mine.mkdir(parents=True)
    (mine / "audio.flac").write_bytes(b"MY RECORDING")
    (mine / "config.json").write_text('{"mine": true}')
    with pytest.raises(ArtifactError, match="but no batch.json: they were not written by `batch`"):
        check_output(out, {item.id}, resume=False)
    state, why = resume_state(mine, item, 2)
    assert state == "refuse" and "holds no result.json" in why, why
    assert (mine / "audio.flac").read_bytes() == b"MY RECORDING" and (mine / "config.json").exists()


def test_an_unreadable_batch_json_is_not_replaced(tmp_path, engine, monkeypatch):
    """Break-it finding: a batch.json that cannot be read (chmod 000 for an ordinary user) was taken as absent on
    --resume and overwritten. The read error is injected, so the test also runs as root (which reads any file)."""
    from yue2_core.batch import driver
    out = tmp_path / "b"
    out.mkdir()
    (out / "batch.json").write_text("{}")
    real = open

    def refusing(path, *a, **kw):
        if str(path) == str(out / "batch.json"):
            raise PermissionError(13, "Permission denied")
        return real(path, *a, **kw)
    monkeypatch.setattr(driver, "open", refusing, raising=False)
    with pytest.raises(ArtifactError, match="cannot read .*batch.json \\(Permission denied\\); resuming would replace"):
        driver.check_output(out, {"a"}, resume=True)
    assert (out / "batch.json").read_text() == "{}"


def test_resume_with_rows_removed_names_the_songs_and_the_fix(tmp_path):
    """Break-it finding: a resume whose request file lost rows said the batch's own songs were "not this batch's"
    and advised a new folder; now it says they are songs of rows this file lacks."""
    from yue2_core.batch.driver import check_output
    out = tmp_path / "b"
    for i in ("s1", "s2"):
        (out / i).mkdir(parents=True)
        (out / i / "result.json").write_text("{}")
    (out / "batch.json").write_text("{}")
    with pytest.raises(ArtifactError, match="holds songs whose ids are not rows of this request file: s2. Resume"):
        check_output(out, {"s1"}, resume=True)


def test_a_utf16_request_file_is_named(tmp_path):
    """Break-it finding: a UTF-16 request file got only "invalid start byte at byte 0"."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "style": "pop", "lyrics": "x"}\n', encoding="utf-16")
    with pytest.raises(RequestError, match="is UTF-16 LE text; the request file must be UTF-8"):
        read_requests(path)


def test_resume_compares_each_songs_weights_with_this_run(tmp_path, engine, tiny_ckpt):
    """Break-it finding (stop 39): --resume compared a song's request, steps and budgets, not what made it — a batch
    stopped before its record counted a song (or with batch.json lost), resumed with another checkpoint or another
    file at the same path, finished the album with two models. Each verified song's config.json is now compared
    with this run's checkpoint (path and sample hash), --dtype, --lora and --vae."""
    import os
    from yue2_core.artifacts import save_song
    from yue2_core.batch.driver import _made_otherwise, resume_state
    from yue2_core.weights.checkpoint import content_sample
    req = write_requests(tmp_path / "in")
    made = {i.id: i for i in read_requests(req, max_abc_tokens=ABC_CAP)[0]}["off-cfg"]
    folder = save_song(engine.generate(made.request, made.budgets, steps=1), tmp_path / "out" / "off-cfg")
    same = {"checkpoint": os.path.abspath(tiny_ckpt), "dtype": "bf16", "loras": [], "vae": None}
    assert resume_state(folder, made, 1, run=same) == ("done", None)
    for change, words in (({"checkpoint": str(tmp_path / "other.safetensors")}, "it was made with the checkpoint"),
                          ({"dtype": "fp32"}, "it was made in bfloat16, this run uses --dtype fp32"),
                          ({"loras": [[str(tmp_path / "a.safetensors"), 1.0, 0.5]]}, "it was made with the LoRAs none"),
                          ({"vae": str(tmp_path / "vae")},
                           "it was decoded with the checkpoint VAE, this run uses --vae")):
        state, why = resume_state(folder, made, 1, run={**same, **change})
        assert state == "refuse" and words in why and "Resume with the song's settings" in why, (change, why)
    # a GPU without native bf16 runs a bf16 request in float32 (pipeline.compute_dtype): the same choice, not refused
    assert _made_otherwise({"model_dtype": "float32", "device": "cuda:0"}, {"dtype": "bf16"}) == []
    assert _made_otherwise({"model_dtype": "float32", "device": "cpu"}, {"dtype": "bf16"}) == [
        "it was made in float32, this run uses --dtype bf16"]
    ck = tmp_path / "ck.safetensors"  # another file later put at the recorded path (same size)
    ck.write_bytes(os.urandom(1 << 20))
    cfg = {"checkpoint": {"path": str(ck), "sample_sha256": content_sample(str(ck))}}
    assert _made_otherwise(cfg, {"checkpoint": str(ck)}) == []
    stat = ck.stat()
    ck.write_bytes(os.urandom(1 << 20))
    os.utime(ck, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10 ** 9))
    assert _made_otherwise(cfg, {"checkpoint": str(ck)}) == [
        f"the checkpoint {ck} is not the file it was made with (the same path, other contents)"]



def test_resume_compares_how_loras_went_onto_int8_layers(monkeypatch):
    """Stop 40: songs record YUE2_LORA_INT8's mode ("weights"."lora_int8"); a --resume under the other mode would
    finish an album whose songs were made two ways."""
    from yue2_core.batch.driver import _made_otherwise
    lora = ["/a.safetensors", 1.0, 1.0]
    cfg = {"weights": {"loras": [{"path": "/a.safetensors", "strength_ar": 1.0, "strength_nar": 1.0}],
                       "lora_int8": "side"}}
    monkeypatch.delenv("YUE2_LORA_INT8", raising=False)
    assert _made_otherwise(cfg, {"loras": [lora]}) == []
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    assert _made_otherwise(cfg, {"loras": [lora]}) == [
        "its LoRAs were applied to the int8 layers as 'side', this run applies them as 'bf16' (YUE2_LORA_INT8)"]
    assert _made_otherwise({"weights": {"loras": []}}, {"loras": []}) == []  # no LoRA: the mode means nothing
    # this run's LoRAs reach no int8 layer (stop 41: float layers only, or a float NAR): the mode changes nothing
    assert _made_otherwise(cfg, {"loras": [lora], "lora_int8": None}) == []


def test_batch_folder_small_cases_from_the_stop_39_review(tmp_path, engine):
    """Break-it findings (stop 39): a file manager's .DS_Store / Thumbs.db in a batch folder made --resume say
    "choose a new folder" (abandoning every finished song); `batch --output` inside another batch's folder was
    accepted (that batch's --resume then refused it); an invisible character (NUL, a DOS Ctrl+Z) in the request
    file gave "column 42: Extra data" without naming it; a claim file name too long for the file system, or a parent
    that cannot be written, ran the batch with no claim."""
    import os
    from yue2_core.artifacts import reserve_output
    from yue2_core.batch.driver import check_output
    out = tmp_path / "album"
    (out / "a").mkdir(parents=True)
    (out / "batch.json").write_text("{}")
    for name in (".DS_Store", "Thumbs.db", "desktop.ini"):
        (out / name).write_bytes(b"\0")
    check_output(out, {"a"}, resume=True)  # accepted: only the file manager's files are extra
    with pytest.raises(ArtifactError, match=r"--output .*nested is inside a batch output folder .* holds batch.json"):
        check_output(out / "nested", {"x"}, resume=False)
    req = tmp_path / "req.jsonl"
    req.write_bytes(b'{"id": "a", "style": "s", "lyrics": "l"}\x1a\n\x00\x00\n')
    _, bad = read_requests(req)
    assert [b.message.split(";")[0] for b in bad] == [
        "line 1 is not JSON (column 41: Extra data, at an invisible character U+001A)",
        "line 2 is not JSON (column 1: Expecting value, at an invisible character U+0000)"]
    long_name = tmp_path / ("L" * 250)  # the claim beside it would be 261 bytes: a hashed name instead
    with reserve_output(long_name, "batch folder", inside_ok=True) as claim:
        assert claim.lock is not None and claim.lock.name.startswith(".yue2-lock-"), claim.lock
        with pytest.raises(ArtifactError, match="is being written by another run"):
            reserve_output(long_name, "batch folder", inside_ok=True)
    locked = tmp_path / "ro"  # a parent this user cannot write (os.open refuses there: root writes anywhere)
    (locked / "album").mkdir(parents=True)
    real_open = os.open

    def refusing_open(path, *args, **kwargs):
        if Path(path).parent == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)
    os.open = refusing_open
    try:
        with reserve_output(locked / "album", "batch folder", inside_ok=True) as claim:
            assert claim.lock == locked / "album" / ".yue2-lock"
            check_output(locked / "album", set(), resume=True)  # the claim inside is the batch's own
            with pytest.raises(ArtifactError, match="is being written by another run"):
                reserve_output(locked / "album", "batch folder", inside_ok=True)
        assert not reserve_output(locked / "new", "batch folder", inside_ok=True).lock  # no folder yet: no place
    finally:
        os.open = real_open


def test_a_song_path_past_the_file_systems_limits_fails_its_row_before_any_work(tmp_path, engine):
    """Review finding (stop 40): an output path longer than PATH_MAX (or holding a name longer than NAME_MAX) was
    found only when the song was saved, after it was computed. Each row's song folder is checked with the other
    validation now: that row fails naming its line and the limit, the others run; a name too long in --output
    itself stops the whole batch with the limit named; `generate`'s output check says the same."""
    import os
    from yue2_core.artifacts import check_output_dir
    from yue2_core.batch.driver import check_output
    long_id = "s" * 180  # the longest id a row may have
    req = tmp_path / "r.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la"}) + "\n"
                   + json.dumps({"id": long_id, "style": "pop", "lyrics": "la"}) + "\n", "utf-8")
    out = tmp_path
    while len(os.fsencode(str(out))) < 3950 - 201:  # "a" saves within PATH_MAX (4096), the long id does not
        out = out / ("d" * 200)
    out = out / ("o" * (3950 - len(os.fsencode(str(out))) - 1))
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    with pytest.raises(AssertionError, match="must not load"):  # row "a" still runs
        run_batch(BatchOptions(str(req), str(out), max_abc_tokens=ABC_CAP), **kw)
    rows_ = {r["id"]: r for r in json.loads((out / "batch.json").read_text("utf-8"))["results"]}
    assert rows_["a"]["status"] == "pending"
    bad = rows_[long_id]
    assert bad["status"] == "failed" and bad["stage"] == "validate", bad
    assert bad["error"].startswith("line 2: song folder ") and "(PATH_MAX 4096)" in bad["error"], bad["error"]
    assert "limit of 4095 bytes for a path" in bad["error"] and len(bad["error"]) < 500, bad["error"]
    with pytest.raises(ArtifactError, match=r"holds a name of 300 bytes \(LLL.*255-byte limit for a name"):
        check_output(tmp_path / ("L" * 300) / "album", {"a"}, resume=False)
    with pytest.raises(ArtifactError, match=r"\(PATH_MAX 4096\)"):
        check_output_dir(out / long_id)


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlap"])
def test_a_full_disk_stops_the_batch_after_the_first_failed_save(tmp_path, engine, monkeypatch, capsys, overlap):
    """Review finding (stop 40): on a full disk every later song was still computed, each then failing at its save,
    and each failure was printed twice (the progress line and the driver's). A save that fails for lack of space
    (ENOSPC / EDQUOT: `errors.DiskFullError`) now stops the batch — with the overlap the render worker stops at
    once and the main thread starts no further AR phase —, says how many songs are left and that --resume
    continues; each failure is printed once; the saved song stays intact and --resume finishes the rest."""
    import errno
    import yue2_core.artifacts as artifacts
    import yue2_core.pipeline as pipeline
    from yue2_core.artifacts import load_song
    req = tmp_path / "r.jsonl"
    req.write_text("".join(json.dumps({"id": i, "style": "pop", "lyrics": "la", "cot": "off", "seed": n,
                                       "semantic_sampling": {"max_tokens": 4, "min_tokens": 1}}) + "\n"
                           for n, i in enumerate("abcd")), "utf-8")
    out = tmp_path / "out"
    saves, renders, real_save, real_render, real_write = [], [], artifacts.save_song, pipeline.render, Path.write_bytes

    def save_song(song, folder, *a, **k):
        saves.append(Path(folder).name)
        return real_save(song, folder, *a, **k)

    def write_bytes(self, data):  # the disk fills up after the first song
        if len(saves) > 1 and self.parent.name.endswith(".partial"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    def render(*a, **k):
        renders.append(1)
        return real_render(*a, **k)
    monkeypatch.setattr(artifacts, "save_song", save_song)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    monkeypatch.setattr(pipeline, "render", render)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine)
    options = dict(steps=1, max_batch=1, overlap=overlap)
    assert run_batch(BatchOptions(str(req), str(out), **options), **kw) == 1
    err = capsys.readouterr().err
    assert saves == ["a", "b"] and len(renders) == 2, (saves, len(renders))  # c and d never rendered
    assert err.count("[b] failed") == 1 and "[b] failed at save: could not save the song to" in err, err
    assert "No space left on device (nothing was written)" in err
    assert "stopped: the disk is full (the save of 'b' failed); 2 songs left not computed, the 1 saved stay as " \
           "they are: free space, then run the same command with --resume to continue" in err, err
    assert "2 not run (the disk is full)" in err
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert summary["stopped"] == "the disk is full" and not summary["interrupted"]
    c_stage = summary["results"][2]["stage"]  # with the overlap c's AR phases run while b is written (stop 41)
    assert c_stage in (("plan", "semantic") if overlap else (None,)), c_stage
    assert [(r["id"], r["status"], r["stage"]) for r in summary["results"]] == [
        ("a", "complete", "complete"), ("b", "failed", "save"), ("c", "pending", c_stage), ("d", "pending", None)]
    assert summary["left_for_resume"] == ["b", "c", "d"]
    assert "disk_full" not in summary["results"][1]
    assert sorted(p.name for p in out.iterdir()) == ["a", "batch.json"]  # nothing half-written
    load_song(out / "a")  # intact
    if overlap:
        return
    monkeypatch.setattr(Path, "write_bytes", real_write)  # space freed
    assert run_batch(BatchOptions(str(req), str(out), resume=True, **options), **kw) == 0
    assert saves == ["a", "b", "b", "c", "d"]


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlap"])
def test_a_full_disk_reports_every_song_as_saved_failed_or_left(tmp_path, engine, monkeypatch, capsys, overlap):
    """Known gap (stop 41): when the disk filled while an AR phase ran, that phase's songs were left "pending" with
    nothing saying they had been computed, and a song that had failed earlier in the stopped batch ("f" at plan
    here) showed as "pending" too. Now batch.json and the report say which songs were saved, which failed (stage
    and error) and which are left for --resume — a pending row with the last AR phase it finished and a note."""
    import errno
    import yue2_core.artifacts as artifacts
    import yue2_core.pipeline as pipeline
    req = tmp_path / "r.jsonl"
    req.write_text("".join(json.dumps({"id": i, "style": "pop", "lyrics": "la", "cot": "off", "seed": n,
                                       "semantic_sampling": {"max_tokens": 4, "min_tokens": 1}}) + "\n"
                           for n, i in enumerate("abcdef")), "utf-8")
    out = tmp_path / "out"
    saves, real_save, real_plan, real_write = [], artifacts.save_song, pipeline.plan, Path.write_bytes

    def save_song(song, folder, *a, **k):
        saves.append(Path(folder).name)
        return real_save(song, folder, *a, **k)

    def write_bytes(self, data):  # the disk fills up at d's save (the first of the second batch)
        if "d" in saves and self.parent.name.endswith(".partial"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    def plan(ar, tok, request, *a, **k):
        if request.id == "f":
            raise RuntimeError("f's plan broke")
        return real_plan(ar, tok, request, *a, **k)
    monkeypatch.setattr(artifacts, "save_song", save_song)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    monkeypatch.setattr(pipeline, "plan", plan)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine)
    options = dict(steps=1, max_batch=3, overlap=overlap)
    assert run_batch(BatchOptions(str(req), str(out), **options), **kw) == 1
    err = capsys.readouterr().err
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    rows_ = {r["id"]: r for r in summary["results"]}
    assert [rows_[i]["status"] for i in "abc"] == ["complete"] * 3
    assert (rows_["d"]["status"], rows_["d"]["stage"]) == ("failed", "save")
    assert (rows_["f"]["status"], rows_["f"]["stage"]) == ("failed", "plan"), rows_["f"]  # was: "pending"
    assert "f's plan broke" in rows_["f"]["error"] and err.count("[f] failed at plan") == 1, err
    e = rows_["e"]
    if e["status"] == "pending":  # its AR phases ran in the batch the disk filled in; it was never saved
        assert e["stage"] == "semantic", e  # was: null, as if never started
        assert e["note"] == ("its lead sheet and music tokens were computed but it was not rendered or saved (the "
                             "disk is full); --resume computes it from the start"), e
    else:  # with the overlap the writer may reach e's save before the render worker stops: the disk is full there
        assert (e["status"], e["stage"]) == ("failed", "save") and overlap, e
    assert summary["stopped"] == "the disk is full"
    assert summary["left_for_resume"] == ["d", "e", "f"]
    assert (summary["complete"], summary["failed"], summary["pending"]) == (3, 2 + (e["status"] == "failed"),
                                                                            int(e["status"] == "pending"))
    assert "  saved: a, b, c\n  failed: d (at save), " in err and "f (at plan)" in err, err
    assert "  left for --resume: d, e, f" in err, err
    if e["status"] == "pending":
        assert "— not computed: e (after semantic, not rendered)" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "batch.json", "c"]  # nothing half-written
    monkeypatch.setattr(Path, "write_bytes", real_write)  # space freed, f's plan mended
    monkeypatch.setattr(pipeline, "plan", real_plan)
    assert run_batch(BatchOptions(str(req), str(out), resume=True, **options), **kw) == 0
    assert saves[-3:] == ["d", "e", "f"] and "left_for_resume" not in json.loads((out / "batch.json").read_text())


def test_resume_under_another_lora_int8_mode_is_refused_as_a_whole(tmp_path, engine):
    """Break-it finding: `batch --resume` under another YUE2_LORA_INT8 refused only the finished songs and computed
    the rows left in the other mode — an album made two ways. batch.json `settings` records the mode (`lora_int8`,
    for --lora on an int8 checkpoint) and a resume under the other one stops before any work; a batch.json without
    the key (older) compares nothing."""
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    (out / rows()[0]["id"]).mkdir(parents=True)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    made = {"checkpoint": "/m/a.safetensors", "dtype": "bf16", "loras": [["/m/l.safetensors", 1.0, 1.0]],
            "vae": None, "lora_int8": "side"}

    def resume(settings, **run):
        (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": {"steps": 2, **settings}}), "utf-8")
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_abc_tokens=ABC_CAP,
                               run={**made, **run}), **kw)
    with pytest.raises(RequestError, match=r"was made with YUE2_LORA_INT8=side \(its batch.json\)"):
        resume(made, lora_int8="bf16")
    for settings in (made, {k: v for k, v in made.items() if k != "lora_int8"}):  # the same mode; an older record
        with pytest.raises(AssertionError, match="must not load"):
            resume(settings)
    with pytest.raises(RequestError, match="settings.lora_int8 is 5"):
        resume({**made, "lora_int8": 5})
    for settings, now in ((made, None), ({**made, "lora_int8": None}, "bf16")):  # one side on float layers only
        with pytest.raises(AssertionError, match="must not load"):  # (stop 41): nothing to compare
            resume(settings, lora_int8=now)


def test_resume_compares_the_vendor_vae_folder(tmp_path, engine):
    """Break-it finding: a batch made from a vendor model folder, resumed after another VAE folder appeared beside
    the model (which `find_vae_folder` then prefers), finished with no note — songs decoded by two VAEs. Each song's
    recorded VAE folder (sample hash, else path) is compared with the one this run uses, and batch.json's record
    stops the whole batch before any work."""
    from types import SimpleNamespace
    from yue2_core.batch.driver import _made_otherwise, vendor_vae_record
    legacy, standard = {"path": "/m/YuE2-Vae-legacy", "sample_sha256": "a" * 64}, {"path": "/m/YuE2-Vae",
                                                                                    "sample_sha256": "b" * 64}
    cfg = {"checkpoint": {"layout": "vendor", "path": "/m/YuE2-3B", "files": {"vae": legacy["path"]},
                          "vae_sample_sha256": legacy["sample_sha256"]}, "weights": {"loras": [], "vae": None}}
    assert _made_otherwise(cfg, {"vendor_vae": legacy}) == []
    assert _made_otherwise(cfg, {"vendor_vae": standard}) == [
        "it was decoded with the VAE folder /m/YuE2-Vae-legacy, this run would decode with /m/YuE2-Vae (found "
        "beside the model now)"]
    assert _made_otherwise(cfg, {"vendor_vae": {**legacy, "sample_sha256": "c" * 64}})[0].endswith("(other weights)")
    older = {"checkpoint": {**cfg["checkpoint"], "vae_sample_sha256": None}, "weights": cfg["weights"]}
    assert _made_otherwise(older, {"vendor_vae": {**legacy, "sample_sha256": "c" * 64}}) == []  # by path
    assert _made_otherwise(older, {"vendor_vae": standard}) != []
    assert vendor_vae_record(SimpleNamespace(layout="comfy", files={})) is None
    assert vendor_vae_record(SimpleNamespace(layout="vendor", files={"vae": "/m/v"}), "/x/vae.safetensors") is None
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    (out / rows()[0]["id"]).mkdir(parents=True)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": {"steps": 2, "vendor_vae": legacy}}))

    def resume(vae):
        run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, max_abc_tokens=ABC_CAP,
                               run={"vendor_vae": vae}), **kw)
    with pytest.raises(RequestError, match=r"was decoded with the VAE folder /m/YuE2-Vae-legacy \(its batch.json\), "
                                           "this run would decode with /m/YuE2-Vae: put that VAE folder back"):
        resume(standard)
    with pytest.raises(AssertionError, match="must not load"):
        resume(legacy)


@pytest.mark.parametrize("name", ["a" * 256, "あ" * 86], ids=["ascii", "utf8"])
def test_a_batch_output_name_over_name_max_is_one_line_before_any_work(tmp_path, engine, name):
    """Break-it finding: `batch --output DIR` whose last name is over 255 bytes died with a traceback
    (`OSError: [Errno 36] File name too long` from the claim, `reserve_output`); it is refused with the limit named,
    as `generate` refuses such a path, before any work."""
    from yue2_core.artifacts import reserve_output
    req = write_requests(tmp_path / "in")
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=_never)
    with pytest.raises(ArtifactError, match=r"holds a name of 25[68] bytes .*255-byte limit for a name; give a "
                                            "shorter path"):
        run_batch(BatchOptions(str(req), str(tmp_path / name), max_abc_tokens=ABC_CAP), **kw)
    with reserve_output(tmp_path / name, "batch folder", inside_ok=True):  # no traceback from the claim itself
        pass


def test_batch_json_write_advice_follows_the_error_and_a_refused_load_may_run_again(tmp_path, engine, monkeypatch):
    """Break-it findings: batch.json that could not be written for a path too long said "the songs already saved
    are intact; free space … --resume" (nothing saved; not a space problem) — the advice follows the error now; a
    batch refused when the engine loads (a refused LoRA stack) left batch.json, and the same command, corrected,
    failed with "already holds a batch … add --resume": a folder holding batch.json and no song runs again."""
    import errno
    import tempfile
    from yue2_core.batch.summary import BatchSummary
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"

    def refused():
        raise RequestError("the LoRAs a and b both replace NAR llm2vae")
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=refused)
    options = BatchOptions(str(req), str(out), max_abc_tokens=ABC_CAP)
    for _ in range(2):  # the same command again: refused at load again, not "add --resume"
        with pytest.raises(RequestError, match="both replace"):
            run_batch(options, **kw)
    assert sorted(p.name for p in out.iterdir()) == ["batch.json"]

    def mkstemp(*a, errno_=errno.ENAMETOOLONG, **k):
        raise OSError(errno_, os.strerror(errno_))
    import os
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(ArtifactError) as e:
        BatchSummary().write(out)
    assert str(e.value) == (f"cannot write {out / 'batch.json'}: File name too long (the path is longer than this file "
                            "system takes: give a shorter --output)"), str(e.value)
    summary = BatchSummary()
    summary.add(1, "a", "complete")
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: mkstemp(errno_=errno.EACCES))
    with pytest.raises(ArtifactError, match=r"Permission denied \(the 1 song already saved is intact; make the folder "
                                            r"writable, then run the same command with --resume\)"):
        summary.write(out)
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: mkstemp(errno_=errno.ENOSPC))
    with pytest.raises(ArtifactError, match=r"\(no song of it is saved yet; free space, then run the same command "):
        BatchSummary().write(out)


def _float_only_adapter(path, dims):
    """A NAR adapter on vae2llm only (a LoRA and a bias diff): a float layer in every checkpoint."""
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(5)
    out_f, in_f = dims.hidden, dims.latent_dim
    save_file({"diffusion_model.vae2llm.lora_A.weight": torch.randn(2, in_f, generator=g) * 0.1,
               "diffusion_model.vae2llm.lora_B.weight": torch.randn(out_f, 2, generator=g) * 0.1,
               "diffusion_model.vae2llm.diff_b": torch.randn(out_f, generator=g) * 0.01}, str(path))
    return path


def test_a_lora_on_float_layers_only_records_no_int8_mode_and_resumes_under_either(tmp_path, tiny_int8_ckpt,
                                                                                    monkeypatch, capsys):
    """Review (stop 41): batch.json recorded `lora_int8` whenever --lora met an int8 checkpoint, also for adapters
    that patch only float layers (the NAR's vae2llm), so `batch --resume` under the other YUE2_LORA_INT8 was
    refused for nothing. Recorded only when an int8 layer is patched (`apply.reaches_int8`, which agrees with what
    the engine records), compared only when both sides have a mode — a batch.json of the old rule is resumed too."""
    import torch
    from yue2_core.__main__ import main
    from yue2_core.pipeline import YuE2Engine
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as S
    from yue2_core.weights.lora.apply import Applied, reaches_int8
    from yue2_core.weights.lora.layouts import read_adapter
    info = inspect_checkpoint(tiny_int8_ckpt)
    floats = _float_only_adapter(tmp_path / "vae2llm_only.safetensors", info.dims)
    both = S.write_adapter("aitk", tmp_path / "aitk.safetensors", info.dims, rank=2, seed=1)
    nar = S.write_adapter("ms-raw-nar", tmp_path / "ms.safetensors", info.dims, rank=2, seed=2)
    for path, strengths, cpu in ((floats, (1.0, 1.0), False), (both, (1.0, 1.0), True), (nar, (1.0, 1.0), True),
                                 (both, (0.0, 1.0), True)):
        engine = YuE2Engine.load(tiny_int8_ckpt, device="cpu", dtype=torch.bfloat16, loras=[(path, *strengths)],
                                 warm_up=False)
        stack = [Applied(read_adapter(str(path), info.dims), *strengths)]
        assert reaches_int8(info, stack, nar_float=False) is cpu, path
        assert ("lora_int8" in engine.weights) is cpu, (path, engine.weights.get("lora_int8"))
    assert not reaches_int8(info, [Applied(read_adapter(str(nar), info.dims))], nar_float=True)  # CUDA: float NAR
    assert not reaches_int8(info, [Applied(read_adapter(str(both), info.dims), 0.0, 1.0)], nar_float=True)
    req = tmp_path / "in.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "seed": 3, "cot": "off",
                               "semantic_sampling": {"max_tokens": 5, "min_tokens": 2}}) + "\n", "utf-8")
    out = tmp_path / "out"
    argv = ["batch", str(req), "--output", str(out), "--checkpoint", tiny_int8_ckpt, "--device", "cpu",
            "--steps", "2", "--max-abc-tokens", str(ABC_CAP), "--lora", str(floats)]
    monkeypatch.delenv("YUE2_LORA_INT8", raising=False)
    assert main(argv) == 0
    settings = json.loads((out / "batch.json").read_text("utf-8"))["settings"]
    assert settings["lora_int8"] is None and settings["loras"], settings
    assert "lora_int8" not in json.loads((out / "a" / "config.json").read_text("utf-8"))["weights"]
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    capsys.readouterr()
    assert main(argv + ["--resume"]) == 0, capsys.readouterr().err
    record = json.loads((out / "batch.json").read_text("utf-8"))
    record["settings"]["lora_int8"] = "side"  # what the old rule wrote for the same run
    (out / "batch.json").write_text(json.dumps(record), "utf-8")
    assert main(argv + ["--resume"]) == 0, capsys.readouterr().err
    assert json.loads((out / "batch.json").read_text("utf-8"))["results"][0]["status"] == "complete"


def test_a_stopped_ray_batch_does_not_call_songs_on_the_workers_not_started(tmp_path, engine):
    """Break-it (stop 41): after a Ctrl-C (or a full disk) under --ray every row left pending got the note "not
    started (interrupted)" — the Ray workers report no job to the driver, so songs they were computing looked
    untouched. Such a row now says that how far it got is not known; --resume still computes it."""
    class Runner:  # the workers were computing when the user pressed Ctrl-C
        settings = {"address": "fake", "workers": []}

        def prepare(self):
            return 1 << 40, False

        def songs(self, todo, out, **kw):
            raise KeyboardInterrupt
            yield  # a generator, as RayRunner.songs

    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_batch(BatchOptions(str(req), str(out), steps=1, max_abc_tokens=ABC_CAP), tokenizer=engine.tokenizer,
                  dims=engine.info.dims, engine_factory=None, runner=Runner())
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    pending = [r for r in summary["results"] if r["status"] == "pending"]
    assert pending and summary["interrupted"] and summary["left_for_resume"] == [r["id"] for r in pending]
    for r in pending:
        assert r["note"] == ("not saved; how far the Ray workers got with it is not known here (interrupted); "
                             "--resume computes it from the start"), r


def _tiny_rows(path: Path, ids: str = "abcd", **changes) -> Path:
    """A request file of short cot-off songs (ids from `ids`); `changes` replace fields of every row."""
    path.write_text("".join(json.dumps({"id": i, "style": "pop", "lyrics": "la", "cot": "off", "seed": n,
                                        "semantic_sampling": {"max_tokens": 4, "min_tokens": 1}, **changes}) + "\n"
                            for n, i in enumerate(ids)), "utf-8")
    return path


@pytest.mark.parametrize("overlap,how", [(False, "moved"), (True, "moved"), (False, "replaced")])
def test_a_batch_folder_moved_away_mid_run_stops_the_batch(tmp_path, engine, monkeypatch, capsys, overlap, how):
    """Break-it finding (stop 57): the batch folder moved away (renamed in a file manager) or removed while the
    batch ran — the next song's save made the folder again, the batch wrote the rest there and ended "4 of 4
    complete" (exit 0) over a folder holding 2 of them. Now the batch stops at the first song after the move (that
    song fails at its save, nothing is written into a folder of that name again), says what happened and how to
    finish, and --resume on the moved folder completes the batch."""
    import yue2_core.artifacts as artifacts
    from yue2_core.artifacts import load_song
    req = _tiny_rows(tmp_path / "r.jsonl")
    out, moved = tmp_path / "album", tmp_path / "album-moved"
    saved, real_save = [], artifacts.save_song

    def save_then_move(song, folder, *a, **k):
        result = real_save(song, folder, *a, **k)
        saved.append(song.request.id)
        if len(saved) == 2:  # the user moves the album away after its second song
            os.rename(out, moved)
            if how == "replaced":
                out.mkdir()  # and makes a new, empty folder of that name
        return result
    monkeypatch.setattr(artifacts, "save_song", save_then_move)
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine)
    options = dict(steps=1, max_batch=1, overlap=overlap)
    what = "removed or moved away" if how == "moved" else "replaced by another folder"
    with pytest.raises(ArtifactError, match=f"the batch folder .*album was {what} while the batch ran: no more "
                                            "songs are saved .*run the same command with --resume"):
        run_batch(BatchOptions(str(req), str(out), **options), **kw)
    assert saved == ["a", "b"]
    assert (sorted(p.name for p in out.iterdir()) == [] if how == "replaced" else not out.exists())
    assert sorted(p.name for p in moved.iterdir()) == ["a", "b", "batch.json"]
    err = capsys.readouterr().err
    assert "not run (the batch folder was moved or removed)" in err, err
    monkeypatch.setattr(artifacts, "save_song", real_save)
    assert run_batch(BatchOptions(str(req), str(moved), resume=True, **options), **kw) == 0
    summary = json.loads((moved / "batch.json").read_text("utf-8"))
    assert [(r["id"], r["status"], r["resumed"]) for r in summary["results"]] == [
        ("a", "complete", True), ("b", "complete", True), ("c", "complete", False), ("d", "complete", False)]
    for i in "abcd":
        load_song(moved / i)


def test_a_batch_folder_given_through_a_symbolic_link_names_the_folder(tmp_path):
    """Break-it finding (stop 57): `--output LINK` where LINK is a symbolic link to the album folder (on another
    disk, say) said "is not a folder; give a new folder for the batch" — a --resume of a half-done album read as
    "start over". It now says it is a link, to what, and gives the folder's own path; a dangling link says so."""
    from yue2_core.batch.driver import check_output
    album = tmp_path / "disk" / "album"
    album.mkdir(parents=True)
    (album / "batch.json").write_text("{}")
    link = tmp_path / "album"
    link.symlink_to(album, target_is_directory=True)
    with pytest.raises(ArtifactError, match=re.escape(f"--output {link} is a symbolic link (to the folder {album}); "
                                                      f"a batch writes into a real folder: give that folder itself "
                                                      f"(--output {album}) or a new folder")):
        check_output(link, {"a"}, resume=True)
    check_output(album, {"a"}, resume=True)  # the folder itself is accepted
    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match=r"is a symbolic link \(to .*nowhere, which does not exist\); .* give the "
                                            r"path of a new folder"):
        check_output(dangling, {"a"}, resume=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="is not a folder; give a new folder"):
        check_output(tmp_path / "file", {"a"}, resume=False)


def test_resume_names_the_request_fields_a_finished_song_differs_in(tmp_path, engine):
    """Break-it finding (stop 57): a --resume whose request file changed a finished song's seed (or lyrics, style,
    score) refused it with "its request.json is another request than this row" and no word of what differs. The
    refusal now names each field, with the song's value and the row's when short."""
    from yue2_core.artifacts import save_song
    from yue2_core.batch.driver import resume_state
    item = read_requests(_tiny_rows(tmp_path / "r.jsonl", "a"))[0][0]
    folder = save_song(engine.generate(item.request, item.budgets, steps=1), tmp_path / "out" / "a")
    assert resume_state(folder, item, 1) == ("done", None)
    changed = read_requests(_tiny_rows(tmp_path / "r2.jsonl", "a", seed=99, lyrics="other words",
                                       style="x" * 50))[0][0]
    state, why = resume_state(folder, changed, 1)
    assert state == "refuse", why
    assert ("its request.json is another request than this row (its style differs; lyrics: the song's 'la', "
            "this row's 'other words'; seed: the song's 0, this row's 99)") in why, why
    scored = read_requests(_tiny_rows(tmp_path / "r3.jsonl", "a", cot="full", abc=SCORE))[0][0]
    state, why = resume_state(folder, scored, 1)
    assert "cot: the song's 'off', this row's 'full'" in why, why
    assert "its score (abc / abc_path) differs" in why, why


@pytest.mark.parametrize("how", ["renumbered", "linked"])
def test_a_batch_folder_renumbered_or_linked_back_is_not_taken_for_a_moved_one(tmp_path, engine, monkeypatch, how):
    """Stop-57 diff review: the moved-folder check compared the folder's (device, inode) only. A FUSE file system
    without use_ino (sshfs, rclone) numbers a folder anew once the kernel forgets it, a CIFS mount with noserverino
    too, an NFS automount remounted after its idle timeout has another device number — the same folder, holding the
    batch, read as "replaced by another folder" and the batch stopped after a song. A folder moved with a link put
    in its place ran on through the link, yet stopped as "removed or moved away". The folder whose batch.json holds
    what this run wrote is now the batch's own, whatever its numbers."""
    import yue2_core.artifacts as artifacts
    req = _tiny_rows(tmp_path / "r.jsonl")
    out, moved = tmp_path / "album", tmp_path / "album-moved"
    saved, real_save, real_lstat = [], artifacts.save_song, os.lstat

    def save(song, folder, *a, **k):
        result = real_save(song, folder, *a, **k)
        saved.append(song.request.id)
        if len(saved) == 1 and how == "linked":  # moved to another place, a link left where it was
            os.rename(out, moved)
            out.symlink_to(moved, target_is_directory=True)
        return result

    def lstat(path, *a, **k):  # the file system's numbers for the folder change after the first song
        st = real_lstat(path, *a, **k)
        if saved and how == "renumbered" and os.fspath(path) == str(out):
            return os.stat_result((st.st_mode, st.st_ino + 1000, st.st_dev + 1, *tuple(st)[3:]))
        return st
    monkeypatch.setattr(artifacts, "save_song", save)
    monkeypatch.setattr(os, "lstat", lstat)
    assert run_batch(BatchOptions(str(req), str(out), steps=1, max_batch=1, overlap=False),
                     tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine) == 0
    assert saved == list("abcd")
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert [(r["id"], r["status"]) for r in summary["results"]] == [(i, "complete") for i in "abcd"]
    if how == "linked":
        assert sorted(p.name for p in moved.iterdir()) == ["a", "b", "batch.json", "c", "d"]


def test_a_ray_batch_folder_moved_away_is_not_made_again_by_the_next_save(tmp_path, engine):
    """Stop-57 diff review: under --ray the driver writes the workers' songs (`RayRunner._store`, whose write makes
    the missing folders), but only the local runner's saves checked the batch folder first: after a move the next
    song made the folder again at the old path (one song, no batch.json) and the batch then stopped saying the folder
    was "replaced by another folder". The check now runs before each of those writes too."""
    from yue2_core.batch.ray_runner import RayRunner
    req = _tiny_rows(tmp_path / "r.jsonl")
    out, moved = tmp_path / "album", tmp_path / "album-moved"
    writes = []

    def write_song_dir(path, files, result):  # as artifacts.write_song_dir: the parents are made
        Path(path).mkdir(parents=True)
        writes.append(Path(path).name)
        return path

    class Runner:
        settings = {"address": "fake", "workers": []}

        def prepare(self):
            return 1 << 40, False

        def songs(self, todo, out, before_save=None, **kw):
            for n, item in enumerate(todo):
                if n == 2:  # the user moves the album away after its second song
                    os.rename(out, moved)
                outcome = dict(id=item.id, line=item.line, status="complete", stage="complete")
                yield RayRunner._store(None, outcome, {}, {}, out, write_song_dir, before_save)

    with pytest.raises(ArtifactError, match="album was removed or moved away while the batch ran"):
        run_batch(BatchOptions(str(req), str(out), steps=1), tokenizer=engine.tokenizer, dims=engine.info.dims,
                  engine_factory=None, runner=Runner())
    assert writes == ["a", "b"] and not out.exists()
    assert sorted(p.name for p in moved.iterdir()) == ["a", "b", "batch.json"]



def test_rows_naming_one_score_file_share_its_text_and_its_tokens(tmp_path):
    """Stop 58 (a §60 leftover): 10,000 rows naming one large score file each held their own copy of its text (≈ 2
    GB), and the context check tokenized it once a row. Now the rows share one text (until the file changes) and
    the batch's context check encodes it once, giving every row the same token ids as before."""
    from yue2_core.batch.driver import _encode_once
    big = SCORE + "%" + "x" * 20_000 + "\n"
    (tmp_path / "s.abc").write_text(big, "utf-8")
    (tmp_path / "t.abc").write_text(big, "utf-8")  # the same text in another file: its own read
    lines = [json.dumps({"id": f"r{i}", "style": "pop", "lyrics": f"la {i}", "abc_path": "s.abc"}) for i in range(200)]
    lines.append(json.dumps({"id": "other", "style": "pop", "lyrics": "la", "abc_path": "t.abc"}))
    errors, good = _errors(tmp_path, lines)
    assert not errors and len(good) == 201
    texts = {id(g.request.abc) for g in good[:200]}
    assert len(texts) == 1 and good[0].request.abc == big
    assert good[200].request.abc == big and good[200].request.abc is not good[0].request.abc
    calls = []

    def encode(text):
        calls.append(len(text))
        return [sum(map(ord, text[i:i + 10])) % 997 for i in range(0, len(text), 10)]  # ≈ a token per 10 chars
    once = _encode_once(encode)
    for g in good:
        assert check_context(g, once) == check_context(g, encode)
    assert calls.count(len(big)) == 201 + 1  # every row by `encode`; by `once`: one for both files' equal texts
    first = once(big)
    first.append(-1)  # a caller's change to its list does not reach the next caller
    assert once(big) == encode(big)
    # a changed file is read again on the next read_requests (size or mtime differ)
    (tmp_path / "s.abc").write_text(big + "% more\n", "utf-8")
    _, good2 = _errors(tmp_path, lines[:1])
    assert good2[0].request.abc.endswith("% more\n")
