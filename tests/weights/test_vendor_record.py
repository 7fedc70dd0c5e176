"""A song made from a vendor folder records that folder's weight files in result.json (names, sizes and sha256 from
its weights_manifest.json), not the folder paths; its VAE entry names the YuE2-Vae folder's files. `render` decodes
with the VAE folder the song records (found again by its sample hash), refuses one gone or changed, and says when
--vae replaces it."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf

from yue2_core.__main__ import main
from synthetic_cache import removed_when_passed, synthetic_link
from yue2_core.weights.synthetic_vae import write_vae
from yue2_core.weights.synthetic_vendor import write_vendor_folder
from yue2_core.weights.vendor import find_vae_folder, recorded_vae_folder


SMALL = ["--max-seconds", "1", "--max-abc-tokens", "8", "--steps", "2", "--device", "cpu", "--offline"]


@pytest.fixture(scope="module")
def vendor_song(tmp_path_factory, request):
    """A song made from a vendor folder whose VAE folder lies beside it (release_variant "legacy"), then a
    "standard" VAE folder with other weights put beside the model — the one `find_vae_folder` prefers now. Removed
    after the module's tests when they passed (≈ 0.2 GB; `removed_when_passed`)."""
    with removed_when_passed(request, tmp_path_factory.mktemp("vendor_vae")) as root:
        comfy = root / "tiny_bf16.safetensors"
        synthetic_link(str(comfy), "tiny", "bf16", seed=0)  # read only
        folder, legacy = root / "YuE2-3B", root / "YuE2-Vae-legacy"
        write_vendor_folder(str(comfy), str(folder), vae_dir=str(legacy))
        config = json.loads((legacy / "config.json").read_text())
        (legacy / "config.json").write_text(json.dumps({**config, "release_variant": "legacy"}))
        song = root / "song"
        assert main(["generate", "--style", "pop", "--lyrics", "la", "--checkpoint", str(folder), *SMALL,
                     "--output", str(song)]) == 0
        write_vae(str(root / "YuE2-Vae"), variant="standard", profile="tiny", seed=1)
        yield {"root": root, "folder": folder, "legacy": legacy, "standard": root / "YuE2-Vae", "song": song}


def _audio(song):
    return sf.read(str(song / "audio.flac"))[0]


def test_vendor_song_records_the_folder_files(vendor_song):
    folder, out = vendor_song["folder"], vendor_song["song"]
    weights = json.loads((out / "result.json").read_text())["weights"]
    manifest = json.loads((folder / "weights_manifest.json").read_text())["files"]
    assert weights["mot"]["files"]["model.safetensors"] == {"sha256": manifest["model.safetensors"]["sha256"],
                                                            "bytes": manifest["model.safetensors"]["bytes"]}
    assert all(entry["bytes"] != 4096 or name in manifest for name, entry in weights["mot"]["files"].items())
    assert not weights["vae"].get("embedded")
    assert any(name.endswith(".safetensors") and entry["sha256"] for name, entry in weights["vae"]["files"].items())


# ---------------------------------------------------------------------------------------------------------------------
# break-it review (stop 40): a vendor song re-renders with the VAE folder it records
# ---------------------------------------------------------------------------------------------------------------------

def test_render_decodes_with_the_vendor_vae_folder_the_song_records(vendor_song, capsys, monkeypatch):
    """Break-it finding (stop 40): the re-render took whatever VAE folder `find_vae_folder` prefers now (a
    "standard" folder downloaded later), not the one the song records. Now the recorded one, found again by its
    sample hash — also after it moved into ComfyUI's vae folder — and the same audio."""
    v = vendor_song
    recorded = json.loads((v["song"] / "config.json").read_text())["checkpoint"]
    assert recorded["files"]["vae"] == str(v["legacy"]) and len(recorded["vae_sample_sha256"]) == 64
    assert find_vae_folder(v["folder"]) == v["standard"]  # what the folder alone would take now
    capsys.readouterr()
    again = v["root"] / "again"
    assert main(["render", str(v["song"]), "--device", "cpu", "--offline", "--output", str(again)]) == 0
    err = capsys.readouterr().err
    assert f"note: decoding with the VAE folder the song was made with ({v['legacy']}), not {v['standard']}" in err
    assert json.loads((again / "config.json").read_text())["checkpoint"]["files"]["vae"] == str(v["legacy"])
    assert np.array_equal(_audio(v["song"]), _audio(again))
    comfy = v["root"] / "comfy"
    (comfy / "models" / "checkpoints").mkdir(parents=True)
    (comfy / "models" / "vae").mkdir()
    moved = comfy / "models" / "vae" / "legacy"
    shutil.move(v["legacy"], moved)
    monkeypatch.setenv("COMFYUI_PATH", str(comfy))
    try:
        found = v["root"] / "found"
        assert main(["render", str(v["song"]), "--device", "cpu", "--offline", "--output", str(found)]) == 0
        assert json.loads((found / "config.json").read_text())["checkpoint"]["files"]["vae"] == str(moved)
        assert np.array_equal(_audio(v["song"]), _audio(found))
    finally:
        shutil.move(moved, v["legacy"])


def test_render_refuses_a_vendor_vae_folder_gone_or_changed_and_notes_a_vae_flag(vendor_song, capsys):
    """Break-it findings (stop 40): a vendor VAE folder had no content check (another release put at its path went
    unnoticed, manifest and all), and `render --vae` replaced the song's VAE without a word."""
    v = vendor_song
    keep = v["root"] / "backup" / "legacy"  # not beside the model, where it would be found again
    shutil.copytree(v["legacy"], keep)
    try:
        write_vae(str(v["legacy"]), variant="legacy", profile="tiny", seed=3)  # other weights, a manifest to match
        capsys.readouterr()
        out = v["root"] / "changed"
        assert main(["render", str(v["song"]), "--device", "cpu", "--offline", "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"this song was decoded with the VAE folder {v['legacy']} (sample sha256" in err, err
        assert "which now holds other weights" in err and f"would now decode with {v['standard']}" in err
        line = err.splitlines()[-1]  # one line: recorded, what is there now, what to do
        assert line.startswith("error: this song was decoded") and "--vae FOLDER" in line and not out.exists()
        shutil.rmtree(v["legacy"])
        assert main(["render", str(v["song"]), "--device", "cpu", "--offline", "--output", str(out)]) == 2
        assert "which is gone" in capsys.readouterr().err
        # --vae: the user's choice, said with both VAEs named; the new song records the new one
        assert main(["render", str(v["song"]), "--vae", str(v["standard"]), "--device", "cpu", "--offline",
                     "--output", str(out)]) == 0
        err = capsys.readouterr().err
        assert (f"note: --vae replaces the VAE this song was decoded with — the vendor VAE folder {v['legacy']} — "
                f"by {v['standard']} (standard)") in err, err
        assert json.loads((out / "config.json").read_text())["weights"]["vae"]["path"] == str(v["standard"])
    finally:
        shutil.rmtree(v["legacy"], ignore_errors=True)
        shutil.copytree(keep, v["legacy"])


def test_an_older_vendor_song_without_the_sample_hash(vendor_song):
    """A song saved before `vae_sample_sha256`: its recorded VAE folder while it is there, else the usual one with a
    note naming both; a song not made from a vendor folder has nothing to find."""
    v = vendor_song
    record = json.loads((v["song"] / "config.json").read_text())["checkpoint"]
    old = {k: val for k, val in record.items() if k != "vae_sample_sha256"}
    assert recorded_vae_folder(old, v["folder"]) == (v["legacy"], None)
    gone = {**old, "files": {**old["files"], "vae": str(v["root"] / "nowhere")}}
    found, note = recorded_vae_folder(gone, v["folder"])
    assert found is None and "is gone" in note and f"decoding with {v['standard']}" in note, note
    assert recorded_vae_folder({"layout": "comfy", "path": "x"}, v["folder"]) == (None, None)
    assert recorded_vae_folder("malformed", v["folder"]) == (None, None)


def test_edits_note_a_vendor_vae_folder_with_other_weights(vendor_song):
    """Regenerate / Continue / Load Song (`edit.check_checkpoint`) say when the vendor folder's VAE folder now in use
    holds other weights than the song was decoded with; not when a VAE file decodes instead (`checkpoint_vae`)."""
    from yue2_core.edit import check_checkpoint
    from yue2_core.weights.checkpoint import inspect_checkpoint
    v = vendor_song
    record = json.loads((v["song"] / "config.json").read_text())["checkpoint"]
    now = inspect_checkpoint(str(v["folder"]))  # finds the "standard" folder put beside the model later
    assert now.files["vae"] == str(v["standard"])
    notes = check_checkpoint(record, now)
    assert len(notes) == 1 and f"the VAE folder {v['standard']} holds other weights" in notes[0], notes
    assert str(v["legacy"]) in notes[0]
    assert check_checkpoint(record, now, checkpoint_vae=False) == []
    assert check_checkpoint(record, inspect_checkpoint(str(v["folder"]), vae_path=str(v["legacy"]))) == []


def test_a_vendor_song_run_with_an_all_in_one_file_names_the_vae_change(vendor_song, tmp_path):
    """Break-it review (stop 40): `render SONG --checkpoint FILE.safetensors` of a song made from a vendor folder
    decoded with the file's embedded VAE instead of the song's VAE folder, without a word."""
    from yue2_core.edit import check_checkpoint
    from yue2_core.weights.checkpoint import inspect_checkpoint
    v = vendor_song
    record = json.loads((v["song"] / "config.json").read_text())["checkpoint"]
    comfy = inspect_checkpoint(str(v["root"] / "tiny_bf16.safetensors"))
    notes = check_checkpoint(record, comfy)
    assert any(f"decoded with the vendor VAE folder {v['legacy']}" in n and f"--vae {v['legacy']}" in n
               for n in notes), notes
    assert not any("vendor VAE folder" in n for n in check_checkpoint(record, comfy, checkpoint_vae=False))
