"""Requests shared by the batch tests: five songs with different prompts, cot modes (a supplied score, off with CFG,
a score file) and lengths, each with the `Budgets` a single `generate` run needs to make the same song."""
import json

from yue2_core.pipeline import Budgets
from yue2_core.protocol import ABC_PRESET, SEMANTIC_PRESET, SongRequest

SCORE = "X:1\nT:t\nM:4/4\nL:1/4\nQ:1/4=240\nK:C\n\"C\"C D E F|\"G\"G A B c|\n"
ABC_CAP = 8  # --max-abc-tokens of the batch command


def rows() -> list[dict]:
    return [
        {"id": "full-model", "style": "indie pop", "lyrics": "[Verse]\nla la la", "seed": 11, "lang": "en",
         "clip_id": "c1", "eval_index": 3, "semantic_sampling": {"max_tokens": 25, "min_tokens": 5}},
        {"id": "melody-score", "tags": "rock, male vocals", "lyrics": "oh oh oh oh", "cot": "melody", "seed": 12,
         "abc": SCORE, "semantic_sampling": {"max_tokens": 20, "min_tokens": 5}},
        {"id": "off-cfg", "style": "jazz trio", "lyrics": "doo wop", "cot": "off", "cfg_scale": 1.5, "seed": 13,
         "semantic_sampling": {"max_tokens": 25, "min_tokens": 5}},
        {"id": "full-file", "style": "folk", "lyrics": "hmm hmm hmm hmm", "seed": 14, "abc_path": "scores/s.abc",
         "semantic_sampling": {"max_tokens": 15, "min_tokens": 3}},
        {"id": "short", "style": "ambient", "lyrics": "", "seed": 15, "abc_sampling": {"temperature": 0.9},
         "semantic_sampling": {"max_tokens": 10, "min_tokens": 2, "top_k": 20}},
    ]


def expected(row: dict) -> tuple[SongRequest, Budgets]:
    """The request and budgets `generate` is given for the same song."""
    abc = row.get("abc")
    if "abc_path" in row:
        abc = SCORE
    request = SongRequest(style=row.get("style", row.get("tags", "")), lyrics=row["lyrics"], cot=row.get("cot", "full"),
                          seed=row["seed"], abc=abc, cfg_scale=row.get("cfg_scale"), id=row["id"])
    budgets = Budgets(None, ABC_CAP, abc=ABC_PRESET.merged(row.get("abc_sampling")),
                      semantic=SEMANTIC_PRESET.merged(row.get("semantic_sampling")))
    return request, budgets


def write_requests(folder, extra: list | None = None, lines: list | None = None):
    """requests.jsonl (+ scores/s.abc) in `folder`; `extra` rows appended, `lines` raw lines appended."""
    (folder / "scores").mkdir(parents=True, exist_ok=True)
    (folder / "scores" / "s.abc").write_text(SCORE, "utf-8")
    text = "\n".join([json.dumps(r) for r in rows() + (extra or [])] + (lines or [])) + "\n"
    path = folder / "requests.jsonl"
    path.write_text(text, "utf-8")
    return path
