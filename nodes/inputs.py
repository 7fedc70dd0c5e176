"""Checks of widget values that ComfyUI's prompt validation lets through to the nodes (ComfyUI 0.3.75,
`execution.validate_inputs`), shared by every node of the pack.

What ComfyUI does with an API prompt's widget values before a node sees them:
  FLOAT    `float(value)`, then the min/max check: "nan" / JSON NaN passes it (every comparison with NaN is false)
  INT      `int(value)`: 1.7 becomes 1 and true becomes 1, silently
  FLOAT    (also) `float(true)`: a JSON boolean becomes 1.0, silently
  BOOLEAN  `bool(value)`: the string "false" (any non-empty string) becomes True, null becomes False, silently
  STRING   `str(value)`: null becomes the text "None", true "True", an object "{'a': 1}", silently (a style "None",
           a song folder None_00001)
  COMBO    not checked against the options at all for V3 nodes (their type is "COMBO", not the list), and an input
           that the node's own `validate_inputs` receives skips ComfyUI's checks: any JSON value reaches it (5, null)

`guard_prompt` (registered as an on-prompt handler, so it runs on the posted JSON before that validation) marks
anything but a JSON boolean given for a BOOLEAN, a non-integral number or a boolean for an INT, a NaN or a boolean for
a FLOAT, and null, a boolean or an object for a STRING of this pack's nodes (break-it review 53b): ComfyUI's
own conversion then fails with this module's message (error `invalid_input_type`, "Failed to convert an input value
to a … value", details "<input>, <value>, <why and what is accepted>"). `entry_name` and `number` are the nodes'
own checks, for values that reach `validate_inputs` / `execute` by any other way. `MISSING` is the default of the
dropdown a node's `validate_inputs` checks: ComfyUI calls that function even when the prompt lacks the input (after
its own "Required input is missing"), and a function without a default then failed with Python's "missing 1
required positional argument", which replaced ComfyUI's message.
"""
from __future__ import annotations

import json
import math

MISSING = object()  # validate_inputs' default: the input is absent from the prompt (ComfyUI names it itself)


def entry_name(input_name: str, value, what: str) -> str | None:
    """None for a non-empty string; else the message for a file/folder dropdown (`what`: "a checkpoint from the
    list") given another JSON value (5, null, {}), which ComfyUI passes to `validate_inputs` unchecked, or "" ."""
    if not isinstance(value, str):
        return f"{input_name} must be the name of {what} (a text), got {value!r} ({type(value).__name__})"
    if not value.strip():
        return f"{input_name} is empty: pick {what}"
    return None


def number(input_name: str, value, lo: float, hi: float, *, auto: float | None = None, auto_means: str = "") -> float:
    """`value` as a float when it is a finite number in [lo, hi] or exactly `auto` (a sentinel such as −1 = auto);
    ValueError naming the input, the value and what is accepted otherwise (NaN passes ComfyUI's own range check).
    −0.0 comes back as 0.0 (it was recorded and shown as "-0")."""
    accepted = f"a number in [{lo:g}, {hi:g}]" + (f", or {auto:g} ({auto_means})" if auto is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{input_name} must be {accepted}; got {value!r} ({type(value).__name__})")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past a float's range
        finite = False
    if auto is not None and value == auto:
        return float(value)
    if not finite or not lo <= value <= hi:
        raise ValueError(f"{input_name} must be {accepted}; got {value!r}")
    return float(value) + 0.0  # −0.0 + 0.0 is 0.0


# --- the on-prompt handler ------------------------------------------------------------------------------------------
class _RefusedText(str):
    """A string given for a BOOLEAN: ComfyUI's `bool(value)` raises with the message instead of reading True."""

    why = ""

    def __bool__(self):
        raise ValueError(self.why)


class _RefusedString(str):
    """A null / boolean / object given for a STRING, as its JSON text: ComfyUI's `str(value)` raises with the
    message instead of reading "None" (its error details format the value, which gives the JSON text)."""

    why = ""

    def __str__(self):
        raise ValueError(self.why)

    def __format__(self, spec):
        return format(str.__str__(self), spec)


class _RefusedNumber(float):
    """A NaN for a FLOAT or a fraction for an INT: ComfyUI's `float(value)` / `int(value)` raises with the message."""

    why = ""

    def __float__(self):
        raise ValueError(self.why)

    def __int__(self):
        raise ValueError(self.why)


def _refused(cls, value, why: str):
    out = cls(value)
    out.why = why
    return out


_WIDGETS: dict | None = None  # class_type → {input: (type, min, max)} of the pack's BOOLEAN / INT / FLOAT /
# STRING inputs


def _widgets() -> dict:
    global _WIDGETS
    if _WIDGETS is None:
        from . import NODE_LIST
        table = {}
        for cls in NODE_LIST:
            info = cls.INPUT_TYPES()
            node_id = cls.GET_SCHEMA().node_id
            table[node_id] = {name: (spec[0], (spec[1] if len(spec) > 1 else {}).get("min"),
                                     (spec[1] if len(spec) > 1 else {}).get("max"))
                              for section in ("required", "optional") for name, spec in info.get(section, {}).items()
                              if spec and spec[0] in ("BOOLEAN", "INT", "FLOAT", "STRING")}
        _WIDGETS = table
    return _WIDGETS


def _show(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _mark(name: str, kind: str, lo, hi, value):
    """The value, or a refusing stand-in for one ComfyUI would silently misread."""
    if isinstance(value, dict) and "__value__" in value:  # ComfyUI's wrapper of a list widget value: its own
        return value
    span = f" in [{_show(lo)}, {_show(hi)}]" if lo is not None and hi is not None else ""
    if kind == "BOOLEAN" and isinstance(value, str):
        return _refused(_RefusedText, value,
                        f"{name} must be true or false (a JSON boolean); got the text {value!r}, which ComfyUI "
                        "would read as " + ("false" if not value else "true"))
    if kind == "BOOLEAN" and not isinstance(value, bool):  # null, 0, 2, 0.5
        return _refused(_RefusedText, _json(value),
                        f"{name} must be true or false (a JSON boolean); got {_json(value)}, which ComfyUI would "
                        "read as " + ("true" if value else "false"))
    if kind in ("INT", "FLOAT") and isinstance(value, bool):
        return _refused(_RefusedNumber, float(value),
                        f"{name} must be a {'whole ' if kind == 'INT' else ''}number{span}; got {_json(value)} (a "
                        f"JSON boolean), which ComfyUI would read as {int(value) if kind == 'INT' else float(value)}")
    if kind == "STRING" and (value is None or isinstance(value, (bool, dict))):
        return _refused(_RefusedString, _json(value),
                        f"{name} must be a text (a JSON string); got {_json(value)}, which ComfyUI would read as the "
                        f"text {str(value)[:40]!r}")
    if kind == "INT" and isinstance(value, float) and not isinstance(value, bool):
        if math.isfinite(value) and not value.is_integer():
            return _refused(_RefusedNumber, value, f"{name} must be a whole number{span}; got {value!r}, which "
                                                   f"ComfyUI would cut to {int(value)}")
    if kind == "FLOAT":
        nan = (isinstance(value, float) and math.isnan(value)) or (
            isinstance(value, str) and value.strip().lower() in ("nan", "+nan", "-nan"))
        if nan:
            return _refused(_RefusedNumber, float("nan"), f"{name} must be a finite number{span}; got NaN")
    return value


def _json(value) -> str:
    """The value as JSON writes it (null, true, {"a": 1}), at most 60 characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def guard_prompt(json_data):
    """ComfyUI on-prompt handler: in the posted prompt's nodes of this pack, wraps the widget values that ComfyUI
    would misread (see the module docstring) so that its validation refuses them with this pack's message. Returns
    `json_data` (changed in place); anything unexpected leaves it as it is."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    if not isinstance(prompt, dict):
        return json_data
    widgets = _widgets()
    for node in prompt.values():
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            continue
        table = widgets.get(node.get("class_type"))
        if not table:
            continue
        inputs = node["inputs"]
        for name, (kind, lo, hi) in table.items():
            if name in inputs and not isinstance(inputs[name], list):  # a list is a link
                inputs[name] = _mark(name, kind, lo, hi, inputs[name])
    return json_data


def register_with_comfy() -> bool:
    """Adds `guard_prompt` to ComfyUI's on-prompt handlers once; False outside a running ComfyUI."""
    try:
        from server import PromptServer
    except ImportError:
        return False
    instance = getattr(PromptServer, "instance", None)
    if instance is None or getattr(instance, "_yue2_guard_prompt", False):
        return False
    instance.add_on_prompt_handler(guard_prompt)
    instance._yue2_guard_prompt = True
    return True
