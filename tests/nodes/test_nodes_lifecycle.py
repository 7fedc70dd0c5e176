"""Cancel and memory over runs, against the real server process: Cancel while the Composer writes leaves the server
usable, the next run succeeds and no partial song directory exists; five songs in a row keep the server's resident
memory (VmRSS) flat."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from nodes_testlib import TINY, VALID_ABC, run, saved_dirs, wait_for_log
from yue2_core.constants import VAE_CORE_FRAMES

RSS_TOLERANCE_MB = 64  # the server runs with a 64 KiB mmap threshold (tests/host/comfy_client.py); what still moves
# between identical runs is about one 60 s stereo waveform (23 MB) alive or not at the moment of measuring


def _song_prompt(seed: int, name: str, max_abc_tokens: int = 8) -> dict:
    """Loader → Composer (plans up to max_abc_tokens) → Renderer → VAE Decode → Save Song."""
    return {
        "1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
        "2": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "synth pop", "lyrics": "[verse]\nla",
                                                       "cot": "full", "seed": seed, "max_seconds": 1.0,
                                                       "max_abc_tokens": max_abc_tokens}},
        "3": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["2", 1], "steps": 8, "seed": -1}},
        "4": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["3", 0]}},
        "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": name, "latent": ["3", 0],
                                                       "audio": ["4", 0]}},
    }


def _entries(root: Path) -> set:
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def test_cancel_while_composing(comfy, comfy_server, checkpoints):
    songs = comfy_server.output_dir / "yue2"
    before = _entries(songs)
    since = len(comfy_server.log_text())
    prompt_id = comfy.queue(_song_prompt(seed=777, name="cancelled", max_abc_tokens=20000))
    wait_for_log(comfy_server, "[YuE2] YuE2 Composer: writing the lead sheet", since)
    time.sleep(0.5)  # a few lead-sheet tokens in (20,000 of them would take many minutes on a CPU)
    comfy.interrupt()
    entry = comfy.wait(prompt_id, timeout=60, check=False)
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds and entry["status"]["status_str"] == "error", entry["status"]
    interrupted = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_interrupted")
    assert interrupted["node_type"] == "YuE2Composer"
    assert _entries(songs) == before, "a cancelled run must leave no song directory (not even a hidden partial one)"
    assert comfy.queue_state() == {"queue_running": [], "queue_pending": []}
    # the server is usable and the next run succeeds
    entry = run(comfy, _song_prompt(seed=778, name="after_cancel"))
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert song_dir.name.startswith("after_cancel_") and (song_dir / "audio.flac").is_file()
    assert not [p for p in songs.iterdir() if p.name.startswith(".")]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def test_five_songs_in_a_row_keep_memory_flat(comfy, comfy_server, checkpoints):
    """Every run samples new tokens (new seed), renders, decodes and saves; the ABC text skips planning."""
    pid = comfy_server.proc.pid

    def prompt(seed):
        p = _song_prompt(seed, f"rss_{seed}")
        p["6"] = {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}}
        p["2"]["inputs"]["abc_text"] = ["6", 0]
        return p

    run(comfy, prompt(900))  # warm-up: every part loaded, allocator caches filled
    rss = []
    for seed in range(901, 906):
        entry = run(comfy, prompt(seed))
        assert len(saved_dirs(entry, comfy_server.output_dir)) == 1
        rss.append(round(_rss_mb(pid), 1))
    record = {"vmrss_mb_after_each_run": rss, "spread_mb": round(max(rss) - min(rss), 1),
              "growth_mb": round(rss[-1] - rss[0], 1)}
    print(f"\nserver VmRSS after runs 2-6 (MB): {rss}")
    artifacts = os.environ.get("YUE2_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / "nodes_rss.json").write_text(json.dumps(record, indent=1))
    assert record["spread_mb"] < RSS_TOLERANCE_MB, record
    assert record["growth_mb"] < RSS_TOLERANCE_MB / 2, record


def test_cancel_while_rendering(comfy, comfy_server, checkpoints):
    """Cancel in the NAR stage (the Composer's tokens come from ComfyUI's cache): execution_interrupted on the
    Renderer, no song folder, and the next run succeeds. One second of music: the cancelled render's 200 ODE steps
    (400 velocity evaluations) still take seconds on a CPU, and the Cancel lands in the first few (8 s of music made
    the warm-up run sample 200 music tokens, most of this test's time in CI)."""
    songs = comfy_server.output_dir / "yue2"

    def prompt(render_seed, name, steps=8):
        p = _song_prompt(seed=4242, name=name)
        p["6"] = {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}}
        p["2"]["inputs"].update({"abc_text": ["6", 0], "max_seconds": 1.0})
        p["3"]["inputs"].update({"steps": steps, "seed": render_seed})
        return p

    run(comfy, prompt(1, "render_warm"))  # composes once; the next prompts reuse the cached tokens
    before = _entries(songs)
    since = len(comfy_server.log_text())
    prompt_id = comfy.queue(prompt(2, "render_cancelled", steps=200))  # 400 velocity evaluations: long on a CPU
    wait_for_log(comfy_server, "[YuE2] YuE2 Renderer: rendering", since)
    time.sleep(0.1)  # a step or two in
    comfy.interrupt()
    entry = comfy.wait(prompt_id, timeout=120, check=False)
    assert _interrupted_at(entry) == "YuE2Renderer"
    assert _entries(songs) == before
    entry = run(comfy, prompt(3, "after_render_cancel"))
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert (song_dir / "audio.flac").is_file()


def _long_prompt(render_seed: int, name: str) -> dict:
    """A given lead sheet (no planning) and 60 s of music: ~1,500 music tokens, half a minute or more of sampling
    on a 2-core CPU, so a Cancel a fraction of a second in lands inside the music-token stage."""
    p = _song_prompt(seed=5, name=name)
    p["6"] = {"class_type": "PrimitiveString", "inputs": {"value": VALID_ABC}}
    p["2"]["inputs"].update({"abc_text": ["6", 0], "max_seconds": 60.0})
    p["3"]["inputs"].update({"steps": 1, "seed": render_seed})
    return p


def _interrupted_at(entry: dict) -> str:
    messages = dict(entry["status"]["messages"])
    assert "execution_interrupted" in messages, entry["status"]
    return messages["execution_interrupted"]["node_type"]


LONG_FRAMES = 600  # one VAE tile


def _saved_long_song(output_dir: Path) -> str:
    """A 600-frame (24 s) song folder written straight into the server's output/yue2 (random codes and latents, no
    model run: sampling them in the server took 40–100 s of a CI run and is not what the decode Cancel tests); its
    name for YuE2 Load Song. The VAE decodes it in one tile (up to `VAE_CORE_FRAMES` = 1,024 frames), seconds on a
    CPU, and checks Cancel after each tile: a Cancel during it stops the node there, as one during the first of the
    two tiles of the 1,500 frames used before did (the second tile, and the longer render and save, only made each
    of the two full runs longer)."""
    from tests.robust.robust_helpers import make_song
    from yue2_core.artifacts import save_song
    name = "long_saved_song"
    save_song(make_song(frames=LONG_FRAMES, seed=5), output_dir / "yue2" / name)
    return name


def _rerender_prompt(song: str, render_seed: int, name: str) -> dict:
    """Loader → Load Song → Renderer (1 step, `render_seed`: a new seed reruns Renderer and VAE Decode) → VAE Decode
    → Save Song."""
    return {
        "1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
        "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": song}},
        "3": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["2", 1], "steps": 1,
                                                       "seed": render_seed}},
        "4": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["3", 0]}},
        "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": name, "latent": ["3", 0],
                                                       "audio": ["4", 0]}},
    }


def test_cancel_while_sampling_music_then_decoding(comfy, comfy_server, checkpoints):
    """Cancel inside the music-token stage, then (after one full run of a saved 24 s song: Load Song, render, decode,
    save) inside the VAE decode: each time the run stops at that node, no song folder appears, the next run
    succeeds, and the server's resident memory after the run that follows a Cancel is within RSS_TOLERANCE_MB of the
    same run before any Cancel."""
    songs = comfy_server.output_dir / "yue2"
    pid = comfy_server.proc.pid
    before = _entries(songs)
    since = len(comfy_server.log_text())
    prompt_id = comfy.queue(_long_prompt(1, "music_cancelled"))
    wait_for_log(comfy_server, "[YuE2] YuE2 Composer: sampling music tokens", since)
    time.sleep(0.3)  # a few music tokens in
    comfy.interrupt()
    entry = comfy.wait(prompt_id, timeout=120, check=False)
    assert _interrupted_at(entry) == "YuE2Composer"
    assert _entries(songs) == before

    song = _saved_long_song(comfy_server.output_dir)
    entry = run(comfy, _rerender_prompt(song, 2, "long_song"), timeout=600)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    import numpy as np
    frames = len(np.load(song_dir / "semantic.npy"))
    assert LONG_FRAMES <= frames <= VAE_CORE_FRAMES, f"{frames} music frames: not the decode to aim a Cancel at"
    rss_full = _rss_mb(pid)
    before = _entries(songs)
    since = len(comfy_server.log_text())
    prompt_id = comfy.queue(_rerender_prompt(song, 3, "decode_cancelled"))  # new render seed: Renderer and VAE
    wait_for_log(comfy_server, "[YuE2] YuE2 VAE Decode: decoding", since)  # Decode rerun
    comfy.interrupt()  # at once: the tile takes seconds
    entry = comfy.wait(prompt_id, timeout=120, check=False)
    assert _interrupted_at(entry) == "YuE2VAEDecode", f"the decode of {frames} frames ended before the Cancel"
    assert _entries(songs) == before
    entry = run(comfy, _rerender_prompt(song, 4, "after_decode_cancel"), timeout=300)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert (song_dir / "audio.flac").is_file()
    rss_after = _rss_mb(pid)
    print(f"\nserver VmRSS after a full long run {rss_full:.0f} MB, after cancels + the same run {rss_after:.0f} MB")
    assert rss_after - rss_full < RSS_TOLERANCE_MB, (rss_full, rss_after)
