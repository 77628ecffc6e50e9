#!/usr/bin/env bash
# The GPU check of issue 21: on one CUDA GPU, with the system's PyTorch (2.11+, CUDA build), transformers and the
# project's light dependencies (no network, no vLLM, nothing installed), write one JSON to OUT:
#   profiles     `rlhfless profile` of the Qwen2.5-0.5B and 1.5B shapes (random weights): decode iteration over
#                batch x context, prefill over tokens, cold start, weight copies; the simulator's predicted
#                decode-iteration and prefill seconds beside each measured one (ratio per point)
#   inline_grpo  10 inline GRPO steps of the tiny task on the GPU (step time, tokens/s)
#   gpu_tests    the gpu-marked tests (when pytest is importable)
# A few minutes on an H100/H200 (budget: 8). Without CUDA: exit 2 with one line. Details: docs/gpu.md.
# usage: scripts/gpu_check.sh OUT.json        (PYTHON=/path/to/python to pick the interpreter; default python3)
set -euo pipefail
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: scripts/gpu_check.sh OUT.json" >&2
  exit 2
fi
OUT=$1
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
cd "$REPO"
# what the check imports, named in one line when missing (no traceback)
"$PY" - <<'PYEOF' || exit 2
import importlib.util, sys
need = ["torch", "transformers", "safetensors", "numpy", "yaml", "tqdm", "pandas", "scipy", "sklearn"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    print(f"gpu_check: missing Python packages for {sys.executable}: {', '.join(missing)}", file=sys.stderr)
    sys.exit(2)
from importlib.metadata import version
v = version("transformers")
if not v.split(".")[0].isdigit() or int(v.split(".")[0]) < 5:  # pyproject.toml: transformers>=5 (cache API)
    print(f"gpu_check: transformers {v} is too old for rlhfless (needs >= 5, see pyproject.toml)", file=sys.stderr)
    sys.exit(2)
PYEOF
exec timeout 600 "$PY" -m rlhfless.bench.gpucheck "$OUT"
