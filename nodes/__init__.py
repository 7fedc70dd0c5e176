"""The ComfyUI layer of ComfyUI-YuE2 (V3 schema): thin nodes that parse inputs, call yue2_core and wrap the results.

    YuE2 Checkpoint Loader → YuE2 Composer (→ YuE2 ABC Editor → YuE2 Composer) → YuE2 Renderer
        → YuE2 VAE Decode → YuE2 Save Song;  YuE2 Load Song → Renderer / VAE Decode / Composer
    Composer (candidates N) → Renderer → VAE Decode → YuE2 Pick Take → Save Song
    YuE2 Load Song → YuE2 Regenerate / YuE2 Continue (each saves the new song)

One file per concern: types (sockets), model (ModelPatchers), memory (working-memory estimates), progress (progress
bar, Cancel, error translation), inputs (widget values ComfyUI's validation lets through), scores (edited text → Score), loader, composer, editor, render, songs, takes
(candidate batches, Pick Take), edit_nodes (Regenerate, Continue).
The repo-root __init__.py registers NODE_LIST through comfy_entrypoint.
"""
import logging

from .composer import YuE2Composer
from .edit_nodes import YuE2Continue, YuE2Regenerate
from .editor import YuE2ABCEditor
from .loader import YuE2CheckpointLoader
from .lora import YuE2LoRA
from .progress import surrogate_safe
from .render import YuE2Renderer, YuE2VAEDecode
from .songs import YuE2LoadSong, YuE2SaveSong
from .takes import YuE2PickTake
from .vae_loader import YuE2VAELoader

NODE_LIST = [YuE2CheckpointLoader, YuE2LoRA, YuE2Composer, YuE2ABCEditor, YuE2Renderer, YuE2VAEDecode, YuE2SaveSong,
             YuE2LoadSong, YuE2PickTake, YuE2Regenerate, YuE2Continue, YuE2VAELoader]

# a node's error must print: ComfyUI's log cannot write an unpaired surrogate, and the failed write ended its queue
for _node in NODE_LIST:
    surrogate_safe(_node)

# Widget values ComfyUI's validation would misread ("false" for a BOOLEAN, 1.7 for an INT, NaN for a FLOAT) are
# refused before it sees them (nodes/inputs.py, an on-prompt handler); the nodes check their values themselves too.
try:
    from .inputs import register_with_comfy
    register_with_comfy()
except Exception:  # never break the pack's import over it
    logging.getLogger("ComfyUI-YuE2").warning("[ComfyUI-YuE2] the prompt value guard was not registered",
                                              exc_info=True)

# HTTP routes of the ABC editor widget (nodes/routes.py, written separately); the nodes work without them.
try:
    from . import routes  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != f"{__name__}.routes":
        logging.getLogger("ComfyUI-YuE2").warning("[ComfyUI-YuE2] editor routes not loaded: missing module %r",
                                                  exc.name)
except ImportError as exc:
    logging.getLogger("ComfyUI-YuE2").warning("[ComfyUI-YuE2] editor routes not loaded: %s", exc)
