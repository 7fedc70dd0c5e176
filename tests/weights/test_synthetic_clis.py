"""The command lines of the synthetic VAE and vendor-folder writers (docs/lora.md "Try it without real files"):
run on the tiny profile, their outputs open with the loaders the engine uses. Each command runs as `python -m …` in
a subprocess for a write, a refusal (exit 1) and a bad option (exit 2); the further calls of a test run its `main`
in this process (`_inprocess`: a subprocess spends 2–4 s importing torch)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from yue2_core.weights.checkpoint import TOKENIZER_KEY, inspect_checkpoint
from synthetic_cache import synthetic_link
from yue2_core.weights.vae_files import open_vae

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def inprocess(capsys):
    """`_run(module, *args)` in this process: the module's `main(args)` — what its `__main__` block hands to
    sys.exit — with stdout and stderr captured, as a CompletedProcess; argparse's exit gives its status."""
    import importlib

    def run(module: str, *args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            rc = importlib.import_module(module).main(list(args))
        except SystemExit as exc:
            rc = exc.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess([module, *args], rc, out.out, out.err)
    return run


@pytest.mark.parametrize("layout,variant", [("vendor-folder", "legacy"), ("vendor-file", "merge"),
                                            ("comfy-prefixed", "standard")])
def test_vae_cli_writes_a_vae_that_opens(tmp_path, layout, variant, inprocess):
    out = str(tmp_path / ("vae" if layout == "vendor-folder" else "vae.safetensors"))
    run = _run if layout == "vendor-folder" else inprocess  # one as a subprocess
    r = run("yue2_core.weights.synthetic_vae", out, "--layout", layout, "--variant", variant, "--profile", "tiny",
             "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert os.path.abspath(out) in r.stdout and layout in r.stdout
    vae = open_vae(out)
    assert vae.layout == layout
    # a folder's config.json, a single file's safetensors metadata `release_variant`: both name the release
    assert vae.variant == variant
    assert vae.encoder and vae.config.latent_dim == 64 and vae.config.hop == 1920
    if layout == "vendor-folder":
        assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "weights_manifest.json"]
        assert "weights_manifest.json" in r.stdout


def test_vae_cli_decoder_only_and_bad_option(tmp_path, inprocess):
    out = str(tmp_path / "dec.safetensors")
    r = inprocess("yue2_core.weights.synthetic_vae", out, "--layout", "vendor-file", "--decoder-only")
    assert r.returncode == 0, r.stderr
    assert not open_vae(out).encoder
    bad = _run("yue2_core.weights.synthetic_vae", str(tmp_path / "x"), "--variant", "sdxl")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and not os.path.exists(tmp_path / "x")


def test_vendor_cli_writes_a_folder_the_loader_reads(tmp_path):
    ckpt = str(tmp_path / "tiny_bf16.safetensors")
    synthetic_link(ckpt, "tiny", "bf16", seed=0)
    out = str(tmp_path / "YuE2-3B")
    r = _run("yue2_core.weights.synthetic_vendor", ckpt, out)
    assert r.returncode == 0, r.stderr
    assert os.path.abspath(out) in r.stdout and "qwen.tiktoken" in r.stdout
    assert os.path.abspath(os.path.join(out, "vae")) in r.stdout
    comfy, vendor = inspect_checkpoint(ckpt), inspect_checkpoint(out)
    assert vendor.layout == "vendor" and vendor.format == "bf16"
    assert vendor.dims == comfy.dims and vendor.vae == comfy.vae
    # every tensor under its Comfy name; the tokenizer is the folder's qwen.tiktoken, not an embedded tensor
    assert sorted(vendor.entries) == sorted(k for k in comfy.entries if k != TOKENIZER_KEY)
    assert vendor.files["tokenizer"] == os.path.join(out, "qwen.tiktoken")
    assert open_vae(os.path.join(out, "vae")).layout == "vendor-folder"


def test_vendor_cli_refuses_a_file_that_is_not_a_checkpoint(tmp_path, inprocess):
    vae = str(tmp_path / "vae.safetensors")
    assert inprocess("yue2_core.weights.synthetic_vae", vae, "--layout", "vendor-file").returncode == 0
    r = _run("yue2_core.weights.synthetic_vendor", vae, str(tmp_path / "out"))
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and "vae.safetensors" in r.stderr and "Traceback" not in r.stderr


# --- stop-46 new-user review (docs/bad_inputs.md §27): the writers refused nothing, make-synthetic refuses ------------

def _tree(root) -> dict:
    """{relative path: (size, mtime_ns)} of every file under `root`."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            out[os.path.relpath(os.path.join(folder, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("layout", ["vendor-folder", "vendor-file"])
def test_vae_cli_refuses_to_replace_a_file_without_force(tmp_path, layout, inprocess):
    out = str(tmp_path / ("vae" if layout == "vendor-folder" else "vae.safetensors"))
    assert inprocess("yue2_core.weights.synthetic_vae", out, "--layout", layout).returncode == 0
    before = _tree(tmp_path)
    refuse = _run if layout == "vendor-folder" else inprocess  # one refusal as a subprocess
    r = refuse("yue2_core.weights.synthetic_vae", out, "--layout", layout, "--variant", "legacy")
    assert r.returncode == 1 and _tree(tmp_path) == before, r.stderr
    first = os.path.join(out, "config.json") if layout == "vendor-folder" else out
    more = " (and 2 more of the files this writes)" if layout == "vendor-folder" else ""
    assert r.stderr == (f"error: {first} exists{more}; synthetic test files (random weights) never replace a file "
                        "unless --force is given\n"), r.stderr
    r = inprocess("yue2_core.weights.synthetic_vae", out, "--layout", layout, "--variant", "legacy", "--force")
    assert r.returncode == 0 and open_vae(out).variant == "legacy", r.stderr


def test_vendor_cli_refuses_to_replace_a_file_without_force(tmp_path, inprocess):
    ckpt = str(tmp_path / "tiny_bf16.safetensors")
    synthetic_link(ckpt, "tiny", "bf16", seed=0)
    out = tmp_path / "YuE2-3B"
    (out / "vae").mkdir(parents=True)
    (out / "vae" / "config.json").write_text("{}")  # one file of the many it writes is enough
    r = inprocess("yue2_core.weights.synthetic_vendor", ckpt, str(out))
    assert r.returncode == 1 and sorted(_tree(out)) == [os.path.join("vae", "config.json")], r.stderr
    assert f"error: {out / 'vae' / 'config.json'} exists; " in r.stderr and "--force" in r.stderr
    assert inprocess("yue2_core.weights.synthetic_vendor", ckpt, str(out), "--force").returncode == 0
    assert inspect_checkpoint(str(out)).layout == "vendor"


def test_lora_cli_refuses_to_replace_a_file_without_force(tmp_path, inprocess):
    out = tmp_path / "loras"
    out.mkdir()
    (out / "fl-nar.safetensors").write_bytes(b"mine")  # the fl file's companion, not a layout's own name
    r = _run("yue2_core.weights.lora.synthetic", str(out))
    assert r.returncode == 1 and sorted(os.listdir(out)) == ["fl-nar.safetensors"], r.stderr
    assert f"error: {out / 'fl-nar.safetensors'} exists; " in r.stderr and "--force" in r.stderr
    r = inprocess("yue2_core.weights.lora.synthetic", str(out), "--force")
    assert r.returncode == 0 and (out / "fl-nar.safetensors").read_bytes() != b"mine", r.stderr
    from yue2_core.weights.lora.synthetic import planned_files
    assert sorted(_tree(out)) == sorted(os.path.relpath(p, out) for p in planned_files(out))
