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
