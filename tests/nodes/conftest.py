"""Fixtures for the node tests: the synthetic checkpoints in the session server's models folder and /object_info.

Every test here talks to the real ComfyUI server of the session (tests/conftest.py: `comfy_server`, `comfy`); the
checkpoints are written once per run with yue2_core.weights.synthetic (random weights; tests/synthetic_cache.py).
Helpers: nodes_testlib.py; `in_host` runs a harness in the installed host's python with the pack loaded, no server
(host_fork.py: one host python per session forks a child per harness).
"""
from __future__ import annotations

import pytest

from nodes_testlib import MICRO, REPO, TINY, TINY_INT8


@pytest.fixture(scope="session")
def checkpoints(comfy_server) -> dict:
    """{name: path} of the synthetic checkpoints, put into the server's models/checkpoints once: hard links to the
    run's shared files (tests/synthetic_cache.py `synthetic_link`; ≈ 0.35 GB not copied): the tests read them, and
    may delete or replace one (os.replace), never write into one (`synthetic_copy` gives a file of its own)."""
    from synthetic_cache import synthetic_link
    made = {}
    for name, profile, fmt in ((TINY, "tiny", "bf16"), (TINY_INT8, "tiny", "int8"), (MICRO, "micro", "bf16")):
        path = comfy_server.models_dir / name
        if not path.exists():
            synthetic_link(path, profile, fmt)
        made[name] = path
    return made


@pytest.fixture(scope="session")
def node_info(comfy, checkpoints) -> dict:
    """/object_info after the checkpoints exist (the loader's list includes them)."""
    return comfy.object_info()


@pytest.fixture(scope="session")
def in_host(comfy_host, tmp_path_factory):
    """`in_host(code, checkpoints) -> dict`: tests/host/pack_in_host.py's `run_in_host(code, comfy_host, REPO,
    checkpoints)`, in a child forked from one host python of the session (host_fork.py) instead of a fresh process
    that imports torch, ComfyUI and the pack again for each harness."""
    from host_fork import HostFork
    fork = HostFork(comfy_host, REPO, tmp_path_factory.mktemp("host-fork"))
    try:
        yield fork.run
    finally:
        fork.close()
