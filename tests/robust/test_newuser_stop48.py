"""Found by the stop-48 new-user review (docs/bad_inputs.md §33): a ComfyUI server on a CPU other jobs share sampled
3–5 tokens/s (33 once started with OMP_NUM_THREADS=1) and neither the nodes nor docs/comfyui.md said why; YuE2
Regenerate / Continue took an edited score longer than the song without the too-long note the Composer gives the same
score; their reports said "the new part hit its budget (250 tokens)" beside "new part 225 tokens"."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from robust_helpers import proc_stat

REPO = Path(__file__).resolve().parents[2]
TINY = "yue2_test_tiny_bf16.safetensors"


# ------------------------------------------------------------------------------------- the busy-CPU note, own load

def test_a_servers_own_load_is_no_reason_but_other_jobs_are(busy_cpu):
    """A ComfyUI server that ran songs back to back makes a load of 2 on 2 cores by itself: with own_load the cores'
    counters decide (this process's own time taken out), so idle cores give no note and other jobs still do; the
    command line's rule (a full load is a note without a sample) is unchanged."""
    idle = [proc_stat((1000, 9000), (1000, 9000)), proc_stat((1002, 9098), (1000, 9100))]
    cli = busy_cpu(2.4, 2, {0, 1}, idle)
    assert cli.busy_cpu_reason(own_load=True) is None
    busy = [proc_stat((1000, 9000), (1000, 9000)), proc_stat((1100, 9000), (1090, 9010))]
    cli = busy_cpu(2.4, 2, {0, 1}, busy)
    assert cli.busy_cpu_reason(own_load=True) == "other jobs kept the 2 cores 95% busy; load 2.4"
    cli = busy_cpu(2.4, 2, {0, 1}, [])  # the fixture fails a /proc/stat read: none is taken at a full load
    assert cli.busy_cpu_reason() == "load 2.4 on 2 cores"


def test_no_reason_with_omp_num_threads_set(busy_cpu, monkeypatch):
    cli = busy_cpu(2.4, 2, {0, 1}, [])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cli.busy_cpu_reason(own_load=True) is None


NODE_HARNESS = r'''
import torch
import yue2_core.cli.busy_cpu as busy
from yue2_nodes import composer, loader
from yue2_nodes.progress import busy_cpu_notes
out = {}
busy.busy_cpu_reason = lambda own_load=False: "other jobs kept the 2 cores 60% busy; load 2.2" if own_load else "x"
out["cpu"] = busy_cpu_notes(torch.device("cpu"), "YuE2 Composer")
out["cuda"] = busy_cpu_notes(torch.device("cuda"), "YuE2 Composer")
model = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]
result = composer.YuE2Composer.execute(model, "pop", "la la", "off", 7, 0.2)
out["report"] = result.args[3]
busy.busy_cpu_reason = lambda own_load=False: None
out["quiet report"] = composer.YuE2Composer.execute(model, "pop", "la la", "off", 7, 0.2).args[3]
results["busy"] = out
'''

NOTE = ("this CPU is busy (other jobs kept the 2 cores 60% busy; load 2.2) and ComfyUI was started without "
        "OMP_NUM_THREADS: PyTorch's threads then compete with the other jobs, which can make sampling several times "
        "slower; start ComfyUI as `OMP_NUM_THREADS=1 python main.py …` (docs/comfyui.md, \"A CPU other jobs "
        "share\")")


@pytest.fixture(scope="module")
def in_host(comfy_host, tmp_path_factory) -> dict:
    """{"edit": EDIT_HARNESS's results, "busy": NODE_HARNESS's}: one run of the installed host's python with the pack
    loaded as ComfyUI loads it, for the two tests below (importing ComfyUI takes ≈ 8 CPU-s), the edit notes first."""
    from pack_in_host import run_in_host
    from synthetic_cache import synthetic_link

    ckpts = tmp_path_factory.mktemp("newuser48") / "checkpoints"
    ckpts.mkdir()
    synthetic_link(str(ckpts / TINY), "tiny", "bf16")
    return run_in_host("results = {}\n" + EDIT_HARNESS + NODE_HARNESS + 'print("RESULT " + json.dumps(results))',
                       comfy_host, REPO, ckpts)


def test_the_composer_says_a_busy_cpu_and_where_to_set_omp_num_threads(in_host):
    """In the installed host's python with the pack loaded as ComfyUI loads it: on a CPU device the note (asked with
    own_load) is in the Composer's report; on CUDA, or on a quiet CPU, none."""
    out = in_host["busy"]
    assert out["cpu"] == [NOTE]
    assert out["cuda"] == []
    assert f"- warning: {NOTE}" in out["report"].splitlines()
    assert "this CPU is busy" not in out["quiet report"]
    assert "docs/comfyui.md" in NOTE and "A CPU other jobs share" in (REPO / "docs" / "comfyui.md").read_text()


EDIT_HARNESS = r'''
from types import SimpleNamespace
from yue2_nodes import edit_nodes
out = {}
abc = open(os.path.join(sys.argv[2], "examples", "text2music_lead_sheet.abc")).read()
child = SimpleNamespace(score=SimpleNamespace(abc=abc), request=SimpleNamespace(cot="full"))
out["edited"] = edit_nodes._edited_score_notes(child, {"score_changed": True}, 250, "Regenerate's max_seconds input")
out["long enough"] = edit_nodes._edited_score_notes(child, {"score_changed": True}, 1000, "x")
out["unchanged"] = edit_nodes._edited_score_notes(child, {"score_changed": False}, 250, "x")
out["ending"] = edit_nodes._ending(SimpleNamespace(ended=False), 250)
out["ended"] = edit_nodes._ending(SimpleNamespace(ended=True), 250)
results["edit"] = out
'''


def test_regenerate_and_continue_note_an_edited_score_longer_than_the_song(in_host):
    """The 16-bar example lead sheet (38.4 s at its tempo) connected to Regenerate of a 10 s song: the report says it
    is longer than the song's budget and names the node's own input, as the Composer says it for the same score;
    an unchanged score, or one that fits, gets no note. The budget in the report is the whole song's."""
    out = in_host["edit"]
    assert len(out["edited"]) == 1, out["edited"]
    assert re.fullmatch(r"the given score line 5 column 1: The score lasts about 38\.4 s at its tempo, more than "
                        r"the 10 s requested; generation stops at that length and the song will be cut\. Shorten the score "
                        r"or raise the duration \(Regenerate's max_seconds input\)\. \[warning\]", out["edited"][0])
    assert out["long enough"] == [] and out["unchanged"] == []
    assert out["ending"] == "hit the song's budget (250 tokens = 10.00 s, the kept part included)"
    assert out["ended"] == "ended on its end token"


# ------------------------------------------------------------------- the engine beside the nodes, not another copy

ENTRY_HARNESS = r'''
import importlib.util, json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(message)s")
spec = importlib.util.spec_from_file_location("pack_entry", sys.argv[1])
pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pack)  # no comfy_api here: the module defines its helpers and registers nothing
pack._make_engine_importable()
import yue2_core, yue2_core.constants
print("RESULT " + json.dumps([yue2_core.__file__, yue2_core.constants.__file__, getattr(yue2_core, "OTHER", None)]))
'''


def _entry(tmp_path, pythonpath: str) -> tuple[list, str]:
    import json
    import os
    import subprocess
    import sys
    # -S: no site-packages, so no installed yue2_core but the one PYTHONPATH names (the test venv's editable install
    # of some clone would otherwise decide)
    run = subprocess.run([sys.executable, "-S", "-c", ENTRY_HARNESS, str(REPO / "__init__.py")], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": pythonpath})
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):]), run.stdout


def test_the_nodes_use_the_engine_beside_them_when_another_copy_is_installed(tmp_path):
    """ComfyUI's python had another clone's yue2_core installed (`pip install -e` elsewhere): the pack appended its
    folder to sys.path only when no yue2_core was importable, so its nodes ran that other engine — an older one failed
    with `ImportError: cannot import name 'busy_cpu_reason' from 'yue2_core.cli.busy_cpu' (/other/clone/…)` when a
    node ran. Now the engine beside the nodes is loaded (its submodules too) and the log says which copy was left."""
    other = tmp_path / "site" / "yue2_core"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("OTHER = 'another clone'\n")
    (other / "constants.py").write_text("OTHER = True\n")
    (files, log) = _entry(tmp_path, str(tmp_path / "site"))
    assert files[0] == str(REPO / "yue2_core" / "__init__.py")
    assert files[1] == str(REPO / "yue2_core" / "constants.py")
    assert files[2] is None
    assert (f"LOG [ComfyUI-YuE2] using the engine beside the nodes ({REPO / 'yue2_core'}), not the yue2_core "
            f"installed at {other}") in log


def test_the_engine_beside_the_nodes_is_found_as_before(tmp_path):
    """No other copy: the pack's folder is appended to sys.path (never prepended: its nodes/ would shadow ComfyUI's
    nodes module), nothing logged; the same copy installed (`pip install -e` of this clone) is used as it is."""
    (files, log) = _entry(tmp_path, "")
    assert files[0] == str(REPO / "yue2_core" / "__init__.py") and "LOG" not in log
    (files, log) = _entry(tmp_path, str(REPO))
    assert files[0] == str(REPO / "yue2_core" / "__init__.py") and "LOG" not in log
