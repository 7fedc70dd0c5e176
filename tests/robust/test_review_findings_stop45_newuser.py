"""Findings of the 2026-12-06 new-user review (stop 45), docs/bad_inputs.md §24: a synthetic checkpoint written to a
folder that did not exist without a word, and a song sampled several times slower on a busy CPU with nothing pointing
at OMP_NUM_THREADS=1."""
from __future__ import annotations

import os

import pytest

from test_cli import main_inprocess


@pytest.fixture
def fake_writer(monkeypatch):
    """make-synthetic's writer replaced by one that makes the folder and an empty file, as fast as a test needs (the
    real one takes seconds; what it writes is tested in tests/core/test_synthetic.py)."""
    import yue2_core.weights.synthetic as synthetic

    def write(path, profile="tiny", fmt="bf16", seed=0, **_):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        open(path, "wb").close()
        return {"path": os.path.abspath(path), "profile": profile, "format": fmt, "seed": seed}
    monkeypatch.setattr(synthetic, "write_synthetic_checkpoint", write)


def test_make_synthetic_names_a_folder_it_had_to_create(tmp_path, capsys, monkeypatch, fake_writer):
    """`cd custom_nodes/ComfyUI-YuE2 && … --output ../../models/checkpoints/x.safetensors` where the pack folder is a
    symbolic link: `..` follows the link's target, so the file went to a new /models/checkpoints, unlisted by ComfyUI,
    and the command said nothing but the path in its JSON. Now the new folder is named on stderr, resolved."""
    clone, comfy = tmp_path / "src" / "clone", tmp_path / "ComfyUI"
    clone.mkdir(parents=True)
    (comfy / "models" / "checkpoints").mkdir(parents=True)
    (comfy / "custom_nodes").mkdir()
    (comfy / "custom_nodes" / "ComfyUI-YuE2").symlink_to(clone)
    monkeypatch.chdir(comfy / "custom_nodes" / "ComfyUI-YuE2")
    rc, err = main_inprocess(capsys, "make-synthetic", "--output", "../../models/checkpoints/tiny.safetensors")
    assert rc == 0 and (tmp_path / "models" / "checkpoints" / "tiny.safetensors").is_file()
    where = (tmp_path / "models").resolve()
    assert (f"note: created the folder {where}, which did not exist, for tiny.safetensors; for ComfyUI the file "
            "belongs in its models/checkpoints folder") in err, err
    rc, err = main_inprocess(capsys, "make-synthetic", "--output", comfy / "models" / "checkpoints" / "x.safetensors")
    assert rc == 0 and "created the folder" not in err, err  # an existing folder: nothing to say


@pytest.mark.parametrize("load, omp, said", [(3.8, None, True), (2.0, None, True), (1.2, None, False),
                                             (3.8, "1", False), (3.8, "2", False)])
def test_a_busy_cpu_without_omp_num_threads_is_pointed_at_the_readme(monkeypatch, capsys, load, omp, said):
    """`bash scripts/song.sh` beside other jobs on 2 cores: 6 tokens/s, 221 s for the default 20 s song, and nothing
    said why; the README's OMP_NUM_THREADS=1 makes it several times faster. Now a note when the load (before the
    run's work) already fills every core and OMP_NUM_THREADS is not set."""
    import yue2_core.__main__ as cli
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # what it counts (stop 46)
    # below a full load the cores' own counters decide (stop 47); here they are idle: the load was an earlier run's
    monkeypatch.setattr("yue2_core.cli.busy_cpu._busy_share", lambda cpus: 0.0)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    cli._note_busy_cpu()
    err = capsys.readouterr().err
    if said:
        assert err == (f"NOTE: this CPU is busy (load {load:.1f} on 2 cores) and OMP_NUM_THREADS is not set: "
                       "PyTorch's threads then compete with the other jobs, which can make sampling several times "
                       "slower; put OMP_NUM_THREADS=1 before the command (README, \"A CPU another job shares?\")\n")
    else:
        assert err == ""
