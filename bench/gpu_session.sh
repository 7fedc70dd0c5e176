#!/usr/bin/env bash
# The GPU measurements and checks behind the README's table and the issue notes, as run through the project's
# GPU machine (one NVIDIA H200). Parts (several may be given; bench + tests fit one 10-minute call, nodes another):
#
#   bash bench/gpu_session.sh bench    # bench/bench.py (full-size synthetic bf16 + int8, ours vs vendor-style) and
#                                      # bench/profile_decode.py (where a decode step's time goes), then cold
#   bash bench/gpu_session.sh cold     # bench/cold_start.py: first song vs second in fresh processes (empty Triton
#                                      # cache / cache kept / no warm-up; ~4 min), rows merged into bench.json;
#                                      # with bytecode caches (--pycache: this machine sets PYTHONDONTWRITEBYTECODE,
#                                      # a user's install has them), then the kept-cache warm-up's profile
#                                      # (bench/warmup_profile.py)
#   bash bench/gpu_session.sh tests    # tests/core/test_cuda_fast.py (fast-path numerics, marked gpu) and the other
#                                      # GPU test files (render graph/VAE folding, batch rows, LoRA under the graph)
#   bash bench/gpu_session.sh int8dot  # bench/int8_dot.py: int8 × int8 decode products (YUE2_INT8_DOT=int8) vs the
#                                      # W8A16 ones per shape and in the step, numerics; the int8 step's profile (~5 min)
#   bash bench/gpu_session.sh parts    # bench/decode_parts.py (decode-attention configurations, int8 rotation
#                                      # placements; ~1 min) and bench/gemv_sweep.py --quick
#   bash bench/gpu_session.sh next     # GEMV tuning for this GPU (~4 min): the CUDA-core GEMV sweep
#                                      # (bench/gemv_sweep.py --cc-only, 1–2 rows), then bench/bench.py's AR sections
#                                      # with its table (YUE2_GEMV_TABLE) against the built-in one, and the int8
#                                      # decode-step profile with it (on an H200 the table lost in the graph)
#   bash bench/gpu_session.sh split    # bench/overlap_split.py: AR batch decode beside the render, streams vs green
#                                      # contexts of K SMs (~3 min; cuda-bindings from .gpuwheels)
#   bash bench/gpu_session.sh layeropts # the CUDA layer kernel's experimental switches (YUE2_LAYER_CUDA_OPTS=pipe,fexp:
#                                      # its attention loop software-pipelined / with fast exponentials), int8 batch 1,
#                                      # with phase stamps, and its GPU tests with both on (~3 min)
#   bash bench/gpu_session.sh layer    # the one-launch decoder layer in CUDA (YUE2_LAYER_KERNEL=cuda) vs the per-kernel
#                                      # step: tiny-model agreement, speed with in-kernel phase times, and the floor of
#                                      # barrier-separated phases (bench/stream_floor.py: register and bulk-copy ring
#                                      # schedules, fenced and relaxed barriers, barrier anatomy) and of a cluster
#                                      # partition (bench/cluster_floor.py: 2 grid barriers + 3 cluster hand-offs a
#                                      # layer, clusters of 16/12/8 where they fit at once); ~4 min
#   bash bench/gpu_session.sh fewer    # bench/stream_floor.py's ring with fewer barriers a layer (MASK 23: none between
#                                      # gate/up and down, a block owning whole ffn columns; 21; 20) at 1 row, a CFG
#                                      # pair's two caches (--kv-scale 2), 8 candidates on a shared prompt (1.1 / 1.8:
#                                      # the bench's average over 512 tokens) and
#                                      # with a cache each (8), and the bf16 file's weights (--weight-scale 2): the
#                                      # floors stop 56 left unmeasured; ~2.5 min
#   bash bench/gpu_session.sh floor    # bench/step_floor.py (the per-kernel decode step's launches streaming only, vs
#                                      # the same bytes in fewer launches; int8 and bf16) and bench/topk_gap.py
#                                      # (the sampling tail's torch.topk alone in a graph, its memset gap) and
#                                      # bench/capture_cost.py (a decode graph capture's cost in a warm process); ~2 min
#   bash bench/gpu_session.sh splits   # the int8 step's profile with pair-code products split fewer ways (one
#                                      # YUE2_GEMV_TABLE per variant, bench/split_tables.py) against the default; ~3 min
#                                      # (SPLIT_FAMILY=pipeline: the built-in blocks with other warps and stages)
#   bash bench/gpu_session.sh attn     # bench/attn_plan.py (decode-attention launch configurations in the step's call,
#                                      # outside the step) and bench/profile_decode.py --attn-cfg (the same ones in the
#                                      # int8 step at 2,000 and 7,000 prompt positions); ~3 min
#   bash bench/gpu_session.sh l2       # the L2 weight prefetch branch (YUE2_L2_PREFETCH, experimental): its GPU
#                                      # test, then bench/profile_decode.py's int8 step with eight prefetch plans (L2_BF16=1:
#                                      # bf16 too, given its checkpoint; L2_ARGS: more --l2 specs), and the 8-row step's
#                                      # idle gaps between kernels in the graph replay (--gaps); ~4 min
#   bash bench/gpu_session.sh nar      # bench/nar_attention.py (SDPA backends of the NAR attention, alone and in the
#                                      # 32-step solve on the full-size bf16 file; ~1.5 min)
#   bash bench/gpu_session.sh w8a8     # tests/core/test_w8a8_gpu.py, then bench/nar_w8a8.py --ode: the int8 NAR's W8A8
#                                      # products (YUE2_NAR_LINEARS=w8a8) vs its bf16 linears, per shape and in the
#                                      # 32-step solve, with the ODE error of each (~4 min)
#   bash bench/gpu_session.sh lora     # tests/weights/test_lora_gpu.py (LoRA under the CUDA graph = portable) and
#                                      # bench/lora.py (decode and NAR with a rank-64 LoRA on both experts vs without)
#   bash bench/gpu_session.sh batch    # bench/batch.py (issue #19 rows): 16 different 3.6-min songs (cot full, 1,500
#                                      # ABC tokens) through `batch`, --max-batch 1 (first 4 songs) / 4 / 8, with and
#                                      # without --overlap; fits one 10-minute call (runs past 540 s are skipped)
#   bash bench/gpu_session.sh nodes    # tests/nodes/gpu_nodes_check.py --full (nodes under ComfyUI's model management); with --own-weights
#   bash bench/gpu_session.sh nodescold # tests/nodes/gpu_nodes_cold.py: the nodes' first song vs second in fresh
#                                      # processes (empty Triton cache, then kept, then kept without the background
#                                      # reads of the later parts), full-size int8, ~4 min
#   bash bench/gpu_session.sh takes    # tests/nodes/gpu_takes_check.py (candidates, Pick Take, Regenerate, Continue;
#                                      # needs soundfile, which the GPU machine's image lacks: carry its wheels)
#   bash bench/gpu_session.sh scale    # bench/scale_ray.py (issue #17): batch --ray on 1, 2, 4 GPUs (those the machine
#                                      # has), 32 songs of 3.6 min, then one actor killed mid-batch → scale_h200.json;
#                                      # needs ray + soundfile (pip install '.[ray]'; SCALE_ARGS="--gpus 1" etc. to split
#                                      # it over 10-minute calls, with --merge of the earlier JSON)
#
# Logs and JSON go to $OUT (default /tmp/yue2_gpu). `tests` reads the parity fixtures' cases.json and
# vectors.safetensors from $YUE2_PARITY_DIR (default .gpuparity); `nodes` needs the ComfyUI host (.comfyhost/comfyui,
# made by scripts/test.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/yue2_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# bench.json records $YUE2_COMMIT: the device tool sends the working tree without .git, so pass it in the command
# (YUE2_COMMIT=<hash> bash bench/gpu_session.sh bench) when git cannot tell
export YUE2_COMMIT=${YUE2_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}
PY=${PYTHON:-python3}
"$PY" -c "import torch, triton; print('torch', torch.__version__, '· triton', triton.__version__, '·', torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
# FlashAttention-3 for the NAR attention (fast/flash_attn.py; the automatic choice on Hopper once it imports): the GPU
# machine cannot download, so carry the wheel in .gpuwheels/ (pip download --no-deps fa3-fwd -d .gpuwheels); without it
# every part runs with PyTorch's attention (cuDNN), as it does with YUE2_NAR_ATTN=gqa.
if ls .gpuwheels/fa3_fwd-*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --find-links .gpuwheels fa3-fwd >/dev/null 2>&1 \
    || echo "fa3-fwd: the carried wheel did not install" >&2
fi
"$PY" -c "from yue2_core.fast import flash_attn as f; h = f.find(); print('NAR attention: FlashAttention-3 from', h[1]) if h else print('NAR attention: PyTorch SDPA (no FlashAttention-3 interface:', f.why_not() + ')')" \
  | tee -a "$OUT/versions.txt"
[ $# -gt 0 ] || { echo "usage: bash bench/gpu_session.sh bench|cold|tests|int8dot|parts|next|lora|batch|split|nar|w8a8|layer|layeropts|fewer|floor|splits|attn|l2|nodes|nodescold|takes|scale ..." >&2; exit 2; }
for part in "$@"; do
  case "$part" in
    bench)
      "$PY" bench/bench.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
      "$PY" bench/profile_decode.py 2>&1 | tee "$OUT/profile_decode.log"
      "$PY" bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors 2>&1 \
        | tee "$OUT/profile_decode_int8.log"
      "$PY" bench/cold_start.py --pycache "$OUT/pycache" --json "$OUT/bench.json" 2>&1 | tee "$OUT/cold_start.log" ;;
    int8dot)
      # the int8 × int8 decode products (YUE2_INT8_DOT=int8) against the W8A16 ones: per-shape sweep, the decode
      # step at 1 / CFG / 2 / 4 / 8 rows, numerics; then the int8 step's profile in both modes (~5 min)
      "$PY" bench/int8_dot.py --json "$OUT/int8_dot.json" 2>&1 | tee "$OUT/int8_dot.log"
      "$PY" bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors --int8-dot 2>&1 \
        | tee "$OUT/profile_decode_int8_dot.log" ;;
    cold)
      "$PY" bench/cold_start.py --pycache "$OUT/pycache" --json "$OUT/bench.json" 2>&1 | tee "$OUT/cold_start.log"
      "$PY" bench/warmup_profile.py --top 20 > "$OUT/warmup_profile.log" 2>&1
      YUE2_BENCH_INT8=/tmp/yue2bench/yue2_full_int8.safetensors "$PY" -m pytest tests/core/test_warmup_gpu.py -s -q \
        -p no:cacheprovider 2>&1 | tee "$OUT/warmup_gpu_tests.log" ;;
    tests)
      # every GPU test file (each skips without CUDA); soundfile (batch song folders) from carried wheels if present
      [ -d .gpuwheels ] && "$PY" -m pip install --no-index --find-links .gpuwheels soundfile >/dev/null 2>&1
      gpu_files=(tests/core/test_cuda_fast.py); for f in tests/core/test_render_gpu.py tests/batch/test_batch_gpu.py \
          tests/weights/test_lora_gpu.py tests/core/test_side_capture_gpu.py tests/core/test_w8a8_gpu.py; do [ -f "$f" ] && gpu_files+=("$f"); done
      YUE2_PARITY_DIR=${YUE2_PARITY_DIR:-.gpuparity} "$PY" -m pytest "${gpu_files[@]}" -s -q \
        -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" ;;
    parts)
      "$PY" bench/decode_parts.py --json "$OUT/decode_parts.json" 2>&1 | tee "$OUT/decode_parts.log"
      "$PY" bench/gemv_sweep.py --quick --json "$OUT/gemv_sweep.json" 2>&1 | tee "$OUT/gemv_sweep.log" ;;
    next)
      "$PY" bench/gemv_sweep.py --cc-only --rows 1,2 --budget-s 240 --json "$OUT/gemv_sweep_cc.json" 2>&1 \
        | grep -v "^  skip" | tee "$OUT/gemv_sweep_cc.log"
      table=(); [ -f "$OUT/gemv_sweep_cc.json" ] && table=(--gemv-table "$OUT/gemv_sweep_cc.json")
      "$PY" bench/bench.py --skip nar,vae,song "${table[@]}" --json "$OUT/bench_next.json" 2>&1 \
        | tee "$OUT/bench_next.log"
      "$PY" bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors "${table[@]}" 2>&1 \
        | tee "$OUT/profile_decode_int8_next.log" ;;
    lora)
      "$PY" -m pytest tests/weights/test_lora_gpu.py -s -q -p no:cacheprovider 2>&1 | tee "$OUT/lora_gpu_tests.log"
      "$PY" bench/lora.py --json "$OUT/lora.json" 2>&1 | tee "$OUT/lora_bench.log" ;;
    batch)
      # song folders need soundfile (FLAC), which the GPU machine's image lacks: carry its wheel in .gpuwheels/
      # (pip download soundfile cffi pycparser --only-binary=:all: -d .gpuwheels) and install it first
      [ -d .gpuwheels ] && "$PY" -m pip install --no-index --find-links .gpuwheels soundfile >/dev/null 2>&1
      "$PY" -c "import soundfile" 2>/dev/null || echo "batch: soundfile missing — carry .gpuwheels (see above)"
      # shellcheck disable=SC2086  # BATCH_ARGS is a list of options (e.g. --runs 8:on,8:off)
      "$PY" bench/batch.py --songs ${BATCH_SONGS:-16} ${BATCH_ARGS:-} --json "$OUT/batch.json" 2>&1 \
        | grep -v "^\[\|^  " | tee "$OUT/batch_bench.log" ;;
    split)
      # bench/overlap_split.py (issue #19): AR batch decode and render alone and at once, on streams of different
      # priority or in CUDA green contexts (torch.cuda.green_contexts needs cuda-bindings: carried in .gpuwheels)
      "$PY" -c "import cuda.bindings" 2>/dev/null || { [ -d .gpuwheels ] && "$PY" -m pip install --no-index \
        --find-links .gpuwheels cuda-bindings >/dev/null 2>&1; }
      "$PY" bench/overlap_split.py ${SPLIT_ARGS:-} 2>&1 | tee "$OUT/overlap_split.log" ;;
    nar)
      "$PY" bench/nar_attention.py --json "$OUT/nar_attention.json" 2>&1 | tee "$OUT/nar_attention.log" ;;
    w8a8)
      # the quantizer's rotations and row scales against the exact values and w8a8.reference (bench/w8a8_rotation.py)
      "$PY" bench/w8a8_rotation.py 2>&1 | tee "$OUT/w8a8_rotation.log"
      "$PY" -m pytest tests/core/test_w8a8_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/w8a8_gpu_tests.log"
      "$PY" bench/nar_w8a8.py --ode --json "$OUT/nar_w8a8.json" 2>&1 | tee "$OUT/nar_w8a8.log" ;;
    layer)
      "$PY" bench/layer_kernel.py --tiny 2>&1 | tee "$OUT/layer_tiny.log"
      "$PY" bench/layer_kernel.py --fmts int8,bf16 --rows 1,2 --modes off,cuda --phase-times --json "$OUT/layer.json" \
        2>&1 | tee "$OUT/layer_kernel.log"
      "$PY" bench/stream_floor.py 2>&1 | tee "$OUT/stream_floor.log"
      "$PY" bench/cluster_floor.py 2>&1 | tee "$OUT/cluster_floor.log" ;;
    layeropts)
      # the CUDA layer kernel's experimental switches (YUE2_LAYER_CUDA_OPTS, stop 58, not yet run on a GPU): int8,
      # batch 1, each switch alone and both, with phase stamps, against the per-kernel step; then the layer-kernel
      # GPU tests with both on (~3 min)
      "$PY" bench/layer_kernel.py --fmts int8 --rows 1 --modes off,cuda,cuda:pipe,cuda:fexp,cuda:pipe+fexp \
        --phase-times --json "$OUT/layer_opts.json" 2>&1 | tee "$OUT/layer_opts.log"
      YUE2_LAYER_CUDA_OPTS=pipe,fexp "$PY" -m pytest tests/core/test_cuda_fast.py -k layer_kernel -q -s \
        -p no:cacheprovider 2>&1 | tee "$OUT/layer_opts_tests.log" ;;
    fewer)
      for kv in 1 2 1.1 1.8 8; do
        "$PY" bench/stream_floor.py --kv-scale "$kv" --anatomy --ring ring-nosync:12:16 ring:12:16 ring:12:16:0:23 \
          ring:12:16:0:21 ring:12:16:0:20 2>&1 | tee -a "$OUT/stream_floor_fewer.log"
      done
      # the bf16 file's step: the weights twice the bytes (no bf16 floor had been measured)
      "$PY" bench/stream_floor.py --weight-scale 2 --anatomy --ring ring-nosync:12:16 ring:12:16 ring:12:16:0:23 \
        ring:12:16:0:21 ring:12:16:0:20 2>&1 | tee -a "$OUT/stream_floor_fewer.log" ;;
    floor)
      "$PY" bench/step_floor.py --fmt int8 2>&1 | tee "$OUT/step_floor_int8.log"
      "$PY" bench/step_floor.py --fmt bf16 2>&1 | tee "$OUT/step_floor_bf16.log"
      "$PY" bench/topk_gap.py 2>&1 | tee "$OUT/topk_gap.log"
      [ -f /tmp/yue2bench/yue2_full_int8.safetensors ] || "$PY" -c "from yue2_core.weights.synthetic import \
write_synthetic_checkpoint as w; w('/tmp/yue2bench/yue2_full_int8.safetensors', profile='full', fmt='int8', device='cuda')"
      "$PY" bench/capture_cost.py --rounds 3 2>&1 | tee "$OUT/capture_cost.log" ;;
    splits)
      [ -f /tmp/yue2bench/yue2_full_int8.safetensors ] || "$PY" -c "from yue2_core.weights.synthetic import \
write_synthetic_checkpoint as w; w('/tmp/yue2bench/yue2_full_int8.safetensors', profile='full', fmt='int8', device='cuda')"
      # shellcheck disable=SC2046  # one --gemv-table option per variant
      "$PY" bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors --only-l2 --top 6 \
        $("$PY" bench/split_tables.py --out "$OUT/split_tables" --family "${SPLIT_FAMILY:-splits}") 2>&1 \
        | tee "$OUT/profile_int8_${SPLIT_FAMILY:-splits}.log" ;;
    attn)
      "$PY" bench/attn_plan.py 2>&1 | tee "$OUT/attn_plan.log"
      [ -f /tmp/yue2bench/yue2_full_int8.safetensors ] || "$PY" -c "from yue2_core.weights.synthetic import \
write_synthetic_checkpoint as w; w('/tmp/yue2bench/yue2_full_int8.safetensors', profile='full', fmt='int8', device='cuda')"
      for p in 2000 7000; do
        "$PY" bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors --only-l2 --prompt "$p" \
          --top 6 --attn-cfg 16,1,3,4 --attn-cfg 16,1,3,2 --attn-cfg 32,2,3,2 2>&1 | tee -a "$OUT/profile_attn_cfg.log"
      done ;;
    l2)
      # the L2 weight prefetch branch (YUE2_L2_PREFETCH, experimental, off): its bit-identity GPU test, then the int8
      # and bf16 step profiles with the prefetch plans against the default in the same run (~3 min)
      "$PY" -m pytest tests/core/test_cuda_fast.py -k l2_prefetch -s -q -p no:cacheprovider 2>&1 \
        | tee "$OUT/l2_prefetch_tests.log"
      [ -f /tmp/yue2bench/yue2_full_int8.safetensors ] || "$PY" -c "from yue2_core.weights.synthetic import \
write_synthetic_checkpoint as w; w('/tmp/yue2bench/yue2_full_int8.safetensors', profile='full', fmt='int8', device='cuda')"
      for ck in yue2_full_int8 ${L2_BF16:+yue2_full_bf16}; do
        "$PY" bench/profile_decode.py --checkpoint "/tmp/yue2bench/$ck.safetensors" --only-l2 --top 6 \
          --l2 'qkv:o,gu;o:down,qkv+' --l2 'qkv:gu;o:down,qkv+' --l2 'qkv:o,gu,down;o:qkv+' \
          --l2 'qkv:o,gu;o:down,qkv+@32:64' --l2 'qkv:o,gu;o:down,qkv+@4:256' --l2 'start:gu;attn:down;gu:qkv+' \
          --l2 'start:kv;qkv:o,gu;o:down,qkv+' --l2 'down:kv+;qkv:o,gu;o:down,qkv+' \
          ${L2_ARGS:-} 2>&1 | tee "$OUT/profile_l2_$ck.log"
      done
      # where the 8-candidate step's idle time lies (0.19–0.25 ms a step the kernel sum does not cover)
      "$PY" bench/profile_decode.py --checkpoint /tmp/yue2bench/yue2_full_int8.safetensors --only-l2 --rows 8 --gaps \
        --top 10 --l2 'qkv:o,gu;o:down,qkv+' 2>&1 | tee "$OUT/profile_gaps_rows8.log" ;;
    nodes)
      PYTHONPATH=tests/nodes/gpu_stubs "$PY" tests/nodes/gpu_nodes_check.py --comfy .comfyhost/comfyui --out "$OUT" \
        --full --own-weights --budget-s 420 2>&1 | tail -c 3000 ;;
    nodescold)
      PYTHONPATH=tests/nodes/gpu_stubs "$PY" tests/nodes/gpu_nodes_cold.py --comfy .comfyhost/comfyui --out "$OUT" \
        --compare-reads 2>&1 | tail -c 3000 ;;
    takes)
      PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}tests/nodes/gpu_stubs "$PY" tests/nodes/gpu_takes_check.py \
        --comfy .comfyhost/comfyui --out "$OUT" 2>&1 | tail -c 3000 ;;
    scale)
      if "$PY" -c "import ray, soundfile" 2>/dev/null; then
        # shellcheck disable=SC2086  # SCALE_ARGS is a list of options
        "$PY" bench/scale_ray.py --out "$OUT" --checkpoint-dir /tmp/yue2bench ${SCALE_ARGS:-} 2>&1 | tee "$OUT/scale_ray.log"
      else
        echo "scale: needs ray and soundfile in $PY (pip install '.[ray]'; on a machine without network carry their" \
             "wheels); skipped" >&2
      fi ;;
    *) echo "unknown part $part (bench|cold|tests|int8dot|parts|next|lora|batch|split|nar|w8a8|layer|layeropts|fewer|floor|splits|attn|l2|nodes|nodescold|takes|scale)" >&2; exit 2 ;;
  esac
done
