"""Candidates: the Composer with candidates = N samples N takes in one AR batch, the Renderer and VAE Decode carry the
batch, YuE2 Pick Take picks one and reports every take — against the real server, on the tiny checkpoint.

- the shipped four-candidates workflow runs; picking each index re-runs only Pick Take and Save Song (the rest is
  cached) and saves that take;
- take i's token stream (and lead sheet) equals a single run with seed + i through the engine's batch decoder
  (`yue2_core.fast.decode`, a batch of one, here in the test process on the same file and dtype) — on CPU the
  streams are identical;
- a batch never reaches a node that needs one song: Save Song says to use Pick Take; Pick Take out of range says the
  valid indices; candidates with 'score only' is refused;
- takes of different lengths (which the random tiny model never produces: its songs always run to max_seconds) are
  checked with the batch helpers directly (nodes/batch.py, loaded without ComfyUI) on the tiny VAE;
- too many candidates: the engine's check_memory message, with the arithmetic that shows why a CPU host cannot hit
  it through the node (16 full-context takes of the tiny model need < 1 GiB).
"""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from nodes_testlib import (REPO, SCORE_240, TINY, api, by_class, codes, load_example, run, run_error, saved_dirs,
                          set_inputs, test_sized)

SEED = 100
N = 4


@pytest.fixture
def one_thread():
    """One intra-op thread in this process while the test runs (the server keeps its own): on a busy 2-core host
    spinning OpenMP workers of two processes slow the tiny model's small ops down several times."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch_module():
    """nodes/batch.py on its own (it imports torch and yue2_core only, not ComfyUI)."""
    spec = importlib.util.spec_from_file_location("yue2_nodes_batch", REPO / "nodes" / "batch.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _prompt(node_info, index: int, name: str) -> dict:
    prompt = test_sized(api("yue2_four_candidates", node_info))
    set_inputs(prompt, "YuE2Composer", seed=SEED, style="pop", lyrics="[verse]\nla la")
    set_inputs(prompt, "YuE2PickTake", index=index)
    set_inputs(prompt, "YuE2SaveSong", name=name)
    return prompt


@pytest.fixture(scope="module")
def takes(comfy, comfy_server, node_info) -> dict:
    """The shipped workflow run once per index: {index: (history entry, saved take folder)}."""
    out = {}
    for index in range(N):
        entry = run(comfy, _prompt(node_info, index, f"take{index}"))
        (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
        out[index] = (entry, song_dir)
    return out


def test_four_candidates_workflow(takes, node_info):
    prompt = _prompt(node_info, 0, "take0")
    (composer,) = by_class(prompt, "YuE2Composer")
    (pick,) = by_class(prompt, "YuE2PickTake")
    assert prompt[composer]["inputs"]["candidates"] == N
    entry, first = takes[0]
    report = entry["outputs"][composer]["text"][0]
    assert f"candidates: {N} takes sampled in one batch" in report
    for i in range(N):
        assert f"take {i}: seed {SEED + i} · 25 tokens = 1.00 s" in report
    for index, (entry, song_dir) in takes.items():
        if index:  # only the picker and the saver ran again
            cached = {n for kind, data in entry["status"]["messages"] if kind == "execution_cached"
                      for n in data["nodes"]}
            assert composer in cached and pick not in cached
        assert len(codes(song_dir)) == 25
        assert np.load(song_dir / "latent.npy").shape == (25, 64)
        assert sf.info(str(song_dir / "audio.flac")).frames == 1920 * 25 - 64
        config = json.loads((song_dir / "config.json").read_text())
        assert config["render_seed"] == SEED + index and config["ode_steps"] == 8
        assert json.loads((song_dir / "request.json").read_text())["seed"] == SEED + index
        text = entry["outputs"][pick]["text"][0]
        assert text.startswith(f"- {N} takes; picked take {index} (seed {SEED + index})")
        assert f"take {index}: seed {SEED + index} · 1.00 s (25 tokens, 1.00 s audio) · hit the max_seconds budget" \
               in text and text.count("← picked") == 1
        reports = entry["outputs"][pick]["takes"]
        assert [r["seed"] for r in reports] == [SEED + i for i in range(N)]
        assert all(r["ended"] is False and r["tokens"] == 25 and r["seconds"] == 1.0 for r in reports)
        assert all(r["score_to_audio"] is None and "does not parse" in r["score_note"] for r in reports)
        previews = [entry["outputs"][i]["text"][0] for i in by_class(prompt, "PreviewAny") if i in entry["outputs"]]
        assert text in previews  # the takes report reaches the stock text preview
    assert len({tuple(codes(d)) for _, d in takes.values()}) == N  # four different songs


def test_each_take_equals_a_single_run_with_its_seed(takes, checkpoints, one_thread):
    """Take i = the engine's batch decoder run alone with seed + i: the same lead sheet ids and music codes."""
    from yue2_core.fast import decode as fd
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import SongRequest, codes_from_ids, planning_prefix, semantic_prefix
    engine = YuE2Engine.load(str(checkpoints[TINY]), device="cpu", dtype=torch.bfloat16, parts=("ar",))
    budgets = Budgets(max_seconds=1.0, max_abc_tokens=8)
    enc = engine.tokenizer.encode
    for index, (_, song_dir) in takes.items():  # (one thread: the tiny model's ops gain nothing from more)
        request = SongRequest("pop", "[verse]\nla la", cot="full", seed=SEED + index)
        plan = fd.generate(engine.ar, planning_prefix(request, enc), budgets.abc_sampling(), request.seed, "abc",
                           use_graph=False)
        music = fd.generate(engine.ar, semantic_prefix(request, plan.tokens, enc), budgets.semantic_sampling(),
                            request.seed, "semantic", use_graph=False)
        assert np.load(song_dir / "abc_tokens.npy").tolist() == plan.tokens
        assert codes(song_dir) == codes_from_ids(music.tokens)



def test_the_notes_promise_a_single_song_of_the_seed_only_where_it_is_one(takes, checkpoints, one_thread):
    """New-user review 56 (docs/bad_inputs.md §57): the shipped workflow's note said "take i uses seed + i, so take i
    is exactly the song of that seed" and the `candidates` tooltip "a take run alone with its seed matches it on
    CPU"; a user who sets candidates 1 and that seed on a CPU gets another song (the single Composer samples with
    the portable loop, docs/comfyui.md "Candidates"; take 0 of the shipped workflow at seed 831001 and the single
    song of yue2_text_to_song_full at 831001 differed from the first token). Take 0 against the single Composer's
    path, in this process (`plan` + `semantic`: what the node calls, the same draws as its saved songs)."""
    from yue2_core.pipeline import Budgets, YuE2Engine, plan, semantic
    from yue2_core.protocol import SongRequest
    engine = YuE2Engine.load(str(checkpoints[TINY]), device="cpu", dtype=torch.bfloat16, parts=("ar",))
    budgets = Budgets(max_seconds=1.0, max_abc_tokens=8)
    request = SongRequest("pop", "[verse]\nla la", cot="full", seed=SEED)
    score = plan(engine.ar, engine.tokenizer, request, budgets.abc_sampling(), semantic_max_tokens=25)
    music = semantic(engine.ar, engine.tokenizer, request, score, budgets.semantic_sampling())
    _, take0 = takes[0]
    assert list(music.codes) != codes(take0), "a single song equals take 0 on CPU now: say so in the note and tooltip"
    (note,) = [n["widgets_values"][0] for n in load_example("yue2_four_candidates")["nodes"] if n["type"] == "Note"]
    assert "exactly the song of that seed" not in note
    assert "on a CPU it samples with another decoder, another song" in note

def test_a_batch_needs_pick_take(comfy, node_info, takes):
    prompt = _prompt(node_info, N, "nope")  # index 4 of 4 takes
    node, kind, message = run_error(comfy, prompt)
    assert (node, kind) == ("YuE2PickTake", "ValueError")
    assert message.strip() == ("take 4 does not exist: the tokens hold 4 takes (index 0 … 3, 0-based); set index to "
                               "at most 3")
    # the batch straight into Save Song: refused with a pointer to Pick Take
    prompt = _prompt(node_info, 0, "batch")
    (composer,) = by_class(prompt, "YuE2Composer")
    (save,) = by_class(prompt, "YuE2SaveSong")
    prompt[save]["inputs"] = {"tokens": [composer, 1], "name": "batch"}
    node, kind, message = run_error(comfy, prompt)
    # a builtin type: ComfyUI names a pack's own exception class by its module, which showed the user
    # "/…/custom_nodes/ComfyUI-YuE2.nodes.batch.BatchNotPicked" (review, stop 44)
    assert (node, kind) == ("YuE2SaveSong", "ValueError")
    assert message.startswith(f"these tokens are a batch of {N} candidate takes (YuE2 Composer candidates = {N}, "
                              f"seeds {SEED} … {SEED + N - 1})") and "YuE2 Pick Take" in message
    # 'score only' writes one lead sheet: more candidates are refused before any work
    prompt = _prompt(node_info, 0, "scoreonly")
    set_inputs(prompt, "YuE2Composer", sample_music=False)
    node, _, message = run_error(comfy, prompt)
    assert node == "YuE2Composer" and "candidates = 4 needs sample_music on" in message


def test_takes_of_different_lengths_round_trip_through_the_padded_batch(checkpoints, one_thread):
    """Renderer → VAE Decode → Pick Take with takes of 9, 14 and 6 frames: each take's audio is exactly its own
    decode (the padding never reaches the VAE), and picking cuts latent and audio back to the take's length."""
    from yue2_core.artifacts import expected_samples
    from yue2_core.pipeline import Score, SemanticTokens, YuE2Engine, decode
    batch = _batch_module()
    vae = YuE2Engine.load(str(checkpoints[TINY]), device="cpu", parts=("vae",)).vae
    g = torch.Generator().manual_seed(0)
    lengths = [9, 14, 6]
    latents = [torch.randn(n, 64, generator=g) for n in lengths]
    latent = batch.padded_latent(latents, 8, [5, 6, 7], {})
    assert latent["samples"].shape == (3, 64, 14) and latent["yue2_frames"] == lengths
    assert torch.count_nonzero(latent["samples"][2, :, 6:]) == 0
    frames = batch.latent_frames(latent, 3, 14)
    waves = batch.decode_batch(lambda one: decode(vae, one), latent["samples"], frames)
    audio = batch.padded_audio(waves)
    assert audio["waveform"].shape == (3, 2, expected_samples(14))
    assert audio["yue2_samples"] == [expected_samples(n) for n in lengths]
    for i, (lat, n) in enumerate(zip(latents, lengths)):
        alone = decode(vae, lat)
        picked = batch.pick_audio(audio, i, audio["yue2_samples"][i])["waveform"][0]
        assert torch.equal(picked, alone)
        assert torch.equal(batch.pick_latent_samples(latent["samples"], i, n)[0].T, lat)
    with pytest.raises(ValueError, match="does not describe its 3 item"):
        batch.latent_frames({**latent, "yue2_frames": [9, 15, 6]}, 3, 14)
    # the report of takes of different lengths and endings, with a score that parses (4 bars at 240 BPM = 4 s)
    score = Score(abc=SCORE_240, abc_ids=[1], cot="full", seed=5, source="user")
    takes = [SemanticTokens(codes=[0] * n, prefix=[1], score=score, request={}, seed=5 + i, cfg_scale=1.0,
                            sampling={}, ended=i == 1) for i, n in enumerate((100, 50))]
    reports = batch.take_reports(takes, [None, None])
    assert [(r["seed"], r["ended"], r["seconds"], r["score_seconds"], r["score_to_audio"]) for r in reports] == [
        (5, False, 4.0, 4.0, 1.0), (6, True, 2.0, 4.0, 2.0)]
    assert batch.describe_take(reports[1]) == ("take 1: seed 6 · 2.00 s (50 tokens, 2.00 s audio) · ended on its "
                                               "end token · score 4.00 s, score/audio 2.00")
    tb = batch.TakeBatch(takes, [5, 6])
    assert batch.as_takes(tb) == takes and batch.as_takes(takes[0]) == [takes[0]]
    with pytest.raises(ValueError, match="batch of 2 candidate takes"):
        tb.codes  # noqa: B018 — any single-song field refuses




def test_too_many_candidates_is_refused_with_the_maximum(checkpoints):
    """The node passes the engine's check_memory error on as its message. On a CPU host it cannot be reached
    through the node: even 16 takes filling the whole context with CFG need < 1 GiB with the tiny model (shown
    below), so the engine function is checked here with the tiny model's real dimensions and a small budget."""
    from yue2_core.candidates import check_memory, kv_bytes_per_song
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.constants import CONTEXT
    from yue2_core.errors import RequestError
    from yue2_core.protocol import SEMANTIC_PRESET
    dims = inspect_checkpoint(str(checkpoints[TINY])).dims
    per_song = kv_bytes_per_song(0, CONTEXT, True, layers=dims.layers, kv_heads=dims.kv_heads,
                                 head_dim=dims.head_dim, dtype_bytes=2)
    assert 16 * per_song < 2 ** 30  # why the server on this host never refuses 16 takes
    ar = type("AR", (), {"dims": dims, "dtype": torch.bfloat16, "device": torch.device("cpu")})()
    sampling = SEMANTIC_PRESET.merged({"max_tokens": 9000, "min_tokens": 200})
    free = 512 * 2 ** 20 + 3 * (kv_bytes_per_song(300, 9000, True, layers=dims.layers, kv_heads=dims.kv_heads,
                                                  head_dim=dims.head_dim) + 9000 * 356 * 4 + 9000 * 8 + 2 * 32769 * 2)
    check_memory(ar, 3, 300, sampling, True, "semantic", free)
    with pytest.raises(RequestError) as info:
        check_memory(ar, 16, 300, sampling, True, "semantic", free)
    message = str(info.value)
    assert message.startswith("16 candidates do not fit: at most 3 candidates fit in 0.6 GiB free on cpu")
    assert "Lower the number of candidates or the max seconds" in message


def test_a_latent_of_no_items_is_refused_by_name():
    """Break-it review, stop 53: a LATENT whose samples are [0, 64, T] (a batch of no takes, from another pack's
    node) reached torch.stack in YuE2 VAE Decode ("stack expects a non-empty TensorList"); VAE Decode reads each
    item's frames through `latent_frames`, which now refuses it by name (Pick Take refused it before, by count)."""
    batch = _batch_module()
    empty = {"samples": torch.zeros(0, 64, 10)}
    with pytest.raises(ValueError, match=r"the latent holds no items \(its samples are \[0, …, 10\]\)"):
        batch.latent_frames(empty, 0, 10)
    with pytest.raises(ValueError, match="holds no items"):
        batch.latent_frames({**empty, "yue2_frames": []}, 0, 10)
    assert batch.latent_frames({"samples": torch.zeros(2, 64, 10)}, 2, 10) == [10, 10]
