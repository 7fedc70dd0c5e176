"""YuE2 ABC Editor: check (and, in the widget, edit) a lead sheet before the music is sampled from it."""
from __future__ import annotations

from comfy_api.latest import io

from yue2_core.abc.service import MAX_ABC_BYTES

from . import scores, types


class YuE2ABCEditor(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2ABCEditor",
            display_name="YuE2 ABC Editor",
            category=types.CATEGORY,
            description="Shows the lead sheet and lets you edit it. With the abc box empty, the connected score (or "
                        "ABC text) is used; text in the box replaces it, unless the box still holds, unedited, the "
                        "previous score received from upstream (then the new score is used and shown). The text is "
                        "checked against YuE2's "
                        "two-voice ABC dialect: any error stops the run with its line and reason. An unchanged "
                        "score passes on with its exact token ids; an edited one is re-tokenized by the Composer.",
            inputs=[
                io.String.Input("abc", multiline=True, default="",
                                tooltip="The ABC lead sheet. Leave empty to use the connected score/abc_text as "
                                        "is; anything typed here is used instead of it."),
                types.Score.Input("score", optional=True,
                                  tooltip="A lead sheet from YuE2 Composer or YuE2 Load Song."),
                io.String.Input("abc_text", optional=True, force_input=True, multiline=True,
                                tooltip="A lead sheet as plain ABC text (text node, SheetSage2 Audio to ABC, …)."),
            ],
            outputs=[
                types.Score.Output("score_out", display_name="score",
                                   tooltip="The checked lead sheet, for the score input of a YuE2 Composer."),
                io.String.Output("abc_out", display_name="abc", tooltip="The checked lead sheet as ABC text."),
            ],
            hidden=[io.Hidden.unique_id, io.Hidden.extra_pnginfo],
        )

    @classmethod
    def execute(cls, abc, score=None, abc_text=None) -> io.NodeOutput:
        if score is not None and abc_text is not None:
            raise ValueError("both a score and an abc_text are connected; connect only one of them")
        incoming = score.abc if score is not None else abc_text
        hidden = getattr(cls, "hidden", None)  # set by ComfyUI's executor; absent when execute is called directly
        stale = _holds_previous_score(abc, incoming, getattr(hidden, "extra_pnginfo", None),
                                      getattr(hidden, "unique_id", None))
        text = abc if abc.strip() and not stale else incoming
        if text is None or not text.strip():
            what = ("the connected score is empty (cot off has no lead sheet)" if score is not None
                    else "the connected abc_text is empty" if abc_text is not None
                    else "nothing is connected")
            raise ValueError(f"the ABC score is empty: {what}. Type a lead sheet in the abc box or connect a "
                             "YuE2 Composer's score.")
        if text is not incoming and len(text.encode("utf-8", "surrogatepass")) > MAX_ABC_BYTES:
            raise ValueError(f"the typed ABC score is {len(text.encode('utf-8', 'surrogatepass')):,} bytes; at most "
                             f"{MAX_ABC_BYTES:,} are accepted (a song's lead sheet is a few kB)")
        errors, warnings = scores.check(text)
        if errors:
            raise ValueError(f"the ABC score has {len(errors)} error(s):\n{scores.describe(errors)}")
        unchanged = score is not None and text == score.abc
        out = score if unchanged else scores.edited_score(text, score)
        source = ("input score, unchanged (exact ids kept)" if unchanged else
                  "edited in this node" if abc.strip() and not stale else "connected ABC text")
        if stale:
            source += ("; the box held the previous score, not edited since, so the new connected one is used "
                       "(the box shows it after this run)")
        summary = f"{source}; {len(text.splitlines())} lines, {len(warnings)} warning(s)"
        if warnings:
            summary += "\n" + scores.describe(warnings)
        # ui: "source_abc" = the connected score's text (the editor widget fills an empty box with it and offers it
        # for Revert), "abc" = the text used, "unchanged" = the input score passed on as is, "issues" = warnings.
        return io.NodeOutput(out, text, ui={"text": [summary], "abc": [text], "source_abc": [incoming or ""],
                                            "unchanged": [unchanged], "issues": [i.to_dict() for i in warnings]})


def _holds_previous_score(abc: str, incoming: str | None, extra_pnginfo, unique_id) -> bool:
    """True when the box holds, unedited, the score the widget last received from upstream and a different score
    now arrives: the widget would replace the box after this run (web/abc_editor/editor.js `executed`), so the run
    itself already uses the new score instead of passing on a stale copy. The widget's record of that last score is
    the node property `yue2_composer_abc`, read from the workflow ComfyUI's frontend sends with each prompt
    (`extra_pnginfo`); API prompts without it, or nodes inside subgraphs, keep the plain rule (the box wins)."""
    if not abc.strip() or not incoming or not incoming.strip() or incoming == abc:
        return False
    workflow = extra_pnginfo.get("workflow") if isinstance(extra_pnginfo, dict) else None
    nodes = workflow.get("nodes") if isinstance(workflow, dict) else None
    if not isinstance(nodes, list) or unique_id is None:
        return False
    for node in nodes:
        if isinstance(node, dict) and str(node.get("id")) == str(unique_id):
            props = node.get("properties")
            previous = props.get("yue2_composer_abc") if isinstance(props, dict) else None
            return isinstance(previous, str) and previous == abc
    return False
