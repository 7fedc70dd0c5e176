"""Regenerate from a cut (bar or seconds): kept codes bit-identical, the original samples kept outside the crossfade,
lineage saved with the song, and every kind of bad input refused with the range or the reason."""
import json
import re
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch

from edit_data import SCORE
from yue2_core import edit
from yue2_core.artifacts import load_song, save_song
from yue2_core.weights.checkpoint import inspect_checkpoint
from yue2_core.constants import CONTEXT, HOP, SAMPLE_RATE
from yue2_core.errors import BudgetError, RequestError
from yue2_core.nar import song_noise
from yue2_core.pipeline import Budgets, Score, SemanticTokens, Song, decode
from yue2_core.protocol import SongRequest, negative_prefix, semantic_prefix

FADE = round(0.05 * SAMPLE_RATE)  # 2400 samples


@pytest.fixture(scope="module")
def by_bar(engine, parent):
    return edit.regenerate(engine, parent, {"bar": 2}, seed=9)


def test_regenerate_from_bar_keeps_codes_latents_and_samples(engine, parent, by_bar):
    child, lineage = by_bar
    k, e = 25, 25 * HOP  # bar 2 starts at 1.0 s (Q:1/4=240, 4/4) → token 25, sample 48,000
    assert (lineage["cut_token"], lineage["cut_seconds"], lineage["cut_bar"], lineage["cut_sample"]) == (k, 1.0, 2, e)
    assert lineage["seed"] == 9 and lineage["parent_seed"] == 3 and lineage["render_seed"] == 3
    assert lineage["crossfade_s"] == 0.05 and lineage["score_changed"] is False
    assert lineage["parent"] == "parent" and lineage["operation"] == "regenerate"
    # codes before the cut: bit-identical; after it: resampled with the new seed
    assert child.tokens.codes[:k] == parent.tokens.codes[:k]
    assert child.tokens.codes[k:] != parent.tokens.codes[k:]
    assert child.tokens.prefix == parent.tokens.prefix and child.tokens.seed == 9 and child.request.seed == 9
    assert len(child.tokens.codes) == 60  # min_tokens = max_tokens = 60 (the parent's own settings)
    assert child.audio.shape == (2, 60 * HOP - 64) and child.latents.shape == (60, 64)
    # latents: the parent's before the cut
    assert torch.equal(child.latents[:k], parent.latents[:k])
    # audio: the parent's samples bit for bit up to the crossfade
    assert torch.equal(child.audio[:, :e - FADE], parent.audio[:, :e - FADE])
    assert not torch.equal(child.audio[:, e - FADE:e], parent.audio[:, e - FADE:e])
    # … the crossfade and everything after it come from the new render (rebuilt here: parent noise, all frames)
    p = edit.as_parent(parent)
    noise = edit._render_noise(p, 60, k, 3)
    assert torch.equal(noise[:k], song_noise(60, 3)[:k])
    new_latents = edit._render(engine, child.tokens.prefix, child.tokens.codes, 3, 32, noise, None)
    assert torch.equal(child.latents[k:], new_latents[k:])
    new_audio = decode(engine.vae, new_latents)
    assert torch.equal(child.audio[:, e:], new_audio[:, e:])
    w_out, w_in = edit.crossfade_weights(FADE)
    mixed = (parent.audio[:, e - FADE:e].double() * w_out + new_audio[:, e - FADE:e].double() * w_in).clamp(-1, 1)
    assert torch.equal(child.audio[:, e - FADE:e], mixed.float())
    assert child.settings["render_seed"] == 3 and child.settings["edit"]["cut_token"] == k


def test_saved_song_round_trip_with_lineage(engine, saved_parent, tmp_path):
    child, lineage = edit.regenerate(engine, str(saved_parent), 1.6, seed=11, crossfade_s=0.02)
    k, e, fade = 40, 40 * HOP, round(0.02 * SAMPLE_RATE)
    assert lineage["cut_token"] == k and lineage["cut_bar"] == 2 and lineage["parent"] == str(saved_parent)
    saved = np.load(saved_parent / "semantic.npy").tolist()
    assert child.tokens.codes[:k] == saved[:k]
    assert torch.equal(child.latents[:k], torch.from_numpy(np.load(saved_parent / "latent.npy"))[:k])
    out = save_song(child, tmp_path / "child", lineage=lineage)
    result = json.loads((out / "result.json").read_text())
    assert result["lineage"] == json.loads(json.dumps(lineage))
    assert json.loads((out / "config.json").read_text())["edit"]["parent"] == str(saved_parent)
    # the saved child's FLAC equals the saved parent's FLAC sample for sample before the crossfade
    a, _ = sf.read(saved_parent / "audio.flac", dtype="int32")
    b, _ = sf.read(out / "audio.flac", dtype="int32")
    assert np.array_equal(b[:e - fade], a[:e - fade]) and not np.array_equal(b[e - fade:e], a[e - fade:e])
    back = load_song(out)
    assert back.tokens.codes[:k] == saved[:k] and back.result["lineage"]["cut_seconds"] == 1.6
    assert back.config["render_seed"] == 3 and edit.as_parent(out, engine.tokenizer).render_seed == 3


def test_splice_audio_exact_outside_the_crossfade():
    g = torch.Generator().manual_seed(0)
    orig = torch.rand(2, 1000, generator=g) - 0.5
    new = torch.rand(2, 1200, generator=g) - 0.5
    out = edit.splice_audio(orig, new, 600, 100)
    assert out.shape == new.shape
    assert torch.equal(out[:, :500], orig[:, :500]) and torch.equal(out[:, 600:], new[:, 600:])
    w_out, w_in = edit.crossfade_weights(100)
    assert torch.allclose(w_out ** 2 + w_in ** 2, torch.ones(100, dtype=torch.float64))  # equal power
    assert w_out[0] > 0.99 and w_in[-1] > 0.99 and torch.all(w_out[:-1] >= w_out[1:])
    assert torch.equal(out[:, 500:600], (orig[:, 500:600].double() * w_out + new[:, 500:600].double() * w_in).float())
    assert torch.equal(edit.splice_audio(orig, new, 50, 100)[:, 50:], new[:, 50:])  # fade clipped to the start
    assert torch.equal(edit.splice_audio(orig, new, 600, 0), torch.cat([orig[:, :600], new[:, 600:]], 1))
    assert torch.equal(edit.splice_audio(orig, new[:, :400], 600, 100), orig[:, :400])  # nothing new to fade into
    lin_out, lin_in = edit.crossfade_weights(4, "linear")
    assert torch.allclose(lin_out + lin_in, torch.ones(4, dtype=torch.float64))
    with pytest.raises(RequestError, match="crossfade shape"):
        edit.crossfade_weights(4, "cubic")


RANGE = "0.04 … 2.96 s (tokens 1 … 74 of 75, 25 per second), or bars 2 … 3 of the score"


@pytest.mark.parametrize("cut, where", [
    (3.0, "at or past the end"), (10, "at or past the end"), (0, "at or before the start"),
    (-1.5, "at or before the start"), (0.01, "at or before the start"), ({"token": 0}, "prompt/prefix"),
    ({"token": -3}, "prompt/prefix"), ({"token": 75}, "past the end"), ("bar 1", "starts at 0.00 s"),
    ({"bar": 4}, "starts at 3.00 s"), ("2.99s", "past the end"),
])
def test_cut_outside_the_music_states_the_range(cut, where):
    with pytest.raises(RequestError) as info:
        edit.resolve_cut(cut, 75, SCORE)
    assert where in str(info.value) and RANGE in str(info.value)


def test_cut_forms_and_bad_bars():
    assert edit.resolve_cut("bar 3", 75, SCORE).token == 50
    assert edit.resolve_cut("b2", 75, SCORE).seconds == 1.0
    assert edit.resolve_cut(1.49, 75, SCORE).token == 37 and edit.resolve_cut(1.49, 75, SCORE).bar == 2
    assert edit.resolve_cut({"seconds": 2.5}, 75, SCORE).bar == 3
    assert edit.resolve_cut({"token": 74}, 75, None).bar is None
    with pytest.raises(RequestError, match=r"bar 9 is not in the score \(bars 1 … 4\)"):
        edit.resolve_cut({"bar": 9}, 75, SCORE)
    in_seconds = 'Give the cut in seconds instead ("12.5s"): a cut in seconds works on any song'
    with pytest.raises(RequestError) as info:
        edit.resolve_cut("bar 2", 75, None)
    assert str(info.value) == f"cannot cut at bar 2: the song has no score (made with cot off, which writes no lead " \
                              f"sheet). {in_seconds}"
    # A score with no ABC header (a synthetic model's token soup, as Load Song gives it): the message says why a song
    # may lack one and that seconds work on any song (polish, stop 41).
    with pytest.raises(RequestError) as info:
        edit.resolve_cut("bar 9", 75, "not a score")
    message = str(info.value)
    assert message.startswith("cannot cut at bar 9: the song's score does not parse, so its bars have no times "
                              "(line 1 column 1: The score has no ABC header; it must start with X:1, T:, "
                              "M:4/4"), message
    assert "then K:<key>). A song made with synthetic weights has random token soup there, not a lead sheet; " \
           "a real model writes its lead sheet token by token, and that may not parse either. " in message, message
    assert message.endswith(in_seconds), message
    for bad in ("soon", {"bar": 2.5}, True, float("nan"), [1]):
        with pytest.raises(RequestError):
            edit.resolve_cut(bad, 75, SCORE)


def test_regenerate_refuses_bad_cuts_before_any_work(engine, parent):
    for cut in (3.0, -1, 0, {"bar": 1}, {"token": 75}):
        with pytest.raises(RequestError, match="choose a cut inside the music"):
            edit.regenerate(engine, parent, cut)
    with pytest.raises(RequestError, match="crossfade"):
        edit.regenerate(engine, parent, 1.0, crossfade_s=-0.1)
    with pytest.raises(RequestError, match="seed"):
        edit.regenerate(engine, parent, 1.0, seed=-1)


def _with_checkpoint(song: Song, record: dict) -> Song:
    return replace(song, settings={**song.settings, "checkpoint": record})


def test_song_from_another_model_is_refused(engine, parent, ckpt_paths):
    micro = inspect_checkpoint(ckpt_paths["micro"]).to_dict()
    with pytest.raises(edit.CheckpointMismatch, match=r"vocab 1024 \(song\) vs 184704 \(loaded\)"):
        edit.regenerate(engine, _with_checkpoint(parent, micro), 1.0, seed=5)
    with pytest.raises(edit.CheckpointMismatch, match="vocab 1024"):
        edit.continue_song(engine, _with_checkpoint(parent, micro), 1.0)
    # the int8 file of the same model: allowed (a note says the new part follows the int8 numerics)
    int8 = inspect_checkpoint(ckpt_paths["int8"])
    notes = edit.check_checkpoint(parent.settings["checkpoint"], int8)
    assert notes and "int8" in notes[0]
    # a song from another tokenizer (its prompt does not re-tokenize to its stored prefix) is refused too
    bad_tokens = replace(parent.tokens, prefix=parent.tokens.prefix[:-2] + [5] + parent.tokens.prefix[-1:])
    with pytest.raises(edit.CheckpointMismatch, match="prefix"):
        edit.regenerate(engine, replace(parent, tokens=bad_tokens), 1.0)


def test_int8_engine_edits_a_bf16_song(ckpt_paths, parent):
    from yue2_core.pipeline import YuE2Engine
    e8 = YuE2Engine.load(ckpt_paths["int8"], device="cpu", dtype=torch.float32)
    child, lineage = edit.regenerate(e8, parent, 2.0, seed=21)
    assert child.tokens.codes[:50] == parent.tokens.codes[:50]
    assert torch.equal(child.audio[:, :50 * HOP - FADE], parent.audio[:, :50 * HOP - FADE])
    assert child.settings["checkpoint"]["format"] == "int8" and any("int8" in w for w in child.warnings)


NEW_SCORE = SCORE.replace('"Am"a8g8e8c8|"F"f32|', '"Dm"d8f8a8f8|"G7"g8b8d\'8b8|').replace(
    "A,32|F,32|", "D,32|G,32|")


def test_new_score_changes_the_prefix_and_keeps_the_past(engine, parent):
    child, lineage = edit.regenerate(engine, (parent.score, parent.tokens, parent.latents, parent.audio,
                                              parent.request, parent.settings), "bar 3", new_score=NEW_SCORE)
    assert lineage["score_changed"] is True and lineage["cut_token"] == 50 and lineage["seed"] == 3
    assert child.score.abc == NEW_SCORE and child.request.abc == NEW_SCORE and child.score.source == "user"
    assert child.tokens.prefix == semantic_prefix(child.request, engine.tokenizer.encode(NEW_SCORE),
                                                  engine.tokenizer.encode)
    assert child.tokens.prefix != parent.tokens.prefix
    assert child.tokens.codes[:50] == parent.tokens.codes[:50]
    assert torch.equal(child.audio[:, :50 * HOP - FADE], parent.audio[:, :50 * HOP - FADE])
    # the unchanged text is recognised as unchanged (exact ids kept)
    assert edit._new_score(edit.as_parent(parent), SCORE, engine.tokenizer) == (parent.score, False)


def test_new_prompt_that_overflows_the_context_says_what_fits(engine, parent):
    enc = engine.tokenizer.encode
    line = 'V: Vocal\n"C"c8d8e8f8|c8d8e8f8|c8d8e8f8|c8d8e8f8|\nV: Ins\nC32|C32|C32|C32|\n'
    long_score = SCORE + line * (CONTEXT // len(enc(line)) + 5)
    request = replace(parent.request, abc=long_score)
    fit = CONTEXT - len(semantic_prefix(request, enc(long_score), enc))
    assert fit < 25
    with pytest.raises(BudgetError) as info:
        edit.regenerate(engine, parent, 1.0, new_score=long_score)
    msg = str(info.value)
    assert f"at most {max(fit, 0)} music tokens = {max(fit, 0) / 25:.2f} s fit" in msg and "new prompt" in msg
    # a score that leaves room for the kept part but not for the budget: the message gives the seconds to ask for
    def fit_with(lines):
        text = SCORE + line * lines
        return text, CONTEXT - len(semantic_prefix(request, enc(text), enc))
    lines = (CONTEXT - 50 - len(semantic_prefix(request, enc(SCORE), enc))) // len(enc(line))
    mid_score, fit = fit_with(lines)
    while fit >= 60:
        lines += 1
        mid_score, fit = fit_with(lines)
    assert 25 < fit < 60, fit
    with pytest.raises(BudgetError, match=rf"set max seconds ≤ {fit / 25:.2f}"):
        edit.regenerate(engine, parent, 1.0, new_score=mid_score)


def test_budget_must_reach_past_the_cut(engine, parent):
    with pytest.raises(BudgetError, match="ends at or before the cut at 2.00 s"):
        edit.regenerate(engine, parent, 2.0, budgets=Budgets(max_seconds=1.5))


def test_cot_off_song_has_no_bars_and_no_score_to_edit(engine, parent):
    req = SongRequest("indie pop", "[Verse]\nla la la", cot="off", seed=3, id="offsong")
    score = Score(abc=None, abc_ids=[], cot="off", seed=3, source="none")
    tokens = SemanticTokens(codes=parent.tokens.codes, prefix=semantic_prefix(req, [], engine.tokenizer.encode),
                            score=score, request={}, seed=3, cfg_scale=1.01, sampling=parent.tokens.sampling,
                            ended=False)
    song = (score, tokens, parent.latents, parent.audio, req)
    with pytest.raises(RequestError, match="no score .*Give the cut in seconds"):
        edit.regenerate(engine, song, {"bar": 2})
    with pytest.raises(RequestError, match="cot='off'"):
        edit.regenerate(engine, song, 1.0, new_score=SCORE)
    longest = max(len(tokens.prefix), len(negative_prefix(req, [], engine.tokenizer.encode)))  # CFG 1.01: both
    assert edit.max_continuation_seconds(engine, song) == (CONTEXT - longest - 60) / 25


def test_bar_cut_follows_the_score_the_codes_were_sampled_after(engine, saved_parent, tmp_path):
    """A saved song whose score.abc was edited since (here: the tempo quartered): "bar 2" still cuts where bar 2 of
    the *sampled* score lies in the audio (1.0 s, token 25), not where the edited score would put it (4.0 s)."""
    import shutil
    song = tmp_path / "edited"
    shutil.copytree(saved_parent, song)
    abc = (song / "score.abc").read_text()
    assert "Q:1/4=240" in abc
    (song / "score.abc").write_text(abc.replace("Q:1/4=240", "Q:1/4=60"))
    parent = edit.as_parent(song, engine.tokenizer)
    assert "Q:1/4=60" in parent.score.abc  # the edit is what the new take is sampled after
    _, lineage = edit.regenerate(engine, song, "bar 2", seed=5, crossfade_s=0.02)
    assert lineage["cut_token"] == 25 and lineage["cut_seconds"] == 1.0, lineage


def test_a_song_saved_without_a_render_record(engine, parent, tmp_path):
    """Break-it finding (stop 38): Save Song of a latent without a render record wrote render_seed null, and an edit
    then said "render_seed must be an integer … got None", which read as a damaged file. With latents the message
    says what happened and what to do; a tokens-only song (nothing rendered) falls back to the tokens' seed, as a
    song from `generate` (which records no render_seed) does."""
    from dataclasses import replace
    from yue2_core.errors import ArtifactError
    with_latents = replace(parent, settings={**parent.settings, "render_seed": None})
    with pytest.raises(ArtifactError, match="got null: the song was saved without a render record"):
        edit.continue_song(engine, with_latents, 0.2)
    tokens_only = edit.as_parent((parent.score, parent.tokens, None, None, parent.request,
                                  {**parent.settings, "render_seed": None, "ode_steps": None}), engine.tokenizer)
    assert tokens_only.render_seed == parent.tokens.seed and tokens_only.steps == 32
    generated = edit.as_parent((parent.score, parent.tokens, parent.latents, parent.audio, parent.request,
                                {k: v for k, v in parent.settings.items() if k != "render_seed"}), engine.tokenizer)
    assert generated.render_seed == parent.tokens.seed


def test_an_edit_that_retimes_the_bars_before_the_cut_is_said(engine, saved_parent, tmp_path):
    """Break-it review, stop 56: an edited score whose bars before the cut lie elsewhere in time (here the tempo
    quartered: bar 2 at 4.0 s instead of 1.0 s) — the kept audio follows the old bars, the new part is sampled after
    the edit, so "bar 2" does not start the edit's bar 2. Regenerate and Continue now say so in the song's warnings
    (the nodes' reports); an edit of the bars after the cut only, or none, gets no such note."""
    import shutil
    song = tmp_path / "retimed"
    shutil.copytree(saved_parent, song)
    (song / "score.abc").write_text(SCORE.replace("Q:1/4=240", "Q:1/4=60"))
    child, lineage = edit.regenerate(engine, song, "bar 2", seed=5, crossfade_s=0.02)
    said = [w for w in child.warnings if w.startswith("the edited score times its bars before the cut")]
    assert lineage["cut_seconds"] == 1.0 and len(said) == 1, child.warnings
    assert "the cut at 1.00 s falls in bar 2 of the song's score" in said[0], said
    assert "its bar 2 starts at 4.00 s and 1.00 s falls in its bar 1" in said[0], said
    longer, _ = edit.continue_song(engine, song, 0.2, seed=5, crossfade_s=0.02)  # the cut: the song's end, 2.4 s
    assert any("the cut at 2.40 s falls in bar 3 of the song's score" in w and "falls in its bar 1" in w
               for w in longer.warnings), longer.warnings
    later_bars = SCORE.replace('"F"f32|', '"F"c32|')  # only bar 4, after the cut, changed
    assert edit.retimed_note(SCORE, later_bars, 1.0) is None
    assert edit.retimed_note(SCORE, SCORE, 2.4) is None
    one_bar_less = SCORE.replace('"C"c8d8e8f8|', "").replace("C32|G,32", "G,32")  # bar 1 removed in both voices
    assert "it has no bar 4" in edit.retimed_note(SCORE, one_bar_less, 3.5)


def test_the_retime_note_is_not_given_for_bars_written_after_the_songs_score():
    """Diff review of stop 56: `retimed_note` counted every bar of the edit that starts at or before the cut, so the
    pack's own way to extend a song — bars appended to its score, then Continue at its end — was told its bars
    before the cut are retimed ("its bar 4 starts at 3.00 s", as in the song's score) when the song is as long as
    its score (the appended bar starts at the cut) or longer; and a cut past the score's end was said to fall "in
    bar 4"."""
    appended = SCORE.replace('"F"f32|', '"F"f32|"C"c32|').replace("F,32|", "F,32|C32|")  # bar 5 from 4.0 s
    assert edit.bar_starts(appended)[-1] == (5, 4.0) and edit.bar_starts(SCORE)[-1] == (4, 3.0)
    for cut in (4.0, 4.5, 3.5, 1.0):  # the score's end, past it (the song runs longer), and before it
        assert edit.retimed_note(SCORE, appended, cut) is None, cut
    # bar 4 halved: bar 5 starts at 3.5 s, where the kept audio still plays the song's bar 4 — said, past the end too
    shortened = appended.replace('"F"f32|', '"F"f16|').replace("F,32|", "F,16|")
    note = edit.retimed_note(SCORE, shortened, 4.0)
    assert note and "the cut at 4.00 s falls after the last bar of the song's score (bar 4, which ends at 4.00 s)" \
        in note and "4.00 s falls in its bar 5" in note, note
    past = edit.retimed_note(SCORE, SCORE.replace('"F"f32|', "").replace("F,32|", ""), 3.5)  # bar 4 removed
    assert "it has no bar 4 and 3.50 s falls after its last bar (bar 3, which ends at 3.00 s)" in past, past


def test_a_tempo_change_is_said_when_the_cut_falls_in_the_first_bar():
    """Diff review of stop 56: a new tempo moves every bar after the first, so a cut in bar 2 or later was said; a cut
    inside bar 1 (the kept audio half-way through it at the song's tempo, an eighth of the way at the edit's) was not.
    A tempo written another way (Q:1/8=480 for Q:1/4=240) or L: with the notes rescaled is no change."""
    slower = SCORE.replace("Q:1/4=240", "Q:1/4=60")
    note = edit.retimed_note(SCORE, slower, 0.5)
    assert note and "(Q:1/4=60 against the song's Q:1/4=240)" in note and "0.50 s falls in its bar 1" in note, note
    assert edit.retimed_note(SCORE, SCORE.replace("Q:1/4=240", "Q:1/8=480"), 0.5) is None
    head, body = SCORE.split("K:C\n")
    halved = head.replace("L:1/32", "L:1/16") + "K:C\n" + re.sub(r"\d+", lambda m: str(int(m[0]) // 2), body)
    assert edit.bar_starts(halved) == edit.bar_starts(SCORE)
    assert edit.retimed_note(SCORE, halved, 0.5) is None and edit.retimed_note(SCORE, halved, 2.5) is None
    # L: changed and the notes left as written: every bar twice as long, said
    assert "its bar 2 starts at 2.00 s" in edit.retimed_note(SCORE, SCORE.replace("L:1/32", "L:1/16"), 1.5)
