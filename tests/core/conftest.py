"""Shared fixtures for engine tests: synthetic checkpoints (generated once per session into a temp dir)."""
import os

import pytest


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    """Paths of the `tiny` synthetic checkpoints (bf16 and int8, seed 0), written once per session. A cache directory
    can be given with $YUE2_TEST_CACHE to reuse them across sessions."""
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    root = os.environ.get("YUE2_TEST_CACHE") or str(tmp_path_factory.mktemp("ckpt"))
    os.makedirs(root, exist_ok=True)
    paths = {}
    for fmt in ("bf16", "int8"):
        path = os.path.join(root, f"yue2_tiny_{fmt}.safetensors")
        if not os.path.exists(path):
            write_synthetic_checkpoint(path, profile="tiny", fmt=fmt, seed=0)
        paths[fmt] = path
    return paths


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
