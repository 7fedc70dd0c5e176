"""Writes the pack's shipped UI-format workflows (what ComfyUI's frontend saves and `app.loadGraphData` loads).

    python workflows/build_workflows.py --url http://127.0.0.1:8188      # a running ComfyUI with the pack loaded
    python workflows/build_workflows.py --object-info object_info.json   # or a saved GET /object_info answer

Each graph below is described by node types, positions, widget values by name and links by input/output name; the
node definitions (/object_info) supply socket types, slot numbers and the positional order of `widgets_values`, so
the files always match the nodes' schemas. tests/nodes/test_nodes_workflows.py rebuilds them from the test server's
/object_info and fails when the shipped files differ (run this script to update them).

Output: example_workflows/<name>.json (the folder ComfyUI lists in its template browser).
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "example_workflows"
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}  # V3 combos say "COMBO" + options
FRONTEND_ONLY = {"AUDIO_UI"}  # widgets the frontend adds and never serialises

HF = "https://huggingface.co/Comfy-Org/YuE2/resolve/main/checkpoints/"
INT8 = "yue2_3b_int8_convrot.safetensors"
FIRST_SONG = "yue2_full_00001"  # what yue2_text_to_song_full saves first: the Load Song workflows start from it
BF16 = "yue2_3b_bf16.safetensors"
STYLE = ("Upbeat indie pop with warm female vocals, bright electric guitars, punchy drums, melodic bass, and subtle "
         "synth layers. Catchy and energetic, with an uplifting summer atmosphere, a memorable chorus, and polished "
         "modern production.")
LYRICS = """[Verse]
Morning light across the window
City waking down below
I can hear the streets are calling
Feels like somewhere we should go

[Chorus]
Run with me into the sunlight
Leave the shadows far behind
We don't need to know tomorrow
Tonight the whole world feels alive
"""
WHERE = (f"Checkpoint: put {INT8} (3.7 GB) from\n{HF}{INT8}\nin ComfyUI/models/checkpoints (for the unquantized "
         f"reference, {BF16}, 7.8 GB, from the same place), then pick it in YuE2 Checkpoint Loader.")
NOTES = {
    "full": "Text → song (cot full)\n\nThe Composer writes an ABC lead sheet (melody + chords) from the style and "
            "lyrics, then samples the music tokens; the Renderer and VAE Decode turn them into 48 kHz stereo; Save "
            "Song writes output/yue2/<name>_NNNNN (score, tokens, latents, audio.flac).\n\nStyle = everything "
            "musical (genre, voice, instruments, tempo). Lyrics = only the words, with [Verse]/[Chorus] tags. "
            "max_seconds is an upper bound; the node says how much fits.",
    "melody": "Text → song (cot melody)\n\nLike the full workflow, but the lead sheet has the melody only (no chord "
              "symbols) — recommended when you bring your own melody.",
    "off": "Text → song (cot off)\n\nNo lead sheet: the music tokens are sampled straight from style and lyrics, "
           "with guidance 1.01 (cfg_scale −1 = auto). Faster to start, less structured.",
    "edit": "Edit & re-render\n\n1. Composer 1 (score only, seed fixed) writes the lead sheet.\n2. Run once; the "
            "ABC Editor shows it. Edit the text in its abc box (empty box = use the score as is). Errors stop the "
            "run with their line.\n3. Run again: Composer 1 is cached, Composer 2 samples new music for the edited "
            "score, then render, decode, save.\nAn unchanged score with the same seed gives the same music.",
    "load": "Load a saved song and re-render\n\nPick a folder from output/yue2 (press R to refresh the list). "
            "The Renderer reuses the song's seed at −1; set another seed for another take of the same music tokens. "
            "Renderer and VAE Decode take Load Song's model: the checkpoint with the LoRAs and VAE the song was made "
            "with (a missing file stops the run and names it). "
            "To follow an edited score.abc, connect Load Song's score to a YuE2 Composer.",
    "regen": "Regenerate from a bar\n\nKeep a saved song up to a cut and sample a new rest from there:\n1. Pick the "
             "song in Load Song (output/yue2; press R to refresh).\n2. Set the cut: \"bar 9\" (a bar of the song's "
             "score, mapped to seconds at the score's tempo) or \"42.5s\".\n3. Optional: edit the lead sheet in the "
             "ABC Editor (empty box = the song's own score) — the new part follows the edit.\n4. Run. Everything "
             "before the cut is kept: the same codes, the same samples up to a 50 ms crossfade. Regenerate saves the "
             "new song (output/yue2/<song>_regen_NNNNN) with its parent and cut, and plays it. The seed changes "
             "after every run, so Run again for another take.\nRegenerate takes Load Song's model: the checkpoint "
             "with the LoRAs and VAE the song was made with, so the new part is made with them too (a missing file "
             "stops the run and names it; to go on without it, connect the Checkpoint Loader's model to "
             "Regenerate instead).",
    "continue": "Continue a song\n\nExtend a saved song by up to extra_seconds: every original code and sample is "
                "kept (up to a 50 ms crossfade at its end) and the model plays on. The 24,576-token context limits "
                "how much fits; the node says the maximum (and refuses more). The new song is saved as "
                "output/yue2/<song>_cont_NNNNN with a record of its parent.\nContinue takes Load Song's model: the "
                "checkpoint with the LoRAs and VAE the song was made with, so the new part is made with them too (a "
                "missing file stops the run and names it; to go on without it, connect the Checkpoint Loader's "
                "model to Continue instead).",
    "takes": "Four candidates, pick one\n\nThe Composer samples 4 songs in one batch (candidates = 4; take i uses "
             "seed + i: on a GPU, candidates 1 with that seed gives take i again up to rounding; on a CPU it "
             "samples with another decoder, another song). The Renderer and VAE Decode handle the batch; "
             "the takes report lists each take's seed, whether it ended on its own end token, its length and its "
             "score-to-audio ratio. Set Pick Take's index (0 … 3) to the take you like and run again: only Pick Take "
             "and Save Song run, the rest comes from ComfyUI's cache — the Composer's seed is fixed for that (its "
             "control is 'fixed'); type another seed for four new takes.",
    "vae": "Custom VAE decoder\n\nYuE2 VAE Loader swaps the checkpoint's VAE decoder for another YuE2 VAE: "
           "m-a-p/YuE2-Vae (standard), m-a-p/YuE2-Vae-legacy or Mothersuperior/YuE2-Vae-merge-0.666. Put the "
           "release's folder (config.json + model.safetensors, about 530 MB) in ComfyUI/models/vae, press R and pick "
           "it as \"name/\"; a .safetensors with decoder.* (or vae.decoder.*) tensors works as well, decoder-only "
           "included. Only the decoding changes: the same music tokens and latents give a different timbre (the "
           "Composer's seed is fixed for that comparison, its control 'fixed'; type another seed for a new song). The "
           "info output says which release the folder's config.json names. The Checkpoint Loader's own model still "
           "decodes with the checkpoint's VAE if you wire it to another VAE Decode.",
    "lora": "Song with a LoRA\n\nYuE2 LoRA adds an adapter to both experts: put the file in ComfyUI/models/loras "
            "(any published YuE2 layout — ai-toolkit, Comfy-native, Mothersuperior, FL, HOT-Step, Starnodes, PEFT "
            "with its adapter_config.json, LoKr), press R and pick it. strength_ar changes the lead sheet and the "
            "music tokens, strength_nar the rendering; 0 turns the adapter off on that expert (the Composer's seed "
            "is fixed, so a strength change gives the same song otherwise; type another seed for a new song). The "
            "report says what "
            "was detected and applied, and lists every key that matched nothing. Chain more LoRA nodes to stack "
            "adapters; the loader's own model stays unpatched. A saved song records its adapters (sha256, "
            "strengths): YuE2 Load Song's model output re-applies them.",
    "int8": "Low VRAM (int8)\n\nThe int8 ConvRot checkpoint (3.7 GB) halves the weights. The AR, NAR and VAE are "
            "three ComfyUI models loaded one at a time: each stage offloads the others when memory is short. A "
            "shorter max_seconds also shrinks the AR's KV cache (≈ 0.11 MB per token per branch). Each part is "
            "loaded whole (ComfyUI's --lowvram partial loading does not apply to it): the GPU must hold the part in "
            "use, about 2.0 GiB for the int8 AR and 2.7 GiB for the NAR, plus its working memory.",
}


class Graph:
    """A UI workflow under construction: nodes with widget values by name, links by socket name."""

    def __init__(self, object_info: dict):
        self.info = object_info
        self.nodes: list[dict] = []
        self.links: list[list] = []
        self.pending: list[tuple] = []

    def node(self, kind: str, pos, size, title: str | None = None, properties: dict | None = None,
             **widgets) -> dict:
        node = {"id": len(self.nodes) + 1, "type": kind, "pos": list(pos), "size": list(size), "flags": {},
                "order": len(self.nodes), "mode": 0, "_widgets": widgets,
                "properties": {"Node name for S&R": kind, **(properties or {})}}
        if title:
            node["title"] = title
        self.nodes.append(node)
        return node

    def note(self, text: str, pos, size) -> dict:
        node = {"id": len(self.nodes) + 1, "type": "Note", "pos": list(pos), "size": list(size), "flags": {},
                "order": len(self.nodes), "mode": 0, "inputs": [], "outputs": [], "properties": {},
                "widgets_values": [text], "color": "#432", "bgcolor": "#653"}
        self.nodes.append(node)
        return node

    def link(self, source: dict, output: str, target: dict, input_name: str) -> None:
        self.pending.append((source, output, target, input_name))

    # -- serialisation ---------------------------------------------------------------------------------------------
    def _spec(self, kind: str) -> dict:
        if kind not in self.info:
            raise KeyError(f"/object_info has no node type {kind!r} (is the pack loaded?)")
        return self.info[kind]

    def _inputs(self, spec: dict) -> list[tuple[str, str, bool, dict]]:
        """(name, type, optional, options) in the order the frontend creates them."""
        out = []
        for section in ("required", "optional"):
            for name in (spec.get("input_order") or {}).get(section, list(spec["input"].get(section, {}))):
                kind, *rest = spec["input"][section][name]
                out.append((name, kind, section == "optional", rest[0] if rest else {}))
        return out

    def build(self, name: str) -> dict:
        for node in self.nodes:
            if node["type"] == "Note":
                continue
            spec = self._spec(node["type"])
            widgets = node.pop("_widgets")
            inputs, values = [], []
            for input_name, kind, optional, opts in self._inputs(spec):
                if kind in FRONTEND_ONLY:
                    continue
                is_widget = (isinstance(kind, list) or kind in WIDGET_TYPES) and not opts.get("forceInput")
                entry = {"name": input_name, "type": "COMBO" if isinstance(kind, list) else kind, "link": None}
                if is_widget:
                    entry["widget"] = {"name": input_name}
                    options = kind if isinstance(kind, list) else opts.get("options") or [None]
                    default = opts.get("default", options[0] if options else None)
                    values.append(widgets.pop(input_name, default))
                    if opts.get("control_after_generate"):
                        values.append(widgets.pop(f"{input_name}_control", "randomize"))
                elif optional:
                    entry["shape"] = 7
                inputs.append(entry)
            if widgets:
                raise KeyError(f"{name}: {node['type']} has no widgets {sorted(widgets)}")
            node["inputs"] = inputs
            node["outputs"] = [{"name": out_name, "type": kind, "links": [], "slot_index": i}
                               for i, (kind, out_name) in enumerate(zip(spec["output"], spec["output_name"]))]
            node["widgets_values"] = values
        for link_id, (source, output, target, input_name) in enumerate(self.pending, start=1):
            slot = next(i for i, o in enumerate(source["outputs"]) if o["name"] == output)
            kind = source["outputs"][slot]["type"]
            target_slot = next(i for i, s in enumerate(target["inputs"]) if s["name"] == input_name)
            target["inputs"][target_slot]["link"] = link_id
            source["outputs"][slot]["links"].append(link_id)
            self.links.append([link_id, source["id"], slot, target["id"], target_slot, kind])
        return {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfyui-yue2/{name}")), "revision": 0,
                "last_node_id": len(self.nodes), "last_link_id": len(self.links), "nodes": self.nodes,
                "links": self.links, "groups": [], "config": {},
                "extra": {"ds": {"scale": 0.75, "offset": [60, 80]}}, "version": 0.4}


def _loader(g: Graph, ckpt: str, pos=(0, 0)) -> dict:
    return g.node("YuE2CheckpointLoader", pos, (380, 110), ckpt_name=ckpt,
                  properties={"models": [{"name": ckpt, "url": HF + ckpt, "directory": "checkpoints"}]})


def _render_chain(g: Graph, loader: dict, tokens_from: dict, x: int, name: str) -> None:
    """Renderer → VAE Decode → Save Song, fed by `tokens_from`'s tokens output and `loader`'s model output."""
    render = g.node("YuE2Renderer", (x, 0), (330, 130))
    decode = g.node("YuE2VAEDecode", (x, 200), (330, 80))
    save = g.node("YuE2SaveSong", (x + 380, 0), (400, 300), name=name)
    for node in (render, decode):
        g.link(loader, "model", node, "model")
    g.link(tokens_from, "tokens", render, "tokens")
    g.link(render, "latent", decode, "latent")
    g.link(tokens_from, "tokens", save, "tokens")
    g.link(render, "latent", save, "latent")
    g.link(decode, "audio", save, "audio")


def text_to_song(info: dict, cot: str, ckpt: str = INT8, max_seconds: float = 120.0, note: str | None = None,
                 show_info: bool = False) -> dict:
    g = Graph(info)
    g.note(f"{NOTES[note or cot]}\n\n{WHERE}", (0, 180), (400, 420))
    loader = _loader(g, ckpt)
    composer = g.node("YuE2Composer", (450, 0), (440, 820), style=STYLE, lyrics=LYRICS, cot=cot, seed=831001,
                      seed_control="randomize", max_seconds=max_seconds)
    g.link(loader, "model", composer, "model")
    report = g.node("PreviewAny", (450, 870), (440, 220), title="Composer report")
    g.link(composer, "report", report, "source")
    if show_info:
        info_node = g.node("PreviewAny", (0, 650), (400, 200), title="Detected checkpoint")
        g.link(loader, "info", info_node, "source")
    _render_chain(g, loader, composer, 950, f"yue2_{note or cot}")
    return g.build(f"text_to_song_{note or cot}")


def edit_and_rerender(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['edit']}\n\n{WHERE}", (0, 180), (400, 460))
    loader = _loader(g, INT8)
    first = g.node("YuE2Composer", (450, 0), (440, 820), title="Composer 1 — lead sheet", style=STYLE,
                   lyrics=LYRICS, cot="full", seed=831001, seed_control="fixed", sample_music=False)
    editor = g.node("YuE2ABCEditor", (950, 0), (560, 640), abc="")
    second = g.node("YuE2Composer", (1560, 0), (440, 820), title="Composer 2 — music for the edited score",
                    style=STYLE, lyrics=LYRICS, cot="full", seed=831001, seed_control="fixed", max_seconds=120.0)
    report = g.node("PreviewAny", (1560, 870), (440, 220), title="Composer 2 report")
    g.link(loader, "model", first, "model")
    g.link(loader, "model", second, "model")
    g.link(first, "score", editor, "score")
    g.link(editor, "score", second, "score")
    g.link(second, "report", report, "source")
    render = g.node("YuE2Renderer", (2060, 0), (330, 130))
    decode = g.node("YuE2VAEDecode", (2060, 200), (330, 80))
    save = g.node("YuE2SaveSong", (2440, 0), (400, 300), name="yue2_edited")
    g.link(loader, "model", render, "model")
    g.link(loader, "model", decode, "model")
    g.link(second, "tokens", render, "tokens")
    g.link(render, "latent", decode, "latent")
    g.link(second, "tokens", save, "tokens")
    g.link(render, "latent", save, "latent")
    g.link(decode, "audio", save, "audio")
    return g.build("edit_and_rerender")


def load_and_rerender(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['load']}\n\n{WHERE}", (0, 180), (400, 360))
    loader = _loader(g, INT8)
    load = g.node("YuE2LoadSong", (450, 0), (380, 110), song=FIRST_SONG)
    g.link(loader, "model", load, "model")
    # the Renderer and VAE Decode take Load Song's model: the checkpoint with the song's own LoRAs and VAE (new-user
    # review, stop 54: fed the Loader's, a LoRA song was re-rendered without its adapter, in silence)
    _render_chain(g, load, load, 900, "yue2_rerender")
    return g.build("load_and_rerender")


def regenerate_from_bar(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['regen']}\n\n{WHERE}", (0, 180), (400, 660))
    loader = _loader(g, INT8)
    load = g.node("YuE2LoadSong", (450, 0), (380, 130), song=FIRST_SONG)
    editor = g.node("YuE2ABCEditor", (880, 0), (560, 640), abc="", title="ABC Editor — optional edit of the score")
    regen = g.node("YuE2Regenerate", (1490, 0), (400, 420), cut="bar 9", seed=1, seed_control="randomize",
                   crossfade_s=0.05)
    report = g.node("PreviewAny", (1490, 470), (400, 220), title="Regenerate report")
    g.link(loader, "model", load, "model")
    # Regenerate takes Load Song's model: the checkpoint with the song's own LoRAs and VAE (review of stop 54: fed the
    # Loader's, a LoRA song's new part was made without its adapter, with only a warning)
    g.link(load, "model", regen, "model")
    g.link(load, "score", editor, "score")
    g.link(load, "song", regen, "song")
    g.link(editor, "score", regen, "score")
    g.link(regen, "report", report, "source")
    return g.build("regenerate_from_bar")


def continue_song(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['continue']}\n\n{WHERE}", (0, 180), (400, 480))
    loader = _loader(g, INT8)
    load = g.node("YuE2LoadSong", (450, 0), (380, 130), song=FIRST_SONG)
    cont = g.node("YuE2Continue", (880, 0), (400, 420), extra_seconds=30.0, seed=1, seed_control="randomize",
                  crossfade_s=0.05)
    report = g.node("PreviewAny", (880, 470), (400, 220), title="Continue report")
    g.link(loader, "model", load, "model")
    g.link(load, "model", cont, "model")  # the song's own LoRAs and VAE, as in regenerate_from_bar
    g.link(load, "song", cont, "song")
    g.link(cont, "report", report, "source")
    return g.build("continue")


def four_candidates(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['takes']}\n\n{WHERE}", (0, 180), (400, 460))
    loader = _loader(g, INT8)
    # the seed fixed: 'randomize' changes it after every queue, so the run after choosing a take composed new takes
    composer = g.node("YuE2Composer", (450, 0), (440, 860), style=STYLE, lyrics=LYRICS, cot="full", seed=831001,
                      seed_control="fixed", max_seconds=60.0, candidates=4)
    composer_report = g.node("PreviewAny", (450, 910), (440, 260), title="Composer report")
    render = g.node("YuE2Renderer", (950, 0), (330, 130))
    decode = g.node("YuE2VAEDecode", (950, 200), (330, 80))
    pick = g.node("YuE2PickTake", (1330, 0), (330, 170), index=0)
    takes = g.node("PreviewAny", (1330, 230), (520, 260), title="Takes report")
    save = g.node("YuE2SaveSong", (1900, 0), (400, 300), name="yue2_take")
    for node in (composer, render, decode):
        g.link(loader, "model", node, "model")
    g.link(composer, "report", composer_report, "source")
    g.link(composer, "tokens", render, "tokens")
    g.link(render, "latent", decode, "latent")
    g.link(composer, "tokens", pick, "tokens")
    g.link(render, "latent", pick, "latent")
    g.link(decode, "audio", pick, "audio")
    g.link(pick, "report", takes, "source")
    g.link(pick, "tokens", save, "tokens")
    g.link(pick, "latent", save, "latent")
    g.link(pick, "audio", save, "audio")
    return g.build("four_candidates")


def custom_vae_decoder(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['vae']}\n\n{WHERE}", (0, 330), (400, 480))
    loader = _loader(g, INT8)
    vae = g.node("YuE2VAELoader", (0, 160), (380, 110), vae_name="YuE2-Vae-legacy/")
    vae_info = g.node("PreviewAny", (0, 860), (400, 200), title="VAE info")
    composer = g.node("YuE2Composer", (450, 0), (440, 820), style=STYLE, lyrics=LYRICS, cot="full", seed=831001,
                      seed_control="fixed", max_seconds=120.0)
    report = g.node("PreviewAny", (450, 870), (440, 220), title="Composer report")
    g.link(loader, "model", vae, "model")
    g.link(vae, "info", vae_info, "source")
    g.link(vae, "model", composer, "model")
    g.link(composer, "report", report, "source")
    _render_chain(g, vae, composer, 950, "yue2_custom_vae")
    return g.build("custom_vae_decoder")


def song_with_lora(info: dict) -> dict:
    g = Graph(info)
    g.note(f"{NOTES['lora']}\n\n{WHERE}", (0, 380), (400, 520))
    loader = _loader(g, INT8)
    lora = g.node("YuE2LoRA", (0, 160), (380, 170), lora_name="my_yue2_lora.safetensors", strength_ar=1.0,
                  strength_nar=1.0)
    lora_report = g.node("PreviewAny", (0, 950), (400, 260), title="LoRA report")
    composer = g.node("YuE2Composer", (450, 0), (440, 820), style=STYLE, lyrics=LYRICS, cot="full", seed=831001,
                      seed_control="fixed", max_seconds=120.0)
    report = g.node("PreviewAny", (450, 870), (440, 220), title="Composer report")
    g.link(loader, "model", lora, "model")
    g.link(lora, "report", lora_report, "source")
    g.link(lora, "model", composer, "model")
    g.link(composer, "report", report, "source")
    _render_chain(g, lora, composer, 950, "yue2_lora")
    return g.build("song_with_lora")


def build_all(object_info: dict) -> dict[str, dict]:
    """{file stem: workflow} for every shipped workflow."""
    return {
        "yue2_text_to_song_full": text_to_song(object_info, "full"),
        "yue2_text_to_song_melody": text_to_song(object_info, "melody"),
        "yue2_text_to_song_off": text_to_song(object_info, "off"),
        "yue2_edit_and_rerender": edit_and_rerender(object_info),
        "yue2_load_and_rerender": load_and_rerender(object_info),
        "yue2_int8_low_vram": text_to_song(object_info, "full", INT8, 60.0, note="int8", show_info=True),
        "yue2_regenerate_from_bar": regenerate_from_bar(object_info),
        "yue2_continue": continue_song(object_info),
        "yue2_four_candidates": four_candidates(object_info),
        "yue2_custom_vae_decoder": custom_vae_decoder(object_info),
        "yue2_song_with_lora": song_with_lora(object_info),
    }


def dumps(workflow: dict) -> str:
    return json.dumps(workflow, indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="ComfyUI server with the pack loaded (reads /object_info)")
    source.add_argument("--object-info", help="a saved /object_info JSON")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.url:
        with urllib.request.urlopen(args.url.rstrip("/") + "/object_info") as r:
            info = json.load(r)
    else:
        info = json.loads(Path(args.object_info).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stem, workflow in build_all(info).items():
        (out / f"{stem}.json").write_text(dumps(workflow), encoding="utf-8")
        print(out / f"{stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
