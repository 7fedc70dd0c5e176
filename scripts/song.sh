#!/usr/bin/env bash
# Installs the engine into .venv (first run only) and makes a song from a style and lyrics:
#
#   bash scripts/song.sh                                   # the example style + lyrics, a 20 s song
#   bash scripts/song.sh --checkpoint yue2_3b_int8_convrot.safetensors --max-seconds 120
#   bash scripts/song.sh --style "lo-fi hip hop, mellow piano" --lyrics-file my_lyrics.txt
#
# Any option of `python -m yue2_core generate` can be given (see --help). The checkpoint is found as generate finds
# it, without its download: --checkpoint, $YUE2_CHECKPOINT, a YuE2 file or vendor YuE2-3B folder in ComfyUI's
# models/checkpoints, m-a-p/YuE2-3B in the Hugging Face cache. When none is found it writes and uses a tiny SYNTHETIC
# checkpoint with random weights: the pipeline runs end to end, but the audio is noise, not music — the real weights
# (Comfy-Org/YuE2 on Hugging Face) cannot be downloaded on every machine. The song directory is written under the
# repository's out/ folder unless --output says otherwise, and its path printed. Relative paths in the options are
# relative to where you run this. First run: creates .venv in the repository and installs torch (a CUDA build where
# pip picks one: ~5 GB) and the engine's dependencies, printing pip's progress while it downloads; installing the
# downloaded packages then takes about a minute without output (a line says so).
# The seed is the release's default (831001) unless --seed is given: the same inputs give the same song every run.
# The last lines name the song folder and its audio.flac. (SONG_SH_VENV=DIR uses another virtual environment.)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
VENV=${SONG_SH_VENV:-$REPO/.venv}
PY="$VENV/bin/python"
want_help=0
for a in "$@"; do [ "$a" = --help ] || [ "$a" = -h ] && want_help=1; done
if [ "$want_help" = 1 ]; then
    sed -n '2,/^[^#]/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo
    echo "Defaults song.sh adds when the option is not given: --max-seconds 20, --output out/song-DATE-TIME, the"
    echo "example --style-file / --lyrics-file (examples/), and with no checkpoint found its synthetic file with"
    echo "--max-abc-tokens 128. The options of generate follow (its --output is optional here)."
    echo
    if [ -x "$PY" ] && "$PY" -c "import yue2_core" 2>/dev/null; then exec "$PY" -m yue2_core generate --help; fi
    echo "(the engine is not installed yet: run bash scripts/song.sh once, then --help lists generate's options)"
    exit 0
fi
if [ ! -x "$PY" ]; then
    if [ -e "$VENV" ] || [ -L "$VENV" ]; then  # a broken link, a file, or a venv without a working python
        echo "[song.sh] $VENV exists but $PY does not run (a broken symlink, a file, or an incomplete virtual" \
             "environment): delete $VENV and run again" >&2
        exit 1
    fi
    echo "[song.sh] creating $VENV (first run)"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
if ! "$PY" -c "import yue2_core, torch, safetensors, tokenizers, soundfile" 2>/dev/null; then
    # the torch pins of scripts/test.sh (scripts/lib/constraints.txt), so that running the tests later in the same
    # .venv does not download a second torch
    has_torch=0
    "$PY" -c "import torch" 2>/dev/null && has_torch=1  # asked once (each import of torch takes seconds)
    if [ "$has_torch" = 1 ]; then
        echo "[song.sh] installing the engine's dependencies into $VENV (the torch there is kept; pip's progress"
        echo "[song.sh] follows)"
    else
        echo "[song.sh] installing torch and the engine's dependencies into $VENV (first run: ~5 GB, a few minutes;"
        echo "[song.sh] pip's progress follows)"
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1 && [ "$has_torch" = 0 ]; then
        echo "[song.sh] no NVIDIA GPU found: pip installs PyTorch's default CUDA build (~5 GB). A CPU-only build is"
        echo "[song.sh] under 1 GB: stop (Ctrl-C), run"
        echo "[song.sh]   $VENV/bin/pip install torch==2.14.1 --index-url https://download.pytorch.org/whl/cpu"
        echo "[song.sh] (or, where that index is unreachable, install a CPU torch wheel you have with"
        echo "[song.sh]   $VENV/bin/pip install /path/to/torch-VERSION+cpu-….whl)"
        echo "[song.sh] and run this script again (it keeps the torch it finds)"
        if [ -t 0 ]; then echo "[song.sh] (going on in 5 s)"; sleep 5; fi
    fi
    # a torch already in the environment (a CPU build, ComfyUI's own) stays: pin the installed versions instead of
    # scripts/lib/constraints.txt's, whose torch==2.14.1 would replace it
    constraints="$REPO/scripts/lib/constraints.txt"
    pins=$("$PY" -c "
import importlib.metadata as m
for name in ('torch', 'torchvision', 'torchaudio'):
    try:
        print(f'{name}=={m.version(name)}')
    except m.PackageNotFoundError:
        pass" 2>/dev/null || true)
    if [[ "$pins" == torch==* ]]; then
        constraints=$(mktemp "${TMPDIR:-/tmp}/song_sh_pins.XXXXXX")
        trap 'rm -f "$constraints"' EXIT
        printf '%s\n' "$pins" > "$constraints"
        echo "[song.sh] keeping the installed $(printf '%s' "$pins" | tr '\n' ' '): pip is told to change none of them"
    fi
    # pip says "Installing collected packages: …" and nothing more until all are installed (a minute for torch)
    if [[ "$pins" == torch==* ]]; then
        quiet="[song.sh] installing the downloaded packages: pip prints nothing until it is done"
    else
        quiet="[song.sh] installing ≈ 5 GB of packages (torch with CUDA): about a minute without output"
    fi
    start=$SECONDS
    "$PY" -m pip install --disable-pip-version-check --progress-bar on -c "$constraints" \
        -e "$REPO" 2>&1 | grep --line-buffered -v "is ignored: it is neither a file nor a directory" \
        | awk -v quiet="$quiet" '{ print "[pip] " $0 } /^Installing collected packages/ { print quiet } { fflush() }' \
        || true
    # the pins file goes now: the `exec` at the end replaces this shell, so the EXIT trap never runs after a song
    if [ "$constraints" != "$REPO/scripts/lib/constraints.txt" ]; then rm -f "$constraints"; trap - EXIT; fi
    "$PY" -c "import yue2_core, torch, safetensors, tokenizers, soundfile" || { echo "[song.sh] install failed" >&2; exit 1; }
    echo "[song.sh] installed in $((SECONDS - start)) s"
fi

args=("$@")
has() { local a; for a in "${args[@]}"; do [ "$a" = "$1" ] || [[ "$a" == "$1="* ]] && return 0; done; return 1; }  # --opt v, --opt=v
# the CLI's own search without the download (yue2_core/weights/locate.py find_checkpoint): a YuE2 file or vendor
# folder in ComfyUI's models/checkpoints, then m-a-p/YuE2-3B in the Hugging Face cache; the synthetic file only when
# that finds nothing; a $COMFYUI_PATH / $COMFYUI_DIR that gave nothing (not a folder, no models/checkpoints, no YuE2
# file there) is named, not passed over in silence (new-user review 53)
found_checkpoint() {
    local why
    why=$("$PY" -c "
import sys
from yue2_core.errors import CheckpointError
from yue2_core.weights.locate import comfy_env_hint, find_checkpoint
try:
    find_checkpoint(download=False)
except CheckpointError:
    print(comfy_env_hint())
    sys.exit(1)" 2>/dev/null) && return 0
    [ -z "$why" ] || echo "[song.sh] note: $why: no checkpoint found there" >&2
    return 1
}
if ! has --checkpoint && [ -z "${YUE2_CHECKPOINT:-}" ] && ! found_checkpoint; then
    ckpt="$REPO/models/yue2_tiny_bf16.safetensors"
    if [ ! -f "$ckpt" ]; then
        mkdir -p "$REPO/models"
        echo "[song.sh] no YuE2 checkpoint given: writing a tiny SYNTHETIC one (random weights) to $ckpt"
        "$PY" -m yue2_core make-synthetic --profile tiny --format bf16 --output "$ckpt" > /dev/null
    fi
    args+=(--checkpoint "$ckpt" --checkpoint-how "picked by scripts/song.sh: its synthetic file, random weights" --offline)
    has --max-abc-tokens || args+=(--max-abc-tokens 128)  # random weights never close the score by themselves
fi
has --style || has --style-file || args+=(--style-file "$REPO/examples/text2music_style.txt")
has --lyrics || has --lyrics-file || args+=(--lyrics-file "$REPO/examples/text2music_lyrics.txt")
has --max-seconds || args+=(--max-seconds 20)
has --output || args+=(--output "$REPO/out/song-$(date +%Y%m%d-%H%M%S)")
has --seed || has --help || has -h || echo "[song.sh] seed 831001 (the default: the same inputs give the same song; --seed N for another)" >&2
exec "$PY" -m yue2_core generate "${args[@]}"  # its last lines (stderr) name the song folder and its audio.flac
