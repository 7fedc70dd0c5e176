"""Shared fixtures for engine tests: synthetic checkpoints (tests/synthetic_cache.py: written once per run)."""

import pytest


@pytest.fixture(scope="session")
def tiny_paths():
    """Paths of the `tiny` synthetic checkpoints (bf16 and int8, seed 0), written once per run for every test folder
    and worker (tests/synthetic_cache.py; $YUE2_TEST_CACHE reuses them across runs). Read-only."""
    from synthetic_cache import cached_checkpoint
    return {fmt: cached_checkpoint("tiny", fmt) for fmt in ("bf16", "int8")}


@pytest.fixture(scope="session")
def tiny_engine_fp32(tiny_paths):
    import torch
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(tiny_paths["bf16"], device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_engine(tiny_paths):
    import torch
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(tiny_paths["bf16"], device="cpu", dtype=torch.bfloat16)
