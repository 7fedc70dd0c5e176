"""Leftovers of the stop-46 reviews, fixed in stop 47 (docs/bad_inputs.md §28): the docs' commands checked against
the real command-line parsers (the synthetic writers' second paste stops with a message the guide now shows), a batch
whose every row fails before any work made a folder holding only batch.json, and the busy-CPU note compared the
host-wide load average with the cores of this process's affinity mask."""
from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest

from robust_helpers import proc_stat

REPO = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "yue2_core/abc/README.md", *sorted(  # not the bad-input catalogue: its commands are wrong on
    str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md") if p.name != "bad_inputs.md")]  # purpose


# ---------------------------------------------------------------------------------- the docs' commands vs argparse

class _Parser(Exception):
    """Raised by the patched parse_args with the parser a module's `main` built."""


def _parser(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The ArgumentParser of `python -m MODULE` (`yue2_core`: `build_parser`; the synthetic writers build theirs
    inside `main`, which is stopped at its parse_args)."""
    if module == "yue2_core":
        from yue2_core.__main__ import build_parser
        return build_parser()
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", lambda self, *a, **k: (_ for _ in ()).throw(_Parser(self)))
        try:
            importlib.import_module(module).main([])
        except _Parser as stop:
            return stop.args[0]
    raise AssertionError(f"{module}.main never parsed its arguments")


def _sub(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and words and words[0] in action.choices:
            return action.choices[words[0]]
    return parser


PY = r"(?:\S*python3?|<ComfyUI's python>) -m (yue2_core[\w.]*)"


def _doc_commands() -> list[tuple[str, int, str, str, bool]]:
    """(file, line, module, the command's words after `-m MODULE` as text, whether it is a whole command a shell runs
    — from a code block, without synopsis brackets or placeholders) for every `python -m yue2_core…` in the docs:
    code blocks (fenced or indented; `\\`-continued lines and a synopsis' `[…]` lines joined) and inline code."""
    found = []
    for name in DOCS:
        lines = (REPO / name).read_text("utf-8").splitlines()
        fenced, i = False, 0
        while i < len(lines):
            line, no = lines[i], i + 1
            i += 1
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced or line.startswith("    "):
                text = line
                while text.endswith("\\") and i < len(lines):  # a continued command
                    text, i = text[:-1] + " " + lines[i].strip(), i + 1
                while fenced and i < len(lines) and lines[i].lstrip().startswith("["):  # a synopsis' next line
                    text, i = text + " " + lines[i].strip(), i + 1
                if text.lstrip().startswith("#"):
                    continue
                m = re.search(PY + r"(.*)", text)
                if m:
                    words = re.split(r"\s(?:&&|\|\||;|\|)\s", m.group(2))[0]
                    whole = not re.search(r"\[|…|\.\.\.|<", words.split(" #")[0])  # a trailing comment may
                    found.append((name, no, m.group(1), words, whole))  # hold them
            else:
                for m in re.finditer(r"`" + PY + r"([^`]*)`", line):
                    found.append((name, no, m.group(1), m.group(2), False))
    return found


def test_every_command_in_the_docs_parses_with_the_real_options(monkeypatch, capsys, tmp_path):
    """Leftover of the stop-46 reviews: the docs' commands are written by hand. Every `python -m yue2_core …` of the
    README and docs/ names only options its parser has; the whole commands of code blocks parse as they stand (in a
    folder holding the adapters their --lora names and the VAEs their --vae names, which the parser checks exist)."""
    monkeypatch.chdir(tmp_path)
    commands = _doc_commands()
    assert len(commands) >= 25 and {c[2] for c in commands} >= {
        "yue2_core", "yue2_core.weights.lora.synthetic", "yue2_core.weights.synthetic_vae",
        "yue2_core.weights.synthetic_vendor"}, commands
    parsers: dict[str, argparse.ArgumentParser] = {}
    wrong = []
    for name, no, module, text, whole in commands:
        parser = parsers.setdefault(module, _parser(module, monkeypatch))
        shell = shlex.shlex(text, posix=True)  # a trailing `# comment` dropped
        shell.whitespace_split = True
        words = list(shell) if whole else text.split()
        sub = _sub(parser, words)
        known = {o for a in sub._actions for o in a.option_strings}
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", text.split(" #")[0]):
            if option not in known:
                wrong.append(f"{name}:{no}: {option} is no option of {sub.prog}")
        if whole:
            for option, value in ((w, words[k + 1]) for k, w in enumerate(words[:-1]) if w in ("--lora", "--vae")):
                path = tmp_path / (value.split(":")[0] if option == "--lora" else value)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch() if path.suffix in (".safetensors", ".pt") else path.mkdir(exist_ok=True)
            try:
                parser.parse_args(words)
            except SystemExit:
                wrong.append(f"{name}:{no}: {' '.join(words)[:80]} — {capsys.readouterr().err.strip()[-160:]}")
    assert wrong == []


def test_the_comfyui_guide_shows_what_a_second_paste_of_the_synthetic_writers_says(tmp_path, capsys):
    """docs/comfyui.md's commands that write the synthetic LoRAs / VAE / checkpoint into ComfyUI's folders have no
    --force (--force would replace a real file of the same name there), so a second paste stops; the guide said
    nothing of it. Now it quotes each message, which must be what the writers print, and says what to do."""
    from yue2_core.weights.lora import synthetic as lora_synthetic
    from yue2_core.weights import synthetic_vae
    guide = " ".join((REPO / "docs" / "comfyui.md").read_text("utf-8").split())
    lora_dir, vae_dir = tmp_path / "loras", tmp_path / "vae" / "YuE2-Vae-legacy"
    for _ in range(2):
        lora_rc = lora_synthetic.main([str(lora_dir), "--profile", "tiny"])
        vae_rc = synthetic_vae.main([str(vae_dir), "--variant", "legacy", "--profile", "tiny"])
    err = capsys.readouterr().err.replace(str(tmp_path), "../../models")
    assert (lora_rc, vae_rc) == (1, 1) and len(lora_synthetic.planned_files(lora_dir)) == 22
    said = [line.removeprefix("error: ") for line in err.splitlines()]
    assert said[0] in guide and said[1].split("; ")[0] in guide, (said, guide)
    assert ("a synthetic checkpoint (random weights) never replaces a file unless --force is given" in guide
            and "(`make-synthetic`: 2)" in guide)
    assert "The files of the first paste are still there: nothing needs doing. Add `--force` only" in guide
    from yue2_core.__main__ import build_parser
    sub = _sub(build_parser(), ["make-synthetic"])
    assert "--force" in {o for a in sub._actions for o in a.option_strings}


# ---------------------------------------------------------------------------------- a batch whose every row fails

def _batch_kw(tokenizer, dims, **extra):
    def never():
        raise AssertionError("no engine is loaded for a batch with nothing to run")
    return dict(tokenizer=tokenizer, dims=dims, engine_factory=never, **extra)


@pytest.fixture(scope="module")
def tiny_bf16() -> str:
    """The tiny synthetic bf16 checkpoint (the run's shared file, tests/synthetic_cache.py; the int8 one is not
    needed). Read-only."""
    from synthetic_cache import cached_checkpoint
    return cached_checkpoint("tiny", "bf16")


@pytest.fixture(scope="module")
def tiny_dims(tiny_bf16):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    return inspect_checkpoint(tiny_bf16).dims


BAD_ROWS = ['{"id": "a", "style": "pop", "bogus": 1}', '{"id": "b", "cot": "nope"}', "not json"]


def test_a_batch_whose_every_row_fails_validation_makes_no_folder(tmp_path, tokenizer, tiny_dims):
    """Every row refused as read (unknown field, bad cot, not JSON): the run made runs/album/ holding only a
    batch.json of errors, and its last line said "after fixing the failed rows, finish it with --resume". Now
    nothing is written — no folder, no parent folder — the errors are printed and the exit status is 1."""
    import io
    from yue2_core.batch import BatchOptions, run_batch
    req = tmp_path / "r.jsonl"
    req.write_text("\n".join(BAD_ROWS) + "\n", "utf-8")
    out = tmp_path / "runs" / "album"
    stream = io.StringIO()
    rc = run_batch(BatchOptions(str(req), str(out)), **_batch_kw(tokenizer, tiny_dims, stream=stream))
    text = stream.getvalue()
    assert rc == 1 and not (tmp_path / "runs").exists(), sorted(p.name for p in tmp_path.iterdir())
    assert "unknown field(s) 'bogus'" in text and "cot must be one of" in text and "line 3 is not JSON" in text
    assert "0 of 3 complete, 3 failed" in text and "--resume" not in text
    assert text.rstrip().endswith(f"nothing ran: every row failed before any work, so no batch folder was made "
                                  f"({out}); fix the rows above and run the same command again"), text[-300:]


def test_a_folder_that_exists_still_gets_its_record(tmp_path, tokenizer, tiny_dims):
    """An output folder given that exists (made by the user, or a --resume's) gets batch.json as before: its record
    of the refusals; the last line no longer sends a folder without any song to --resume."""
    import io
    from yue2_core.batch import BatchOptions, run_batch
    req = tmp_path / "r.jsonl"
    req.write_text("\n".join(BAD_ROWS) + "\n", "utf-8")
    out = tmp_path / "album"
    out.mkdir()
    stream = io.StringIO()
    rc = run_batch(BatchOptions(str(req), str(out)), **_batch_kw(tokenizer, tiny_dims, stream=stream))
    record = json.loads((out / "batch.json").read_text("utf-8"))
    assert rc == 1 and (record["failed"], record["complete"]) == (3, 0)
    assert stream.getvalue().rstrip().endswith("after fixing the failed rows, run the same command again")


def test_rows_that_fail_while_computing_keep_their_record(tmp_path, tokenizer, tiny_dims):
    """Rows that failed during the work (here every one, at its plan) are a record worth keeping: the folder and
    batch.json are written as before, exit 1."""
    import io
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.batch.runner import SongOutcome

    class Runner:  # the driver's runner interface (ray_runner.RayRunner): every song fails at its plan
        settings: dict = {}

        def prepare(self):
            return None, False

        def songs(self, todo, out, **kw):
            for item in todo:
                yield SongOutcome(item.id, item.line, "failed", "plan", error="NaN logits")

    req = tmp_path / "r.jsonl"
    req.write_text('{"id": "a", "style": "pop"}\n{"id": "b", "style": "rock"}\n', "utf-8")
    out = tmp_path / "runs" / "album"
    stream = io.StringIO()
    rc = run_batch(BatchOptions(str(req), str(out), max_seconds=1.0, max_abc_tokens=8),
                   **_batch_kw(tokenizer, tiny_dims, stream=stream, runner=Runner()))
    record = json.loads((out / "batch.json").read_text("utf-8"))
    assert rc == 1 and [(r["id"], r["stage"], r["error"]) for r in record["results"]] == [
        ("a", "plan", "NaN logits"), ("b", "plan", "NaN logits")]
    assert sorted(p.name for p in out.iterdir()) == ["batch.json"]


def test_the_capped_error_list_does_not_point_at_a_batch_json_never_written():
    """The "errors in full" cap (§26) pointed at batch.json for the rest; when every row failed before any work no
    batch.json is written, so the pointer says so."""
    from yue2_core.batch.summary import FULL_ERROR_LINES, BatchSummary
    s = BatchSummary()
    for i in range(1, FULL_ERROR_LINES + 50):
        s.add(i, f"r{i}", "failed", stage="validate", error=f"line {i}: unknown field 'x'; " + "y" * 100)
    assert s.table().splitlines()[-1].endswith('every row\'s error is whole in batch.json ("results": "error")')
    assert s.table(written=False).splitlines()[-1] == (
        "… 49 more errors not shown here: nothing ran, so no batch.json keeps them; fix the rows above and run again "
        "to see the rest")


def test_the_cli_batch_of_bad_rows_exits_1_and_leaves_nothing(tmp_path, capsys, tiny_bf16):
    """The command line as a user runs it: `batch` on a request file of bad rows, exit 1, no folder."""
    from test_cli import main_inprocess
    req = tmp_path / "r.jsonl"
    req.write_text("\n".join(BAD_ROWS) + "\n", "utf-8")
    rc, err = main_inprocess(capsys, "batch", req, "--output", tmp_path / "runs" / "album", "--checkpoint", tiny_bf16,
                             "--offline", "--device", "cpu", "--max-seconds", "1", "--max-abc-tokens", "8")
    assert rc == 1 and not (tmp_path / "runs").exists(), err
    assert "nothing ran: every row failed before any work, so no batch folder was made" in err


# ---------------------------------------------------------------------------------------------- the busy-CPU note

def test_host_load_on_other_cores_is_no_busy_note_in_a_pinned_container(busy_cpu, capsys):
    """A container pinned to 2 of a 64-core host's cores: the load average counts the whole host, so 3 jobs on its
    other cores made "this CPU is busy (load 3.0 on 2 cores)" though the 2 cores were idle. Now the 2 cores' own
    counters decide: idle → no note."""
    idle = [(100, 900)] * 64
    later = [(100, 920)] * 2 + [(120, 900)] * 3 + [(100, 900)] * 59  # cpus 0,1 idle; 2-4 busy
    cli = busy_cpu(3.0, 64, {0, 1}, [proc_stat(*idle), proc_stat(*later)])
    cli._note_busy_cpu()
    assert capsys.readouterr().err == ""


def test_busy_pinned_cores_get_the_note_naming_both_numbers(busy_cpu, capsys):
    cli = busy_cpu(3.0, 64, {0, 1}, [proc_stat(*[(100, 900)] * 64), proc_stat(*[(120, 900)] * 2, *[(100, 920)] * 62)])
    cli._note_busy_cpu()
    assert capsys.readouterr().err.startswith(
        "NOTE: this CPU is busy (other jobs kept the 2 cores this process may use 100% busy; load 3.0 on the host's 64 "
        "cores) and OMP_NUM_THREADS is not set")


def test_a_saturated_host_is_busy_for_any_affinity_without_sampling(busy_cpu, capsys):
    cli = busy_cpu(70.0, 64, {0, 1})  # no /proc/stat read: every core of the host is busy
    cli._note_busy_cpu()
    assert capsys.readouterr().err.startswith(
        "NOTE: this CPU is busy (load 70.0 on the host's 64 cores, 2 of which this process may use) and")


@pytest.mark.parametrize("load, said", [(2.0, True), (1.2, False)])
def test_a_whole_machine_compares_the_load_with_its_cores(busy_cpu, capsys, load, said):
    """Without an affinity limit (a VM, a laptop: affinity = os.cpu_count()) a load that fills the cores is a note
    without /proc/stat sampling; a lower one is looked at in /proc/stat since the stop-47 new-user review (here idle
    cores: the load was an earlier run's; one other job's core: tests/robust/test_newuser_stop47.py)."""
    idle = [proc_stat((100, 900), (100, 900)), proc_stat((100, 920), (100, 920))]
    cli = busy_cpu(load, 2, {0, 1}, idle if load < 2 else ())
    cli._note_busy_cpu()
    err = capsys.readouterr().err
    assert err.startswith(f"NOTE: this CPU is busy (load {load:.1f} on 2 cores)") if said else err == ""


def test_the_own_process_time_is_not_counted_as_other_jobs(busy_cpu, capsys, monkeypatch):
    """The sample runs before this run's work, but this process's own CPU time in it (a thread) is taken out."""
    import resource
    times = iter([0.0, 0.4])  # 0.4 s of our own CPU = 40 ticks at 100 Hz: all the busy ticks of the two cores
    usage = lambda who: type("U", (), {"ru_utime": next(times), "ru_stime": 0.0})()  # noqa: E731
    monkeypatch.setattr(resource, "getrusage", usage)
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    cli = busy_cpu(3.0, 64, {0, 1}, [proc_stat(*[(100, 900)] * 64), proc_stat(*[(120, 900)] * 2, *[(100, 920)] * 62)])
    assert cli._busy_share({0, 1}) == 0.0


def test_a_container_proc_stat_of_its_own_cores_is_read(busy_cpu, capsys):
    """lxcfs shows a container only its cores, renumbered cpu0…: an affinity of {10, 11} then reads those two lines;
    a /proc/stat that fits neither numbering gives no note (unknown, so nothing said)."""
    cli = busy_cpu(3.0, 64, {10, 11}, [proc_stat((100, 900), (100, 900)), proc_stat((120, 900), (120, 900))])
    cli._note_busy_cpu()
    assert "other jobs kept the 2 cores this process may use 100% busy" in capsys.readouterr().err
    cli = busy_cpu(3.0, 64, {10, 11}, [proc_stat(*[(100, 900)] * 3), proc_stat(*[(120, 900)] * 3)])
    cli._note_busy_cpu()
    assert capsys.readouterr().err == ""


def test_proc_stat_is_read_per_busy_cpu(tmp_path):
    from yue2_core.cli.busy_cpu import _cpu_ticks
    path = tmp_path / "stat"
    path.write_text("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 40 5 6 7 8 0 0\ncpu1 1 0 0 10\nintr 5\n")
    assert _cpu_ticks(str(path)) == {0: (1 + 2 + 3 + 6 + 7 + 8, 72), 1: (1, 11)}
    assert _cpu_ticks(str(tmp_path / "missing")) == {}
