#!/usr/bin/env bash
# The GPU check, one call away: on a bare machine with one NVIDIA GPU and a CUDA build of torch (a Vertex AI Workbench
# GPU instance, a Deep Learning VM, or any box with nothing to download from), from what lies beside the checkout.
#
#   bash benchmarks/device_check.sh --prepare   # here, where PyPI answers: the pinned wheels, tokenizer and data
#   bash benchmarks/device_check.sh             # there: the ratio table, then the CUDA-only tests (about 8 minutes)
#   bash benchmarks/device_check.sh --dry-run   # anywhere: check what it carries, print what it would run
#
# --prepare fills .device/ (ignored by git; NLI_DEVICE_DIR names another folder): wheels of the transformers and
# datasets constraints.txt pins and of the three pure-Python packages datasets needs beyond a GPU image's own, for
# Python $DEVICE_PYTHON (default 3.12); the MiniLM tokenizer files (from the [smoke] extra), and the data file
# ($NLI_REAL_DATA, else ../shared/data/mnli_dev_matched.jsonl; without one the check trains on the bundled sample).
# On the GPU machine the wheels go into a folder of their own, first on PYTHONPATH: torch, accelerate and the rest are
# the machine's, and the report names the torch build it used. Figures go to $NLI_DEVICE_OUT (default runs/device).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${NLI_DEVICE_DIR:-.device}
OUT=${NLI_DEVICE_OUT:-runs/device}
PY=${PYTHON:-python3}
WHEELS=(transformers datasets dill multiprocess fsspec)
RUNNERS=nli_helpers@bf16,nli_helpers@compile,hf_trainer,hf_trainer@compile
# 2,000 pairs: a 63-step epoch, so the warm-up (an epoch plus 50 steps) ends at step 113 and 287 steps are timed.
CHECK=(benchmarks/gpu_check.py --tokenizer "$DIR/tokenizer" --max-train-samples 2000 --steps 400 --repeats 2
       --runners "$RUNNERS" --out "$OUT/gpu_check.json")
TESTS=(tests/test_compile.py tests/test_gpu_paths.py)

pin() { grep -i "^$1==" constraints.txt || { echo "error: constraints.txt pins no $1" >&2; exit 2; }; }

if [[ ${1:-} == --prepare ]]; then
    mkdir -p "$DIR/wheels" "$DIR/tokenizer"
    pins=(); for name in "${WHEELS[@]}"; do pins+=("$(pin "$name")"); done
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
        --implementation cp --platform manylinux2014_x86_64 -d "$DIR/wheels" "${pins[@]}"
    tokenizer=$("$PY" -c "from nli_helpers.model import resolve_model_path; print(resolve_model_path('minilm-l6'))")
    install -m 0644 "$tokenizer"/{tokenizer.json,tokenizer_config.json,special_tokens_map.json,vocab.txt} "$DIR/tokenizer/"
    data=${NLI_REAL_DATA:-../shared/data/mnli_dev_matched.jsonl}
    if [[ -f $data ]]; then install -m 0644 "$data" "$DIR/data.jsonl"; else echo "note: no $data: the check will use the sample"; fi
    du -sh "$DIR"
    echo "prepared $DIR: carry it beside the checkout and run bash benchmarks/device_check.sh there"
    exit 0
fi

dry=false; [[ ${1:-} == --dry-run ]] && dry=true
[[ -z ${1:-} || $dry == true ]] || { echo "usage: $0 [--prepare | --dry-run]" >&2; exit 2; }

missing=()
for name in "${WHEELS[@]}"; do
    version=$(pin "$name" | cut -d= -f3)
    compgen -G "$DIR/wheels/${name}-${version}-*.whl" > /dev/null || missing+=("the $name $version wheel")
done
[[ -f $DIR/tokenizer/tokenizer.json ]] || missing+=("the tokenizer ($DIR/tokenizer/tokenizer.json)")
if (( ${#missing[@]} )); then
    printf 'error: %s is missing %s. Run bash benchmarks/device_check.sh --prepare where PyPI answers, and carry %s\n' \
        "$DIR" "$(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')" "$DIR" >&2
    exit 2
fi
if [[ -f $DIR/data.jsonl ]]; then CHECK+=(--data "$DIR/data.jsonl"); else CHECK+=(--data sample); fi
SITE=$(mktemp -d /tmp/device-check-site.XXXX)
trap 'rm -rf "$SITE"' EXIT
run() { echo "+ $*"; $dry || "$@"; }

run "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$DIR"/wheels/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
if $dry; then
    # What can be checked without a GPU: the wheels are the pinned ones, and the tokenizer loads.
    "$PY" -c "from transformers import AutoTokenizer; AutoTokenizer.from_pretrained('$DIR/tokenizer')"
    echo "+ ${PY} ${CHECK[*]}"
    echo "+ ${PY} -m pytest -q -p no:cacheprovider ${TESTS[*]}"
    echo "dry run: $DIR holds everything the check needs"
    exit 0
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" -c "import torch, transformers, datasets; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      '| transformers', transformers.__version__, '| datasets', datasets.__version__)"
start=$SECONDS
status=0
"$PY" "${CHECK[@]}" || status=$?
echo "gpu_check: $((SECONDS - start)) s, figures in $OUT/gpu_check.json"
start=$SECONDS
"$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" 2>&1 | tee "$OUT/cuda_tests.log" || status=$?
echo "CUDA-only tests: $((SECONDS - start)) s"
exit $status
