"""N candidate songs in one AR batch: each take equals the single run with its seed (token streams identical on CPU),
takes report their length, ending and score ratio, and N beyond memory is refused with the maximum."""
import json

import pytest
import torch

from edit_data import SCORE
from yue2_core.artifacts import save_song
from yue2_core.candidates import (RELEASE_KV, candidates, check_memory, kv_bytes_per_song, max_candidates,
                                  take_seeds)
from yue2_core.edit import regenerate
from yue2_core.errors import RequestError
from yue2_core.fast import decode as fd
from yue2_core.pipeline import Budgets
from yue2_core.protocol import SongRequest, semantic_prefix

PLAN = Budgets(max_seconds=1.0, max_abc_tokens=10)  # 25 music tokens after a 10-token lead sheet


def _same(a, b):
    return (a.song.tokens.codes == b.song.tokens.codes and a.song.score.abc_ids == b.song.score.abc_ids
            and torch.equal(a.song.latents, b.song.latents) and torch.equal(a.song.audio, b.song.audio))


def test_planned_candidates_equal_single_runs(engine, tmp_path):
    req = SongRequest("indie pop", "[Verse]\nla la", cot="full", seed=40)
    takes = candidates(engine, req, 3, PLAN)
    assert [t.seed for t in takes] == [40, 41, 42] and [t.index for t in takes] == [0, 1, 2]
    singles = [candidates(engine, SongRequest("indie pop", "[Verse]\nla la", cot="full", seed=s), 1, PLAN)[0]
               for s in (40, 41, 42)]
    assert all(_same(a, b) for a, b in zip(takes, singles))  # lead sheet, codes, latents and audio identical
    assert len({tuple(t.song.tokens.codes) for t in takes}) == 3 and len({tuple(t.score.abc_ids) for t in takes}) == 3
    # the same streams straight from the batch decoder, one song at a time
    sem = PLAN.semantic_sampling()
    for t in takes:
        one = fd.generate(engine.ar, t.song.tokens.prefix, sem, t.seed, "semantic", use_graph=False)
        assert [151853 + c for c in t.song.tokens.codes] == one.tokens
    t = takes[1]
    rep = t.report()
    assert rep["tokens"] == len(t.tokens.codes) == 25 and rep["seconds"] == 1.0 and rep["ended"] is False
    assert rep["score_seconds"] is None and "does not parse" in rep["score_note"]  # random tiny-model ABC
    assert t.audio is t.song.audio and t.request.seed == 41  # Song-like
    # a take can be edited like any song (its own seed is its render seed)
    stages = []
    child, lineage = regenerate(engine, t, {"token": 20}, seed=1, progress=lambda st, d, tot, info: stages.append(st))
    assert child.tokens.codes[:20] == t.tokens.codes[:20] and lineage["render_seed"] == 41
    assert {"semantic", "render", "decode"} <= set(stages) and "take" not in child.settings
    out = save_song(t.song, tmp_path / "take1")
    assert json.loads((out / "config.json").read_text())["take"] == {"index": 1, "seed": 41, "n": 3,
                                                                     "seeds": [40, 41, 42], "shared_score": False}


def test_cfg_candidates_with_given_seeds_and_a_score(engine):
    """cot off (CFG 1.01, two branches per song) and a given score (shared lead sheet): batch = single runs."""
    off = SongRequest("lofi", "[Verse]\nhm", cot="off", seed=1)
    takes = candidates(engine, off, 2, Budgets(max_seconds=0.8), seeds=[77, 5])
    singles = [candidates(engine, off, 1, Budgets(max_seconds=0.8), seeds=[s])[0] for s in (77, 5)]
    assert [t.seed for t in takes] == [77, 5] and all(_same(a, b) for a, b in zip(takes, singles))
    assert takes[0].song.tokens.cfg_scale == 1.01 and takes[0].tokens.timing["cfg_branches"] == 2
    scored = SongRequest("indie pop", "[Verse]\nla la", cot="full", seed=9, abc=SCORE)
    takes = candidates(engine, scored, 2, Budgets(max_seconds=0.8))
    assert takes[0].score.abc_ids == takes[1].score.abc_ids and takes[0].tokens.codes != takes[1].tokens.codes
    assert takes[0].score_seconds == 4.0 and takes[0].score_to_audio == 4.0 / 0.8  # 4 bars at 240 BPM vs 0.8 s


def test_shared_score_plans_once(engine):
    req = SongRequest("indie pop", "[Verse]\nla la", cot="full", seed=40)
    takes = candidates(engine, req, 2, Budgets(max_seconds=0.4, max_abc_tokens=10), shared_score=True)
    first = candidates(engine, req, 1, Budgets(max_seconds=0.4, max_abc_tokens=10))[0]
    assert takes[0].score.abc_ids == takes[1].score.abc_ids == first.score.abc_ids
    assert takes[0].tokens.codes == first.tokens.codes and takes[1].tokens.codes != first.tokens.codes


def test_max_candidates_arithmetic_by_hand():
    # release bf16: 2 (K,V) · 28 layers · 8 kv heads · 128 dims · 2 bytes = 114,688 B = 112 KiB per position
    assert kv_bytes_per_song(1, 0, False) == 114_688
    per = 114_688 * (1000 + 9000)  # 1,146,880,000 B ≈ 1.07 GiB per song
    assert kv_bytes_per_song(1000, 9000, False) == per == 1_146_880_000
    assert kv_bytes_per_song(1000, 9000, True) == kv_bytes_per_song(1000, 9000, 1.5) == 2 * per
    assert kv_bytes_per_song(1000, 9000, 1.0) == per and kv_bytes_per_song(1000, 9000, 1.01) == 2 * per
    gib80 = 80 * 2 ** 30  # 85,899,345,920 B
    assert max_candidates(gib80, 1000, 9000, False) == 74  # 85,899,345,920 // 1,146,880,000 = 74 (74.9)
    assert max_candidates(gib80, 1000, 9000, True) == 37  # // 2,293,760,000 = 37 (37.4)
    assert max_candidates(gib80, 1000, 9000, True, headroom_bytes=2 * 2 ** 30) == 36  # 83,751,862,272 // … = 36.5
    assert max_candidates(per - 1, 1000, 9000, False) == 0 and max_candidates(per, 1000, 9000, False) == 1
    # the tiny fp32 model: 2 · 2 layers · 1 kv head · 128 · 4 B = 2,048 B per position
    assert max_candidates(2048 * 100 * 3 + 5, 60, 40, False, layers=2, kv_heads=1, head_dim=128, dtype_bytes=4) == 3
    assert RELEASE_KV == {"layers": 28, "kv_heads": 8, "head_dim": 128}


def test_too_many_candidates_states_the_maximum(engine):
    req = SongRequest("indie pop", "[Verse]\nla la", cot="full", seed=9, abc=SCORE)
    budgets = Budgets(max_seconds=1.0)
    sem = budgets.semantic_sampling()
    prefix = len(semantic_prefix(req, engine.tokenizer.encode(SCORE), engine.tokenizer.encode))
    # tiny fp32 K/V: 2,048 B per position; sampler: 25 steps × 356 candidates × 4 B noise + 25 × 8 B output +
    # 32,769 logits × 4 B
    per = 2048 * (prefix + 25) + 25 * 356 * 4 + 25 * 8 + 32769 * 4
    headroom = 512 * 2 ** 20
    free = headroom + 2 * per + 100
    with pytest.raises(RequestError, match=r"at most 2 candidates fit in 0\.5 GiB free on cpu"):
        candidates(engine, req, 3, budgets, free_bytes=free)
    check_memory(engine.ar, 2, prefix, sem, False, "semantic", free)  # two fit: no error
    with pytest.raises(RequestError, match="not even one candidate fits"):
        check_memory(engine.ar, 1, prefix, sem, False, "semantic", headroom + per - 1)


def test_bad_n_and_seeds(engine):
    req = SongRequest("indie pop", "[Verse]\nla la", cot="off", seed=2 ** 63 - 1)
    assert take_seeds(req.seed, 3) == [2 ** 63 - 1, 0, 1]  # wraps inside the seed range
    for n in (0, -1, 65, 2.0, True):
        with pytest.raises(RequestError, match="number of candidates"):
            candidates(engine, req, n)
    with pytest.raises(RequestError, match="3 candidates need 3 seeds"):
        candidates(engine, req, 3, seeds=[1, 2])
    with pytest.raises(RequestError, match="seeds must be integers"):
        candidates(engine, req, 2, seeds=[1, -2])
