#!/usr/bin/env bash
# The GPU proof (issue 30), one command: every attention kernel x design against float64, bench_train against the
# real training loop (tokens/s, MFU), greedy decoding in fp32 and bf16 against transformers on the same weights,
# FlexAttention training, the arena's quick mode, FSDP2 when several GPUs are present. At most 10 minutes on one
# H100/H200; writes runs/gpu_proof/proof.json and proof.md. Nothing is downloaded. Run again, it replaces its earlier
# run in the same --out (the prepared data is kept); a folder that no proof wrote is refused, not cleared.
#
#   bash scripts/gpu_proof.sh [--dry-run] [--wheels DIR] [--out DIR] [--parts kernels,train,...] [--budget-s 600]
#
#   --dry-run     every part on the CPU at tiny sizes (seconds; the test suite runs it)
#   --wheels DIR  first install what is missing from the wheel files in DIR, offline (pip --no-index)
#
# It needs torch and the project's runtime packages (numpy, pyyaml, tqdm, tensorboard, matplotlib, tiktoken), not
# Hydra: it calls the library the scripts call. transformers is optional (without it decoding is measured on this
# project's side only). On a machine without them and without a network (a GPU image with torch alone), fetch the
# wheels where there is a network, carry the folder over, and pass it:
#
#   pip download -d wheels numpy pyyaml tqdm tensorboard matplotlib tiktoken transformers \
#       hydra-core omegaconf antlr4-python3-runtime      # hydra-core, omegaconf, antlr4: for scripts/*.py afterwards
#   bash scripts/gpu_proof.sh --wheels wheels
#
# (pip download fetches wheels for its own Python and platform: use the GPU machine's, or add --python-version,
# --platform manylinux2014_x86_64 --only-binary=:all:.)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
wheels=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="${2:?--wheels needs a folder}"; shift 2 ;;
    --wheels=*) wheels="${1#*=}"; shift ;;
    -h|--help) sed -n '2,/^set -e/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

# module:package pairs; required first, then the ones installed only when their wheels are in DIR
required="torch:torch numpy:numpy yaml:pyyaml tqdm:tqdm tensorboard:tensorboard matplotlib:matplotlib tiktoken:tiktoken"
optional="transformers:transformers hydra:hydra-core omegaconf:omegaconf antlr4:antlr4-python3-runtime"
missing() {  # the packages of the given module:package pairs whose module is not installed (one process, no imports)
  "$PYTHON" -c 'import importlib.util, sys
print(" ".join(p.split(":")[1] for p in sys.argv[1:] if importlib.util.find_spec(p.split(":")[0]) is None))' "$@"
}
if [ -n "$wheels" ]; then
  [ -d "$wheels" ] || { echo "error: --wheels $wheels is not a folder" >&2; exit 2; }
  want="$(missing $required $optional)"
  for package in $want; do  # each on its own: a wheel that is not there leaves the others to install
    if [ "$package" = torch ]; then continue; fi
    "$PYTHON" -m pip install --quiet --no-index --find-links "$wheels" "$package" \
      || echo "note: $package: no usable wheel in $wheels" >&2
  done
fi
lacking="$(missing $required)"
if [ -n "$lacking" ]; then
  echo "error: missing Python packages: $lacking" >&2
  echo "hint: pip install $lacking; offline: pip download -d wheels $lacking on a machine with a network, carry" \
       "wheels/ here, then: bash scripts/gpu_proof.sh --wheels wheels (bash scripts/gpu_proof.sh --help)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m benchmarks.gpu_proof "${args[@]+"${args[@]}"}"
