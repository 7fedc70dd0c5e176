"""Checks of widget values that ComfyUI's prompt validation lets through to the nodes (ComfyUI 0.3.75,
`execution.validate_inputs`), shared by every node of the pack.

What ComfyUI does with an API prompt's widget values before a node sees them:
  FLOAT    `float(value)`, then the min/max check: "nan" / JSON NaN passes it (every comparison with NaN is false)
  INT      `int(value)`: 1.7 becomes 1 and true becomes 1, silently
  BOOLEAN  `bool(value)`: the string "false" (any non-empty string) becomes True, silently
  COMBO    not checked against the options at all for V3 nodes (their type is "COMBO", not the list), and an input
           that the node's own `validate_inputs` receives skips ComfyUI's checks: any JSON value reaches it (5, null)

`guard_prompt` (registered as an on-prompt handler, so it runs on the posted JSON before that validation) marks a
string given for a BOOLEAN, a non-integral number for an INT and a NaN for a FLOAT of this pack's nodes: ComfyUI's
own conversion then fails with this module's message (error `invalid_input_type`, "Failed to convert an input value
to a … value", details "<input>, <value>, <why and what is accepted>"). `entry_name` and `number` are the nodes'
own checks, for values that reach `validate_inputs` / `execute` by any other way.
"""
from __future__ import annotations

import math


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


_WIDGETS: dict | None = None  # class_type → {input: (type, min, max)} of the pack's BOOLEAN / INT / FLOAT inputs


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
                              if spec and spec[0] in ("BOOLEAN", "INT", "FLOAT")}
        _WIDGETS = table
    return _WIDGETS


def _show(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _mark(name: str, kind: str, lo, hi, value):
    """The value, or a refusing stand-in for one ComfyUI would silently misread."""
    span = f" in [{_show(lo)}, {_show(hi)}]" if lo is not None and hi is not None else ""
    if kind == "BOOLEAN" and isinstance(value, str):
        return _refused(_RefusedText, value,
                        f"{name} must be true or false (a JSON boolean); got the text {value!r}, which ComfyUI "
                        "would read as " + ("false" if not value else "true"))
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
            if name in inputs and not isinstance(inputs[name], (list, dict)):  # a list is a link
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
