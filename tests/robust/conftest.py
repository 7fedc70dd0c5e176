"""Fixtures of the robustness tests (issue 6: the bad-input catalogue, the int8 self-check, fuzzing).

Checkpoints are synthetic and written once per session (into $YUE2_TEST_CACHE when set, so they are shared with
tests/core): `micro` (vocab 1024, 15–19 MB) for loader tests, `tiny` (release vocabulary) where prompts must be
built, and `nano` (one layer, 1.2 MB) for header fuzzing. `tokenizer` is the synthetic release-vocabulary tokenizer
without any file (the one embedded in the tiny checkpoints)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for path in (str(REPO), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory) -> Path:
    root = Path(os.environ.get("YUE2_TEST_CACHE") or tmp_path_factory.mktemp("robust_ckpt"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _synthetic(root: Path, profile, fmt: str) -> str:
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    if isinstance(profile, str):  # the named profiles: one file per run for every folder and worker (read-only)
        from synthetic_cache import cached_checkpoint
        return cached_checkpoint(profile, fmt)
    name = profile.name
    path = root / f"yue2_{name}_{fmt}.safetensors"
    if not path.exists():
        write_synthetic_checkpoint(str(path), profile=profile, fmt=fmt, seed=0)
    return str(path)


@pytest.fixture(scope="session")
def micro_paths(ckpt_dir) -> dict:
    return {fmt: _synthetic(ckpt_dir, "micro", fmt) for fmt in ("bf16", "int8")}


@pytest.fixture(scope="session")
def tiny_paths(ckpt_dir) -> dict:
    return {fmt: _synthetic(ckpt_dir, "tiny", fmt) for fmt in ("bf16", "int8")}


@pytest.fixture(scope="session")
def nano_path(ckpt_dir) -> str:
    from robust_helpers import NANO
    return _synthetic(ckpt_dir, NANO, "int8")


@pytest.fixture(scope="session")
def tokenizer():
    from yue2_core.weights.synthetic_tokenizer import tokenizer_json
    from yue2_core.weights.tokenizer import YuE2Tokenizer
    return YuE2Tokenizer(tokenizer_json().decode("utf-8"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_paths):
    import torch
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(tiny_paths["bf16"], device="cpu", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def single_thread():
    """Fuzz tests run thousands of tiny torch ops: one intra-op thread avoids OpenMP spin-waits that make them
    10–30× slower on a busy 2-core machine. Restored afterwards."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def busy_cpu(monkeypatch, tmp_path):
    """The busy-CPU note's inputs (`yue2_core.cli.busy_cpu`), set per test: `busy_cpu(load, host cores, affinity
    mask, /proc/stat samples)` → the module; reading /proc/stat more often than samples were given fails the test."""
    import yue2_core.cli.busy_cpu as cli
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cli, "BUSY_SAMPLE_S", 0)
    state = {"samples": []}
    real = cli._cpu_ticks
    monkeypatch.setattr(cli, "_cpu_ticks", lambda path="/proc/stat": (
        real(state["samples"].pop(0)) if state["samples"] else pytest.fail("/proc/stat read without a sample")))

    def setup(load, host, affinity, samples=()):
        monkeypatch.setattr(cli.os, "getloadavg", lambda: (load, load, load))
        monkeypatch.setattr(cli.os, "cpu_count", lambda: host)
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: set(affinity), raising=False)
        files = []
        for n, text in enumerate(samples):
            path = tmp_path / f"stat{n}"
            path.write_text(text)
            files.append(str(path))
        state["samples"] = files
        return cli
    return setup
