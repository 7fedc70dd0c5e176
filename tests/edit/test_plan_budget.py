"""The lead sheet's budget leaves room for the music asked for (`pipeline.plan` with the music budget): before, a
lead sheet written to its full budget could make the music stage refuse after the planning (minutes) and the score
was lost (break-it finding, stop 38: the Composer with max_seconds 900 and max_abc_tokens 2,100)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from yue2_core.constants import CONTEXT
from yue2_core.errors import BudgetError
from yue2_core.pipeline import plan, plan_notes
from yue2_core.protocol import ABC_PRESET, SongRequest, planning_prefix


def test_the_lead_sheet_budget_is_lowered_so_the_music_fits(engine):
    req = SongRequest("indie pop", "[Verse]\nla la la", cot="full", seed=3)
    n = len(planning_prefix(req, engine.tokenizer.encode))
    sampling = replace(ABC_PRESET, max_tokens=64)
    music = CONTEXT - n - 2 - 40  # leaves 40 tokens for the lead sheet
    score = plan(engine.ar, engine.tokenizer, req, sampling, None, music)
    assert len(score.abc_ids) <= 40 and score.timing["abc_budget"] == 40
    assert n + len(score.abc_ids) + 2 + music <= CONTEXT
    (note,) = plan_notes(score)
    assert note.startswith("the lead sheet budget was lowered from 64 to 40 ABC tokens so that the music")
    roomy = plan(engine.ar, engine.tokenizer, req, replace(sampling, max_tokens=8, min_tokens=4), None, 25)
    assert plan_notes(roomy) == [] and "abc_budget_lowered_from" not in roomy.timing


def test_no_room_for_the_lead_sheets_minimum_is_refused_before_planning(engine):
    req = SongRequest("indie pop", "[Verse]\nla la la", cot="full", seed=3)
    n = len(planning_prefix(req, engine.tokenizer.encode))
    with pytest.raises(BudgetError, match="below its minimum of 32; lower the music duration"):
        plan(None, engine.tokenizer, req, replace(ABC_PRESET, max_tokens=64), None, CONTEXT - n - 2 - 10)


def test_a_batched_plan_records_its_lowered_budget(engine):
    """The batch command's batched planning (`batch.runner._plan_phase` → `score_of`) lowers the budget the same
    way (`pipeline.fit_abc_budget`) and its scores carry the note."""
    from types import SimpleNamespace
    from yue2_core.batch.runner import score_of
    from yue2_core.pipeline import fit_abc_budget
    sampling = replace(ABC_PRESET, max_tokens=64)
    assert fit_abc_budget(100, sampling, CONTEXT - 102 - 64) is sampling  # room enough: unchanged
    lowered = fit_abc_budget(100, sampling, CONTEXT - 102 - 40)
    assert lowered.max_tokens == 40 and lowered.min_tokens == sampling.min_tokens
    job = SimpleNamespace(item=SimpleNamespace(request=SongRequest("pop", "la", cot="full", seed=1)), abc_asked=64)
    result = SimpleNamespace(tokens=[5] * 40, truncated=True, timing={"seconds": 1.0})
    score = score_of(engine, (job, [0] * 100, lowered), result)
    (note,) = plan_notes(score)
    assert "lowered from 64 to 40" in note and "cut off" in note
