"""A song records a sample hash of its all-in-one checkpoint (`checkpoint.content_sample`, config.json
"checkpoint"."sample_sha256"), so that running it again with another file of the same layout at that path — same
format and dimensions, other weights — says the audio will differ (break-it finding, stop 38: `render` re-rendered
with a re-made file at the recorded path, exit 0, no word, latents up to 1.49 apart)."""
from __future__ import annotations

import os
import shutil

from yue2_core.edit import check_checkpoint
from yue2_core.weights.checkpoint import content_sample, inspect_checkpoint
from yue2_core.weights.synthetic import write_synthetic_checkpoint


def test_another_file_at_the_recorded_path_is_named(tmp_path):
    path = str(tmp_path / "m.safetensors")
    write_synthetic_checkpoint(path, profile="micro", fmt="bf16", seed=0)
    recorded = inspect_checkpoint(path).to_dict()
    assert recorded["sample_sha256"] == content_sample(path) and len(recorded["sample_sha256"]) == 64
    assert check_checkpoint(recorded, inspect_checkpoint(path)) == []  # the same file: nothing to say
    moved = str(tmp_path / "moved.safetensors")
    shutil.copyfile(path, moved)  # the same contents elsewhere: still the same file
    assert check_checkpoint(recorded, inspect_checkpoint(moved)) == []
    before = os.stat(path).st_size
    write_synthetic_checkpoint(path, profile="micro", fmt="bf16", seed=1)  # re-made in place: same header
    assert os.stat(path).st_size == before
    notes = check_checkpoint(recorded, inspect_checkpoint(path))
    assert len(notes) == 1 and "is not the file this song was made with" in notes[0] and path in notes[0]
    old = {k: v for k, v in recorded.items() if k != "sample_sha256"}  # a song saved before the field: no check
    assert check_checkpoint(old, inspect_checkpoint(path)) == []


def test_content_sample_of_an_unreadable_path_is_none(tmp_path):
    assert content_sample(str(tmp_path / "missing.safetensors")) is None


def test_the_sample_is_taken_once_per_read(tmp_path):
    """`CheckpointInfo.to_dict` keeps the sample of its first call: a record made later from the same read (the
    ComfyUI Renderer saving a song after its render) names the file that was read, not one put at its path since
    (break-it, stop 41); a new read samples the new file."""
    path = str(tmp_path / "m.safetensors")
    write_synthetic_checkpoint(path, profile="micro", fmt="bf16", seed=0)
    info = inspect_checkpoint(path)
    first = info.to_dict()["sample_sha256"]
    write_synthetic_checkpoint(path, profile="micro", fmt="bf16", seed=1)  # replaced after the read
    assert info.to_dict()["sample_sha256"] == first
    assert inspect_checkpoint(path).to_dict()["sample_sha256"] == content_sample(path) != first
