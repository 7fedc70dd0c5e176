"""Fixtures for the batch tests: the tiny synthetic checkpoints (written once per run for every folder and worker by
tests/synthetic_cache.py; reused across runs under $YUE2_TEST_CACHE), a bf16 CPU engine loaded as the CLI loads it,
and one intra-op thread while a test runs (the tiny model's ops gain nothing from threads on a shared 2-core
machine)."""

import pytest


@pytest.fixture(scope="session")
def tiny_ckpt():
    from synthetic_cache import cached_checkpoint
    return cached_checkpoint("tiny", "bf16")


@pytest.fixture(scope="session")
def tiny_int8_ckpt():
    from synthetic_cache import cached_checkpoint
    return cached_checkpoint("tiny", "int8")


@pytest.fixture(scope="session")
def engine(tiny_ckpt):
    import torch
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(tiny_ckpt, device="cpu", dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def one_thread():
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
