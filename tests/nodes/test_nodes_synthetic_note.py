"""The Composer's note on synthetic weights advises lowering only the budgets a quick try would lower (new-user review,
stop 45: "for a quick try lower max_abc_tokens (≈ 64) and max_seconds" was said with max_abc_tokens at 32, and by
a Composer with a connected score, which writes no lead sheet). Run in the installed host's python with the pack
loaded as ComfyUI loads it, no server (the note is built before any work)."""
from __future__ import annotations

HARNESS = r'''
from types import SimpleNamespace
from yue2_nodes.composer import _synthetic_note
model = SimpleNamespace(info=SimpleNamespace(metadata={"yue2_synthetic": "random weights, not a trained model"}))
real = SimpleNamespace(info=SimpleNamespace(metadata={}))
full, off = SimpleNamespace(cot="full"), SimpleNamespace(cot="off")
out = {"workflow as shipped": _synthetic_note(model, full, None, 4096, 3000),
       "already quick": _synthetic_note(model, full, None, 32, 75),
       "score given": _synthetic_note(model, full, object(), 4096, 3000),
       "score only": _synthetic_note(model, full, None, 4096, 0),
       "cot off, short": _synthetic_note(model, off, None, 4096, 100),
       "real weights": _synthetic_note(real, full, None, 4096, 3000)}
print("RESULT " + json.dumps(out))
'''

HEAD = ("synthetic (random) weights never end a lead sheet or the music on their own end token, so each phase runs "
        "to its budget: ")


def test_the_synthetic_note_advises_only_budgets_a_quick_try_lowers(in_host, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    out = in_host(HARNESS, tmp_path / "checkpoints")
    assert out["workflow as shipped"] == [
        HEAD + "the lead sheet to 4096 tokens (`max_abc_tokens`) and the music to 3000 tokens (`max_seconds`); for a "
        "quick try lower max_abc_tokens (≈ 64) and max_seconds (≈ 10)"]
    assert out["already quick"] == [
        HEAD + "the lead sheet to 32 tokens (`max_abc_tokens`) and the music to 75 tokens (`max_seconds`)"]
    assert out["score given"] == [
        HEAD + "the music to 3000 tokens (`max_seconds`); for a quick try lower max_seconds (≈ 10)"]
    assert out["score only"] == [
        HEAD + "the lead sheet to 4096 tokens (`max_abc_tokens`); for a quick try lower max_abc_tokens (≈ 64)"]
    assert out["cot off, short"] == [HEAD + "the music to 100 tokens (`max_seconds`)"]
    assert out["real weights"] == []

