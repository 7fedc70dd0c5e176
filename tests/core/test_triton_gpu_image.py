"""Every Triton kernel of the GPU path compiles with the GPU machine image's Triton, not only with CI's.

The project's GPU machine runs torch 2.11 + Triton 3.6 (docs/gpu_tests.md), CI and the development machines Triton
3.8; the PTX tests (tests/core/test_pdl_ptx.py, test_w8a8_ptx.py, …) compile with the latter. Stop 51: the W8A8 GEMM
passed them and failed on the GPU — Triton 3.6's front end refused an int8 `tl.dot(a, b, acc)` without
`out_dtype=tl.int32`, which 3.8 infers. scripts/test.sh installs that Triton with `pip install --target` into
.comfyhost/triton-gpu-image/lib (its pin, GPU_IMAGE_TRITON, is read from there) and exports the folder as
YUE2_TRITON_GPU_IMAGE; this test runs tests/core/gpu_kernel_variants.py with it first on the path (this venv's
Python and torch otherwise), which compiles every launched kernel of yue2_core in the configurations the GPU compiles
for sm_90, and reports each refusal with the variant's name and Triton's message. Outside CI (CI=true) a missing
side environment skips; in CI it fails.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_kernel_variants import launched_kernels  # tests/core/gpu_kernel_variants.py (no Triton needed for this)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("gpu_kernel_variants.py")
TEST_SH = REPO / "scripts" / "test.sh"


def gpu_image_triton() -> str:
    """GPU_IMAGE_TRITON of scripts/test.sh: the version of Triton the GPU machine image has (one pin, there)."""
    found = re.search(r'^readonly GPU_IMAGE_TRITON="([0-9][^"]*)"', TEST_SH.read_text(encoding="utf-8"), re.M)
    assert found, "scripts/test.sh has no readonly GPU_IMAGE_TRITON=\"X.Y.Z\" pin"
    return found.group(1)


def _side_env() -> Path:
    lib = Path(os.environ.get("YUE2_TRITON_GPU_IMAGE") or REPO / ".comfyhost" / "triton-gpu-image" / "lib")
    version = gpu_image_triton()
    if not (lib / "triton" / "__init__.py").is_file() or not (lib / f"triton-{version}.dist-info").is_dir():
        reason = f"no Triton {version} (the GPU image's) in {lib}; `bash scripts/test.sh --setup-only` installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: scripts/test.sh should have)", pytrace=False)
        pytest.skip(reason)
    return lib


def test_the_launched_kernels_are_found_in_the_source():
    """The list the compile is checked against (kernels = @triton.jit functions no jit function refers to) finds
    the known kernels — including those defined in closures (fused, int8_kernels) — and leaves out helpers, called
    or passed to `tl.reduce`."""
    found = set(launched_kernels())
    assert {"gemm_kernel", "quantize_kernel", "gemv_kernel", "gemv_q_kernel", "attn_split_kernel", "snake_kernel",
            "w8a16", "scores_kernel", "finish_kernel", "layer_kernel"} <= found, sorted(found)
    assert not found & {"pdl_prologue", "rot_rows", "_max_keep_nan", "merge_store", "attend_chunk", "grid_sync"}


def test_every_gpu_kernel_compiles_with_the_gpu_images_triton(tmp_path):
    lib = _side_env()
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH", "TRITON_CACHE_DIR")}
    env.update(PYTHONPATH=os.pathsep.join([str(lib), str(REPO)]), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{SCRIPT.name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines and "triton" in lines[-1], proc.stdout[-2000:]
    *results, summary = lines
    # the side environment's Triton compiled them, not this venv's
    assert summary["triton"] == gpu_image_triton(), summary
    assert Path(summary["file"]).resolve().is_relative_to(lib.resolve()), summary["file"]
    uncovered = set(summary["launched"]) - {r["kernel"] for r in results}
    assert not uncovered, (f"kernels of yue2_core that {SCRIPT.name} does not compile (add their GPU "
                           f"configurations there): {sorted(uncovered)}")
    failed = [r for r in results if not r["ok"]]
    if failed:
        pytest.fail(f"{len(failed)} of {len(results)} kernel variants do not compile with Triton {summary['triton']} "
                    "(the GPU image's; CI's Triton may accept them):\n\n"
                    + "\n\n".join(f"{r['variant']} ({r['kernel']}):\n{r['error']}" for r in failed), pytrace=False)
    assert summary["launched"], "no launched kernel found in yue2_core: the source scan is broken"
