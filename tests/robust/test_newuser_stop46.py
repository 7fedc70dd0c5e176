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
