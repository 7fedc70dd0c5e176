"""The editor's compact, capped playback timeline (`timeline.playback`, the analyze route's "timeline") against the
full one (`timeline.play`), at every cap from 0 to past the score's events, and at the route's own cap of 12,000
(diff review of stop 56).

What it must hold for any cap k: the kept events are exactly the full timeline's events that start before "cut_s",
the (k+1)-th start in time (so never more than k, and one more start would exceed k: events starting together are
kept or left out together), notes and chord symbols counted alike, a tied note once; nothing sounds past "cut_s" (the
synth stops there and the editor says "Playing the first …"); without a cut, every event as the full timeline has it,
to the millisecond.
"""

from __future__ import annotations

import random
from pathlib import Path

from yue2_core.abc import analyze, parse
from yue2_core.abc.timeline import MAX_PLAYBACK_EVENTS, play, playback

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "examples" / "text2music_lead_sheet.abc").read_text()
HEAD = EXAMPLE[:EXAMPLE.index("% verse")]
# ties over bar lines in both voices, a chord held two bars, a rest-only bar, two voices starting together
TIED = HEAD + ('% verse\nV: Vocal\n"G"B16-B16-|B8A8"Em"G16|z32|"C"c8d8e8f8-|\n'
               'V: Ins\nG,32-|G,16D16|E,32|C32|\n')


def _events(timeline: dict) -> list[tuple]:
    notes = [(voice, n["start_s"], n["dur_s"], n["midi"]) for voice, ns in timeline["voices"].items() for n in ns]
    chords = [("chord", c["start_s"], c["dur_s"], tuple(c["midis"]), c["symbol"]) for c in timeline["chords"]]
    return notes + chords


def _check(score, cap: int) -> None:
    full, sent = play(score), playback(score, cap)
    events = _events(full)
    starts = sorted(e[1] for e in events)
    kept = _events(sent)
    assert len(kept) <= cap and sent["duration_s"] == full["duration_s"] and sent["tempo"] == full["tempo"]
    if len(events) <= cap:
        assert sent["cut_s"] is None
        assert sorted(kept) == sorted((*e[:1], round(e[1], 3), round(e[2], 3), *e[3:]) for e in events)
        return
    cut = starts[cap]
    assert sent["cut_s"] == round(cut, 3)
    before = [e for e in events if e[1] < cut]
    assert len([s for s in starts if s <= cut]) > cap  # one more start time would pass the cap
    assert sorted((e[0], e[1], *e[3:]) for e in kept) == \
        sorted((e[0], round(e[1], 3), *e[3:]) for e in before), cap
    for e in kept:  # what starts before the cut sounds until the cut at most, else as long as it lasts
        whole = next(f for f in before if (f[0], round(f[1], 3), *f[3:]) == (e[0], e[1], *e[3:]))
        assert e[2] == round(min(whole[2], cut - whole[1]), 3), (cap, e, whole)


def test_every_cap_keeps_the_earliest_events_and_stops_at_the_cut():
    for text in (EXAMPLE, TIED):
        score = parse(text)
        total = len(_events(play(score)))
        for cap in range(total + 2):
            _check(score, cap)


def test_random_scores_at_random_caps():
    rng = random.Random(56)
    lengths = [[32], [16, 16], [8, 8, 16], [8, 8, 8, 8], [24, 8], [4] * 8]
    for _ in range(12):
        groups = []
        for _ in range(rng.randint(1, 3)):
            bars = {voice: [] for voice in ("Vocal", "Ins")}
            for _ in range(4):
                for voice in bars:
                    notes = [rng.choice("zGABcde") + str(n) for n in rng.choice(lengths)]
                    if voice == "Vocal":
                        for i in rng.sample(range(len(notes)), rng.randint(0, len(notes))):
                            notes[i] = f'"{rng.choice(["C", "G", "Am", "D7"])}"' + notes[i]
                    if rng.random() < 0.3 and "z" not in notes[-1]:
                        notes[-1] += "-"  # a tie into the next bar (its first note may differ: a new note then)
                    bars[voice].append("".join(notes))
            groups.append("".join(f"V: {v}\n" + "|".join(b) + "|\n" for v, b in bars.items()))
        score = parse(HEAD + "% verse\n" + "".join(groups))
        total = len(_events(play(score)))
        for cap in sorted({0, 1, total - 1, total, total + 1, *rng.sample(range(total + 1), min(total, 6))}):
            if cap >= 0:
                _check(score, cap)


def test_the_routes_cap_at_exactly_12000_events():
    """12,000 notes and chord symbols are all sent; one more chord symbol (on the last note) and the score is cut
    where it starts: the last two notes (Vocal and Ins start together) and the chord are left out, 11,998 kept."""
    assert MAX_PLAYBACK_EVENTS == 12_000
    group = "V: Vocal\n" + "|".join(["B" * 32] * 4) + "|\nV: Ins\n" + "|".join(["G" * 32] * 4) + "|\n"
    chorded = ("V: Vocal\n" + "|".join(['"C"BBBB"G"BBBB' * 4] * 4) + "|\nV: Ins\n" + "|".join(["G" * 32] * 4)
               + "|\n")  # 256 notes and 32 chord symbols
    text = HEAD + chorded * 7 + group * 39  # 46 groups of 256 notes and 7 × 32 chord symbols: 12,000
    answer = analyze({"abc": text})["timeline"]
    notes = sum(len(v) for v in answer["voices"].values())
    assert (notes, len(answer["chords"]), answer["cut_s"]) == (11_776, 224, None)
    one_more = text[:-len("B|\nV: Ins\n" + "|".join(["G" * 32] * 4) + "|\n")] + '"D"' + text[-len(
        "B|\nV: Ins\n" + "|".join(["G" * 32] * 4) + "|\n"):]
    answer = analyze({"abc": one_more})["timeline"]
    last = max(n["start_s"] for n in play(parse(one_more))["voices"]["Vocal"])
    notes = sum(len(v) for v in answer["voices"].values())
    assert (notes, len(answer["chords"]), answer["cut_s"]) == (11_774, 224, round(last, 3))
