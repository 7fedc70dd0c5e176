"""YuE2 ABC Editor: check (and, in the widget, edit) a lead sheet before the music is sampled from it."""
from __future__ import annotations

from comfy_api.latest import io

from . import scores, types


class YuE2ABCEditor(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="YuE2ABCEditor",
            display_name="YuE2 ABC Editor",
            category=types.CATEGORY,
            description="Shows the lead sheet and lets you edit it. With the abc box empty, the connected score (or "
                        "ABC text) is used; text in the box replaces it. The text is checked against YuE2's "
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
        )

    @classmethod
    def execute(cls, abc, score=None, abc_text=None) -> io.NodeOutput:
        if score is not None and abc_text is not None:
            raise ValueError("both a score and an abc_text are connected; connect only one of them")
        incoming = score.abc if score is not None else abc_text
        text = abc if abc.strip() else incoming
        if text is None or not text.strip():
            what = ("the connected score is empty (cot off has no lead sheet)" if score is not None
                    else "the connected abc_text is empty" if abc_text is not None
                    else "nothing is connected")
            raise ValueError(f"the ABC score is empty: {what}. Type a lead sheet in the abc box or connect a "
                             "YuE2 Composer's score.")
        errors, warnings = scores.check(text)
        if errors:
            raise ValueError(f"the ABC score has {len(errors)} error(s):\n{scores.describe(errors)}")
        unchanged = score is not None and text == score.abc
        out = score if unchanged else scores.edited_score(text, score)
        source = ("input score, unchanged (exact ids kept)" if unchanged else
                  "edited in this node" if abc.strip() else "connected ABC text")
        summary = f"{source}; {len(text.splitlines())} lines, {len(warnings)} warning(s)"
        if warnings:
            summary += "\n" + scores.describe(warnings)
        # ui: "source_abc" = the connected score's text (the editor widget fills an empty box with it and offers it
        # for Revert), "abc" = the text used, "unchanged" = the input score passed on as is, "issues" = warnings.
        return io.NodeOutput(out, text, ui={"text": [summary], "abc": [text], "source_abc": [incoming or ""],
                                            "unchanged": [unchanged], "issues": [i.to_dict() for i in warnings]})
