"""What ComfyUI's /object_info says about the pack's nodes: every node, its socket types, widgets with units and
ranges, and a prompt that links the wrong types is rejected by ComfyUI's validation."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from comfy_client import PACK_NAME
from nodes_testlib import PACK_NODES, REPO, TINY, rejected, run

DISPLAY = {"YuE2CheckpointLoader": "YuE2 Checkpoint Loader", "YuE2LoRA": "YuE2 LoRA",
           "YuE2VAELoader": "YuE2 VAE Loader", "YuE2Composer": "YuE2 Composer",
           "YuE2ABCEditor": "YuE2 ABC Editor", "YuE2Renderer": "YuE2 Renderer", "YuE2VAEDecode": "YuE2 VAE Decode",
           "YuE2SaveSong": "YuE2 Save Song", "YuE2LoadSong": "YuE2 Load Song", "YuE2PickTake": "YuE2 Pick Take",
           "YuE2Regenerate": "YuE2 Regenerate", "YuE2Continue": "YuE2 Continue"}
EDIT_OUTPUTS = [("AUDIO", "audio"), ("YUE2_TOKENS", "tokens"), ("LATENT", "latent"), ("YUE2_SCORE", "score"),
                ("STRING", "song_dir"), ("STRING", "report")]

# (required inputs with types, optional inputs with types, outputs) — the socket contract between the nodes.
SOCKETS = {
    "YuE2CheckpointLoader": ({"ckpt_name": "COMBO"}, {}, [("YUE2_MODEL", "model"), ("STRING", "info")]),
    "YuE2LoRA": ({"model": "YUE2_MODEL", "lora_name": "COMBO", "strength_ar": "FLOAT", "strength_nar": "FLOAT"}, {},
                 [("YUE2_MODEL", "model"), ("STRING", "report")]),
    "YuE2VAELoader": ({"model": "YUE2_MODEL", "vae_name": "COMBO"}, {}, [("YUE2_MODEL", "model"), ("STRING", "info")]),
    "YuE2Composer": ({"model": "YUE2_MODEL", "style": "STRING", "lyrics": "STRING", "cot": "COMBO", "seed": "INT",
                      "max_seconds": "FLOAT"},
                     {"score": "YUE2_SCORE", "abc_text": "STRING", "sample_music": "BOOLEAN", "max_abc_tokens": "INT",
                      "abc_temperature": "FLOAT", "abc_top_p": "FLOAT", "abc_top_k": "INT",
                      "abc_repetition_penalty": "FLOAT", "abc_penalty_window": "INT", "music_temperature": "FLOAT",
                      "music_top_p": "FLOAT", "music_top_k": "INT", "music_repetition_penalty": "FLOAT",
                      "music_penalty_window": "INT", "cfg_scale": "FLOAT", "candidates": "INT"},
                     [("YUE2_SCORE", "score"), ("YUE2_TOKENS", "tokens"), ("STRING", "abc"), ("STRING", "report")]),
    "YuE2ABCEditor": ({"abc": "STRING"}, {"score": "YUE2_SCORE", "abc_text": "STRING"},
                      [("YUE2_SCORE", "score"), ("STRING", "abc")]),
    "YuE2Renderer": ({"model": "YUE2_MODEL", "tokens": "YUE2_TOKENS", "steps": "INT", "seed": "INT"}, {},
                     [("LATENT", "latent")]),
    "YuE2VAEDecode": ({"model": "YUE2_MODEL", "latent": "LATENT"}, {}, [("AUDIO", "audio")]),
    "YuE2SaveSong": ({"tokens": "YUE2_TOKENS", "name": "STRING"},
                     {"latent": "LATENT", "audio": "AUDIO", "audioUI": "AUDIO_UI"}, [("STRING", "song_dir")]),
    "YuE2LoadSong": ({"model": "YUE2_MODEL", "song": "COMBO"}, {},
                     [("YUE2_SCORE", "score"), ("YUE2_TOKENS", "tokens"), ("LATENT", "latent"), ("YUE2_SONG", "song"),
                      ("YUE2_MODEL", "model")]),
    "YuE2PickTake": ({"tokens": "YUE2_TOKENS", "index": "INT"}, {"latent": "LATENT", "audio": "AUDIO"},
                     [("YUE2_TOKENS", "tokens"), ("LATENT", "latent"), ("AUDIO", "audio"), ("YUE2_SCORE", "score"),
                      ("STRING", "report")]),
    "YuE2Regenerate": ({"model": "YUE2_MODEL", "song": "YUE2_SONG", "cut": "STRING", "seed": "INT",
                        "crossfade_s": "FLOAT", "name": "STRING"},
                       {"score": "YUE2_SCORE", "audioUI": "AUDIO_UI", "max_seconds": "FLOAT"}, EDIT_OUTPUTS),
    "YuE2Continue": ({"model": "YUE2_MODEL", "song": "YUE2_SONG", "extra_seconds": "FLOAT", "seed": "INT",
                      "crossfade_s": "FLOAT", "name": "STRING"},
                     {"score": "YUE2_SCORE", "audioUI": "AUDIO_UI", "min_extra_seconds": "FLOAT"}, EDIT_OUTPUTS),
}


def test_every_node_is_listed_by_the_pack(comfy_server, node_info):
    assert comfy_server.pack_load_error is None, comfy_server.pack_load_error
    ours = sorted(name for name, info in node_info.items() if info["python_module"].endswith(PACK_NAME))
    assert ours == sorted(PACK_NODES)
    for name in PACK_NODES:
        assert node_info[name]["display_name"] == DISPLAY[name]
        assert node_info[name]["category"] == "audio/YuE2"
        assert node_info[name]["description"]


@pytest.mark.parametrize("name", PACK_NODES)
def test_sockets_widgets_and_tooltips(node_info, name):
    info = node_info[name]
    required, optional, outputs = SOCKETS[name]
    assert {k: v[0] for k, v in info["input"]["required"].items()} == required
    assert {k: v[0] for k, v in info["input"].get("optional", {}).items()} == optional
    assert list(zip(info["output"], info["output_name"])) == outputs
    for section in ("required", "optional"):
        for input_name, (kind, opts) in info["input"].get(section, {}).items():
            assert opts.get("tooltip"), f"{name}.{input_name} has no tooltip"
    assert all(info["output_tooltips"]), f"{name} has outputs without tooltips"


def test_widget_defaults_ranges_and_units(node_info):
    composer = node_info["YuE2Composer"]["input"]
    seed = composer["required"]["seed"][1]
    assert seed["control_after_generate"] is True and seed["min"] == 0 and seed["max"] == 2 ** 63 - 1
    seconds = composer["required"]["max_seconds"][1]
    # up to the whole context, as Regenerate / Continue: was 900, below the "room for 971.92 s" the report states
    assert (seconds["default"], seconds["min"], seconds["max"], seconds["step"]) == (120.0, 1.0, 983.04, 1.0)
    assert node_info["YuE2Regenerate"]["input"]["optional"]["max_seconds"][1]["max"] == seconds["max"]
    assert "seconds" in seconds["tooltip"] and "25" in seconds["tooltip"]
    assert composer["required"]["cot"][1]["options"] == ["full", "melody", "off"]
    assert composer["required"]["style"][1]["multiline"] and composer["required"]["lyrics"][1]["multiline"]
    opt = {k: v[1] for k, v in composer["optional"].items()}
    abc_preset = [opt[k]["default"] for k in ("abc_temperature", "abc_top_p", "abc_top_k", "abc_repetition_penalty",
                                              "abc_penalty_window", "max_abc_tokens")]
    music_preset = [opt[k]["default"] for k in ("music_temperature", "music_top_p", "music_top_k",
                                                "music_repetition_penalty", "music_penalty_window")]
    assert abc_preset == [0.7, 0.9, 30, 1.005, 100, 4096]
    assert music_preset == [1.0, 0.95, 100, 1.2, 50]
    assert opt["cfg_scale"]["default"] == -1.0 and "1.01" in opt["cfg_scale"]["tooltip"]
    assert opt["abc_text"]["forceInput"] is True
    editor = node_info["YuE2ABCEditor"]["input"]["required"]["abc"][1]
    assert editor["multiline"] is True and editor["default"] == ""
    renderer = node_info["YuE2Renderer"]["input"]["required"]
    assert (renderer["steps"][1]["default"], renderer["steps"][1]["min"], renderer["steps"][1]["max"]) == (32, 1, 200)
    assert renderer["seed"][1]["default"] == -1 and "−1" in renderer["seed"][1]["tooltip"]
    assert "48 kHz" in node_info["YuE2SaveSong"]["input"]["optional"]["audio"][1]["tooltip"]
    assert "25 frames per second" in node_info["YuE2VAEDecode"]["input"]["required"]["latent"][1]["tooltip"]
    assert TINY in node_info["YuE2CheckpointLoader"]["input"]["required"]["ckpt_name"][1]["options"]
    assert node_info["YuE2SaveSong"]["output_node"] is True
    lora = node_info["YuE2LoRA"]["input"]["required"]
    for key in ("strength_ar", "strength_nar"):
        assert (lora[key][1]["default"], lora[key][1]["min"], lora[key][1]["max"]) == (1.0, -5.0, 5.0)


def test_tooltips_name_where_each_default_comes_from(node_info):
    """New-user review 55: the Composer's eleven sampling widgets showed 0.7, 0.9, 30, … with tooltips that said what
    each does but not that these are the release's presets (runtime.md §2.1–2.2), so a newcomer could not tell a
    tuned pack value from the model's own; max_seconds' 120 s is this pack's (the release's budget is 9,000 tokens =
    360 s, the CLI's default); Regenerate / Continue's crossfade 0.05 s and Continue's 8 s are the pack's and the
    release's min_tokens. Each tooltip now says its default and whose it is."""
    composer = node_info["YuE2Composer"]["input"]
    opt = {k: v[1] for k, v in composer["optional"].items()}
    presets = {"abc": "the release's lead-sheet preset", "music": "the release's music preset"}
    for key in ("temperature", "top_p", "top_k", "repetition_penalty", "penalty_window"):
        for phase, source in presets.items():
            spec = opt[f"{phase}_{key}"]
            assert f"Default {spec['default']:g}: {source}" in spec["tooltip"], (phase, key, spec["tooltip"])
    assert "(default 4096, the release's)" in opt["max_abc_tokens"]["tooltip"]
    seed = composer["required"]["seed"][1]
    assert f"Default {seed['default']}, the release's" in seed["tooltip"]
    seconds = composer["required"]["max_seconds"][1]
    assert "Default 120 s, this pack's" in seconds["tooltip"] and "9,000 tokens = 360 s" in seconds["tooltip"]
    for node in ("YuE2Regenerate", "YuE2Continue"):
        fade = node_info[node]["input"]["required"]["crossfade_s"][1]
        assert fade["default"] == 0.05 and "Default 0.05 s (50 ms), this pack's choice" in fade["tooltip"]
    extra = node_info["YuE2Continue"]["input"]["optional"]["min_extra_seconds"][1]["tooltip"]
    assert "8 s = the 200 music tokens the release blocks" in extra and "min_tokens" in extra



def test_tooltips_say_what_a_musician_meets_on_the_node(node_info, checkpoints):
    """New-user review 56 (docs/bad_inputs.md §57): YuE2 Continue, which has no cut input, shared Regenerate's
    tooltips — its crossfade "ends at the cut", its tokens are "the original's before the cut", its report says
    "where the cut fell"; the Composer's `candidates` said a take "run alone with its seed matches it on CPU", but a
    Composer with candidates 1 and that seed samples with another decoder on a CPU (docs/comfyui.md, "Candidates")
    and gave another song; `max_abc_tokens` gave no idea how many tokens a lead sheet takes; the Renderer's `steps`
    said only "Midpoint ODE steps … per chunk" and Continue's `min_extra_seconds` "The end token is blocked"."""
    import re

    from yue2_core.weights.checkpoint import inspect_checkpoint, load_tokenizer
    cont, regen = node_info["YuE2Continue"], node_info["YuE2Regenerate"]
    fade = cont["input"]["required"]["crossfade_s"][1]["tooltip"]
    assert "ends at the original's end" in fade and "cut" not in fade, fade
    assert "ends at the cut" in regen["input"]["required"]["crossfade_s"][1]["tooltip"]
    for name, tip in zip(cont["output_name"], cont["output_tooltips"]):
        assert "cut" not in tip, (name, tip)
    tips = dict(zip(cont["output_name"], cont["output_tooltips"]))
    assert "every one of the original's, bit for bit" in tips["tokens"]
    assert tips["report"].startswith("How much was added")
    regen_tips = dict(zip(regen["output_name"], regen["output_tooltips"]))
    assert "before the cut" in regen_tips["tokens"] and "Where the cut fell" in regen_tips["report"]
    extra = cont["input"]["optional"]["min_extra_seconds"][1]["tooltip"]
    assert extra.startswith("The song cannot end during this many seconds of new music"), extra

    composer = node_info["YuE2Composer"]
    takes = composer["input"]["optional"]["candidates"][1]["tooltip"]
    assert "matches it on CPU" not in takes
    assert "on a CPU, candidates 1 samples with another decoder and gives another song for the same seed" in takes
    assert composer["description"].startswith("The AR expert (the half of the model that writes one token after "
                                              "another).")
    budget = composer["input"]["optional"]["max_abc_tokens"][1]["tooltip"]
    quoted = re.search(r"examples/text2music_lead_sheet\.abc, is (\d+) tokens", budget)
    assert quoted, budget
    tok = load_tokenizer(inspect_checkpoint(str(checkpoints[TINY])))  # the release's tokenizer, embedded
    sheet = (REPO / "examples" / "text2music_lead_sheet.abc").read_text(encoding="utf-8")
    assert int(quoted.group(1)) == len(tok.encode(sheet))

    steps = node_info["YuE2Renderer"]["input"]["required"]["steps"][1]
    assert f"Default {steps['default']}, the release's" in steps["tooltip"]
    assert "fewer render faster but rougher" in steps["tooltip"]

# What the pinned frontend (comfyui-frontend-package 1.32.9) does with a FLOAT widget, in its own minified words:
# useFloatWidget derives the options, NumberWidget.setValue clamps what is typed or stepped to [min, max] and calls
# the widget's callback, onFloatValueChange, which rounds to `round` at `precision` decimals and clamps again.
FLOAT_OPTIONS_JS = ('c=n.step??.5,p=s.get("Comfy.FloatRoundingPrecision")||Math.max(0,-Math.floor(Math.log10(c)))',
                    "round:m&&p&&!n.round?Math.pow(10,-p):n.round,step:c*10,step2:c,precision:p")
SET_VALUE_JS = ("setValue(i,o){let n=i;this.options.min!=null&&n<this.options.min&&(n=this.options.min),"
                "this.options.max!=null&&n>this.options.max&&(n=this.options.max),super.setValue(n,o)}")


def _frontend_float_widget(spec: dict, typed: list, clicks: int) -> dict:
    """{"typed": [[value typed, value the widget keeps], …], "up": [values after each right-arrow click from the
    minimum], "down": [… left-arrow clicks back]} for a FLOAT input `spec` (/object_info), computed by node with the
    frontend's own `onFloatValueChange`, taken from the installed bundle (default settings: rounding on, precision
    auto)."""
    node = shutil.which("node")
    if not node:
        if os.environ.get("YUE2_REQUIRE_BROWSER") == "1":
            pytest.fail("node is missing (YUE2_REQUIRE_BROWSER=1)", pytrace=False)
        pytest.skip("node is missing; bash scripts/test.sh installs the browser tools")
    found = importlib.util.find_spec("comfyui_frontend_package")
    assert found is not None, "comfyui-frontend-package is not installed beside ComfyUI"
    for bundle in sorted((Path(found.origin).parent / "static" / "assets").glob("*.js")):
        text = bundle.read_text("utf-8", errors="replace")
        fn = re.search(r"function onFloatValueChange\(\w\)\{.*?\}(?=u\(onFloatValueChange)", text)
        if fn:
            break
    else:
        pytest.fail("no onFloatValueChange in the frontend's bundle: its float rounding changed; look again")
    for piece in (*FLOAT_OPTIONS_JS, SET_VALUE_JS):  # the options and the clamp below are the bundle's
        assert piece in text, f"the frontend's FLOAT widget changed ({piece!r} is gone from {bundle.name})"
    script = f"""
const clamp = (v, a, b) => Math.min(Math.max(v, a), b);
{fn.group(0)}
const n = {json.dumps(spec)}, c = n.step ?? .5, p = Math.max(0, -Math.floor(Math.log10(c)));
const w = {{value: n.default, options: {{min: n.min ?? 0, max: n.max ?? 2048,
            round: p && !n.round ? Math.pow(10, -p) : n.round, step: c * 10, step2: c, precision: p}}}};
const set = v => {{ v = Math.min(Math.max(v, w.options.min), w.options.max); w.value = v;
                    onFloatValueChange.call(w, v); return w.value; }};
const typed = {json.dumps(typed)}.map(v => [v, set(v)]);
set(w.options.min);
const up = [], down = [];
for (let i = 0; i < {clicks}; i++) up.push(set(w.value + w.options.step2));
for (let i = 0; i < {clicks} + 2; i++) down.push(set(w.value - w.options.step2));
console.log(JSON.stringify({{typed, up, down}}));"""
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("name, low, default", [("extra_seconds", 0.04, 30.0), ("min_extra_seconds", -1.0, -1.0)])
def test_continue_seconds_widgets_hold_whole_frames(node_info, name, low, default):
    """Continue's extra_seconds (min 0.04) and min_extra_seconds (min −1 = auto) had step 0.1, so the frontend
    rounded every typed or stepped value to 0.1 s (its precision from the step) — 2.5 frames: an extra_seconds of
    0.1 made 2 frames and 0.3 made 8 (more than asked), the maximum 983.04 became 983, and extra_seconds' minimum
    was reached only by clamping (review 51: "stepping never lands on it"). Now step and round are one frame
    (0.04 s): every value the widget holds is a whole number of frames at 25 per second, within half a frame of
    what was typed, and each arrow click moves one frame, down to the minimum and up to the context's 983.04 s.
    Saved workflows keep their values: ComfyUI checks min / max only, and no minimum rose."""
    section = "optional" if name == "min_extra_seconds" else "required"
    spec = node_info["YuE2Continue"]["input"][section][name][1]
    assert (spec["min"], spec["max"], spec["default"]) == (low, 983.04, default)
    typed = [-2, -1, -0.98, -0.5, 0, 0.01, 0.03, 0.05, 0.06, 0.1, 0.14, 0.25, 0.3, 0.5, 1.02, 2.5, 7.7, 29.99, 30,
             123.45, 983, 983.04, 983.05, 2000]
    widget = _frontend_float_widget(spec, typed, clicks=30)
    for asked, kept in widget["typed"]:
        frames = kept * 25
        assert abs(frames - round(frames)) < 1e-6, f"typed {asked}: the widget keeps {kept} s = {frames} frames"
        assert spec["min"] <= kept <= spec["max"]
        if spec["min"] <= asked <= spec["max"]:
            assert abs(kept - asked) <= 0.02 + 1e-9, (asked, kept)
    kept = dict(widget["typed"])
    assert kept[983.04] == 983.04 and kept[0.1] == 0.12 and kept[0.3] == 0.32 and kept[-2] == low
    assert widget["up"] == [round(low + 0.04 * (i + 1), 2) for i in range(30)]  # one frame a click
    assert widget["down"] == [round(low + 0.04 * i, 2) for i in range(29, 0, -1)] + [low] * 3


def test_a_prompt_linking_wrong_types_is_rejected(comfy, node_info):
    prompt = {
        "1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
        "2": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "", "lyrics": "", "cot": "full",
                                                       "seed": 1, "max_seconds": 1.0}},
        # the score output (YUE2_SCORE) into the Renderer's tokens input (YUE2_TOKENS)
        "3": {"class_type": "YuE2Renderer", "inputs": {"model": ["1", 0], "tokens": ["2", 0], "steps": 8,
                                                       "seed": -1}},
        # the loader's info STRING into VAE Decode's latent input, and the model into Save Song's tokens
        "4": {"class_type": "YuE2VAEDecode", "inputs": {"model": ["1", 0], "latent": ["1", 1]}},
        "5": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["1", 0], "name": "x", "latent": ["3", 0],
                                                       "audio": ["4", 0]}},
    }
    body = rejected(comfy, prompt)
    details = str(body["node_errors"])
    assert "return_type_mismatch" in details
    assert "tokens, received_type(YUE2_MODEL) mismatch input_type(YUE2_TOKENS)" in details
    assert "latent, received_type(STRING) mismatch input_type(LATENT)" in details
    for bad in ({"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
                 "2": {"class_type": "YuE2ABCEditor", "inputs": {"abc": "", "score": ["1", 0]}},
                 "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}}},):
        assert "received_type(YUE2_MODEL) mismatch input_type(YUE2_SCORE)" in str(rejected(comfy, bad))


def test_a_model_socket_previews_as_its_description(comfy, checkpoints):
    """Preview as Text on a YUE2_MODEL output (what a user wires to see what a socket holds) shows what the loader
    detected (review, stop 44: "</…/custom_nodes/ComfyUI-YuE2.nodes.model.YuE2Model object at 0x7f…>")."""
    entry = run(comfy, {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
                        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}})
    (text,) = entry["outputs"]["2"]["text"]
    assert text.startswith("YuE2 bf16 all-in-one") and "object at 0x" not in text, text
