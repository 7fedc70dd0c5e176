"""Issue 20, "faithful to the vendor" (items 1, 2, 3, 14): text files read as the vendor's CLI reads them, score.abc
loaded byte for byte, the vendor's song-folder layout (plan.json, plan_manifest.json, result.json identity/weights)
checked against the formats of runtime.md §7.1/§7.3 with a fixture folder written the vendor's way, and result.json
protected like the other files. The vendor-side checks below are written from that documented format (no vendor
code): `vendor_plan_load` follows `SymbolicPlan.load`'s documented rules, `vendor_verify_result` those of the
resumable run's result check."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from robust_helpers import make_song
from yue2_core.artifacts import canonical_sha256, load_song, save_song, seal_result
from yue2_core.errors import ArtifactError, YuE2Error

ABC = "X:1\r\nT:\r\nM:4/4\r\nL:1/16\r\nQ:1/4=96\r\nK:C\r\nV:Vocal\r\nC4 D4 E4 F4|\r\n"


# --- item 1: --lyrics-file / --style-file / --abc-file ---------------------------------------------------------------

def test_text_files_are_read_as_the_vendor_reads_them(tmp_path):
    """Bytes decoded as UTF-8, nothing rewritten: CRLF, lone CR and a BOM stay (same ids as `yue2 generate`), and
    each is warned about; before the fix CRLF became LF and the BOM was dropped silently. The warnings come from
    SongRequest.input_warnings, which sees inline text too (stop 46), not from the file reader."""
    from yue2_core.cli.text_input import read_text_file
    from yue2_core.protocol import SongRequest
    cases = {"crlf.txt": b"[Verse]\r\nla la\r\n", "cr.txt": b"[Verse]\rla la\r", "bom.txt": b"\xef\xbb\xbfsmooth jazz",
             "lf.txt": "[Verse]\n你好\n".encode()}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        text, notes = read_text_file(str(tmp_path / name), "lyrics")
        assert text == data.decode("utf-8"), name  # the vendor: Path.read_bytes().decode("utf-8")
        assert notes == []  # said once, by input_warnings
        notes = SongRequest(style="pop", lyrics=text).input_warnings()
        joined = " ".join(notes)
        if name == "crlf.txt":
            assert "CRLF (Windows) line endings: kept" in joined and "lone CR" not in joined
        elif name == "cr.txt":
            assert "lone CR (old Mac) line endings: kept" in joined
        elif name == "bom.txt":
            assert "byte-order mark (U+FEFF): it is kept" in joined and text.startswith("\ufeff")
        else:
            assert notes == []


@pytest.mark.parametrize("data,kind", [("la la\n".encode("utf-16"), "UTF-16"),  # with a BOM
                                       ("[Verse]\nla la\n".encode("utf-16-le"), "UTF-16 LE"),  # without one
                                       ("[Verse]\nla la\n".encode("utf-16-be"), "UTF-16 BE"),
                                       ("la la\n".encode("utf-32"), "UTF-32 LE"),  # with a BOM (named UTF-16 before)
                                       ("[Verse]\nla la\n".encode("utf-32-le"), "UTF-32 LE"),  # taken as text before
                                       ("[Verse]\nla la\n".encode("utf-32-be"), "UTF-32 BE"),
                                       ("[Verse]\nこんにちは\n".encode("utf-32-le"), "UTF-32 LE")])
def test_utf16_text_files_are_refused_with_save_as_utf8(tmp_path, data, kind):
    """NUL-interleaved text is never taken as lyrics (before: a UTF-16 file without BOM decoded 'fine' as UTF-8 with
    a NUL after every letter; a UTF-32 one without BOM still did, break-it 2026-12-04)."""
    from yue2_core.cli.text_input import read_text_file
    path = tmp_path / "lyrics.txt"
    path.write_bytes(data)
    with pytest.raises(YuE2Error) as exc:
        read_text_file(str(path), "lyrics")
    assert kind in str(exc.value) and "save the file as UTF-8" in str(exc.value)


def test_cli_keeps_crlf_and_warns(tmp_path, capsys):
    """Through the command line: the warning is printed and the request goes on to the checkpoint (missing here)."""
    from test_cli import main_inprocess
    lyrics = tmp_path / "l.txt"
    lyrics.write_bytes(b"[Verse]\r\nla\r\n")
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics-file", lyrics, "--offline",
                             "--checkpoint", "/nonexistent/x.safetensors", "--output", tmp_path / "o")
    assert rc == 2 and "CRLF (Windows) line endings: kept" in err and "checkpoint not found" in err, err
    bad = tmp_path / "u16.txt"
    bad.write_bytes("la\n".encode("utf-16-le"))
    rc, err = main_inprocess(capsys, "generate", "--style", "pop", "--lyrics-file", bad, "--offline",
                             "--checkpoint", "/nonexistent/x.safetensors", "--output", tmp_path / "o")
    assert rc == 2 and "save the file as UTF-8" in err and "checkpoint not found" not in err, err


# --- item 2: load_song returns score.abc's exact text ---------------------------------------------------------------

def _song_with_score(tokenizer, text):
    from dataclasses import replace

    from yue2_core.constants import ABC_END, ABC_START, EOD, MUSIC_START
    from yue2_core.pipeline import Score
    song = make_song()
    score = Score.from_text(text, tokenizer, "full", 7)
    tokens = replace(song.tokens, score=score, prefix=[EOD, 5, ABC_START, *score.abc_ids, ABC_END, MUSIC_START])
    return replace(song, score=score, tokens=tokens)


def test_load_song_returns_the_exact_score_text(tmp_path, tokenizer):
    """A CRLF score loads as CRLF (before: LF), so the loaded text tokenizes to the saved ids."""
    root = save_song(_song_with_score(tokenizer, ABC), tmp_path / "song")
    assert (root / "score.abc").read_bytes() == ABC.encode("utf-8")
    saved = load_song(root, tokenizer)
    assert saved.score.abc == ABC and not saved.score_edited
    assert tokenizer.encode(saved.score.abc) == saved.score.abc_ids


# --- item 3: the vendor's layout ------------------------------------------------------------------------------------

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def vendor_plan_load(root: Path) -> dict:
    """The documented rules of the vendor's `SymbolicPlan.load(dir)` (runtime.md §7.1/§7.3): plan_manifest.json
    lists at least plan.json, abc_tokens.npy and prefix.npy (and only plan files), each matching its sha256;
    abc_tokens.npy / prefix.npy equal plan.json's abc_ids / prefix; score.abc's bytes are plan.json's abc in UTF-8."""
    hashes = json.loads((root / "plan_manifest.json").read_text("utf-8"))
    assert {"plan.json", "abc_tokens.npy", "prefix.npy"} <= set(hashes)
    for name, digest in hashes.items():
        assert name in {"plan.json", "abc_tokens.npy", "prefix.npy", "score.abc"}
        assert not (root / name).is_symlink() and _sha(root / name) == digest, name
    plan = json.loads((root / "plan.json").read_text("utf-8"))
    assert set(plan) == {"request", "timing", "truncated", "prefix", "abc_ids", "abc"}
    for key, name in (("abc_ids", "abc_tokens.npy"), ("prefix", "prefix.npy")):
        array = np.load(root / name, allow_pickle=False)
        assert array.ndim == 1 and array.dtype.kind in "iu" and array.tolist() == plan[key]
    if plan["abc"] is not None:
        assert "score.abc" in hashes and (root / "score.abc").read_bytes() == plan["abc"].encode("utf-8")
    assert set(plan["request"]) == {"style", "lyrics", "cot", "seed", "abc", "cfg_scale", "id"}  # SongRequest(**…)
    return plan


def vendor_verify_result(root: Path) -> dict:
    """The documented result check of the vendor's `--resume` (runtime.md §7.3): status complete, the audio, prefix,
    semantic, latent, request and config files listed, each with its size and sha256; identity and weights present."""
    result = json.loads((root / "result.json").read_text("utf-8"))
    assert result["status"] == "complete"
    assert {"audio.flac", "prefix.npy", "semantic.npy", "latent.npy", "request.json", "config.json"} <= \
        set(result["artifacts"])
    for name, entry in result["artifacts"].items():
        assert (root / name).stat().st_size == entry["bytes"] and _sha(root / name) == entry["sha256"], name
    listed = set(result["artifacts"]) | {"result.json"}
    assert {p.name for p in root.iterdir()} == listed  # every file except result.json is listed
    assert isinstance(result["identity"], str) and len(result["identity"]) == 64
    assert {"mot", "vae"} <= set(result["weights"])
    for part in ("mot", "vae"):
        assert isinstance(result["weights"][part]["files"], dict)
    return result


def test_our_song_folder_is_the_vendors_layout(tmp_path, tokenizer):
    """plan.json / plan_manifest.json / result.json identity + weights are there (before: none of them), satisfy the
    vendor's load rules, and the identity is the vendor's rule over request, config and weights."""
    song = _song_with_score(tokenizer, ABC)
    song.settings.update({"checkpoint": {"path": str(tmp_path / "m.safetensors"), "layout": "comfy",
                                         "format": "int8"},
                          "weights": {"loras": [{"file": "a.safetensors", "sha256": "ab" * 32, "bytes": 9}],
                                      "vae": None}})
    (tmp_path / "m.safetensors").write_bytes(b"12345")
    root = save_song(song, tmp_path / "song")
    plan = vendor_plan_load(root)
    result = vendor_verify_result(root)
    assert plan["abc"] == ABC and plan["abc_ids"] == song.score.abc_ids and plan["prefix"] == song.tokens.prefix
    request = json.loads((root / "request.json").read_text())
    config = json.loads((root / "config.json").read_text())
    assert result["identity"] == canonical_sha256({"request": request, "config": config,
                                                   "weights": result["weights"]})
    weights = result["weights"]
    assert weights["mot"]["files"] == {"m.safetensors": {"sha256": None, "bytes": 5}}
    assert weights["vae"]["embedded"] is True and weights["loras"][0]["sha256"] == "ab" * 32
    assert load_song(root, tokenizer).score.abc_ids == song.score.abc_ids  # and we read it back


def _npy(values) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(values, dtype=np.int32), allow_pickle=False)
    return buf.getvalue()


def write_vendor_folder(root: Path, tokenizer) -> dict:
    """A song folder written the vendor's way, file by file, from runtime.md §7.3 (no `result_sha256`, no score /
    semantic sections: what `save_artifacts` writes)."""
    import soundfile as sf
    from yue2_core.constants import ABC_END, ABC_START, EOD, MUSIC_START
    root.mkdir()
    abc = ABC
    ids = tokenizer.encode(abc)
    request = {"style": "pop", "lyrics": "la la", "cot": "full", "seed": 3, "abc": None, "cfg_scale": None,
               "id": "song"}
    prefix = [EOD, *tokenizer.encode("x"), ABC_START, *ids, ABC_END, MUSIC_START]
    frames = 4
    (root / "score.abc").write_bytes(abc.encode("utf-8"))
    (root / "abc_tokens.npy").write_bytes(_npy(ids))
    (root / "prefix.npy").write_bytes(_npy(prefix))
    dump = lambda v: (json.dumps(v, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")  # noqa
    (root / "plan.json").write_bytes(dump({"request": request, "timing": {}, "truncated": True, "prefix": prefix,
                                           "abc_ids": ids, "abc": abc}))
    (root / "plan_manifest.json").write_bytes(dump({n: _sha(root / n) for n in
                                                    ("plan.json", "abc_tokens.npy", "prefix.npy", "score.abc")}))
    buf = io.BytesIO()
    sf.write(buf, np.zeros((1920 * frames - 64, 2), dtype=np.float32), 48000, format="FLAC", subtype="PCM_24")
    (root / "audio.flac").write_bytes(buf.getvalue())
    (root / "semantic.npy").write_bytes(_npy([1, 2, 3, 4]))
    lat = io.BytesIO()
    np.save(lat, np.zeros((frames, 64), dtype=np.float32))
    (root / "latent.npy").write_bytes(lat.getvalue())
    (root / "request.json").write_bytes(dump(request))
    config = {"cot": "full", "cfg_scale": 1.0, "model_dtype": "bfloat16", "validation_status": "unvalidated"}
    (root / "config.json").write_bytes(dump(config))
    weights = {"mot": {"files": {"model.safetensors": {"sha256": "0" * 64, "bytes": 1}}, "config_sha256": "1" * 64},
               "vae": {"files": {"model.safetensors": {"sha256": "2" * 64, "bytes": 1}}, "config_sha256": "3" * 64}}
    artifacts = {p.name: {"sha256": _sha(p), "bytes": p.stat().st_size} for p in sorted(root.iterdir())}
    result = {"status": "complete", "identity": canonical_sha256({"request": request, "config": config,
                                                                   "weights": weights}),
              "truncated": {"abc": True, "semantic": False}, "sample_rate": 48000,
              "audio_seconds": (1920 * frames - 64) / 48000, "weights": weights, "timing": {}, "artifacts": artifacts}
    (root / "result.json").write_bytes(dump(result))
    return {"ids": ids, "prefix": prefix}


def test_a_vendor_written_folder_loads(tmp_path, tokenizer):
    """Our loader keeps reading both: a folder the vendor wrote (fixture from the documented format) loads with its
    exact ids, the plan's truncation flag and the mode's guidance."""
    want = write_vendor_folder(tmp_path / "vendor", tokenizer)
    vendor_plan_load(tmp_path / "vendor")
    vendor_verify_result(tmp_path / "vendor")
    saved = load_song(tmp_path / "vendor", tokenizer)
    assert saved.score.abc == ABC and saved.score.abc_ids == want["ids"] and saved.tokens.prefix == want["prefix"]
    assert saved.score.truncated is True and saved.tokens.codes == [1, 2, 3, 4] and saved.tokens.ended is True
    assert saved.tokens.cfg_scale == 1.0


# --- item 14: result.json protected ---------------------------------------------------------------------------------

def _edit_result(root: Path, edit, reseal: bool = False) -> None:
    result = json.loads((root / "result.json").read_text())
    edit(result)
    if reseal:
        result = seal_result(result)
    (root / "result.json").write_text(json.dumps(result))


def _rewrite(root: Path, name: str, data: bytes) -> None:
    """Replace a song file consistently: its manifest entry and result.json's seal recomputed."""
    (root / name).write_bytes(data)
    _edit_result(root, lambda r: r["artifacts"].__setitem__(name, {"sha256": hashlib.sha256(data).hexdigest(),
                                                                    "bytes": len(data)}), reseal=True)


@pytest.mark.parametrize("edit", [lambda r: r["semantic"].__setitem__("seed", 99),
                                  lambda r: r["semantic"]["sampling"].__setitem__("max_tokens", 20000),
                                  lambda r: r.__setitem__("result_sha256", "0" * 64),
                                  lambda r: r.pop("result_sha256")])
def test_an_edited_result_json_is_refused(tmp_path, edit):
    """Before: result.json's semantic seed (the render noise) and budget were read unchecked."""
    root = save_song(make_song(), tmp_path / "song")
    load_song(root)
    _edit_result(root, edit)
    with pytest.raises(ArtifactError, match="result_sha256"):
        load_song(root)


@pytest.mark.parametrize("prefix,phrase", [([], "prefix.npy is empty"),
                                           (None, "more than the 24576-token context"),
                                           ([151643, 151853 + 5, 151851], "holds codec or end-of-music ids"),
                                           ([151643, 151852, 151851], "holds codec or end-of-music ids")])
def test_a_bad_saved_prefix_is_refused_with_its_reason(tmp_path, prefix, phrase):
    from yue2_core.constants import ABC_END, ABC_START, EOD, MUSIC_START
    root = save_song(make_song(cot="off"), tmp_path / "song")
    if prefix is None:
        prefix = [EOD] + [7] * 24570 + [ABC_START, ABC_END, MUSIC_START]
    _rewrite(root, "prefix.npy", _npy(prefix))
    with pytest.raises(ArtifactError, match=phrase):
        load_song(root)


def test_a_request_saying_off_on_a_scored_song_is_refused(tmp_path):
    root = save_song(make_song(cot="full"), tmp_path / "song")
    request = json.loads((root / "request.json").read_text())
    request["cot"] = "off"
    _rewrite(root, "request.json", json.dumps(request).encode())
    with pytest.raises(ArtifactError, match="request.json says cot 'off' but the song has a score"):
        load_song(root)
