"""Fixtures for the edit/candidate tests: the tiny synthetic checkpoints (bf16, int8, and a `micro` file of another
shape), an fp32 engine on CPU, and one short parent song made from a fixed 4-bar score at 240 BPM (one bar = 1 s).

The checkpoint files are written once per run for every folder and worker (tests/synthetic_cache.py); set
$YUE2_TEST_CACHE to reuse them across runs."""
import contextlib

import pytest

# 4/4 at Q:1/4=240 → one bar = 1.0 s = 25 tokens; bars 1…4 start at 0, 1, 2, 3 s.
from edit_data import SCORE  # noqa: E402,F401
PARENT_SECONDS = 2.4  # 60 tokens; min_tokens shrinks to 60, so the parent is exactly 60 tokens long


@pytest.fixture(scope="session")
def ckpt_paths():
    """Read-only shared files (tests/synthetic_cache.py): written once per run for every folder and worker."""
    from synthetic_cache import cached_checkpoint
    paths = {}
    with single_thread():
        for profile, fmt in (("tiny", "bf16"), ("tiny", "int8"), ("micro", "bf16")):
            paths[profile if profile == "micro" else fmt] = cached_checkpoint(profile, fmt)
    return paths


@pytest.fixture(scope="session")
def engine(ckpt_paths):
    import torch
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(ckpt_paths["bf16"], device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def parent(engine):
    """A 2.4 s song (60 tokens) with the 4-bar user score, seed 3, through the ordinary pipeline."""
    from yue2_core.pipeline import Budgets
    from yue2_core.protocol import SongRequest
    req = SongRequest("indie pop", "[Verse]\nla la la", cot="full", seed=3, abc=SCORE, id="parent")
    with single_thread():
        song = engine.generate(req, Budgets(max_seconds=PARENT_SECONDS))
    assert len(song.tokens.codes) == 60
    return song


@pytest.fixture(scope="session")
def saved_parent(parent, tmp_path_factory):
    from yue2_core.artifacts import save_song
    return save_song(parent, tmp_path_factory.mktemp("songs") / "parent")


@contextlib.contextmanager
def single_thread():
    """One intra-op thread inside the block (restored afterwards): the tiny model's ops are too small to gain from
    threads, and on a busy 2-core machine spinning OpenMP workers made these tests up to 5× slower."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    with single_thread():
        yield
