"""ComfyUI's output cache and the pack's saving nodes (stop-54 cache/queue review, bad_inputs §52), against the real
server: ComfyUI answers a node whose inputs are unchanged from its cache — an output node too, with the ui of the run
that saved. YuE2 Save Song, Regenerate and Continue then did not save: a song deleted or moved away between two
queues of one prompt was not saved again, and the report named the folder that was gone. Now the song is saved again
(the nodes before it still answered from the cache), and the prompt queued once more is answered from the cache."""
from __future__ import annotations

import shutil

from nodes_testlib import TINY, codes, run, saved_dirs

LOADER = {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}}


def _cached(entry) -> set:
    return {n for kind, data in entry["status"]["messages"] if kind == "execution_cached" for n in data["nodes"]}


def _song_prompt(name: str) -> dict:
    return {"1": LOADER,
            "2": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "pop", "lyrics": "la",
                                                           "cot": "off", "seed": 5404, "max_seconds": 1.0}},
            "3": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["2", 1], "steps": 4,
                                                           "seed": -1}},
            "4": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["3", 0]}},
            "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "latent": ["3", 0],
                                                           "audio": ["4", 0], "name": name}}}


def _prefixed(comfy_server, prefix: str) -> list[str]:
    return sorted(d.name for d in (comfy_server.output_dir / "yue2").iterdir() if d.name.startswith(prefix + "_0"))


def _again(comfy, prompt: dict, node: str, first, gone_how) -> tuple:
    """Run `prompt` once more after `gone_how(first)` took the song folder `first` away: `node` runs, the others
    answer from the cache; then once more, wholly from the cache. Returns (the new folder, its report)."""
    gone_how(first)
    entry = run(comfy, prompt)
    assert node not in _cached(entry) and set(prompt) - {node} <= _cached(entry), entry["status"]
    (again,) = saved_dirs(entry, first.parent.parent)
    assert (again / "result.json").is_file()
    report = entry["outputs"][node]["text"][0]
    assert f"yue2/{first.name}, the last song this node saved, is no longer in" in report, report
    entry = run(comfy, prompt)
    assert set(prompt) <= _cached(entry), entry["status"]  # not saved a third time
    assert saved_dirs(entry, first.parent.parent) == [again]
    return again, report


def _moved_away(song):
    song.rename(song.parent.parent / f"moved_{song.name}")


def test_a_song_deleted_or_moved_between_two_queues_is_saved_again(comfy, comfy_server, checkpoints):
    prompt = _song_prompt("cache_gone")
    (first,) = saved_dirs(run(comfy, prompt), comfy_server.output_dir)
    made = codes(first)
    entry = run(comfy, prompt)  # unchanged: wholly from the cache, nothing saved twice
    assert set(prompt) <= _cached(entry) and _prefixed(comfy_server, "cache_gone") == [first.name]
    again, report = _again(comfy, prompt, "5", first, shutil.rmtree)
    assert again == first and codes(again) == made  # the number is free again; the same music, not computed again
    again, _ = _again(comfy, prompt, "5", again, _moved_away)
    assert codes(again) == made and _prefixed(comfy_server, "cache_gone") == [first.name]


def test_regenerate_and_continue_make_a_deleted_child_again(comfy, comfy_server, checkpoints):
    (parent,) = saved_dirs(run(comfy, _song_prompt("cache_parent")), comfy_server.output_dir)
    edits = {"YuE2Regenerate": {"cut": "0.5s"}, "YuE2Continue": {"extra_seconds": 0.2, "min_extra_seconds": 0.0}}
    for kind, widgets in edits.items():
        prompt = {"1": LOADER,
                  "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": parent.name}},
                  "3": {"class_type": kind, "inputs": {"model": ["2", 4], "song": ["2", 3], "seed": 11,
                                                       "crossfade_s": 0.0, "name": f"cache_{kind}", **widgets}}}
        (child,) = saved_dirs(run(comfy, prompt), comfy_server.output_dir)
        made = codes(child)
        again, _ = _again(comfy, prompt, "3", child, shutil.rmtree)
        assert again == child and codes(again) == made, kind
