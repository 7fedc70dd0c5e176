"""YuE2 LoRA against the real ComfyUI server: strength 0 gives the base tokens, strength 1 changes them, the unpatched
model in the same graph still gives the base tokens, a strength change re-runs without reading the checkpoint or the
adapter again, int8 layers take the delta beside their codes, a song records its adapter and Load Song re-applies it
(the shipped re-render, Regenerate and Continue workflows keep a LoRA song's adapter), and a LoRA of another model is
refused by name."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nodes_testlib import (SCORE_240, TINY, TINY_INT8, api, by_class, codes, run, run_error, saved_dirs, set_inputs,
                           test_sized)

LORA = "yue2_test_aitk_lora.safetensors"
SDXL = "yue2_test_sdxl_lora.safetensors"


@pytest.fixture(scope="module")
def loras(comfy_server, checkpoints):
    """An ai-toolkit-layout LoRA for the tiny geometry (both experts, rank 4, deltas of the weights' own size, so
    the random model's tokens move) and an SDXL-style file, in the server's models/loras."""
    from yue2_core.weights.checkpoint import inspect_checkpoint
    d = inspect_checkpoint(str(checkpoints[TINY])).dims
    folder = comfy_server.models_dir.parent / "loras"
    folder.mkdir(exist_ok=True)
    g = torch.Generator().manual_seed(3)
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    shapes = {"self_attn.qkv_proj": (q + 2 * kv, d.hidden), "self_attn.o_proj": (d.hidden, q),
              "mlp.gate_up_proj": (2 * d.ffn, d.hidden), "mlp.down_proj": (d.hidden, d.ffn)}
    t = {}
    for prefix in ("text_encoders.model.layers", "diffusion_model.model.layers"):
        for i in range(d.layers):
            for leaf, (out, inp) in shapes.items():
                t[f"{prefix}.{i}.{leaf}.lora_A.weight"] = (torch.randn(4, inp, generator=g) * 0.1).half()
                t[f"{prefix}.{i}.{leaf}.lora_B.weight"] = (torch.randn(out, 4, generator=g) * 0.1).half()
    save_file(t, str(folder / LORA))
    save_file({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": torch.zeros(4, 320),
               "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": torch.zeros(320, 4),
               "lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": torch.zeros(4, 768)},
              str(folder / SDXL))
    return folder


def _compose(ckpt, seed, lora=None, name="lora", render=False):
    """Loader (→ LoRA) → Composer → Save Song (tokens only, or rendered + decoded)."""
    p = {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": ckpt}}}
    model = ["1", 0]
    if lora is not None:
        p["9"] = {"class_type": "YuE2LoRA", "inputs": {"model": model, "lora_name": lora[0], "strength_ar": lora[1],
                                                     "strength_nar": lora[2]}}
        model = ["9", 0]
    p["2"] = {"class_type": "YuE2Composer", "inputs": {"model": model, "style": "synth pop", "lyrics": "[verse]\nla",
                                                     "cot": "full", "seed": seed, "max_seconds": 1.0,
                                                     "max_abc_tokens": 8}}
    p["5"] = {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": name}}
    if render:
        p["3"] = {"class_type": "YuE2Renderer", "inputs": {"model": model, "tokens": ["2", 1], "steps": 4,
                                                         "seed": -1}}
        p["4"] = {"class_type": "YuE2VAEDecode", "inputs": {"model": model, "latent": ["3", 0]}}
        p["5"]["inputs"].update(latent=["3", 0], audio=["4", 0])
    return p


def _song(comfy, comfy_server, prompt):
    entry = run(comfy, prompt)
    (song,) = saved_dirs(entry, comfy_server.output_dir)
    return song, entry


@pytest.mark.parametrize("ckpt", [TINY, TINY_INT8])
def test_strength_zero_is_base_and_one_changes_tokens(comfy, comfy_server, checkpoints, loras, ckpt):
    base, _ = _song(comfy, comfy_server, _compose(ckpt, 11, name="base"))
    zero, _ = _song(comfy, comfy_server, _compose(ckpt, 11, (LORA, 0.0, 0.0), name="zero"))
    one, entry = _song(comfy, comfy_server, _compose(ckpt, 11, (LORA, 1.0, 1.0), name="one"))
    assert codes(zero) == codes(base)
    assert codes(one) != codes(base), "a strength-1 LoRA must change the music tokens"
    report = "\n".join(entry["outputs"]["9"]["text"]) if "text" in entry["outputs"].get("9", {}) else \
        json.dumps(entry["outputs"].get("9"))
    assert "ai-toolkit" in report.lower() or "aitk" in report.lower(), report
    weights = json.loads((one / "config.json").read_text()).get("weights") if (one / "config.json").exists() else None
    assert weights is None or weights["loras"][0]["file"] == LORA


def test_unpatched_model_in_the_same_graph_gives_base_tokens(comfy, comfy_server, checkpoints, loras):
    base, _ = _song(comfy, comfy_server, _compose(TINY, 21, name="alone"))
    p = _compose(TINY, 21, (LORA, 1.0, 1.0), name="patched")
    # the same graph also composes with the loader's model directly, after the patched branch
    p["12"] = {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "synth pop",
                                                      "lyrics": "[verse]\nla", "cot": "full", "seed": 21,
                                                      "max_seconds": 1.0, "max_abc_tokens": 8}}
    p["15"] = {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["12", 1], "name": "unpatched"}}
    entry = run(comfy, p)
    dirs = {d.name.rsplit("_", 1)[0]: d for d in saved_dirs(entry, comfy_server.output_dir)}
    assert codes(dirs["unpatched"]) == codes(base)
    assert codes(dirs["patched"]) != codes(base)


def test_strength_change_reads_neither_checkpoint_nor_lora_again(comfy, comfy_server, checkpoints, loras):
    _song(comfy, comfy_server, _compose(TINY, 31, (LORA, 1.0, 1.0), name="s1"))
    since = len(comfy_server.log_text())
    second, _ = _song(comfy, comfy_server, _compose(TINY, 31, (LORA, 0.5, 0.5), name="s05"))
    log = comfy_server.log_text()[since:]
    assert "AR expert read from" not in log, log[-2000:]
    assert "LoRA read from" not in log, log[-2000:]
    first_run = _song(comfy, comfy_server, _compose(TINY, 31, (LORA, 1.0, 1.0), name="s1b"))[0]
    assert codes(second) != codes(first_run)


def test_song_records_its_lora_and_load_song_reapplies_it(comfy, comfy_server, checkpoints, loras):
    song, _ = _song(comfy, comfy_server, _compose(TINY, 41, (LORA, 0.8, 0.6), name="rec", render=True))
    weights = json.loads((song / "config.json").read_text())["weights"]
    (rec,) = weights["loras"]
    assert rec["file"] == LORA and rec["strength_ar"] == 0.8 and rec["strength_nar"] == 0.6 and len(rec["sha256"]) == 64
    # Load Song's model output re-renders the saved tokens with the recorded adapter: the same latents
    rel = song.relative_to(comfy_server.output_dir / "yue2").as_posix()
    p = {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
         "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": rel}},
         "3": {"class_type": "YuE2Renderer", "inputs": {"model": ["2", 4], "tokens": ["2", 1], "steps": 4,
                                                      "seed": -1}},
         "4": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["2", 1], "steps": 4,
                                                      "seed": -1}},
         "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": "again", "latent": ["3", 0]}},
         "6": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": "plain", "latent": ["4", 0]}}}
    entry = run(comfy, p)
    dirs = {d.name.rsplit("_", 1)[0]: d for d in saved_dirs(entry, comfy_server.output_dir)}
    saved = np.load(song / "latent.npy")
    assert np.array_equal(np.load(dirs["again"] / "latent.npy"), saved)
    assert not np.array_equal(np.load(dirs["plain"] / "latent.npy"), saved)
    # the adapter renamed in the loras folder: found by its size and sha256, the same latents (review, stop 44)
    (loras / LORA).rename(loras / ("renamed " + LORA))
    try:
        entry = run(comfy, {k: v for k, v in p.items() if k in ("1", "2", "3", "5")})
        (again,) = saved_dirs(entry, comfy_server.output_dir)
        assert np.array_equal(np.load(again / "latent.npy"), saved)
    finally:
        (loras / ("renamed " + LORA)).rename(loras / LORA)
    # the adapter gone (moved out of the loras folder): with its model output connected, Load Song says which file
    # is missing ...
    (loras / LORA).rename(loras.parent / (LORA + ".moved"))
    try:
        node, _, message = run_error(comfy, {k: v for k, v in p.items() if k in ("1", "2", "3", "5")})
        assert node == "YuE2LoadSong" and LORA in message and "missing" in message, message
        # ... and without it the song still loads (review, stop 44: Load Song failed as a whole, so a song whose LoRA
        # was moved could not even be rendered with the plain checkpoint or continued)
        entry = run(comfy, {k: v for k, v in p.items() if k in ("1", "2", "4", "6")})
        (plain,) = saved_dirs(entry, comfy_server.output_dir)
        assert np.array_equal(np.load(plain / "latent.npy"), np.load(dirs["plain"] / "latent.npy"))
        text = entry["outputs"]["2"]["text"][0]
        assert "warning: no model output" in text and LORA in text, text
    finally:
        (loras.parent / (LORA + ".moved")).rename(loras / LORA)


def test_lora_of_another_model_is_refused_by_name(comfy, comfy_server, checkpoints, loras):
    node, _, message = run_error(comfy, _compose(TINY, 51, (SDXL, 1.0, 1.0), name="sdxl"))
    assert node == "YuE2LoRA"
    assert "not a YuE2" in message, message


@pytest.fixture(scope="module")
def lora_song(comfy, comfy_server, node_info, loras):
    """The shipped yue2_song_with_lora workflow run once: (prompt, history entry, song folder)."""
    prompt = test_sized(api("yue2_song_with_lora", node_info))
    set_inputs(prompt, "YuE2LoRA", lora_name=LORA, strength_ar=0.5, strength_nar=0.5)
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    return prompt, entry, song_dir


def test_shipped_lora_workflow_runs(lora_song):
    from test_nodes_workflows import check_song
    prompt, entry, song_dir = lora_song
    check_song(song_dir)
    texts = [entry["outputs"][i]["text"][0] for i in by_class(prompt, "PreviewAny") if i in entry["outputs"]]
    assert any("ai-toolkit" in t for t in texts), texts
    rec = json.loads((song_dir / "config.json").read_text())["weights"]["loras"][0]
    assert rec["file"] == LORA and rec["strength_ar"] == 0.5


def test_shipped_load_and_rerender_keeps_the_songs_lora(comfy, comfy_server, node_info, lora_song):
    """New-user review, stop 54: yue2_load_and_rerender fed its Renderer and VAE Decode the Checkpoint Loader's model,
    so a song made with a LoRA was re-rendered without it — other audio, not a word said (`render` on the command line
    re-applies the song's adapters, and says so when --no-lora leaves them out). They take Load Song's `model` now:
    the checkpoint with the song's own adapters and VAE, so the song's render comes back exactly."""
    _, _, original = lora_song
    prompt = test_sized(api("yue2_load_and_rerender", node_info))
    set_inputs(prompt, "YuE2LoadSong", song=original.name)
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert song_dir != original and codes(song_dir) == codes(original)
    assert np.array_equal(np.load(song_dir / "latent.npy"), np.load(original / "latent.npy"))
    assert json.loads((song_dir / "config.json").read_text())["weights"]["loras"][0]["file"] == LORA


@pytest.fixture(scope="module")
def lora_parent(comfy, comfy_server, node_info, loras):
    """A 1 s song of the shipped yue2_song_with_lora (the LoRA at 0.5 / 0.5) composed for SCORE_240: a lead sheet
    that yue2_regenerate_from_bar's ABC Editor passes on (the model's 8-token one of `lora_song` is no valid score)."""
    prompt = test_sized(api("yue2_song_with_lora", node_info))
    set_inputs(prompt, "YuE2LoRA", lora_name=LORA, strength_ar=0.5, strength_nar=0.5)
    prompt["abc"] = {"class_type": "PrimitiveString", "inputs": {"value": SCORE_240}}
    set_inputs(prompt, "YuE2Composer", abc_text=["abc", 0])
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    return song_dir


def _edit_run(comfy, comfy_server, prompt, node: str):
    """Run a Regenerate / Continue prompt: (the child song folder, the node's report)."""
    entry = run(comfy, prompt)
    (child,) = saved_dirs(entry, comfy_server.output_dir)
    (node_id,) = by_class(prompt, node)
    return child, entry["outputs"][node_id]["text"][0]


@pytest.mark.parametrize("workflow, node, values", [
    ("yue2_regenerate_from_bar", "YuE2Regenerate", {"cut": "0.4s"}),
    ("yue2_continue", "YuE2Continue", {"extra_seconds": 0.4}),
])
def test_shipped_regenerate_and_continue_keep_the_songs_lora(comfy, comfy_server, node_info, lora_parent, loras,
                                                             workflow, node, values):
    """Review of stop 54: yue2_regenerate_from_bar and yue2_continue fed Regenerate / Continue the Checkpoint
    Loader's model, so the new part of a song made with a LoRA was made without it (only a warning said "the new
    part follows this run's weights"). They take Load Song's `model` now: the new part is the one a graph with the
    song's LoRA applied explicitly (Loader → YuE2 LoRA, the song's file and strengths) makes, and the child records
    the LoRA; another model wired in by hand still gets the warning; a missing adapter stops the shipped workflow at
    Load Song, naming the file and how to go on without it."""
    original = lora_parent
    prompt = test_sized(api(workflow, node_info))
    set_inputs(prompt, "YuE2LoadSong", song=original.name)
    set_inputs(prompt, node, seed=5, **values)
    child, report = _edit_run(comfy, comfy_server, prompt, node)
    (load,) = by_class(prompt, "YuE2LoadSong")
    (edit,) = by_class(prompt, node)
    assert prompt[edit]["inputs"]["model"] == [load, 4]  # Load Song's model output
    rec = json.loads((child / "config.json").read_text())["weights"]["loras"]
    assert [(r["file"], r["strength_ar"], r["strength_nar"]) for r in rec] == [(LORA, 0.5, 0.5)]
    assert "this run uses" not in report, report
    # the same edit with the song's LoRA applied explicitly gives the same codes and latents
    (loader,) = by_class(prompt, "YuE2CheckpointLoader")
    by_hand = {"1": prompt[loader], "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0],
                                                                                   "song": original.name}},
               "3": {"class_type": "YuE2LoRA", "inputs": {"model": ["1", 0], "lora_name": LORA, "strength_ar": 0.5,
                                                          "strength_nar": 0.5}},
               "4": {"class_type": node, "inputs": {**{k: v for k, v in prompt[edit]["inputs"].items()
                                                       if k not in ("score", "audioUI")},
                                                    "model": ["3", 0], "song": ["2", 3], "name": "by_hand"}}}
    explicit, _ = _edit_run(comfy, comfy_server, by_hand, node)
    assert codes(explicit) == codes(child)
    assert np.array_equal(np.load(explicit / "latent.npy"), np.load(child / "latent.npy"))
    # another model wired in by hand (here the Loader's, without the LoRA): made with it, and said so
    by_hand["4"]["inputs"].update(model=["1", 0], name="plain")
    plain, plain_report = _edit_run(comfy, comfy_server, by_hand, node)
    assert not np.array_equal(np.load(plain / "latent.npy"), np.load(child / "latent.npy"))
    assert "this run uses no LoRA" in plain_report and "the new part follows this run's weights" in plain_report, \
        plain_report
    assert json.loads((plain / "config.json").read_text())["weights"]["loras"] == []
    # the adapter gone: the shipped workflow stops at Load Song, naming the file and the way on without it
    (loras / LORA).rename(loras.parent / (LORA + ".moved"))
    try:
        failed, _, message = run_error(comfy, prompt)
    finally:
        (loras.parent / (LORA + ".moved")).rename(loras / LORA)
    assert failed == "YuE2LoadSong" and LORA in message and "missing" in message, message
    label = "YuE2 Regenerate" if node == "YuE2Regenerate" else "YuE2 Continue"
    assert f"feeds {label} (#{edit})" in message and "YuE2 Checkpoint Loader's model" in message, message


def test_a_file_replaced_on_disk_is_read_again(comfy, comfy_server, checkpoints, loras):
    """Break-it finding (stop 38): ComfyUI reused the cached Checkpoint Loader / LoRA output when a file of the same
    name was replaced — the old adapter applied (and the new file's sha256 recorded), a checkpoint's parts read from
    two files. Both nodes fingerprint the file (size, mtime) now: a replaced file is read again; an unchanged one is
    not."""
    import os
    import shutil
    from synthetic_cache import synthetic_link
    ckpt, lora = "yue2_test_swap.safetensors", "yue2_test_swap_lora.safetensors"
    synthetic_link(str(comfy_server.models_dir / ckpt), "tiny", "bf16")  # checkpoints[TINY]'s bytes, never written
    shutil.copyfile(loras / LORA, loras / lora)
    first, _ = _song(comfy, comfy_server, _compose(ckpt, 51, (lora, 1.0, 1.0), name="swap1"))
    since = len(comfy_server.log_text())
    again, _ = _song(comfy, comfy_server, _compose(ckpt, 51, (lora, 1.0, 1.0), name="swap2"))
    log = comfy_server.log_text()[since:]
    assert "LoRA read from" not in log and "AR expert read from" not in log, log[-2000:]
    assert codes(again) == codes(first)
    from safetensors.torch import load_file
    t = load_file(str(loras / LORA))
    save_file({k: (v.float() * -1).half() for k, v in t.items()}, str(loras / lora))  # another adapter, same name
    st = os.stat(loras / lora)
    os.utime(loras / lora, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    since = len(comfy_server.log_text())
    _song(comfy, comfy_server, _compose(ckpt, 51, (lora, 1.0, 1.0), name="swap3"))
    assert "LoRA read from" in comfy_server.log_text()[since:]
    synthetic_link(str(comfy_server.models_dir / ckpt), "tiny", "bf16", seed=5)  # same layout, put by os.replace
    since = len(comfy_server.log_text())
    _song(comfy, comfy_server, _compose(ckpt, 51, None, name="swap4"))
    assert "AR expert read from" in comfy_server.log_text()[since:], comfy_server.log_text()[since:][-2000:]


def test_a_sidecar_added_beside_the_adapter_is_read_again(comfy, comfy_server, checkpoints, loras, tmp_path):
    """Review finding (stop 40): the node's fingerprint and parse cache covered the adapter's main file only, so an
    adapter_config.json put beside a PEFT adapter_model.safetensors after a run left the cached adapter (no sidecar,
    scale 1) in place — the song then recorded no sidecar and `render` refused it as one that now reads other files.
    Both now cover every file the adapter reads (`layouts_io.read_state`): the node re-runs and reads the adapter
    with its sidecar (its report lists the files read); unchanged files are not read again."""
    import shutil
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as lora_synth
    dims = inspect_checkpoint(str(checkpoints[TINY])).dims
    made = lora_synth.write_adapter("peft", tmp_path / "peft", dims, rank=4, seed=3)
    sub = loras / "yue2_test_peft"
    sub.mkdir(exist_ok=True)
    shutil.copyfile(made / "adapter_model.safetensors", sub / "adapter_model.safetensors")  # no sidecar yet
    prompt = {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
              "2": {"class_type": "YuE2LoRA", "inputs": {"model": ["1", 0], "strength_ar": 1.0, "strength_nar": 1.0,
                                                         "lora_name": "yue2_test_peft/adapter_model.safetensors"}},
              "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}}

    def report():
        since = len(comfy_server.log_text())
        entry = run(comfy, prompt)
        return json.dumps(entry["outputs"].get("2")), comfy_server.log_text()[since:]

    def files_read(text):  # the report's "file(s):" block
        block = json.loads(text)["text"][-1].split("file(s):\n", 1)[1].split("scale rule", 1)[0]
        return [os.path.basename(line.strip()) for line in block.splitlines() if line.strip()]
    try:
        text, log = report()
        assert "LoRA read from" in log and files_read(text) == ["adapter_model.safetensors"], text
        assert "there is none beside this one" in text  # the lost-alpha warning (stop-54 review)
        text, log = report()
        assert "LoRA read from" not in log, log[-2000:]  # nothing changed: not read again
        shutil.copyfile(made / "adapter_config.json", sub / "adapter_config.json")
        text, log = report()
        assert "LoRA read from" in log, log[-2000:]
        assert "adapter_config.json" in files_read(text) and "scale cannot be read" not in text, text
    finally:
        shutil.rmtree(sub, ignore_errors=True)


def test_node_songs_record_the_int8_mode_and_load_song_says_a_bf16_one(comfy, comfy_server, checkpoints, loras,
                                                                       monkeypatch, capsys):
    """Review (stop 41): songs of the nodes recorded no `weights.lora_int8`, though the nodes always apply LoRAs on
    int8 layers as side deltas — a command-line `render` under YUE2_LORA_INT8=bf16 could only guess. They record
    "side" (an int8 checkpoint; none for bf16, whose layers are all float), so `render` says what the switch
    changes; Load Song of a song whose LoRAs were merged into bf16 (YUE2_LORA_INT8=bf16 on the command line) says
    that its model output applies them as side deltas."""
    from yue2_core.__main__ import main
    int8, _ = _song(comfy, comfy_server, _compose(TINY_INT8, 61, (LORA, 1.0, 1.0), name="i8mode", render=True))
    assert json.loads((int8 / "config.json").read_text())["weights"]["lora_int8"] == "side"
    plain, _ = _song(comfy, comfy_server, _compose(TINY, 61, (LORA, 1.0, 1.0), name="bfmode", render=True))
    assert "lora_int8" not in json.loads((plain / "config.json").read_text())["weights"]
    monkeypatch.setenv("YUE2_LORA_INT8", "bf16")
    capsys.readouterr()
    made = comfy_server.output_dir / "yue2" / "cli_bf16_00001"
    assert main(["render", str(int8), "--device", "cpu", "--offline", "--output", str(made)]) == 0
    err = capsys.readouterr().err
    assert "note: YUE2_LORA_INT8=bf16 applies the LoRAs to int8 layers" in err, err
    assert "this song was made with side" in err and "does not record" not in err, err
    assert json.loads((made / "config.json").read_text())["weights"]["lora_int8"] == "bf16"
    monkeypatch.delenv("YUE2_LORA_INT8")
    texts = {}
    for ckpt in (TINY_INT8, TINY):
        p = {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": ckpt}},
             "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": made.name}},
             "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}}
        entry = run(comfy, p)
        texts[ckpt] = json.dumps(entry["outputs"]["2"])
    assert "merged into its int8 layers dequantized to bf16" in texts[TINY_INT8], texts[TINY_INT8]
    assert "exact side deltas" in texts[TINY_INT8]
    assert "dequantized to bf16" not in texts[TINY], texts[TINY]  # a bf16 checkpoint: no int8 layer


def test_load_song_says_what_the_stacking_change_does_to_an_older_song(comfy, comfy_server, checkpoints, loras,
                                                                      tmp_path, older_song):
    """Review (stop 41): Load Song of a song made before the stacking change (2026-12-06) — an FL AR file and its own
    NAR file as two LoRAs; a replacement after another adapter's deltas on its module — gave no word (the Renderer
    then refused the first with the general message, and rendered the second otherwise). Its report says what
    changed and which strengths give the song again; a song recording `stack_rules` gets no such note."""
    import shutil
    from yue2_core.__main__ import main
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as S
    from yue2_core.weights.lora.apply import Applied
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.record import lora_record
    dims = inspect_checkpoint(str(checkpoints[TINY])).dims
    fl = S.write_adapter("fl", loras / "yue2_test_fl" / "fl-ar.safetensors", dims, rank=2, seed=4)
    nar = fl.parent / "fl-nar.safetensors"
    cn = S.write_adapter("comfy-native", loras / "yue2_test_cn.safetensors", dims, rank=2, seed=5)
    ms = S.write_adapter("ms-raw-nar", loras / "yue2_test_ms.safetensors", dims, rank=2, seed=6)
    small = ["--style", "pop", "--lyrics", "la", "--max-seconds", "1", "--max-abc-tokens", "8", "--steps", "2",
             "--device", "cpu", "--offline", "--checkpoint", str(checkpoints[TINY])]
    songs = comfy_server.output_dir / "yue2"
    try:
        assert main(["generate", *small, "--lora", f"{fl}:1:0.75", "--output", str(tmp_path / "fl")]) == 0
        extra = lora_record(Applied(read_adapter(str(nar), dims), 1.0, 0.5))
        older_song(tmp_path / "fl", songs / "old_fl_00001",
               lambda c: (c["weights"]["loras"].append(extra), c["weights"].pop("stack_rules")))
        assert main(["generate", *small, "--lora", str(cn), "--lora", str(ms), "--output", str(tmp_path / "rep")]) == 0
        shutil.copytree(tmp_path / "rep", songs / "new_rep_00001")
        older_song(tmp_path / "rep", songs / "old_rep_00001", lambda c: c["weights"].pop("stack_rules"))
        texts = {}
        for name in ("old_fl_00001", "old_rep_00001", "new_rep_00001"):
            p = {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
                 "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": name}},
                 "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}}
            texts[name] = json.dumps(run(comfy, p)["outputs"]["2"])
        assert ("this song was made before 2026-12-06 with the FL adapter fl-ar.safetensors and its own NAR file "
                "fl-nar.safetensors as two LoRAs") in texts["old_fl_00001"], texts["old_fl_00001"]
        assert "with strength_nar 1.25" in texts["old_fl_00001"]
        assert ("if it was made before then, yue2_test_ms.safetensors replaced NAR llm2vae, vae2llm and erased the "
                "deltas yue2_test_cn.safetensors") in texts["old_rep_00001"], texts["old_rep_00001"]
        assert "stacking rule" not in texts["new_rep_00001"], texts["new_rep_00001"]
    finally:
        shutil.rmtree(fl.parent, ignore_errors=True)
        for f in (cn, ms):
            f.unlink(missing_ok=True)
