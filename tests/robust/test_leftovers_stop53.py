"""Leftovers of the stop-53 reviews (docs/bad_inputs.md §44–§46): the file-size advice at a limit of exactly a song's
bound."""
from __future__ import annotations

import pytest


def test_a_limit_of_exactly_a_songs_bound_fits_that_song(monkeypatch):
    """Stop-53 leftover: `tokens_within` inverted the FLAC bound in floats and only ever stepped down, so a limit of
    exactly a song's bound (`song_bytes_bound`, which rounds its bytes down) gave one token too few — `ulimit -f`'s
    advice "lower --max-seconds to at most N s" 0.04 s short of what fits. Now it is the exact inverse at every
    length: the bound of T tokens fits T, one byte less fits T − 1; and the advice says so."""
    import yue2_core.artifacts as artifacts
    from yue2_core.artifacts import ArtifactError, check_file_size_limit, song_bytes_bound, tokens_within
    from yue2_core.constants import FRAMES_PER_SECOND
    for tokens in (1, 2, 25, 251, 1500, 7500):
        bound = song_bytes_bound(tokens)[0]
        assert (tokens_within(bound), tokens_within(bound - 1)) == (tokens, tokens - 1), tokens
    assert tokens_within(song_bytes_bound(1)[0] - 1) == tokens_within(0) == 0
    limit = song_bytes_bound(251)[0]  # 10.04 s of music fits this limit exactly
    monkeypatch.setattr(artifacts, "file_size_limit", lambda: limit)
    check_file_size_limit(251, "the song", "--max-seconds")  # fits: no error
    with pytest.raises(ArtifactError, match="lower --max-seconds to at most ") as e:
        check_file_size_limit(500, "the song (--max-seconds 20)", "--max-seconds")
    assert f"to at most {251 / FRAMES_PER_SECOND:g} s" in str(e.value) and "10.04 s" in str(e.value), str(e.value)
