"""Findings of the stop-46 new-user review (docs/bad_inputs.md §27)."""
from __future__ import annotations

import os
import stat

import pytest

from robust_helpers import REPO


# --- the test-file writers' safetensors are 0600, the JSON beside them 0644 -----------------------------------------

def test_synthetic_lora_and_vae_files_get_a_new_files_mode(tmp_path):
    """safetensors' save_file leaves 0600: the LoRA and VAE files of the test-file writers could not be read by
    another user (a ComfyUI service account) while the JSON files beside them could. Now 0666 less the umask."""
    from yue2_core.artifacts import UMASK
    from yue2_core.weights.lora.synthetic import profile_dims, write_all
    from yue2_core.weights.synthetic_vae import write_vae
    want = 0o666 & ~UMASK
    paths = list(write_all(tmp_path / "loras", profile_dims("tiny")).values())
    paths += [write_vae(str(tmp_path / "vae")), write_vae(str(tmp_path / "v.safetensors"), layout="comfy-prefixed")]
    files = [p for p in map(str, paths) if os.path.isfile(p)]
    files += [str(p) for p in (tmp_path / "loras").rglob("*") if p.is_file()]
    files += [str(p) for p in (tmp_path / "vae").iterdir()]
    assert len(files) > 20 and any(f.endswith(".json") for f in files)
    modes = {f: stat.S_IMODE(os.stat(f).st_mode) for f in files}
    assert {f: m for f, m in modes.items() if m != want} == {}, want


# --- the search order as documented: the Hugging Face cache step was left out ---------------------------------------

def test_the_checkpoint_search_order_names_the_hugging_face_cache():
    """`find_checkpoint` looks for m-a-p/YuE2-3B in the Hugging Face cache before it downloads; the --checkpoint
    help of generate / render / batch, WHERE_TO_GET and the README's "On the command line" did not say so."""
    from yue2_core.__main__ import build_parser
    from yue2_core.weights.locate import WHERE_TO_GET
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    for name in ("generate", "render", "batch"):
        helped = " ".join(next(a for a in sub[name]._actions if a.dest == "checkpoint").help.split())
        assert ("is set, the vendor's m-a-p/YuE2-3B in the Hugging Face cache, else download Comfy-Org/YuE2's int8 "
                "file" in helped), (name, helped)
    assert "then the Hugging Face cache for the vendor's m-a-p/YuE2-3B" in WHERE_TO_GET
    readme = " ".join((REPO / "README.md").read_text("utf-8").split())
    assert ("is set), then the vendor's m-a-p/YuE2-3B folder in the Hugging Face cache (where the vendor runtime "
            "downloaded it; never downloaded here), then downloads the 3.7 GB int8 file") in readme


# --- docs: commands with the system python, which has no torch ------------------------------------------------------

def test_docs_run_the_engine_with_the_packs_python():
    """`python -m yue2_core …` in README / docs/lora.md / docs/batch.md failed where `python` is the system's (no
    torch); the pack's environment is `.venv/bin/python` (scripts/song.sh makes it). Headings naming the command
    (`# Many songs at once: \\`python -m yue2_core batch\\``) and ComfyUI's own python are fine."""
    import re
    bare = re.compile(r"(?<![/\w.-])python3? -m yue2_core")
    found = []
    for name in ("README.md", "docs/lora.md", "docs/batch.md", "docs/comfyui.md", "docs/editor.md"):
        for no, line in enumerate((REPO / name).read_text("utf-8").splitlines(), 1):
            if not line.startswith("#") and bare.search(line.replace("<ComfyUI's python>", "")):
                found.append(f"{name}:{no}: {line.strip()[:80]}")
    assert found == []


def test_readme_batch_try_on_a_cpu_is_a_block_that_copies():
    """README's "To try it on a CPU" batch command was inline code wrapped over four lines: pasted, the shell ran
    its first line alone. Now a fenced block whose lines end in `\\`, which the batch command line parses."""
    import shlex
    from yue2_core.__main__ import build_parser
    readme = (REPO / "README.md").read_text("utf-8")
    after = readme.split("To try\nit on a CPU with the synthetic model", 1)[1]
    block = after.split("```\n", 2)[1]
    lines = block.rstrip("\n").splitlines()
    assert lines[0].startswith(".venv/bin/python -m yue2_core batch ") and len(lines) > 1
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\"), lines
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == [".venv/bin/python", "-m", "yue2_core"]
    args = build_parser().parse_args(argv[3:])
    assert (args.command, args.output, args.max_abc_tokens, args.steps) == ("batch", "runs/try", 16, 4)
    assert (REPO / args.requests).is_file() and args.offline and args.device == "cpu"


# --- a LoRA given as --checkpoint ------------------------------------------------------------------------------------

def test_a_lora_given_as_the_checkpoint_is_named_with_its_option(tmp_path, capsys):
    """`--checkpoint aitk.safetensors` said "not a YuE2 all-in-one checkpoint … First keys: text_encoders…lora_A…",
    while a checkpoint given as --lora names --checkpoint. Now the layout is detected from the header and --lora
    named; a PEFT folder too. Another model's file keeps the general message."""
    from test_cli import main_inprocess

    from yue2_core.errors import CheckpointError
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    dims = profile_dims("tiny")
    aitk = write_adapter("aitk", tmp_path / "aitk.safetensors", dims)
    rc, err = main_inprocess(capsys, "generate", "--checkpoint", aitk, "--style", "pop", "--lyrics", "la",
                             "--cot", "off", "--device", "cpu", "--output", tmp_path / "song")
    assert rc == 2 and not (tmp_path / "song").exists(), err
    assert ("aitk.safetensors is a LoRA adapter (ai-toolkit layout), not a YuE2 checkpoint: pass it with --lora (or "
            "the YuE2 LoRA node in ComfyUI), and the base YuE2 checkpoint with --checkpoint (the YuE2 Checkpoint "
            "Loader)") in " ".join(err.split()), err
    assert "First keys" not in err
    for layout, said in (("hot-split-ar", "(hot-step-split layout)"), ("peft", "is a PEFT LoRA adapter folder")):
        path = write_adapter(layout, tmp_path / layout, dims)
        with pytest.raises(CheckpointError, match="pass it with --lora") as info:
            inspect_checkpoint(str(path))
        assert said in str(info.value)
    from safetensors.torch import save_file
    import torch
    other = tmp_path / "sd.safetensors"
    save_file({"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(2, 2)}, str(other))
    with pytest.raises(CheckpointError, match="is not a YuE2 all-in-one checkpoint: .* First keys"):
        inspect_checkpoint(str(other))


# --- a vendor model folder without its vae/, with --vae -------------------------------------------------------------

@pytest.fixture(scope="module")
def vendor_without_vae(tmp_path_factory, tiny_paths, request):
    """{"model": a vendor YuE2-3B folder of the tiny bf16 file with its vae/ removed, "vae": that VAE folder moved
    elsewhere (not beside the model), "file": a comfy-prefixed VAE file}; removed after the module's tests when they
    passed (≈ 0.2 GB; tests/synthetic_cache.py `removed_when_passed`)."""
    import shutil

    from synthetic_cache import removed_when_passed
    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.synthetic_vendor import write_vendor_folder
    with removed_when_passed(request, tmp_path_factory.mktemp("novae")) as root:
        model = root / "models" / "YuE2-3B"
        write_vendor_folder(tiny_paths["bf16"], str(model))
        (root / "vaes").mkdir()
        shutil.move(str(model / "vae"), str(root / "vaes" / "YuE2-Vae"))
        vae_file = write_vae(str(root / "vaes" / "legacy.safetensors"), layout="comfy-prefixed", variant="legacy")
        yield {"model": model, "vae": root / "vaes" / "YuE2-Vae", "file": vae_file}


@pytest.fixture
def _no_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no_hf_cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("YUE2_CHECKPOINT", raising=False)


SONG = ("--style", "pop", "--lyrics", "la", "--cot", "off", "--max-seconds", "0.2", "--steps", "1", "--device",
        "cpu", "--offline")


def test_a_vendor_folder_without_its_vae_folder_runs_with_vae(tmp_path, capsys, vendor_without_vae, _no_hf_cache,
                                                                single_thread):
    """`generate --checkpoint YuE2-3B --vae PATH` where YuE2-3B has no vae/: "no VAE folder for the vendor model …
    (or pass its path as vae_path)", though --vae replaces that decoder. Now the folder's own VAE is not looked for
    when a VAE is given (a folder or a file); without one the message names --vae PATH; render re-applies the VAE
    the song records."""
    import json

    from test_cli import main_inprocess
    model = vendor_without_vae["model"]
    rc, err = main_inprocess(capsys, "generate", "--checkpoint", model, *SONG, "--output", tmp_path / "none")
    assert rc == 2 and not (tmp_path / "none").exists(), err
    assert "no VAE folder for the vendor model" in err and "vae_path" not in err, err
    assert "or give a VAE: --vae PATH on the command line (a VAE folder or file)" in " ".join(err.split()), err
    for name, vae in (("folder", vendor_without_vae["vae"]), ("file", vendor_without_vae["file"])):
        out = tmp_path / name
        rc, err = main_inprocess(capsys, "generate", "--checkpoint", model, "--vae", vae, *SONG, "--output", out)
        assert rc == 0, err[-3000:]
        config = json.loads((out / "config.json").read_text())
        assert config["weights"]["vae"]["path"] == str(vae), config["weights"]
        assert "vae" not in config["checkpoint"]["files"] and "vae_blocks" not in config["checkpoint"]
        assert (out / "audio.flac").is_file()
    rc, err = main_inprocess(capsys, "render", tmp_path / "file", "--device", "cpu", "--offline", "--output",
                             tmp_path / "again")
    assert rc == 0 and (tmp_path / "again" / "audio.flac").is_file(), err[-3000:]
    requests = tmp_path / "r.jsonl"
    requests.write_text(json.dumps({"id": "one", "style": "pop", "lyrics": "la", "cot": "off"}) + "\n")
    rc, err = main_inprocess(capsys, "batch", requests, "--checkpoint", model, "--vae", vendor_without_vae["vae"],
                             "--max-seconds", "0.2", "--steps", "1", "--device", "cpu", "--offline", "--output",
                             tmp_path / "batch")
    assert rc == 0 and (tmp_path / "batch" / "one" / "audio.flac").is_file(), err[-3000:]


def test_inspect_describes_a_vendor_folder_without_its_vae(capsys, vendor_without_vae, _no_hf_cache):
    """`inspect YuE2-3B` of such a folder failed with the same error; now it describes the model and says the VAE
    is missing."""
    import json

    from yue2_core.__main__ import main
    rc = main(["inspect", str(vendor_without_vae["model"])])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads(captured.out)
    assert report["kind"] == "checkpoint" and report["layout"] == "vendor" and report["dims"]["layers"] >= 1
    assert "vae" not in report["files"] and "VAE missing (no VAE folder found; give one: --vae PATH" in \
        report["summary"], report["summary"]
    assert "warning: the VAE is missing:" in captured.err and "--vae PATH" in captured.err
