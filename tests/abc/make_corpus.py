"""Generator of the native-dialect scores in corpus/ and of the facts each one must show.

Independent of yue2_core.abc on purpose: it builds each score from musical choices (bars of (length, MIDI) events)
and writes the text itself, so the facts it records (bar count, durations, pitches, sections) are an expectation the
parser did not produce. Run `python tests/abc/make_corpus.py` to rewrite corpus/gen_*.abc and corpus/generated.json;
test_corpus.py checks that the files on disk equal what this module generates.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus")
HEADER = ('X:1\nT:\nM:{meter}\nL:1/{unit}\nQ:1/4={bpm}\n'
          'V: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n'
          'V: Ins clef=treble name="Ins Melody" snm="Inst."\nK:{key}\n')
NATURAL = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
SIGNATURES = {"C": {}, "G": {"F": 1}, "D": {"F": 1, "C": 1}, "Bb": {"B": -1, "E": -1}, "Em": {"F": 1},
              "F#": {"F": 1, "C": 1, "G": 1, "D": 1, "A": 1, "E": 1}, "Dm": {"B": -1}}
NATIVE = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]
CHORDS = ["C", "Am", "F", "G7", "Dm7", "Em", "Bbmaj7", "F#m/C#", "Gsus4", "Bdim", "Eaug", "Am6", "C#m7b5"]

SPECS = {
    "gen_4_4_C_chords": dict(meter=(4, 4), unit=32, bpm=88, key="C", groups=6, chords=True, seed=1),
    "gen_3_4_Bb_plain": dict(meter=(3, 4), unit=16, bpm=72, key="Bb", groups=5, chords=False, seed=2),
    "gen_6_8_Em_chords": dict(meter=(6, 8), unit=32, bpm=60, key="Em", groups=8, chords=True, seed=3),
    "gen_4_4_Fsharp_ties": dict(meter=(4, 4), unit=32, bpm=132, key="F#", groups=4, chords=True, seed=4, ties=True),
    "gen_2_4_Dm_plain": dict(meter=(2, 4), unit=16, bpm=100, key="Dm", groups=7, chords=False, seed=5),
}
SECTIONS = ["intro", "verse", "pre-chorus", "chorus", "bridge", "outro"]


def write_note(midi: int, letter: str) -> tuple[str, int]:
    """Text (letter case + octave marks) of `letter` in the octave that puts it nearest `midi`; its natural MIDI."""
    octave = round((midi - 60 - NATURAL[letter]) / 12) + 4
    natural = 60 + 12 * (octave - 4) + NATURAL[letter]
    text = letter.lower() + "'" * (octave - 5) if octave >= 5 else letter + "," * (4 - octave)
    return text, natural


def bar_events(rng: random.Random, units: int, low: int, high: int, key: str, carry=None):
    """One bar: a list of (length, (text, letter) | None, accidental, midi | None) filling `units` with native
    lengths. carry = (text, letter, midi) of a note tied into this bar: the bar starts with it, unmarked (the dialect
    keeps the tied pitch and the bar's accidentals do not change)."""
    events = []
    left = units
    if carry is not None:
        length = rng.choice([n for n in NATIVE if n <= left and n >= min(2, left)])
        events.append((length, carry[:2], "", carry[2]))
        left -= length
    local: dict[str, int] = {}
    signature = SIGNATURES[key]
    while left:
        length = rng.choice([n for n in NATIVE if n <= left and n >= min(2, left)])
        if rng.random() < 0.15:
            events.append((length, None, "", None))
        else:
            letter = rng.choice("CDEFGAB")
            base = rng.randrange(low, high)
            text, natural = write_note(base, letter)
            accidental = ""
            if rng.random() < 0.1:
                accidental = rng.choice(["^", "_", "="])
                local[letter] = {"^": 1, "_": -1, "=": 0}[accidental]
            alter = local.get(letter, signature.get(letter, 0))
            events.append((length, (text, letter), accidental, natural + alter))
        left -= length
    return events


def generate(name: str) -> tuple[str, dict]:
    """(score text, facts) for one spec in SPECS."""
    spec = SPECS[name]
    rng = random.Random(spec["seed"])
    n, d = spec["meter"]
    units = int(Fraction(n, d) * spec["unit"])
    lines = [HEADER.format(meter=f"{n}/{d}", unit=spec["unit"], bpm=spec["bpm"], key=spec["key"]).rstrip("\n")]
    facts = {"bars": 0, "groups": spec["groups"], "sections": [], "chords": 0, "notes": {"Vocal": 0, "Ins": 0},
             "bpm": spec["bpm"], "meter": [n, d], "unit": spec["unit"], "key": spec["key"], "midis": {"Vocal": [],
                                                                                                   "Ins": []}}
    bar_number = 1
    tie_state: dict = {}
    for group in range(spec["groups"]):
        count = rng.randint(1, 4)
        if group == 0 or rng.random() < 0.4:
            label = SECTIONS[min(len(facts["sections"]), len(SECTIONS) - 1)]
            lines.append(f"% {label}")
            facts["sections"].append({"label": label, "first_bar": bar_number})
        vocal, ins = [], []
        for _ in range(count):
            vocal.append(_bar_text(rng, units, 60, 79, spec, facts, "Vocal", spec["chords"], tie_state))
        if rng.random() < 0.3:
            ins = ["Z" if count == 1 else f"Z{count}"]
        else:
            for _ in range(count):
                ins.append(_bar_text(rng, units, 43, 72, spec, facts, "Ins", False))
        lines += ["V: Vocal", "|".join(vocal) + "|", "V: Ins", "|".join(ins) + "|"]
        bar_number += count
    if tie_state.get("carry"):  # close a tie left open by the last bar with one more group
        lines += ["V: Vocal", _bar_text(rng, units, 60, 79, {**spec, "ties": False}, facts, "Vocal",
                                             spec["chords"], tie_state) + "|",
                  "V: Ins", "Z|"]
        bar_number += 1
        facts["groups"] += 1
    facts["bars"] = bar_number - 1
    return "\n".join(lines) + "\n", facts


def _bar_text(rng, units, low, high, spec, facts, voice, chords, state=None) -> str:
    """Text of one bar; `state` (Vocal only) carries a tie into the next bar when the spec asks for ties."""
    carry = state.pop("carry", None) if state is not None else None
    events = bar_events(rng, units, low, high, spec["key"], carry)
    out = []
    position = 0
    chord_at = {0} | ({units // 2} if rng.random() < 0.3 else set())
    for length, written, accidental, midi in events:
        if chords and position in chord_at:
            out.append(f'"{rng.choice(CHORDS)}"')
            facts["chords"] += 1
        suffix = "" if length == 1 else str(length)
        if written is None:
            out.append("z" + suffix)
        else:
            out.append(accidental + written[0] + suffix)
            if not (carry is not None and position == 0):
                facts["notes"][voice] += 1
                facts["midis"][voice].append(midi)
        position += length
    last = events[-1]
    if state is not None and spec.get("ties") and last[1] is not None and rng.random() < 0.5:
        out.append("-")
        state["carry"] = (*last[1], last[3])
    return "".join(out)


def main() -> None:
    facts = {}
    for name in SPECS:
        text, facts[name] = generate(name)
        (CORPUS / f"{name}.abc").write_text(text, encoding="utf-8")
    (CORPUS / "generated.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
