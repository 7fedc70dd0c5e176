"""bench/draft_acceptance.py (issue #18): replaying prompt look-up drafts along a song's own tokens — the yield of a
verify pass — against a brute-force replay, the pass-cost interpolation, and the whole script on saved song folders
(only sampled tokens counted: a regenerated song's kept part is not)."""
from __future__ import annotations

import random

import pytest
import torch

from bench_scripts import load

da = load("draft_acceptance")


def _reference(tokens, k, n_max, n_min):
    """The same replay by plain search: at each pass the latest earlier occurrence of the longest matching suffix."""
    pos = passes = drafted = kept = 0
    while pos < len(tokens):
        draft = []
        if k:
            for n in range(min(n_max, pos), n_min - 1, -1):
                key = tokens[pos - n:pos]
                hits = [e for e in range(n, pos) if tokens[e - n:e] == key]
                if hits:
                    e = hits[-1]
                    draft = tokens[e:min(e + k, pos)]
                    break
        run = 0
        while run < len(draft) and pos + run < len(tokens) and tokens[pos + run] == draft[run]:
            run += 1
        passes, drafted, kept = passes + 1, drafted + len(draft), kept + run
        pos = min(len(tokens), pos + run + 1)
    return passes, drafted, kept


@pytest.mark.parametrize("seed", range(12))
def test_the_indexed_replay_equals_a_brute_force_one(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5, 40])
    tokens = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 160))]
    k, n_min = rng.randrange(0, 8), rng.randrange(1, 3)
    n_max = n_min + rng.randrange(0, 4)
    got = da.simulate(tokens, k, n_max, n_min)
    assert (got["passes"], got["drafted"], got["kept"]) == _reference(tokens, k, n_max, n_min)
    assert got["tokens"] == len(tokens) and 1 <= len(tokens) / got["passes"] <= k + 1


def test_a_repeating_song_yields_up_to_k_plus_one_tokens_a_pass():
    tokens = list(range(10)) * 10  # a 10-token phrase played ten times
    r1, r7 = da.simulate(tokens, 1), da.simulate(tokens, 7)
    assert r1["passes"] == 10 + 45 + 1 and r1["kept"] == r1["drafted"] == 45  # first phrase 1 a pass, then pairs
    assert r7["tokens"] / r7["passes"] > 4 and da.simulate(tokens, 0)["passes"] == 100


def test_tokens_that_never_repeat_keep_no_draft():
    tokens = list(range(500))
    r = da.simulate(tokens, 4)
    assert r["drafted"] == 0 and r["passes"] == 500


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="n_min"):
        da.simulate([1, 2], 2, n_max=1, n_min=2)
    with pytest.raises(ValueError, match="k ≥ 0"):
        da.simulate([1, 2], -1)


def test_pass_costs_interpolate_and_mark_extrapolation():
    bench = {"metrics": {"AR decode int8 batch 1": {"ours": 800.0}, "AR decode int8 CFG pair": {"ours": 700.0},
                         "AR decode int8 8 candidates (total)": {"ours": 4000.0}}}
    costs = da.pass_costs(bench)
    assert costs == pytest.approx({1: 1.25, 2: 1e3 / 700, 8: 2.0})
    ms, extra = da.cost_at(costs, 5)
    assert ms == pytest.approx(costs[2] + (2.0 - costs[2]) * 3 / 6) and not extra
    ms, extra = da.cost_at(costs, 14)
    assert ms == pytest.approx(2.0 + (2.0 - costs[2]) / 6 * 6) and extra
    with pytest.raises(KeyError, match="CFG pair"):
        da.pass_costs({"metrics": {"AR decode int8 batch 1": {"ours": 800.0}}})


def _song(codes, cut=None, cfg=1.0):
    from yue2_core.constants import ABC_END, ABC_START, EOD, MUSIC_START
    from yue2_core.pipeline import Score, SemanticTokens, Song, request_dict
    from yue2_core.protocol import SEMANTIC_PRESET, SongRequest
    request = SongRequest(style="pop", lyrics="[verse]\nla la", cot="full", seed=3, id="song")
    score = Score(abc="X:1\nK:C\n", abc_ids=[11, 22, 33], cot="full", seed=3, source="model")
    tokens = SemanticTokens(codes=list(codes), prefix=[EOD, 5, ABC_START, 11, 22, 33, ABC_END, MUSIC_START],
                            score=score, request=request_dict(request), seed=3, cfg_scale=cfg,
                            sampling=SEMANTIC_PRESET.to_dict(), ended=True)
    settings = {"protocol": "yue2-native-v1", "cot": "full"}
    if cut is not None:
        settings["edit"] = {"operation": "regenerate", "cut_token": cut}
    g = torch.Generator().manual_seed(0)
    return Song(request=request, score=score, tokens=tokens, latents=torch.randn(len(codes), 64, generator=g),
                audio=None, settings=settings, warnings=[])


def test_the_script_reads_song_folders_and_counts_only_sampled_tokens(tmp_path, capsys):
    from yue2_core.artifacts import save_song
    save_song(_song(list(range(10)) * 6), tmp_path / "album" / "a")
    kept_part = list(range(100, 160))  # a regenerated song: its first 60 codes were kept, not sampled
    save_song(_song(kept_part + list(range(10)) * 4, cut=60), tmp_path / "album" / "b")
    phases = da.song_phases(tmp_path / "album" / "b")
    assert [(p, len(t)) for p, t, _ in phases] == [("abc", 3), ("semantic", 40)]
    assert da.main([str(tmp_path / "album"), "--k", "1,3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 songs")
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith("semantic")}
    assert rows[("semantic", "0")][2] == "100"  # 60 + 40 sampled codes, one a pass
    assert float(rows[("semantic", "3")][4]) > 2  # repeats: more than two tokens a pass
    assert da.main([str(tmp_path / "nothing")]) == 2
