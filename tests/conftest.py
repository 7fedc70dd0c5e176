"""Shared test set-up: markers, and the one real ComfyUI server per test session.

Markers (declared in pyproject.toml):
  gpu   needs CUDA; skipped (visibly) where torch.cuda.is_available() is false
  host  applied automatically to every test that uses `comfy_host`/`comfy_server` (directly or through a fixture)
  e2e   applied automatically to everything under tests/e2e

Fixtures (session-scoped, shared by tests/host, tests/e2e and any other folder that needs the host):
  comfy_host    (ComfyUI dir, python) of the installed host, for in-process use without a server
  comfy_server  a started ComfyUI 0.3.75 (`.url`, `.log_path`, `.models_dir`, `.output_dir`, `.input_dir`,
                `.user_dir`, `.pack_load_error`, `.import_problems()`); see tests/host/comfy_client.py:ComfyServer
  comfy         a ComfyClient bound to it
  synthetic_run_folder  (autouse) where tests/synthetic_cache.py keeps this run's synthetic checkpoints, written
                once per run for every folder and worker (`cached_checkpoint`, `synthetic_link`, `synthetic_copy`);
                at the session's end it fails when a test wrote into one of them (`check_shared`)

When the host is not installed the host tests SKIP with the reason (pytest -ra lists it); under scripts/test.sh
(YUE2_REQUIRE_HOST=1) a missing host is an error instead.

Process set-up, before any test (and inherited by every subprocess and the ComfyUI server):
  ONEDNN_MAX_CPU_ISA=AVX2 (unless set): the tests that check the batched decoder's rows against single runs bit for
        bit (tests/batch, tests/nodes/test_nodes_takes.py) check the batching (masks, positions, draws), and need
        products whose rows do not depend on how many rows are multiplied. oneDNN's AVX-512 bf16 kernels, chosen on
        AVX-512 CPUs (the stop-57 machine), block by the row count: one row of a 3-row LM-head product differs in
        the last bit from the same row alone; its AVX2 kernels do not (docs/batch.md, "CPU"). A value set before
        the run is kept (another ISA on such a CPU makes those tests fail, as they should).
  SIGINT → KeyboardInterrupt: a test run started in the background by a script (`cmd &`) inherits SIGINT ignored,
        and Python then installs no handler, so the tests that interrupt themselves (tests/robust) saw nothing; a
        handler set here is also reset to the default in their subprocesses.
"""
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS / "host"))  # comfy_client: importable from any test folder

from comfy_client import ComfyClient, ComfyError, ComfyServer, find_host  # noqa: E402
import synthetic_cache  # noqa: E402  (tests/synthetic_cache.py: this folder is on sys.path, as every conftest's is)


def _unavailable(reason: str, required_by: str):
    """Skip, or fail when the environment says this layer must run (scripts/test.sh installed it)."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{reason} ({required_by}=1, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(config, items):
    gpu_items = []
    for item in items:
        if "comfy_host" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.host)
        if TESTS / "e2e" in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("gpu"):
            gpu_items.append(item)
    if gpu_items:
        try:
            import torch
            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            skip = pytest.mark.skip(reason="needs CUDA (marked gpu); torch.cuda.is_available() is false here")
            for item in gpu_items:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def synthetic_run_folder(tmp_path_factory):
    """The folder of this run's shared synthetic checkpoints (tests/synthetic_cache.py): under pytest-xdist the
    parent of the workers' temporary folders (pytest-N/, so every worker reads the same files), else the session's
    own temporary folder. $YUE2_TEST_CACHE, when set, takes precedence (in synthetic_cache.run_folder)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "synthetic-checkpoints"
    synthetic_cache.set_run_folder(folder)
    yield folder
    synthetic_cache.check_shared(sample=True)  # no test wrote into a shared file (a hard link of synthetic_link)


@pytest.fixture(scope="session")
def node_js() -> str:
    """The `node` executable, for tests that run the pack's web/ modules without a browser; skips without it (an
    error under scripts/test.sh, which installs it: YUE2_REQUIRE_BROWSER=1)."""
    import shutil
    found = shutil.which("node")
    if not found:
        _unavailable("node is not installed (scripts/test.sh installs it)", "YUE2_REQUIRE_BROWSER")
    return found


@pytest.fixture(scope="session")
def comfy_host() -> tuple:
    """(ComfyUI dir, python that runs it) of the installed host; skips (or fails under scripts/test.sh) without one."""
    host = find_host(REPO)
    if isinstance(host, str):
        _unavailable(host, "YUE2_REQUIRE_HOST")
    return host


@pytest.fixture(scope="session")
def comfy_server(comfy_host, tmp_path_factory):
    comfy_dir, python = comfy_host
    server = ComfyServer(comfy_dir, python, tmp_path_factory.mktemp("comfyui"))
    try:
        server.start()
    except ComfyError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def comfy(comfy_server) -> ComfyClient:
    return ComfyClient(comfy_server.url)


def _older_song(song, dst, edit):
    """A copy of the song folder `song` at `dst` whose config.json `edit(config)` changed, resealed (the manifest
    entry and result.json's seal recomputed): what a song of an earlier version records. Returns dst."""
    import hashlib
    import json
    import shutil
    from yue2_core.artifacts import seal_result
    shutil.copytree(song, dst)
    config = json.loads((dst / "config.json").read_text("utf-8"))
    edit(config)
    data = json.dumps(config, indent=2).encode("utf-8")
    (dst / "config.json").write_bytes(data)
    result = json.loads((dst / "result.json").read_text("utf-8"))
    result["artifacts"]["config.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (dst / "result.json").write_text(json.dumps(seal_result(result)), "utf-8")
    return dst


@pytest.fixture
def older_song():
    """`_older_song`: (song, dst, edit) → a resealed copy of a song whose config.json was edited."""
    return _older_song
