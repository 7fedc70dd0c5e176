"""Edit & re-render: the music follows the score. Changing the score in the ABC Editor changes the tokens; the same
score with the same seed gives the same tokens, both from ComfyUI's node cache and when everything is recomputed; an
unchanged score passes the editor with its exact ids."""
from __future__ import annotations

from nodes_testlib import TINY, VALID_ABC, api, by_class, codes, run, saved_dirs, set_inputs, test_sized

EDITED_ABC = VALID_ABC.replace('"C"z8E8G8c8|', '"C"z8F8A8c8|')  # two melody notes moved


def _edit_prompt(node_info, abc: str, name: str) -> dict:
    prompt = test_sized(api("yue2_edit_and_rerender", node_info))
    set_inputs(prompt, "YuE2ABCEditor", abc=abc)
    set_inputs(prompt, "YuE2SaveSong", name=name)
    return prompt


def _song(comfy, comfy_server, prompt):
    entry = run(comfy, prompt)
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    return entry, song_dir


def _free_caches(comfy) -> None:
    """POST /free, then one trivial prompt: ComfyUI's worker applies the free flags (clearing its node cache) only
    when it next wakes — after a GC timer or after the *next* prompt — so without this the reset could land after
    the following song and wipe its cache (a race seen once in CI)."""
    comfy.free()
    run(comfy, {"1": {"class_type": "PrimitiveString", "inputs": {"value": "free"}},
                "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}, timeout=60)


def test_changing_the_score_changes_the_tokens_and_the_same_score_gives_the_same(comfy, comfy_server, node_info):
    assert EDITED_ABC != VALID_ABC
    _, song_a = _song(comfy, comfy_server, _edit_prompt(node_info, VALID_ABC, "edit_a"))
    # 1. the identical prompt again: ComfyUI's cache answers, no node runs, the same song is reported
    entry_cached = run(comfy, _edit_prompt(node_info, VALID_ABC, "edit_a"))
    assert saved_dirs(entry_cached, comfy_server.output_dir) == [song_a]
    # 2. caches dropped (POST /free): everything is recomputed from the same score and seed → the same tokens
    _free_caches(comfy)
    _, song_b = _song(comfy, comfy_server, _edit_prompt(node_info, VALID_ABC, "edit_b"))
    assert song_b != song_a
    assert codes(song_b) == codes(song_a)
    # 3. an edited score → new tokens for it, and its text is what was saved
    entry_c, song_c = _song(comfy, comfy_server, _edit_prompt(node_info, EDITED_ABC, "edit_c"))
    assert (song_c / "score.abc").read_text() == EDITED_ABC
    assert codes(song_c) != codes(song_a)
    # only the music was recomputed: the first Composer's lead sheet came from the cache
    first, second = by_class(_edit_prompt(node_info, EDITED_ABC, "edit_c"), "YuE2Composer")
    cached = _cached(entry_c)
    assert first in cached and second not in cached


def _cached(entry) -> set:
    return {node for kind, data in entry["status"]["messages"] if kind == "execution_cached" for node in data["nodes"]}


def _reuse_prompt(song: str, abc: str, seed: int) -> dict:
    """Load Song → ABC Editor → Composer (score connected) → Save Song (tokens only)."""
    return {
        "1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
        "2": {"class_type": "YuE2LoadSong", "inputs": {"model": ["1", 0], "song": song}},
        "3": {"class_type": "YuE2ABCEditor", "inputs": {"abc": abc, "score": ["2", 0]}},
        "4": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "", "lyrics": "", "cot": "full",
                                                       "seed": seed, "max_seconds": 1.0, "score": ["3", 0]}},
        "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["4", 1], "name": "reuse"}},
    }


def test_an_unchanged_score_keeps_its_exact_ids(comfy, comfy_server, node_info):
    """A saved score goes through the editor untouched (box empty, or holding exactly the same text): the composer
    gets the very same ids, and with the song's seed and request it samples the very same tokens."""
    prompt = _edit_prompt(node_info, VALID_ABC, "exact")
    set_inputs(prompt, "YuE2Composer", style="", lyrics="", seed=4242)
    _, original = _song(comfy, comfy_server, prompt)
    for abc in ("", VALID_ABC):
        entry = run(comfy, _reuse_prompt(original.name, abc, 4242))
        assert entry["outputs"]["3"]["unchanged"] == [True]
        assert "input score, unchanged (exact ids kept)" in entry["outputs"]["3"]["text"][0]
        assert "exact ids kept" in entry["outputs"]["4"]["text"][0]
        (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
        assert (song_dir / "abc_tokens.npy").read_bytes() == (original / "abc_tokens.npy").read_bytes()
        assert codes(song_dir) == codes(original)
        assert not (song_dir / "latent.npy").exists() and not (song_dir / "audio.flac").exists()
    entry = run(comfy, _reuse_prompt(original.name, EDITED_ABC, 4242))
    assert entry["outputs"]["3"]["unchanged"] == [False]
    (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
    assert codes(song_dir) != codes(original)


def _editor_prompt(box: str, connected: str) -> dict:
    """A text node → ABC Editor (box = `box`) → Preview Any of the editor's abc output."""
    return {"1": {"class_type": "PrimitiveString", "inputs": {"value": connected}},
            "2": {"class_type": "YuE2ABCEditor", "inputs": {"abc": box, "abc_text": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}}


def _workflow(previous: str) -> dict:
    """extra_data as ComfyUI's frontend sends it: the workflow, whose editor node (id 2) records the last score the
    widget received from upstream."""
    return {"extra_pnginfo": {"workflow": {"nodes": [{"id": 2, "type": "YuE2ABCEditor",
                                                      "properties": {"yue2_composer_abc": previous}}]}}}


def test_a_new_upstream_score_replaces_an_unedited_box_in_the_same_run(comfy, comfy_server, node_info):
    """The box still holds the previous upstream score, unedited (the widget's record says so): the run that brings a
    new score already uses it. With an edited box, or with no record (plain API prompts), the box wins."""
    def used(box, connected, extra):
        entry = comfy.wait(comfy.queue(_editor_prompt(box, connected), extra_data=extra), timeout=60)
        return entry["outputs"]["3"]["text"][0], entry["outputs"]["2"]["text"][0]

    text, summary = used(VALID_ABC, EDITED_ABC, _workflow(previous=VALID_ABC))
    assert text == EDITED_ABC and "the new connected one is used" in summary
    text, summary = used(VALID_ABC + "% my edit\n", EDITED_ABC, _workflow(previous=VALID_ABC))
    assert text == VALID_ABC + "% my edit\n" and "edited in this node" in summary
    text, _ = used(VALID_ABC, EDITED_ABC.replace("K:C", "K:G"), None)
    assert text == VALID_ABC
    # odd workflow records never break the run: the box wins
    for key, workflow in enumerate(({"nodes": "x"}, {"nodes": [None, {"id": 2, "properties": "x"}]},
                                    {"nodes": [{"id": 2, "properties": {"yue2_composer_abc": 5}}]})):
        text, _ = used(VALID_ABC, EDITED_ABC.replace("K:C", f"K:{'DEA'[key]}"), {"extra_pnginfo": {"workflow": workflow}})
        assert text == VALID_ABC, workflow
