"""Found by the stop-58 own-weights break-it review (docs/bad_inputs.md §63): the synthetic VAE writer given a
file in a folder that does not exist yet, `inspect` of a YuE2 VAE file that the VAE reader refuses, and an
unfinished Hugging Face download of the vendor's model folder."""
from __future__ import annotations

import os

from yue2_core.weights import synthetic_vae
from yue2_core.weights.vae_files import open_vae


def test_the_vae_writer_makes_the_folder_of_a_single_file(tmp_path, capsys):
    out = tmp_path / "models" / "vae" / "tiny legacy.safetensors"  # neither folder exists yet
    assert synthetic_vae.main([str(out), "--layout", "vendor-file", "--variant", "legacy"]) == 0
    assert os.path.abspath(out) in capsys.readouterr().out
    assert open_vae(str(out)).variant == "legacy"
    prefixed = tmp_path / "other" / "vae.safetensors"
    assert synthetic_vae.main([str(prefixed), "--layout", "comfy-prefixed"]) == 0
    assert open_vae(str(prefixed)).layout == "comfy-prefixed"


def _inspect(capsys, *args) -> tuple[int, str]:
    from yue2_core.__main__ import main
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exit_:
        rc = exit_.code
    return rc, capsys.readouterr().err


def test_inspect_of_a_vae_the_vae_reader_refuses_gives_that_reason_alone(tmp_path, capsys):
    """A YuE2 VAE file with one conv's weight_g of another width, and a VAE release folder whose config.json says
    44100 Hz: `inspect` said "neither a YuE2 checkpoint, a VAE decoder nor a LoRA adapter", the checkpoint and LoRA
    readers each adding "give it as --vae" — where it is refused."""
    from safetensors.torch import load_file, save_file
    import json
    good = tmp_path / "good.safetensors"
    synthetic_vae.write_vae(str(good), layout="vendor-file")
    t = load_file(str(good))
    key = "decoder.layers.1.layers.1.weight_g"
    t[key] = t[key][: t[key].shape[0] // 2].clone()
    bad = tmp_path / "bad.safetensors"
    save_file(t, str(bad))
    rc, err = _inspect(capsys, "inspect", bad)
    assert rc == 2 and f"{bad} is a VAE file that is refused: " in err, err
    assert f"shape mismatch for {key}" in err, err
    assert "neither" not in err and "give it as --vae" not in err and "as a checkpoint" not in err, err
    folder = tmp_path / "vae_44k"
    synthetic_vae.write_vae(str(folder), layout="vendor-folder")
    config = json.loads((folder / "config.json").read_text())
    config["sample_rate"] = 44100
    (folder / "config.json").write_text(json.dumps(config))
    rc, err = _inspect(capsys, "inspect", folder)
    assert rc == 2 and "is a VAE folder (config.json model_type yue2_vae) that is refused: " in err, err
    assert "sample_rate is 44100" in err and "give it as --vae" not in err and "song folder" not in err, err
