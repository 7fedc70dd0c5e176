"""Found by the stop-55 new-user review (docs/bad_inputs.md §53): `generate --help` gave `--cfg-scale` as "guidance
(default 1.0; 1.01 in off mode)" and `--steps` as "default 32" without saying these are the release's values, as
`--seed`, `--dtype`, `--max-seconds` and `--max-abc-tokens` beside them do; `inspect score.abc` of a lead sheet that
does not parse exits 0 (its JSON says `"ok": false`), while `inspect --help` named only exit status 2, so a newcomer
checking a score with `inspect … && render …` could not tell from the help that errors do not stop it."""
from __future__ import annotations

import re

import pytest


def _help(capsys, *argv: str) -> str:
    from yue2_core.__main__ import main
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return re.sub(r"\s+", " ", capsys.readouterr().out)  # argparse wraps at the terminal's width


def test_generate_help_names_the_release_as_the_source_of_its_defaults(capsys):
    text = _help(capsys, "generate")
    assert "--cfg-scale CFG_SCALE classifier-free guidance of the music (default: the release's 1.0; 1.01 with " \
           "--cot off)" in text, text
    assert "--steps STEPS ODE steps of the renderer (default 32, the release's;" in text, text
    render = _help(capsys, "render")  # render's own default is the song's, not the release's
    assert "ODE steps of the renderer (default the song's own, from its config.json" in render, render


def test_inspect_help_says_what_a_lead_sheet_with_errors_exits_with(capsys):
    text = _help(capsys, "inspect")
    assert "a lead sheet with errors is described with exit status 0 and \"ok\": false" in text, text
