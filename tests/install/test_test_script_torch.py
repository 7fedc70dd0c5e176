"""scripts/test.sh and a .venv that holds another torch than the tests' pins (new-user review, stop 39): after the
README's "No GPU?" route (a CPU torch, which scripts/song.sh keeps) the test script replaced it with the pinned CUDA
build, ≈ 5 GB, and filled a shared disk. Its `check_torch_room` now says what it replaces and stops before any
download where the disk cannot hold it. The function is run as the script defines it (extracted from test.sh), with
a stand-in python that reports the torch version and a `df` that reports the free space."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "scripts" / "test.sh").read_text()


def _function(name: str) -> str:
    m = (re.search(rf"^{name}\(\) {{ .*}}$", SCRIPT, re.M)  # a one-line function
         or re.search(rf"^{name}\(\) {{\n.*?^}}$", SCRIPT, re.S | re.M))
    assert m, f"{name} is not defined in scripts/test.sh"
    return m.group(0)


def _run(tmp_path: Path, torch_version: str | None, free_kb: int) -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n" + (f"echo {torch_version}\n" if torch_version else "exit 1\n"))
    python.chmod(0o755)
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                              f"echo '/dev/x 100000000 1 {free_kb} 1% /'\n")
    (shims / "df").chmod(0o755)
    pins = re.search(r"^readonly TORCH_SPECS=.*$", SCRIPT, re.M).group(0)
    room = re.search(r"^readonly TORCH_ROOM_GB=.*$", SCRIPT, re.M).group(0)
    body = "\n".join(["set -euo pipefail", f'VENV="{venv}"', f'VPY="{python}"', pins, room,
                      _function("say"), _function("die"), _function("check_torch_room"),
                      "check_torch_room", "echo CONTINUED"])
    return subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{shims}:/usr/bin:/bin"})


def test_another_torch_on_a_full_disk_stops_before_downloading(tmp_path):
    run = _run(tmp_path, "2.13.0+cpu", 3 * 1024 * 1024)
    assert run.returncode == 1 and "CONTINUED" not in run.stdout
    assert ".venv has torch 2.13.0+cpu; the tests run on torch==2.14.1 torchvision==0.29.1" in run.stdout
    assert "only 3 GB free where .venv lies" in run.stderr and "nothing was downloaded" in run.stderr


def test_another_torch_with_room_is_replaced_after_saying_so(tmp_path):
    run = _run(tmp_path, "2.13.0+cpu", 50 * 1024 * 1024)
    assert run.returncode == 0 and "CONTINUED" in run.stdout and "≈ 5 GB to download" in run.stdout


def test_the_pinned_torch_or_none_goes_on_without_a_word(tmp_path):
    for version in ("2.14.1+cu130", None):  # the pins (any build), or a fresh venv without torch (CI)
        run = _run(tmp_path, version, 1024)
        assert run.returncode == 0 and run.stdout == "CONTINUED\n", (version, run.stdout, run.stderr)
