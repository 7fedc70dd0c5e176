"""Install safety (issue 6; user_reports.md §3.3 entries 36–37: installers that replaced the user's CUDA torch).

A throwaway virtual environment gets a torch of its own (the CPU wheel 2.13.0 already on disk, /opt/wheels or pip's
find-links; skipped with the reason when there is none — the test never downloads a torch), then the
pack is installed into it twice — the way pip users do (`pip install <repo>`, non-editable, with its declared
dependencies; from a copy of the checkout, so pip's build/ folder stays out of it) and the way ComfyUI-Manager does
(`pip install -r requirements.txt`). torch's version and location
must not change and pip must not fetch or remove any torch build (a CUDA torch download is a failure). Slow (about
40 CPU-seconds: one real torch install, two of the pack), but part of the suite. torch is looked at without importing
it (its metadata version, where `import torch` would load it from, and that file's inode and change time: a
reinstall of the same version shows too); it is imported — works — in the import check of the installed pack and in
scripts/song.sh's song."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TORCH = "2.13.0"
TORCH_PROBE = ("import importlib.metadata as m, importlib.util as u, json, os\n"
               "origin = u.find_spec('torch').origin\n"  # the file `import torch` runs, found without running it
               "st = os.stat(origin)\n"
               "print(json.dumps([m.version('torch'), origin, st.st_ino, st.st_ctime_ns]))")
TORCH_NAMES = re.compile(r"^\s*(torch|torchvision|torchaudio)\s*([=<>!~;\[].*)?$", re.I)
pytestmark = pytest.mark.slow


def _pip(python: Path, *args, timeout=600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONWARNINGS="ignore")
    if args[0] == "install":  # no byte-compiling of what pip installs (torch alone: ~15 of its ~22 CPU-seconds);
        args = ("install", "--no-compile", *args[1:])  # the probes compile what they import (`_probe_env`)
    for name in ("PYTHONPATH", "PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_TARGET", "PIP_PREFIX", "PIP_USER"):
        env.pop(name, None)
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(python.parent))


SKIP_DIRS = {".git", ".venv", ".comfyhost", "build", "dist", "node_modules", "out", "models", "__pycache__",
             ".hypothesis", ".pytest_cache", ".parity", ".ruff_cache"}


def _source_copy(dst: Path) -> Path:
    """The checkout without environments, caches, models and build output (what `pip install <repo>` packs)."""
    def ignore(folder, names):
        return {n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")}
    shutil.copytree(REPO, dst, ignore=ignore)
    return dst


def _local_torch_wheel() -> Path | None:
    """A torch wheel already on disk (pip's find-links folders, /opt/wheels), CPU builds first: the test never
    downloads a torch itself."""
    folders = [f.removeprefix("file://") for f in os.environ.get("PIP_FIND_LINKS", "").split() if f]
    wheels = []
    for folder in [*folders, "/opt/wheels"]:
        wheels += sorted(Path(folder).glob(f"torch-{TORCH}*.whl")) if Path(folder).is_dir() else []
    wheels.sort(key=lambda w: "+cpu" not in w.name)
    return wheels[0] if wheels else None


def _probe_env() -> dict:
    """The environment of the throwaway venv's Python: bytecode written (a PYTHONDONTWRITEBYTECODE=1 here would
    recompile torch's modules at every import, pip having compiled none), and no PYTHONPATH (a checkout on it would be
    imported instead of the installed pack)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPATH", None)
    return env


def _torch(python: Path) -> list:
    """[version, torch/__init__.py, its inode, its change time] in the venv, without importing torch (each import
    costs 2–4 s)."""
    import json
    proc = subprocess.run([str(python), "-W", "ignore", "-c", TORCH_PROBE], capture_output=True, text=True,
                          timeout=120, cwd=str(python.parent), env=_probe_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _unavailable(proc: subprocess.CompletedProcess) -> str | None:
    """A failure to *get* packages (no network, missing from the index) that is not about torch: skip, not fail."""
    text = proc.stdout + proc.stderr
    missing = re.findall(r"No matching distribution found for ([A-Za-z0-9_.\-]+)", text)
    if missing and not any(m.lower().startswith("torch") for m in missing):
        return f"package index unavailable for {missing}"
    if re.search(r"(NewConnectionError|Temporary failure in name resolution|Network is unreachable)", text):
        return "no network for the package index"
    return None


def _no_torch_activity(proc: subprocess.CompletedProcess) -> None:
    log = proc.stdout + proc.stderr
    for pattern in (r"Uninstalling torch", r"Collecting torch\b", r"Downloading torch-", r"Processing \S*torch-",
                    r"Collecting nvidia-", r"Downloading nvidia-", r"Attempting uninstall: torch"):
        assert not re.search(pattern, log), f"pip touched torch ({pattern}):\n{log[-4000:]}"


def test_requirements_do_not_pin_torch():
    for path in (REPO / "requirements.txt",):
        lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
        pinned = [ln for ln in lines if ln and TORCH_NAMES.match(ln)]
        assert not pinned, f"{path.name} must not list torch/torchvision/torchaudio (ComfyUI owns torch): {pinned}"
    import tomllib
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_deps = [d for d in deps if TORCH_NAMES.match(d)]
    assert all(d.replace(" ", "").lower().startswith("torch>=") and "<" not in d and "==" not in d
               for d in torch_deps), f"torch may only have a lower bound in pyproject.toml: {torch_deps}"
    assert not any(re.match(r"^\s*(torchvision|torchaudio)", d, re.I) for d in deps)


def test_install_keeps_torch(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    if not python.exists():  # Windows layout
        python = env_dir / "Scripts" / "python.exe"
    wheel = _local_torch_wheel()
    if wheel is None:
        pytest.skip(f"no torch {TORCH} wheel on disk (PIP_FIND_LINKS, /opt/wheels); the test does not download one")
    proc = _pip(python, "install", str(wheel))
    if proc.returncode != 0:
        reason = _unavailable(proc)
        if reason:
            pytest.skip(f"cannot install the torch test wheel's dependencies here ({reason})")
        pytest.fail(f"installing {wheel.name} failed:\n{proc.stderr[-3000:]}")
    before = _torch(python)
    assert before[0].startswith(TORCH), before

    source = _source_copy(tmp_path / "src")  # pip builds in the source tree: keep build/ out of the checkout
    proc = _pip(python, "install", str(source))  # non-editable, with the declared dependencies
    if proc.returncode != 0:
        reason = _unavailable(proc)
        if reason:
            pytest.skip(reason)
        pytest.fail(f"pip install <repo> failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    _no_torch_activity(proc)
    assert _torch(python) == before, "installing the pack changed torch"
    check = subprocess.run([str(python), "-W", "ignore", "-c",
                            "import yue2_core, yue2_core.weights.checkpoint, yue2_core.weights.selfcheck; print(yue2_core.__file__)"],
                           capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=_probe_env())
    assert check.returncode == 0 and str(env_dir) in check.stdout, check.stderr[-2000:]

    proc = _pip(python, "install", "-r", str(REPO / "requirements.txt"))  # ComfyUI-Manager's way
    if proc.returncode != 0 and not _unavailable(proc):
        pytest.fail(f"pip install -r requirements.txt failed:\n{proc.stderr[-3000:]}")
    _no_torch_activity(proc)
    assert _torch(python) == before, "installing requirements.txt changed torch"

    # the README's first command into an environment that has a torch of another version than scripts/lib/
    # constraints.txt pins (2.14.1): song.sh installs the engine (editable, from the copy) and keeps that torch
    proc = _pip(python, "uninstall", "-y", "comfyui-yue2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # song.sh's synthetic file (models/ is not copied): the run's shared tiny file, not one more written by the script
    from synthetic_cache import cached_checkpoint
    tiny = Path(cached_checkpoint("tiny", "bf16"))
    (source / "models").mkdir()
    try:
        os.link(tiny, source / "models" / "yue2_tiny_bf16.safetensors")
    except OSError:  # another file system
        shutil.copyfile(tiny, source / "models" / "yue2_tiny_bf16.safetensors")
    env = dict(_probe_env(), SONG_SH_VENV=str(env_dir), OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    for name in ("PYTHONPATH", "PIP_CONSTRAINT", "YUE2_CHECKPOINT"):
        env.pop(name, None)
    song = subprocess.run(["bash", str(source / "scripts" / "song.sh"), "--max-seconds", "0.12", "--steps", "1",
                           "--max-abc-tokens", "2", "--output", str(tmp_path / "song")], capture_output=True,
                          text=True, timeout=900, env=env, cwd=str(tmp_path))
    log = song.stdout + song.stderr
    if song.returncode != 0 and _unavailable(song):
        pytest.skip(_unavailable(song))
    assert song.returncode == 0, log[-4000:]
    assert f"keeping the installed torch=={before[0]}" in log, log[-4000:]
    assert "picked by scripts/song.sh: its synthetic file" in log, log[-4000:]
    assert "the torch there is kept" in log and "~5 GB" not in log, log[-4000:]  # no download announced (review)
    _no_torch_activity(song)
    assert _torch(python) == before, "scripts/song.sh changed torch"
    assert (tmp_path / "song" / "audio.flac").is_file(), log[-3000:]
    assert sys.prefix != str(env_dir)  # the test's own environment was never touched
