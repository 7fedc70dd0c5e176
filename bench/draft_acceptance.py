"""How many tokens a verify pass of speculative decoding would yield on real songs (issue #18's last lever).

Speculative decoding checks k drafted tokens in one pass of the decode step with k + 1 query rows. With a draft that
is one fixed token d (a look-up, not a model), speculative sampling keeps d with probability p(d) — the sampler's
probability after all its processors — and otherwise draws from the rest, so the output has exactly the sampler's
distribution. A song the sampler already wrote is one such draw, and "d is kept" ⇔ "the song's token equals d" has
exactly that probability at every step (a valid coupling: the kept/rejected split and the resampled token have the
right laws). So replaying the drafter along a song's own tokens simulates speculative decoding of that song without
the model: each pass drafts k tokens, keeps the run that matches the song, and adds the one token the verify pass
samples itself. It needs songs sampled from the **real** weights (a random model's tokens say nothing: ≈ 1/100 of
drafts kept); a folder of them is what `generate` or `batch` writes.

The drafter is prompt look-up: the longest of the last n = n_max … n_min tokens that occurred before in the same
phase, and the (up to k) tokens that followed its latest occurrence. The pass costs come from the benchmark JSON
(`docs/bench_h200.json`, H200, int8: batch 1 = 1 row, the CFG pair = 2, 8 candidates = 8 rows behind a shared prefix;
between them linear in the rows; more than 8 rows extrapolated, marked) — 8 candidates hold 8 caches, a verify pass
one, so the costs are upper bounds. A CFG song (guidance ≠ 1) verifies both branches: 2 (k + 1) rows.

    python bench/draft_acceptance.py out/song_a out/song_b runs/album [--k 1,2,3,4,5,6,7] [--ngram 4,1]

Prints per phase (lead sheet `abc`, music `semantic`) and k: passes, tokens a pass, the share of drafted tokens kept,
the pass's rows and cost, and the projected tok/s against one token a pass. Only sampled tokens count: a user's own
score (source "user") is skipped, and a regenerated / continued song's kept part (`edit.cut_token`) too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BENCH_ROWS = {  # docs/bench_h200.json metric → (rows of the step, tokens a step counts)
    "AR decode int8 batch 1": (1, 1),
    "AR decode int8 CFG pair": (2, 1),
    "AR decode int8 8 candidates (total)": (8, 8),
}


def simulate(tokens: list[int], k: int, n_max: int = 4, n_min: int = 1) -> dict:
    """Replay prompt look-up speculative decoding along `tokens` (one phase's sampled tokens, in order) with up to
    `k` drafted tokens a pass. Returns {"tokens", "passes", "drafted", "kept", "passes_with_draft"}; tokens / passes
    is the mean yield of a pass (1 with k = 0 or no repeats; k + 1 at most). ValueError for k < 0 or
    n_min < 1 or n_max < n_min."""
    if k < 0 or n_min < 1 or n_max < n_min:
        raise ValueError(f"need k ≥ 0 and 1 ≤ n_min ≤ n_max, got k={k}, n={n_max}…{n_min}")
    n_tok = len(tokens)
    index = [dict() for _ in range(n_max + 1)]  # index[n][n-gram] = e: the latest n-gram ending before e, e < pos
    known = 0  # index holds every e < known
    pos = passes = drafted = kept = with_draft = 0
    while pos < n_tok:
        for e in range(known, pos):  # tokens[e] is known now: index the n-grams it follows
            for n in range(n_min, min(n_max, e) + 1):
                index[n][tuple(tokens[e - n:e])] = e
        known = pos
        draft: list[int] = []
        if k:
            for n in range(min(n_max, pos), n_min - 1, -1):
                e = index[n].get(tuple(tokens[pos - n:pos]))
                if e is not None:
                    draft = tokens[e:min(e + k, pos)]
                    break
        run = 0
        while run < len(draft) and pos + run < n_tok and tokens[pos + run] == draft[run]:
            run += 1
        passes += 1
        drafted += len(draft)
        kept += run
        with_draft += bool(draft)
        pos = min(n_tok, pos + run + 1)  # the kept run, then the token the verify pass samples itself
    return {"tokens": n_tok, "passes": passes, "drafted": drafted, "kept": kept, "passes_with_draft": with_draft}


def pass_costs(bench: dict) -> dict[int, float]:
    """{rows: ms a step} from a bench JSON's metrics (BENCH_ROWS); KeyError naming a missing metric."""
    metrics = bench["metrics"]
    costs = {}
    for name, (rows, per_step) in BENCH_ROWS.items():
        if name not in metrics or not metrics[name].get("ours"):
            raise KeyError(f"the benchmark JSON has no {name!r} row")
        costs[rows] = 1e3 * per_step / float(metrics[name]["ours"])
    return costs


def cost_at(costs: dict[int, float], rows: int) -> tuple[float, bool]:
    """(ms a step at `rows` rows, extrapolated?) — linear between the measured row counts, beyond the last one on
    the last segment's slope."""
    known = sorted(costs)
    if rows in costs:
        return costs[rows], False
    lo = max((r for r in known if r < rows), default=known[0])
    hi = min((r for r in known if r > rows), default=None)
    if hi is None:
        lo, hi = known[-2], known[-1]
    slope = (costs[hi] - costs[lo]) / (hi - lo)
    return costs[lo] + slope * (rows - lo), rows > known[-1]


def song_phases(folder: Path) -> list[tuple[str, list[int], bool]]:
    """The sampled token runs of one song folder: [(phase, tokens, cfg)], verified by `artifacts.load_song`."""
    from yue2_core.artifacts import load_song
    saved = load_song(folder, edited_ok=True, audio_ok=True)
    out = []
    score = saved.tokens.score
    if score.source == "model" and score.abc_ids:
        out.append(("abc", list(score.abc_ids), False))
    cut = int((saved.config.get("edit") or {}).get("cut_token") or 0)
    codes = list(saved.tokens.codes)[cut:]
    if codes:
        out.append(("semantic", codes, float(saved.tokens.cfg_scale) != 1.0))
    return out


def find_songs(paths: list[str]) -> list[Path]:
    """Song folders: each path itself when it holds result.json, else every song folder below it."""
    songs = []
    for p in map(Path, paths):
        if (p / "result.json").is_file():
            songs.append(p)
        else:
            songs.extend(sorted(r.parent for r in p.rglob("result.json") if not r.parent.name.startswith(".")))
    return songs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("songs", nargs="+", help="song folders (or folders of them, e.g. a batch folder)")
    ap.add_argument("--k", default="1,2,3,4,5,6,7", help="drafted tokens a pass, comma-separated")
    ap.add_argument("--ngram", default="4,1", help="n_max,n_min of the look-up")
    ap.add_argument("--bench", default=str(ROOT / "docs" / "bench_h200.json"), help="bench JSON with the pass costs")
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.k.split(",")]
    n_max, n_min = (int(x) for x in args.ngram.split(","))
    songs = find_songs(args.songs)
    if not songs:
        print("no song folders (a folder holding result.json) under " + " ".join(args.songs), file=sys.stderr)
        return 2
    bench = json.loads(Path(args.bench).read_text("utf-8"))
    costs = pass_costs(bench)
    machine = bench.get("machine") if isinstance(bench.get("machine"), dict) else {}
    runs: dict[tuple[str, bool], list[list[int]]] = {}
    for s in songs:
        for phase, toks, cfg in song_phases(s):
            runs.setdefault((phase, cfg), []).append(toks)
    print(f"{len(songs)} songs · look-up of the last {n_max}…{n_min} tokens · pass costs from {args.bench} "
          f"({machine.get('gpu', '?')}, {machine.get('date', '?')}): "
          + ", ".join(f"{r} rows {ms:.3f} ms" for r, ms in sorted(costs.items())))
    print(f"{'phase':<16}{'k':>3}{'tokens':>9}{'passes':>9}{'tok/pass':>10}{'kept/drafted':>14}{'rows':>6}"
          f"{'ms/pass':>9}{'tok/s':>9}{'vs k=0':>8}")
    for (phase, cfg), seqs in sorted(runs.items()):
        base_rows = 2 if cfg else 1
        base_ms, _ = cost_at(costs, base_rows)
        for k in [0] + ks:
            tot = {"tokens": 0, "passes": 0, "drafted": 0, "kept": 0}
            for toks in seqs:
                r = simulate(toks, k, n_max, n_min)
                for key in tot:
                    tot[key] += r[key]
            rows = base_rows * (k + 1)
            ms, extra = cost_at(costs, rows)
            yield_ = tot["tokens"] / max(1, tot["passes"])
            rate = yield_ / ms * 1e3
            share = f"{tot['kept'] / tot['drafted']:.3f}" if tot["drafted"] else "–"
            name = phase + (" (CFG)" if cfg else "")
            print(f"{name:<16}{k:>3}{tot['tokens']:>9}{tot['passes']:>9}{yield_:>10.3f}{share:>14}"
                  f"{rows:>5}{'*' if extra else ' '}{ms:>9.3f}{rate:>9.0f}{rate / (1e3 / base_ms):>7.2f}×")
    print("* rows beyond the measured 8: the cost extrapolated on the 2→8-row slope. Targets: 1,100 tok/s "
          "(milestone), 1,700 (goal).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
