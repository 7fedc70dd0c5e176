"""service.analyze(): input checks, the full answer, and no exceptions on bad input."""

from __future__ import annotations

import json
import os
from importlib.util import find_spec

import pytest
from abc_corpus import read

from yue2_core.abc import analyze


def test_full_answer_for_a_good_score(song):
    result = analyze({"abc": song})
    assert set(result) == {"ok", "issues", "structure", "timeline", "svg", "svg_error", "time_map"}
    assert result["ok"] and result["issues"] == [] and result["svg"] is None and result["svg_error"] is None
    assert result["structure"]["bars"] == {"Vocal": 15, "Ins": 15}
    assert result["timeline"]["voices"]["Vocal"]
    json.dumps(result)  # JSON-ready


def test_options_reach_validation(song):
    result = analyze({"abc": song, "instrumental": True, "max_seconds": 30})
    assert [i["code"] for i in result["issues"]] == ["too-long", "vocal-in-instrumental"]
    assert result["ok"]  # warnings only
    issue = result["issues"][1]
    assert set(issue) == {"severity", "code", "message", "line", "column", "bar", "voice"}


def test_unparseable_score_still_gets_its_issues():
    result = analyze({"abc": read("polyphony_token.abc"), "engrave": True})
    assert not result["ok"] and result["structure"] is None and result["timeline"] is None
    assert result["issues"][0]["code"] == "token" and result["issues"][0]["line"] == 10
    assert result["svg"] is None and "does not parse" in result["svg_error"]


@pytest.mark.skipif(find_spec("verovio") is None, reason="engraving needs the optional package verovio")
def test_engrave_on_request(song):
    result = analyze({"abc": song, "engrave": True})
    assert result["svg"].startswith("<svg") and result["svg_error"] is None


def test_engrave_without_verovio_explains(song, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "verovio", None)
    result = analyze({"abc": song, "engrave": True})
    assert result["svg"] is None and "pip install verovio" in result["svg_error"] and result["structure"]


@pytest.mark.parametrize("payload, fragment", [
    (None, "JSON object"),
    ([1, 2], "JSON object"),
    ({}, "'abc' must be a string"),
    ({"abc": 5}, "'abc' must be a string"),
    ({"abc": b"X:1"}, "'abc' must be a string"),
    ({"abc": "X:1", "instrumental": "yes"}, "'instrumental' must be true or false"),
    ({"abc": "X:1", "engrave": 1}, "'engrave' must be true or false"),
    ({"abc": "X:1", "max_seconds": -1}, "'max_seconds'"),
    ({"abc": "X:1", "max_seconds": float("nan")}, "'max_seconds'"),
    ({"abc": "X:1", "max_seconds": True}, "'max_seconds'"),
    ({"abc": "X:1", "max_seconds": "60"}, "'max_seconds'"),
])
def test_bad_payloads_get_an_error_message(payload, fragment):
    result = analyze(payload)
    assert set(result) == {"error"} and fragment in result["error"]


def test_two_hundred_kilobytes_is_refused(song):
    big = song * (200_000 // len(song) + 1)
    result = analyze({"abc": big})
    assert set(result) == {"error"} and "at most 100,000 bytes" in result["error"]


def test_just_under_the_limit_is_analysed_quickly(song):
    body = song.split("% intro\n", 1)[1]
    text = song + body * (95_000 // len(body))
    assert len(text.encode()) < 100_000
    result = analyze({"abc": text})
    assert result["ok"] and result["structure"]["bars"]["Vocal"] > 1000


@pytest.mark.parametrize("abc", ["", "   ", "\x00\x01\x02", os.urandom(4000).decode("latin-1"),
                                 "\ud800 lone surrogate", "<script>alert(1)</script>", "X:1\n" * 5000])
def test_garbage_is_answered_not_raised(abc):
    result = analyze({"abc": abc, "engrave": True})
    assert "error" not in result and not result["ok"] and result["issues"]
    json.dumps(result)


def test_internal_failure_is_reported_not_raised(monkeypatch, song):
    import yue2_core.abc.service as service

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(service, "check", broken)
    result = analyze({"abc": song})
    assert set(result) == {"error"} and result["error"].startswith("internal error") and "boom" in result["error"]
