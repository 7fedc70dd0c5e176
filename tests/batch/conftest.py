"""Fixtures for the batch tests: the tiny synthetic checkpoint (bf16, reused across sessions under $YUE2_TEST_CACHE),
a bf16 CPU engine loaded as the CLI loads it, and one intra-op thread while a test runs (the tiny model's ops gain
nothing from threads on a shared 2-core machine)."""
import os

import pytest


def _tiny(tmp_path_factory, fmt: str) -> str:
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    root = os.environ.get("YUE2_TEST_CACHE") or str(tmp_path_factory.mktemp("ckpt"))
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"yue2_tiny_{fmt}.safetensors")
    if not os.path.exists(path):
        write_synthetic_checkpoint(path, profile="tiny", fmt=fmt, seed=0)
    return path


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    return _tiny(tmp_path_factory, "bf16")


@pytest.fixture(scope="session")
def tiny_int8_ckpt(tmp_path_factory):
    return _tiny(tmp_path_factory, "int8")


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
