"""Parsing and refusing command-line values: numbers, `--lora PATH[:STRENGTH[:NAR_STRENGTH]]`, unknown options."""
from __future__ import annotations

import argparse
import os
import re
import sys


def _ascii_number(text: str) -> float:
    """float(text) for a plain ASCII decimal (1, -0.5, 2e-1, .5): ValueError for what float() also takes but nobody
    types as a strength — other scripts' digits (٣), underscores (1_0), surrounding spaces (break-it finding:
    FILE:٣ became strength 3). inf and nan pass, for `check_strength` to refuse by name."""
    if not re.fullmatch(r"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf|infinity|nan)", text,
                        flags=re.ASCII | re.IGNORECASE):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


_ASCII_SPACE = " \t\n\r\f\v"  # what a shell or a command puts around a number (not U+3000 and the like)


def whole_number(text: str) -> int:
    """An argparse type for the integer options (--seed, --steps, --max-abc-tokens, --max-batch, …): int(text) for
    ASCII digits with an optional sign only. int() also takes other scripts' digits (٣, full-width ３), underscores
    (1_0), so `--seed ３` made seed 3 without a word — the rule `--lora FILE:٣` follows since stop 33 (break-it
    review, stop 51). ASCII spaces, tabs and newlines around the number are dropped, as int() dropped them: a value
    from a shell variable or a command (`--seed "$(wc -l < f)"`, padded on macOS) names one number all the same
    (stop-51 diff review: refused since the break-it fix)."""
    digits = text.strip(_ASCII_SPACE)
    if not re.fullmatch(r"[+-]?[0-9]+", digits):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: write it in ASCII digits 0-9 with an "
                                         "optional sign, e.g. 42")
    return int(digits)


def plain_number(text: str) -> float:
    """An argparse type for the number options (--max-seconds, --cfg-scale, --budget): `_ascii_number` (the plain
    ASCII decimals float() takes; inf and nan pass, for the option's own check to refuse by name), ASCII spaces
    around it dropped as for `whole_number`."""
    try:
        return _ascii_number(text.strip(_ASCII_SPACE))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: write a plain decimal with a point, e.g. 30, "
                                         "2.5 or 1e-3 (ASCII digits 0-9; no comma, unit, underscore or other "
                                         "scripts' digits)") from None


def seconds(text: str) -> float:
    """An argparse type for --max-seconds: `plain_number`. A duration written as musicians write one (1:30, 2m, 90s)
    is refused with the number of seconds it means: new-user review 58 typed `--max-seconds 1:30` and was told to
    "write it in ASCII" (it was ASCII). Not accepted as is: the option is the release's seconds, and a minute
    written `1.30` would still be read as 1.3 s."""
    try:
        return plain_number(text)
    except argparse.ArgumentTypeError:
        from ..protocol import duration_seconds
        value = duration_seconds(text.strip(_ASCII_SPACE))
        if value is None:
            raise
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds: give the length in seconds, "
                                         f"{value:g} for {text.strip(_ASCII_SPACE)}") from None


def _is_number(text: str) -> bool:
    try:
        _ascii_number(text)
    except ValueError:
        return False
    return True


def parse_lora(value: str) -> tuple[str, float, float]:
    """--lora PATH[:AR[:NAR]] → (path, strength_ar, strength_nar). Strengths are read from the right, so a path with
    colons (C:\\x.safetensors) works; one number sets both. Raises argparse.ArgumentTypeError for a strength outside
    ±5, a strength that is not a number or is empty (PATH:1:), more than two strengths, a missing file, or a path
    that is a FIFO / device / socket (named: reading one would block). A PATH that does not exist here but does in
    the `models/loras` folder of the ComfyUI the checkpoint search uses is taken from there, with a note."""
    from ..errors import AdapterError
    from ..weights.lora.apply import check_strength
    parts, nums = value.split(":"), []
    while len(parts) > 1 and len(nums) < 2:
        try:
            _ascii_number(parts[-1])
            nums.insert(0, parts[-1])  # the text: check_strength tells 1e-400 (underflows to 0) from 0
        except ValueError:
            break
        parts.pop()
    path = ":".join(parts)
    try:
        ar = check_strength(nums[0], "--lora AR strength") if nums else 1.0
        nar = check_strength(nums[1], "--lora NAR strength") if len(nums) > 1 else ar
    except AdapterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    from ..weights.checkpoint import not_a_file
    from ..weights.locate import comfy_model_path
    in_comfy = comfy_model_path(path, "loras")
    if in_comfy is not None:  # a name as the LoRA node lists it, in the ComfyUI the checkpoint search uses
        print(f"note: --lora {path}: {in_comfy[0]} (ComfyUI folder {in_comfy[1]})", file=sys.stderr)
        path = in_comfy[0]
    kind = not_a_file(path)
    if kind is not None and kind != "a directory":  # a directory may be a PEFT folder
        raise argparse.ArgumentTypeError(f"LoRA {path!r} is {kind}, not a file (an adapter is a .safetensors or .pt "
                                         f"file, or a PEFT folder)")
    if not os.path.exists(path):
        cut = value.split(":")
        for k in range(1, len(cut)):  # PATH:abc, PATH:1:, PATH:1:2:3 — the strengths are wrong, not the file
            if not os.path.exists(":".join(cut[:-k])):
                continue
            fields = cut[-k:]
            bad = next((f for f in fields if f and not _is_number(f)), None)
            if k > 2 and bad is None and "" not in fields:
                why = "more than two strengths (at most AR and NAR)"
            elif bad is not None:
                why = f"strength {bad!r} is not a number"
            elif "" in fields:  # break-it (stop 40): PATH:1: was looked for as a file named "PATH:1:"
                why = "a strength after ':' is empty"
            else:
                continue  # PATH:1 where "PATH:1" exists too: said below
            raise argparse.ArgumentTypeError(f"--lora {value!r}: {why} (forms: PATH, PATH:S for both experts, "
                                             "PATH:AR:NAR; e.g. adapter.safetensors:0.8 or "
                                             "adapter.safetensors:1:0.5)")
        for n in range(1, len(nums) + 1):  # a file whose own name ends in ":<number>" (x:1)
            longer = ":".join(cut[:len(cut) - len(nums) + n])
            if os.path.exists(longer):
                raise argparse.ArgumentTypeError(
                    f"LoRA file {path!r} not found, but {longer!r} exists: the text after its last ':' was read as "
                    f"a strength; give the strengths too, e.g. {longer}:1:1 (form: PATH[:AR[:NAR]])")
        from ..weights.locate import comfy_model_folders, looks_up_in_comfy
        # where a name was looked for too (diff review, stop 49: unsaid); not for `/abs`, `../x`, `./x`
        folders = comfy_model_folders("loras") if looks_up_in_comfy(path) else []
        where = f", neither here nor in ComfyUI's {' or '.join(folders)}" if folders else ""
        raise argparse.ArgumentTypeError(f"LoRA file {path!r} not found{where} (form: PATH[:AR[:NAR]])")
    return path, ar, nar


def parse_vae(value: str) -> str:
    """--vae PATH → the path; a name that is no path here but is one in the `models/vae` folder of the ComfyUI the
    checkpoint search uses (`locate.comfy_model_path`) → that one, with a note. An empty name, or one that is neither
    (not even a link), is refused here, before any checkpoint search; whether it is a VAE is checked later
    (vae_files.open_vae)."""
    from ..weights.locate import comfy_model_folders, comfy_model_path, looks_up_in_comfy
    if not value.strip():  # `--vae "$UNSET"` got as far as loading the model before its error
        raise argparse.ArgumentTypeError(f"{value!r} names no VAE (an unset shell variable?); give its path, or "
                                         "leave the option out")
    from ..weights.locate import HF_REPO, _is_repo_id
    from ..weights.vendor import MODEL_REPO, VAE_REPO
    in_comfy = comfy_model_path(value, "vae")
    repo = value.rstrip("/")  # a repo id, never a path: `/m-a-p/YuE2-Vae` (absolute) or `m-a-p/…` with a folder
    # m-a-p here are paths (diff review 58: the first was read as the repo id)
    if in_comfy is None and not os.path.lexists(value) and _is_repo_id(repo) and repo.lower() == VAE_REPO.lower():
        # the repo id, as --checkpoint m-a-p/YuE2-3B reads: its snapshot in the Hugging Face cache (stop 58)
        from ..weights.vendor import hf_snapshot
        snap = hf_snapshot(VAE_REPO)
        if snap is None:
            raise argparse.ArgumentTypeError(f"VAE {value!r}: no snapshot of m-a-p/YuE2-Vae in the Hugging Face cache "
                                             "(this pack reads the folder the vendor runtime downloads, e.g. `hf "
                                             "download m-a-p/YuE2-Vae`, but does not download it itself)")
        print(f"note: --vae {value}: {snap} (Hugging Face cache)", file=sys.stderr)
        return str(snap)
    if in_comfy is None:
        if not os.path.lexists(value):  # said now, as a missing --lora is (new-user review 57:
            # the checkpoint search ran first, with its 3.7 GB download when no checkpoint was found); a broken
            # link is said by open_vae
            folders = comfy_model_folders("vae") if looks_up_in_comfy(value) else []
            where = f", neither here nor in ComfyUI's {' or '.join(folders)}" if folders else ""
            model = (f"; {repo} is the model's repo — give it as --checkpoint; the VAE's is {VAE_REPO}"
                     if _is_repo_id(repo) and repo.lower() in (MODEL_REPO.lower(), HF_REPO.lower()) else "")
            raise argparse.ArgumentTypeError(f"VAE {value!r} not found{where} (a YuE2 VAE is a folder with "
                                             f"config.json + model.safetensors, or a .safetensors file){model}")
        return value
    print(f"note: --vae {value}: {in_comfy[0]} (ComfyUI folder {in_comfy[1]})", file=sys.stderr)
    return in_comfy[0]


def _named(what: str):
    """An argparse type: the text as given, refusing an empty one — `--abc-file ""` (an unset shell variable) was
    read as "option not given" and silently changed the request (the model wrote its own lead sheet; the checkpoint
    search fell through to a download)."""
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} names no {what} (an unset shell variable?); give its path, or "
                                             "leave the option out")
        return text
    return check


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (new-user review 43: a mistyped option printed the top-level usage and
    "unrecognized arguments: --max-second 5", naming neither the subcommand nor the option meant; `--cot ful`
    printed ten lines of usage before its error). The error names the subcommand, the closest option for an
    unknown one, and where the accepted options are listed."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; {self.prog} --help lists what is accepted\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # reported by the subcommand's parser (its prog, its options), not the top-level one
            parser = self
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parser = action.choices.get(getattr(parsed, action.dest, None), self)
            parser.error(_unrecognized(parser, extra))
        return parsed


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """argparse's "unrecognized arguments: …", with the closest option of `parser` for each unknown one."""
    import difflib
    known = [s for a in parser._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
    hints = []
    for word in extra:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close and close[0] not in hints:
                hints.append(close[0])
    text = "unrecognized arguments: " + " ".join(extra)
    return text + (f" (did you mean {' / '.join(hints)}?)" if hints else "")
