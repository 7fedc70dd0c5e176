"""Own weights on the command line (CPU, tiny synthetic model): --lora at strength 0 gives the song without it, at
strength 1 another song; config.json records the adapter and VAE; `render` re-applies them (same latents and audio)
or names the missing file; --vae replaces the decoder; bad --lora values are refused before any loading."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf

from yue2_core.__main__ import main
from yue2_core.weights.checkpoint import inspect_checkpoint
from yue2_core.weights.lora import synthetic as lora_synth
from synthetic_cache import synthetic_link, tokenizers_built_once

# 5 music tokens, 2 ABC tokens: the adapters' effect and the records need no longer song
SMALL = ["--max-seconds", "0.2", "--max-abc-tokens", "2", "--steps", "2", "--device", "cpu", "--offline"]


@pytest.fixture(scope="module", autouse=True)
def _one_tokenizer():
    """The ≈ 40 loads of the tiny model here parse its embedded tokenizer once (`tokenizers_built_once`)."""
    with tokenizers_built_once():
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_weights")
    ckpt = root / "tiny_int8.safetensors"
    synthetic_link(str(ckpt), "tiny", "int8", seed=0)
    dims = inspect_checkpoint(str(ckpt)).dims
    lora = lora_synth.write_adapter("aitk", root / "aitk.safetensors", dims, rank=4, seed=1)
    from yue2_core.weights.synthetic_vae import write_vae
    vae = write_vae(root / "legacy_vae", layout="vendor-folder", variant="legacy", profile="tiny", seed=5)
    return {"ckpt": ckpt, "lora": lora, "vae": vae, "root": root}


def _run(*args) -> int:
    try:
        return main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code


def _song(files, name, *extra):
    out = files["root"] / name
    assert _run("generate", "--style", "pop", "--lyrics", "la la", "--seed", "5", "--checkpoint", files["ckpt"],
                *SMALL, "--output", out, *extra) == 0
    return out


def _same(a, b) -> bool:
    return (np.array_equal(np.load(a / "semantic.npy"), np.load(b / "semantic.npy"))
            and np.array_equal(np.load(a / "latent.npy"), np.load(b / "latent.npy"))
            and np.array_equal(sf.read(str(a / "audio.flac"))[0], sf.read(str(b / "audio.flac"))[0]))


def test_lora_strength_zero_one_and_render_reapplies(files, capsys):
    base = _song(files, "base")
    capsys.readouterr()
    zero = _song(files, "zero", "--lora", f"{files['lora']}:0")
    # an expert left alone is said so (new-user finding, stop 40: "AR ×1, NAR ×1" for a file without NAR patches)
    assert f"LoRA: {files['lora']} (ai-toolkit) AR not patched (strength 0), NAR not patched (strength 0)" in \
        capsys.readouterr().err
    one = _song(files, "one", "--lora", f"{files['lora']}:1:0.5")
    assert f"LoRA: {files['lora']} (ai-toolkit) AR ×1, NAR ×0.5" in capsys.readouterr().err
    ar_only = lora_synth.write_adapter("hot-split-ar", files["root"] / "ar_only.safetensors",
                                       inspect_checkpoint(str(files["ckpt"])).dims, rank=2, seed=4)
    _song(files, "ar_only", "--lora", ar_only)
    err = capsys.readouterr().err
    assert f"LoRA: {ar_only} (" in err and "AR ×1, NAR not patched (no patch for it)" in err, err
    assert _same(base, zero)
    assert not _same(base, one)
    rec = json.loads((one / "config.json").read_text())["weights"]["loras"][0]
    assert rec["file"] == "aitk.safetensors" and rec["strength_ar"] == 1.0 and rec["strength_nar"] == 0.5
    assert rec["layout"] == "ai-toolkit" and len(rec["sha256"]) == 64
    # render re-applies the recorded adapter: the saved tokens give the same latents and audio
    again = files["root"] / "one_again"
    assert _run("render", one, "--steps", "2", "--device", "cpu", "--offline", "--output", again) == 0
    assert _same(one, again)
    # the adapter gone: render names it and writes nothing
    moved = files["root"] / "moved.safetensors"
    shutil.move(files["lora"], moved)
    try:
        gone = files["root"] / "gone"
        assert _run("render", one, "--steps", "2", "--device", "cpu", "--offline", "--output", gone) == 2
        err = capsys.readouterr().err
        assert "aitk.safetensors" in err and "missing" in err
        assert not gone.exists()
    finally:
        shutil.move(moved, files["lora"])


def test_render_of_a_two_adapter_song_names_every_adapter_and_warns_of_a_partial_lora(files, capsys):
    """Review finding (2026-12-05): with one of two recorded adapters moved, the hint said "the command line also
    takes it with --lora PATH"; following it dropped the other adapter and changed a strength without a word. Now
    the refusal gives the --lora options for all of them, and a --lora that differs from the record warns."""
    second = files["root"] / "second.safetensors"
    if not second.exists():
        lora_synth.write_adapter("aitk", second, inspect_checkpoint(str(files["ckpt"])).dims, rank=2, seed=3)
    two = _song(files, "two", "--lora", f"{files['lora']}:0.8", "--lora", f"{second}:1:0")
    capsys.readouterr()
    moved = files["root"] / "moved_two.safetensors"
    shutil.move(files["lora"], moved)
    try:
        out = files["root"] / "two_gone"
        assert _run("render", two, "--steps", "2", "--device", "cpu", "--offline", "--output", out) == 2
        err = capsys.readouterr().err
        assert "give all 2 with their strengths" in err, err
        # paths, pasteable (new-user finding, stop 40: bare names were not found from another folder)
        assert f"--lora={files['lora']}:0.8:0.8 --lora={second}:1:0" in err, err
        out = files["root"] / "two_partial"
        assert _run("render", two, "--lora", moved, "--steps", "2", "--device", "cpu", "--offline",
                    "--output", out) == 0
        err = capsys.readouterr().err
        assert "warning: --lora replaces the adapters this song was made with" in err, err
        assert "now moved_two.safetensors:1:1" in err, err
        out = files["root"] / "two_all"
        assert _run("render", two, "--lora", f"{moved}:0.8", "--lora", f"{second}:1:0", "--steps", "2",
                    "--device", "cpu", "--offline", "--output", out) == 0
        # the same bytes under another name, the same strengths: the song's adapters (new-user finding, stop 40:
        # was warned about as "the music will differ")
        assert "--lora replaces" not in capsys.readouterr().err
        assert _same(two, out)
    finally:
        shutil.move(moved, files["lora"])
    same = files["root"] / "two_same"
    assert _run("render", two, "--lora", f"{files['lora']}:0.8", "--lora", f"{second}:1:0", "--steps", "2",
                "--device", "cpu", "--offline", "--output", same) == 0
    assert "--lora replaces" not in capsys.readouterr().err
    assert _same(two, same)
    # the same adapters in another order: said (break-it review, stop 40: deltas are summed in stack order, so the
    # weights differ by rounding)
    assert _run("render", two, "--lora", f"{second}:1:0", "--lora", f"{files['lora']}:0.8", "--steps", "2",
                "--device", "cpu", "--offline", "--output", files["root"] / "two_swapped") == 0
    assert "warning: --lora gives the song's adapters in another order (second.safetensors:1:0, " \
           "aitk.safetensors:0.8:0.8; the song: aitk.safetensors:0.8:0.8, second.safetensors:1:0)" in \
           capsys.readouterr().err
    # --no-lora: the song without its adapters (new-user finding, stop 40: only `--lora FILE:0` did it, with two
    # warnings), said; the new song records none
    bare = files["root"] / "two_bare"
    assert _run("render", two, "--no-lora", "--steps", "2", "--device", "cpu", "--offline", "--output", bare) == 0
    assert "note: --no-lora renders without the adapters this song was made with (aitk.safetensors:0.8:0.8, " \
           "second.safetensors:1:0): the audio will differ" in capsys.readouterr().err
    assert json.loads((bare / "config.json").read_text())["weights"]["loras"] == []
    assert not np.array_equal(np.load(two / "latent.npy"), np.load(bare / "latent.npy"))
    assert _run("render", two, "--no-lora", "--lora", files["lora"], "--device", "cpu", "--offline", "--output",
                files["root"] / "two_both") == 2
    assert "--no-lora and --lora exclude each other" in capsys.readouterr().err


def test_vae_flag_changes_audio_not_tokens_and_is_recorded(files):
    base = files["root"] / "base"
    if not base.exists():
        base = _song(files, "base")
    legacy = _song(files, "legacy", "--vae", files["vae"])
    assert np.array_equal(np.load(base / "latent.npy"), np.load(legacy / "latent.npy"))
    assert not np.array_equal(sf.read(str(base / "audio.flac"))[0], sf.read(str(legacy / "audio.flac"))[0])
    vae = json.loads((legacy / "config.json").read_text())["weights"]["vae"]
    assert vae["variant"] == "legacy"


@pytest.mark.parametrize("value, message", [("missing.safetensors", "not found"),
                                            ("{lora}:9", "between -5 and 5"),
                                            ("{lora}:nan:1", "between -5 and 5"),
                                            ("{lora}:1:1e-320", "NAR strength 1e-320 is too small to change any "
                                                                "weight")])
def test_bad_lora_values_refused_before_loading(files, capsys, value, message):
    out = files["root"] / "never"
    rc = _run("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", "/nonexistent.safetensors", *SMALL,
              "--output", out, "--lora", value.format(lora=files["lora"]))
    assert rc == 2 and message in capsys.readouterr().err and not out.exists()


def test_sdxl_lora_refused_by_name(files, capsys, tmp_path):
    import torch
    from safetensors.torch import save_file
    sdxl = tmp_path / "sdxl.safetensors"
    save_file({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": torch.zeros(4, 320)}, str(sdxl))
    rc = _run("generate", "--style", "pop", "--lyrics", "la", "--checkpoint", files["ckpt"], *SMALL,
              "--output", tmp_path / "x", "--lora", sdxl)
    assert rc == 2 and "not a YuE2" in capsys.readouterr().err


def test_inspect_adapter_against_a_model_and_clear_refusal(files, capsys):
    assert _run("inspect", files["lora"]) == 2  # a tiny adapter against the release geometry
    err = capsys.readouterr().err
    assert "looks like a LoRA adapter but does not fit the release geometry" in err and "--model" in err
    assert _run("inspect", files["lora"], "--model", files["ckpt"]) == 0
    captured = capsys.readouterr()
    assert "layout ai-toolkit" in captured.err  # the readable report
    assert json.loads(captured.out)["layout"] == "ai-toolkit"
    assert _run("inspect", files["ckpt"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "checkpoint"


def test_generate_warns_of_adapter_keys_that_patch_nothing(files, capsys):
    """An ai-toolkit file with a LoRA pair on the embedding (no linear YuE2 module): `generate` said only "LoRA: …
    AR ×1, NAR ×1" and dropped the two keys in silence; only `inspect` listed them (break-it review, stop 32)."""
    from safetensors.torch import load_file, save_file
    import torch
    t = load_file(str(files["lora"]))
    t["diffusion_model.model.embed_tokens.lora_A.weight"] = torch.randn(4, 64).half()
    t["diffusion_model.model.embed_tokens.lora_B.weight"] = torch.randn(100, 4).half()
    odd = files["root"] / "embed.safetensors"
    save_file(t, str(odd))
    capsys.readouterr()
    _song(files, "unmatched", "--lora", odd)
    err = capsys.readouterr().err
    assert (f"warning: LoRA {odd}: 2 keys name no YuE2 module and are NOT applied: "
            "diffusion_model.model.embed_tokens.lora_A.weight, diffusion_model.model.embed_tokens.lora_B.weight") in err


def test_render_without_steps_uses_the_songs_own(files, capsys):
    """New-user finding (stop 32): a song made with --steps 2 re-rendered unchanged with 32 steps — other audio,
    though the help promised the same, and 16× the time. Now render takes the song's ode_steps / ode_method."""
    song = _song(files, "own_steps", "--ode-method", "ab2")
    capsys.readouterr()
    again = files["root"] / "own_steps_again"
    assert _run("render", song, "--device", "cpu", "--offline", "--output", again) == 0
    assert "render: 2 ODE steps, ab2 (the song's own" in capsys.readouterr().err
    assert _same(song, again)
    config = json.loads((again / "config.json").read_text())
    assert config["ode_steps"] == 2 and config["ode_method"] == "ab2"
    other = files["root"] / "own_steps_3"
    assert _run("render", song, "--steps", "3", "--device", "cpu", "--offline", "--output", other) == 0
    config = json.loads((other / "config.json").read_text())
    assert config["ode_steps"] == 3 and config["ode_method"] == "ab2"
    assert not np.array_equal(np.load(song / "latent.npy"), np.load(other / "latent.npy"))


def test_render_refuses_an_adapter_folder_that_now_reads_other_files(files, capsys):
    """Break-it findings (stop 39): a song made with a PEFT weights file and no sidecar re-rendered with another
    scale once an adapter_config.json was put beside it; a song made with a folder adapter re-rendered with another
    adapter once a lora.safetensors was added to the folder (read first) — both without a word. `render` (and Load
    Song) now compare the adapters as read again with the song's record (`record.check_reread`)."""
    dims = inspect_checkpoint(str(files["ckpt"])).dims
    peft = lora_synth.write_adapter("peft", files["root"] / "peft_src", dims, rank=4, seed=3)
    bare = files["root"] / "bare"
    bare.mkdir()
    shutil.copy(peft / "adapter_model.safetensors", bare / "adapter_model.safetensors")  # no sidecar yet
    song = _song(files, "bare_song", "--lora", f"{bare / 'adapter_model.safetensors'}:1:1")
    assert _run("render", song, "--output", files["root"] / "bare_again") == 0  # unchanged: renders
    shutil.copy(peft / "adapter_config.json", bare / "adapter_config.json")
    capsys.readouterr()
    assert _run("render", song, "--output", files["root"] / "bare_sidecar") != 0
    err = capsys.readouterr().err
    assert "now reads adapter_config.json, which the song was made without" in err, err[-2000:]
    folder = files["root"] / "fold"
    folder.mkdir()
    shutil.copy(files["lora"], folder / "custom.safetensors")
    song = _song(files, "fold_song", "--lora", f"{folder}:1:1")
    shutil.copy(files["lora"], folder / "lora.safetensors")  # another weights file, read before custom.safetensors
    capsys.readouterr()
    assert _run("render", song, "--output", files["root"] / "fold_again") != 0
    err = capsys.readouterr().err
    assert "the LoRA folder fold now reads lora.safetensors, not the custom.safetensors" in err, err[-2000:]


def test_render_vae_flag_names_the_songs_vae_and_records_the_new_one(files, capsys):
    """Break-it finding (stop 40): `render --vae X` of a song decoded with another VAE replaced it without a word.
    It still does (the user's choice), with a note naming the song's VAE and the one used; the new song records the
    new one. The same file again gets no note."""
    from yue2_core.weights.synthetic_vae import write_vae
    legacy = files["root"] / "legacy"
    if not legacy.exists():
        legacy = _song(files, "legacy", "--vae", files["vae"])
    std = write_vae(str(files["root"] / "std_vae.safetensors"), layout="vendor-file", variant="standard",
                    profile="tiny", seed=0)
    capsys.readouterr()
    out = files["root"] / "legacy_std"
    assert _run("render", legacy, "--vae", std, "--device", "cpu", "--offline", "--output", out) == 0
    err = capsys.readouterr().err
    assert (f"note: --vae replaces the VAE this song was decoded with — the VAE {files['vae']} (legacy) — by {std} "
            "(standard): the audio will differ") in err, err
    assert json.loads((out / "config.json").read_text())["weights"]["vae"]["path"] == std
    assert _run("render", legacy, "--vae", files["vae"], "--device", "cpu", "--offline", "--output",
                files["root"] / "legacy_same") == 0
    assert "--vae replaces" not in capsys.readouterr().err


def test_render_applies_the_lora_int8_mode_the_song_records(files, capsys, monkeypatch):
    """Break-it finding (stop 40): YUE2_LORA_INT8=bf16 (LoRAs merged into int8 layers dequantized to bf16) was not
    recorded, so a song made with it re-rendered without the switch got its LoRA as side deltas — other latents.
    Songs record the mode; render applies the song's; YUE2_LORA_INT8 asking for the other one is used, with a note
    naming both, and recorded."""
    one = files["root"] / "one"
    if not one.exists():
        one = _song(files, "one", "--lora", f"{files['lora']}:1:0.5")
    assert json.loads((one / "config.json").read_text())["weights"]["lora_int8"] == "side"
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    capsys.readouterr()
    merged = files["root"] / "one_bf16"
    assert _run("render", one, "--device", "cpu", "--offline", "--output", merged) == 0
    err = capsys.readouterr().err
    assert "note: YUE2_LORA_INT8=bf16 applies the LoRAs to int8 layers merged into layers dequantized to bf16" in err
    assert "this song was made with side" in err and "the new song records bf16" in err, err
    assert json.loads((merged / "config.json").read_text())["weights"]["lora_int8"] == "bf16"
    assert not np.array_equal(np.load(one / "latent.npy"), np.load(merged / "latent.npy"))
    monkeypatch.delenv("YUE2_LORA_INT8")
    again = files["root"] / "one_bf16_again"
    assert _run("render", merged, "--device", "cpu", "--offline", "--output", again) == 0
    assert "render: LoRAs on int8 layers merged into layers dequantized to bf16" in capsys.readouterr().err
    assert _same(merged, again)


def test_render_of_a_song_without_the_int8_mode_notes_the_switch(capsys, monkeypatch):
    """Break-it review (stop 40): a song that records no `lora_int8` (made by the nodes before they recorded it, or
    before the field) rendered under YUE2_LORA_INT8=bf16 changed without a word. Said after the load, only when
    int8 layers got LoRAs (review, stop 41: `used` None — a bf16 checkpoint — says nothing)."""
    from yue2_core.__main__ import _say_lora_int8, _song_lora_int8
    weights = {"loras": [{"file": "a.safetensors", "strength_ar": 1.0, "strength_nar": 1.0}]}
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    assert _song_lora_int8(weights) is None and capsys.readouterr().err == ""
    _say_lora_int8(weights, "bf16")
    assert "note: this song does not record how its LoRAs went onto int8 layers" in capsys.readouterr().err
    _say_lora_int8(weights, None)  # no int8 layer got a LoRA: the mode changed nothing
    _say_lora_int8({"loras": []}, "bf16")  # no LoRA of the song's: nothing to say of it
    _say_lora_int8({**weights, "lora_int8": "bf16"}, None)
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("YUE2_LORA_INT8")
    _say_lora_int8(weights, "side")
    assert capsys.readouterr().err == ""


def test_render_says_nothing_of_the_int8_mode_where_no_int8_layer_gets_a_lora(files, capsys, monkeypatch):
    """Review (stop 41): `render: LoRAs on int8 layers merged into layers dequantized to bf16 …` (and the notes on
    YUE2_LORA_INT8) were said for a bf16 checkpoint too, which has no int8 layer. Said only when int8 layers got
    LoRAs; the new song then records no mode."""
    bf16 = files["root"] / "tiny_bf16.safetensors"
    if not bf16.exists():
        synthetic_link(str(bf16), "tiny", "bf16", seed=0)
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    made = _song(files, "int8_bf16", "--lora", f"{files['lora']}:1:0.5")
    assert json.loads((made / "config.json").read_text())["weights"]["lora_int8"] == "bf16"
    monkeypatch.delenv("YUE2_LORA_INT8")
    capsys.readouterr()
    out = files["root"] / "int8_bf16_on_bf16"
    assert _run("render", made, "--checkpoint", bf16, "--device", "cpu", "--offline", "--output", out) == 0
    err = capsys.readouterr().err
    assert "int8 layers" not in err and "YUE2_LORA_INT8" not in err, err
    assert "lora_int8" not in json.loads((out / "config.json").read_text())["weights"]
    monkeypatch.setenv("YUE2_LORA_INT8", "side")  # the other mode asked: nothing to apply it to, nothing said
    out = files["root"] / "int8_bf16_on_bf16_side"
    assert _run("render", made, "--checkpoint", bf16, "--device", "cpu", "--offline", "--output", out) == 0
    err = capsys.readouterr().err
    assert "int8 layers" not in err and "YUE2_LORA_INT8" not in err, err
    # the int8 file still says it (the song's own mode)
    monkeypatch.delenv("YUE2_LORA_INT8")
    out = files["root"] / "int8_bf16_again"
    assert _run("render", made, "--device", "cpu", "--offline", "--output", out) == 0
    assert "render: LoRAs on int8 layers merged into layers dequantized to bf16" in capsys.readouterr().err


def test_weights_at_paths_that_are_not_utf8_are_found_again_by_render(tmp_path, monkeypatch):
    """Review (stop 41): a checkpoint and a LoRA whose names hold bytes that are not UTF-8 (a Latin-1 `é`, `\\xff`)
    were recorded in config.json as `\\xNN` text, so `render` reported both missing. They are written as JSON
    `\\udcNN` escapes (valid UTF-8 JSON) that read back as the same path: render finds them, the same song."""
    import io
    import os
    import sys
    raw_err = io.BytesIO()  # as Python's own stderr (capsys' refuses surrogates)
    err = io.TextIOWrapper(raw_err, encoding="utf-8", errors="backslashreplace", write_through=True)
    monkeypatch.setattr(sys, "stderr", err)
    root = os.fsencode(str(tmp_path))
    ckpt = os.fsdecode(root + b"/tiny\xff.safetensors")
    synthetic_link(ckpt, "tiny", "int8", seed=0)
    lora = os.fsdecode(root + b"/lo\xe9ra.safetensors")
    lora_synth.write_adapter("aitk", lora, inspect_checkpoint(ckpt).dims, rank=2, seed=1)
    song = tmp_path / "song"
    assert _run("generate", "--style", "pop", "--lyrics", "la", "--seed", "5", "--checkpoint", ckpt, *SMALL,
                "--lora", lora, "--output", song) == 0
    raw = (song / "config.json").read_bytes()
    raw.decode("utf-8")  # still UTF-8 text
    assert b"tiny\\udcff.safetensors" in raw and b"\\\\x" not in raw
    config = json.loads(raw)
    assert config["checkpoint"]["path"] == ckpt and config["weights"]["loras"][0]["path"] == lora
    assert config["weights"]["loras"][0]["file"] == os.path.basename(lora)
    start = len(raw_err.getvalue())
    again = tmp_path / "again"
    assert _run("render", song, "--device", "cpu", "--offline", "--output", again) == 0
    said = raw_err.getvalue()[start:].decode("utf-8")
    assert "missing" not in said and "gone" not in said and "recorded in the song's config.json" in said, said
    assert _same(song, again)


def test_songs_of_the_stacking_rule_before_2026_12_06_get_a_specific_note(files, capsys, older_song):
    """Review (stop 41): songs made before the stacking change (2026-12-06) re-rendered differently — a replacement
    used to erase the deltas of the adapters before it in the stack, now they add to it — or were refused (an FL
    AR file and its own NAR file, whose NAR deltas applied twice) with only the general messages. Songs now record
    `weights.stack_rules` (2); a song that records neither it nor `lora_int8` gets a note naming the modules, the
    adapters and the --lora options that give the old weights where they exist; the FL stack's refusal says that
    the rules changed and gives the options that apply the NAR deltas once at the summed strength."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "batch"))
    from test_batch_bad_input import _float_only_adapter
    from yue2_core.weights.lora.apply import Applied
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.record import lora_record
    dims = inspect_checkpoint(str(files["ckpt"])).dims
    root = files["root"] / "rules"
    root.mkdir()
    io_only = _float_only_adapter(root / "io.safetensors", dims)  # deltas on NAR vae2llm only
    ms = lora_synth.write_adapter("ms-raw-nar", root / "ms.safetensors", dims, rank=2, seed=3)  # replaces it
    song = _song(files, "rules/new", "--lora", f"{io_only}:1:0.5", "--lora", ms)
    weights = json.loads((song / "config.json").read_text())["weights"]
    assert weights["stack_rules"] == 2
    capsys.readouterr()
    assert _run("render", song, "--device", "cpu", "--offline", "--output", root / "new_again") == 0
    assert "stacking rule" not in capsys.readouterr().err  # recorded: made under today's rule
    older = older_song(song, root / "older", lambda c: [c["weights"].pop(k) for k in ("stack_rules",
                                                                                            "lora_int8")])
    assert _run("render", older, "--device", "cpu", "--offline", "--output", root / "older_again") == 0
    err = capsys.readouterr().err
    assert (f"note: this song records no stacking rule (saved before 2026-12-06, or that day): if it was made "
            f"before then, {ms} replaced NAR vae2llm and erased the deltas {io_only}, before it in the stack, had "
            "put on them; replacements now apply first and those deltas add to them") in err, err
    assert f"--lora={io_only}:1:0 --lora={ms}:1:1 renders it as the old rule did" in err, err
    assert _run("render", older, "--lora", f"{io_only}:1:0", "--lora", ms, "--device", "cpu", "--offline",
                "--output", root / "older_old_rule") == 0  # the options it gives are accepted
    # an FL AR file and its own NAR file as two entries (the NAR deltas twice): refused now, and said why
    fl = lora_synth.write_adapter("fl", root / "fl" / "fl-ar.safetensors", dims, rank=2, seed=4)
    nar = root / "fl" / "fl-nar.safetensors"
    alone = _song(files, "rules/fl_song", "--lora", f"{fl}:1:0.75")
    extra = lora_record(Applied(read_adapter(str(nar), dims), 1.0, 0.5))
    twice = older_song(alone, root / "fl_twice", lambda c: (c["weights"]["loras"].append(extra),
                                                                [c["weights"].pop(k) for k in ("stack_rules",
                                                                                               "lora_int8")]))
    capsys.readouterr()
    assert _run("render", twice, "--device", "cpu", "--offline", "--output", root / "fl_again") == 2
    err = capsys.readouterr().err
    assert (f"this song was made before 2026-12-06 with the FL adapter {fl} and its own NAR file {nar} as two "
            "LoRAs: both reached the NAR, so that file's deltas applied twice (×0.75 as the companion, ×0.5 as its "
            "own entry); the stacking rules changed and refuse that stack now") in err, err
    assert f"--lora={fl}:1:0 --lora={nar}:0:1.25 applies the same NAR deltas once" in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]  # one line, no traceback
    assert "--no-lora" in line and "Traceback" not in err and not (root / "fl_again").exists()
    assert _run("render", twice, "--lora", f"{fl}:1:0", "--lora", f"{nar}:0:1.25", "--device", "cpu", "--offline",
                "--output", root / "fl_once") == 0


def test_lora_and_vae_names_are_read_in_the_comfyui_models_folders(tmp_path, monkeypatch, capsys):
    """The checkpoint search looks in $COMFYUI_PATH/models/checkpoints; a --lora / --vae name that is no path here
    is looked for in the same ComfyUI's models/loras / models/vae, as the nodes list them (own-weights review, stop
    49: "LoRA file 'my.safetensors' not found" beside a checkpoint found there). A local file keeps priority; a name
    leaving the folder is not followed."""
    from yue2_core.cli.options import parse_lora, parse_vae
    comfy = tmp_path / "ComfyUI"
    for sub in ("checkpoints", "loras/styles", "vae/YuE2-Vae-legacy"):
        (comfy / "models" / sub).mkdir(parents=True)
    (comfy / "models" / "loras" / "styles" / "mine.safetensors").write_bytes(b"x")
    (tmp_path / "secret.safetensors").write_bytes(b"x")
    monkeypatch.setenv("COMFYUI_PATH", str(comfy))
    monkeypatch.delenv("COMFYUI_DIR", raising=False)  # scripts/test.sh points it at the test host's ComfyUI
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path, ar, nar = parse_lora("styles/mine.safetensors:0.5")
    assert path == str(comfy / "models" / "loras" / "styles" / "mine.safetensors") and (ar, nar) == (0.5, 0.5)
    assert parse_vae("YuE2-Vae-legacy") == str(comfy / "models" / "vae" / "YuE2-Vae-legacy")
    assert "ComfyUI folder" in capsys.readouterr().err
    (work / "YuE2-Vae-legacy").mkdir()  # a local path of that name wins
    assert parse_vae("YuE2-Vae-legacy") == "YuE2-Vae-legacy"
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="not found"):
        parse_lora("../../../secret.safetensors")  # ComfyUI/models/loras/../../../secret: outside the folder
    with pytest.raises(argparse.ArgumentTypeError, match="not found"):
        parse_lora("styles/../../../../secret.safetensors")  # a `..` anywhere in the name
    with pytest.raises(argparse.ArgumentTypeError) as exc:  # the message says where it was looked for
        parse_lora("other.safetensors:0.5")
    assert str(exc.value) == (f"LoRA file 'other.safetensors' not found, neither here nor in ComfyUI's "
                              f"{comfy / 'models' / 'loras'} (form: PATH[:AR[:NAR]])")
    # a link in the folder is followed, as ComfyUI's get_full_path does (diff review, stop 49: "not found")
    (comfy / "models" / "loras" / "linked.safetensors").symlink_to(tmp_path / "secret.safetensors")
    assert parse_lora("linked.safetensors")[0] == str(comfy / "models" / "loras" / "linked.safetensors")
    monkeypatch.delenv("COMFYUI_PATH")
    with pytest.raises(argparse.ArgumentTypeError, match="not found"):
        parse_lora("styles/mine.safetensors")
