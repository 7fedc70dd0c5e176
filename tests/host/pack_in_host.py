"""A Python preamble that loads the pack into the installed ComfyUI host's python the way ComfyUI loads it, without a
server: run `[python, "-c", PREAMBLE + code, comfy_dir, repo, checkpoints_dir]`; the code after it finds the nodes
package as `yue2_nodes`, ComfyUI's CPU mode set and `checkpoints_dir` as the only checkpoints folder."""

PREAMBLE = r'''
import importlib.util, json, os, sys
comfy_dir, repo, ckpts = sys.argv[1:4]
sys.path.insert(0, comfy_dir)
os.chdir(comfy_dir)
import utils.extra_config  # before any comfy.* import
from comfy.cli_args import args
args.cpu = True
import folder_paths
folder_paths.folder_names_and_paths["checkpoints"] = ([ckpts], folder_paths.supported_pt_extensions)
sys.path.append(repo)
spec = importlib.util.spec_from_file_location("yue2_nodes", os.path.join(repo, "nodes", "__init__.py"),
                                              submodule_search_locations=[os.path.join(repo, "nodes")])
module = importlib.util.module_from_spec(spec)
sys.modules["yue2_nodes"] = module
spec.loader.exec_module(module)
'''


def run_in_host(code: str, comfy_host: tuple, repo, checkpoints, env: dict | None = None) -> dict:
    """Run `PREAMBLE + code` in the host's python (`comfy_host` = (ComfyUI dir, python)) and return the JSON the code
    printed on its last line starting "RESULT "; an AssertionError with the end of stderr when it printed none.
    YUE2_* variables are left out of the environment (but YUE2_TEST_CACHE), YUE2_WARMUP=0 added; `env` adds more."""
    import json
    import os
    import subprocess
    comfy_dir, python = comfy_host
    base = {k: v for k, v in os.environ.items() if not k.startswith("YUE2_") or k == "YUE2_TEST_CACHE"}
    run = subprocess.run([python, "-c", PREAMBLE + code, str(comfy_dir), str(repo), str(checkpoints)],
                         capture_output=True, text=True, env={**base, "YUE2_WARMUP": "0", **(env or {})}, timeout=300)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])
