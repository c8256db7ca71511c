#!/usr/bin/env bash
# DALI and TorchCodec on the GPU machine, which has neither and reaches no registry: the wheels travel
# in pieces (each call carries at most 64 MiB with the working tree), are joined in /tmp and installed
# with ONE pip call (a second `--target --upgrade` replaces the shared nvidia/ folder and loses DALI).
# benchmarks/device_dali.md gives the calls. Run from the repository root.
#
#   prepare          here: download benchmarks/device_dali.txt into .whl/dali/wheels, check the
#                    sums, tar them and split the tar into $PIECES pieces in .whl/dali/pieces
#   piece            there: keep the carried piece(s) in /tmp/dali (survives between warm calls)
#   data             there: make the 10,000-image set /tmp/inet and pack /tmp/shards --dali-index
#   install          there: join the pieces, check the sums, pip install --target /tmp/site
#   check            there: versions, the DALI tests (GPU decode too), dali_read.py, bench_decoders.py
#   train MODEL SIZE there: shardkit bench --train MODEL with every loader, DALI's two included
set -euo pipefail
PIECES=5
WHL=.whl/dali                                   # under the repository root (git-ignored: /.whl/)
HERE=$(cd "$(dirname "$0")" && pwd)
LIST=$HERE/device_dali.txt SUMS=$HERE/device_dali.sha256
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

site_env() {
    export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
    export LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

case "${1:-}" in
prepare)
    py=${PYTHON:-python3}
    mkdir -p "$WHL/wheels" "$WHL/pieces"
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHL/wheels" -r "$LIST"
    (cd "$WHL/wheels" && sha256sum --quiet -c "$SUMS")
    rm -f "$WHL/pieces/"* "$WHL/wheels.tar"
    (cd "$WHL/wheels" && tar -cf ../wheels.tar $(cut -c67- "$SUMS"))
    split -n "$PIECES" -d -a 1 "$WHL/wheels.tar" "$WHL/pieces/wheels.tar."
    rm "$WHL/wheels.tar"
    ls -l "$WHL/pieces"
    ;;
piece)
    mkdir -p /tmp/dali
    cp -v "$WHL"/pieces/wheels.tar.* /tmp/dali/
    ls /tmp/dali
    ;;
data)
    if [ ! -f /tmp/shards/index.json ]; then
        python3 -m sample_data.generate imagenet-like /tmp/inet --classes 20 --per-class 500 --seed 0 --workers 16
        PYTHONPATH=. python3 -m shardkit pack /tmp/inet /tmp/shards --workers 16 --dali-index -q
    fi
    ls /tmp/shards | head -4; du -sh /tmp/inet /tmp/shards
    ;;
install)
    have=$(ls /tmp/dali/wheels.tar.* 2>/dev/null | wc -l)
    if [ "$have" != "$PIECES" ]; then
        echo "/tmp/dali holds $have of $PIECES pieces: a call found a fresh machine; start again from call 1"
        exit 1
    fi
    mkdir -p /tmp/dali/wheels
    cat /tmp/dali/wheels.tar.? | tar -x -C /tmp/dali/wheels
    (cd /tmp/dali/wheels && sha256sum --quiet -c "$SUMS")
    rm /tmp/dali/wheels.tar.?
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/dali/wheels/*.whl
    echo "installed $(ls /tmp/dali/wheels | wc -l) wheels into /tmp/site ($(du -sh /tmp/site | cut -f1))"
    ;;
check)
    site_env
    set +e  # every step runs and reports, whatever the one before did
    python3 -c "import torch, torchvision, nvidia.dali as d, torchcodec as tc, webdataset; \
print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'dali', d.__version__, 'torchcodec', \
tc.__version__, torch.cuda.get_device_name(0)); print('nvidia.dali from', d.__file__)"
    python3 -m pytest -q -p no:cacheprovider -rs tests/interop/test_dali.py tests/bench/test_dali.py \
        > "$OUT/pytest_dali.txt" 2>&1
    echo "pytest exit $?"; tail -8 "$OUT/pytest_dali.txt"
    python3 benchmarks/dali_read.py /tmp/shards --device cuda --threads 8 --batches 300 --size 176 \
        --imagefolder /tmp/inet --out "$OUT/dali_read.json" > "$OUT/dali_read.txt" 2>&1
    echo "dali_read exit $?"; grep -v -i -E "warn|deprecat" "$OUT/dali_read.txt" | tail -30
    python3 benchmarks/bench_decoders.py --device cuda --rounds 7 > "$OUT/decoders_cuda.txt" 2>&1
    echo "bench_decoders exit $?"; cat "$OUT/decoders_cuda.txt"
    ;;
train)
    site_env
    model=${2:?model}; size=${3:?size}
    python3 -m shardkit bench /tmp/inet --shards /tmp/shards --device cuda --train "$model" --size "$size" \
        --workers 8 --batch-size 128 --steps 200 --warmup 15 --repeats 3 --contender imagefolder \
        --contender shardloader --contender dali --contender dali_files \
        --out "$OUT/train-$model.json"
    ;;
*)
    sed -n '2,14p' "$0"; exit 2
    ;;
esac
