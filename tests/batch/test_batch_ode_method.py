"""`batch --ode-method ab2`: the opt-in solver reaches the batch's songs as it reaches `generate`'s (same files byte for
byte, config.json records it), --resume treats a song of the other solver as another setting, a bad method is refused
before any work; and YUE2_RENDER_SMS (where the overlapped stages run on a GPU) is validated by the CLI's check."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import ABC_CAP, expected, rows  # noqa: E402


def _two(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "requests.jsonl"
    picked = [r for r in rows() if r["id"] in ("melody-score", "short")]
    path.write_text("\n".join(json.dumps(r) for r in picked) + "\n", "utf-8")
    return path


def test_ab2_batch_equals_ab2_generate_and_resume_checks_the_solver(tmp_path, engine):
    from yue2_core.artifacts import save_song
    from yue2_core.batch import BatchOptions, run_batch
    req, out = _two(tmp_path / "in"), tmp_path / "batch"
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine)
    assert run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, method="ab2"), **kw) == 0
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert summary["settings"]["ode_method"] == "ab2" and summary["complete"] == 2
    for row in rows():
        if not (out / row["id"]).exists():
            continue
        request, budgets = expected(row)
        alone = save_song(engine.generate(request, budgets, steps=2, method="ab2"), tmp_path / "alone" / row["id"])
        assert json.loads((out / row["id"] / "config.json").read_text("utf-8"))["ode_method"] == "ab2"
        for name in ("latent.npy", "semantic.npy", "audio.flac", "config.json"):
            assert (alone / name).read_bytes() == (out / row["id"] / name).read_bytes(), (row["id"], name)
        mid = engine.generate(request, budgets, steps=2)  # the default solver gives other latents: the switch acts
        assert not (mid.latents == engine.generate(request, budgets, steps=2, method="ab2").latents).all()
    # resuming with the default solver: refused before any work (the album would be rendered two ways)
    from yue2_core.errors import RequestError
    before = (out / "batch.json").read_bytes()
    with pytest.raises(RequestError, match="made with --ode-method ab2"):
        run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, resume=True), **kw)
    assert (out / "batch.json").read_bytes() == before
    with pytest.raises(RequestError, match="made with --steps 2 .*same options"):
        run_batch(BatchOptions(str(req), str(out), steps=3, max_abc_tokens=ABC_CAP, resume=True), **kw)
    # without batch.json the songs themselves tell: each row refused, naming the solver, every folder kept
    (out / "batch.json").unlink()
    rc = run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, resume=True), **kw)
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert rc == 1 and summary["failed"] == 2
    assert all("--ode-method 'ab2', this run uses midpoint" in r["error"] for r in summary["results"])
    assert all((out / r["id"] / "audio.flac").exists() for r in summary["results"])
    rc = run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, resume=True, method="ab2"), **kw)
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert rc == 0 and all(r["resumed"] for r in summary["results"])
    # a hand-edited settings file: refused and kept (the audio still verifies), never removed to be redone
    song = out / summary["results"][0]["id"]
    cfg = json.loads((song / "config.json").read_text("utf-8"))
    cfg["ode_method"] = "euler"
    (song / "config.json").write_text(json.dumps(cfg), "utf-8")
    audio = (song / "audio.flac").read_bytes()
    rc = run_batch(BatchOptions(str(req), str(out), steps=2, max_abc_tokens=ABC_CAP, resume=True, method="ab2"), **kw)
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert rc == 1 and "config.json changed after the song was saved" in summary["results"][0]["error"]
    assert (song / "audio.flac").read_bytes() == audio


def test_bad_ode_method_is_refused_before_work(tmp_path, tiny_ckpt, capsys):
    from yue2_core.__main__ import main
    req = _two(tmp_path / "in")
    with pytest.raises(SystemExit):
        main(["batch", str(req), "--output", str(tmp_path / "b"), "--checkpoint", tiny_ckpt, "--device", "cpu",
              "--ode-method", "euler"])
    assert "invalid choice: 'euler'" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("value,ok", [("auto", True), ("0", True), ("96", True), ("", True), ("half", False),
                                      ("-8", False), ("1.5", False), ("99999", False), ("9" * 5000, False)])
def test_render_sms_switch_is_checked(monkeypatch, value, ok):
    from yue2_core.__main__ import _check_switches
    from yue2_core.errors import RequestError
    monkeypatch.setenv("YUE2_RENDER_SMS", value)
    if ok:
        _check_switches()
    else:
        with pytest.raises(RequestError, match="YUE2_RENDER_SMS must be 'auto', 0 or a number of SMs"):
            _check_switches()
