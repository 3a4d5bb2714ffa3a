#!/usr/bin/env bash
# Issue 13's measurements on the 16-core device machine, in one lease.
#
#   OUT=/some/dir DEADLINE_S=480 [STEPS="networks16 profile16 ..."] bash benchmarks/device_check.sh
#
# STEPS picks steps by name (default: all, in the order below; about 8 minutes on the 16-core
# machine with the first compile, so give DEADLINE_S what the lease allows and the rest is skipped).
# Every step runs under its own timeout, clipped so that the whole script ends within DEADLINE_S
# seconds; a step that runs out is reported (rc=124) and the next one starts. Everything goes to
# $OUT/log.txt (and stdout); the profile's bar chart to $OUT/profile_resnet50.png.
# Order: what the issue asks to show first (networks at 16 threads), the assembly strips' bitwise
# tests on this CPU, networks and the ResNet18 training step at 2 threads, scaling, 1x1 single-core
# efficiency, where the time goes (profile, per layer against ORT), then issue 9's modern suite and
# the remaining tests. The networks rows end with where tilefuse's task loops ran (`regions numba N /
# narrowed N / our pool N`: threads.region_plan), so a slow row says whether it ran on our Python pool.
set -u
OUT=${OUT:-/tmp/tilefuse_device}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-480}
CASES=${CASES:-"resnet50:1 resnet50:32 resnet18:16 vgg16:16"}

# prewarm: one process per case compiles its kernels at the same time (benchmarks/prewarm.py), while the
# AVX-512 bitwise tests run beside it (their output in $OUT/tests_*.txt); the timed steps then load
# every kernel from numba's cache instead of compiling ~3 minutes inside the first case (PREWARM_TESTS=0: the
# compiles alone). modern2b1 (not in the default STEPS): issue 9's batch-1 cases with more rounds.
PREWARM=${PREWARM:-"resnet50:1:16 resnet50:32:16 resnet18:16:16 vgg16:16:16 resnet50:1:2 resnet50:32:2 resnet18:16:2
  vgg16:16:2 mobilenet_v2:1:2 mobilenet_v2:32:2 efficientnet_b0:1:2 efficientnet_b0:32:2 regnet_y_400mf:1:2
  regnet_y_400mf:32:2 convnext_tiny:1:2 convnext_tiny:32:2 unet:1:2"}

STEPS=${STEPS:-"prewarm isa networks16 test_tiles networks2 train2 scaling32 scaling1 conv1x1 profile16 vs_ort16 test_isa modern2 idle16 align vs_ort2 vs_ort2_mnv2 test_threads"}

step() {  # step NAME SECONDS CMD...   (only the steps named in $STEPS run)
    local name=$1 want=$2; shift 2
    case " $STEPS " in *" $name "*) ;; *) return ;; esac
    local left=$((START + DEADLINE_S - $(date +%s)))
    local t=$((want < left ? want : left))
    if [ "$t" -le 5 ]; then echo "== $name: skipped, no time left"; return; fi
    echo "== $name (limit ${t}s, at $(($(date +%s) - START))s): $*"
    timeout "$t" "$@" 2>&1
    echo "== $name rc=$? after $(($(date +%s) - START))s"
}

{
    date -u
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)|L2|L3|Flags" | sed 's/Flags:.*/flags: &/' | cut -c1-200
    grep -o -w -E "avx512f|avx512_bf16|amx_tile|avx512_vnni" /proc/cpuinfo | sort | uniq -c
    "$PY" -c "import numpy, numba, torch, onnxruntime as o; print('numpy', numpy.__version__, 'numba', numba.__version__, 'torch', torch.__version__, 'ort', o.__version__)"
    step prewarm 280 bash -c "
        [ \"${PREWARM_TESTS:-1}\" = 0 ] || {
        $PY -m pytest -q -p no:cacheprovider tests/test_register_tiles.py tests/test_channel_shuffle.py \
            -k 'strips_same_bits or direct_tiles or stem_tiles or k1x1_tiles or shuffle' > $OUT/tests_tiles.txt 2>&1 &
        $PY -m pytest -q -p no:cacheprovider tests/test_isa.py > $OUT/tests_isa.txt 2>&1 &
        $PY benchmarks/training.py --models resnet18 --threads 2 --steps 1 --no-unfused > /dev/null 2>&1 & }
        $PY benchmarks/prewarm.py $(echo $PREWARM)
        wait; tail -n 4 $OUT/tests_tiles.txt $OUT/tests_isa.txt 2>/dev/null; true"
    step isa 60 "$PY" -c "from tilefuse.kernels import isa; print(isa.info())"
    step networks16 200 "$PY" benchmarks/networks.py --cases $CASES --threads 16 --reps 3
    step test_tiles 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_register_tiles.py \
        -k "strips_same_bits or direct_tiles or stem_tiles or k1x1_tiles"
    step networks2 200 taskset -c 0,1 "$PY" benchmarks/networks.py --cases $CASES --threads 2 --reps 3 --no-cl
    step train2 150 taskset -c 0,1 "$PY" benchmarks/training.py --models resnet18 --threads 2 --steps 5 \
        --no-unfused
    step scaling32 100 "$PY" benchmarks/scaling.py --batches 32 --threads-list 1,16 --no-layers --reps 2
    step scaling1 100 "$PY" benchmarks/scaling.py --batches 1 --threads-list 1,16 --no-layers --reps 3
    step conv1x1 90 "$PY" benchmarks/conv_layers.py --threads 1 --batch 1 32 --repeat 3 \
        --layers 1x1_56 1x1_28 1x1_14 1x1_7
    step profile16 60 "$PY" -m tilefuse.cli profile resnet50 --threads 16 --plot "$OUT/profile_resnet50.png"
    step vs_ort16 150 "$PY" benchmarks/layers_vs_ort.py resnet50 --threads 16 --repeat 20
    step test_isa 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_isa.py   # its cases compile in subprocesses: >90 s on the device (tenth session)
    step modern2 200 taskset -c 0,1 "$PY" benchmarks/networks.py --suite modern --threads 2 --reps 3 --no-cl
    step modern2b1 200 taskset -c 0,1 "$PY" benchmarks/networks.py --cases mobilenet_v2:1 efficientnet_b0:1 \
        convnext_tiny:1 regnet_y_400mf:1 --threads 2 --reps 9 --no-cl
    step idle16 120 "$PY" benchmarks/idle_gaps.py --model resnet50 --threads 16 --gaps 0 0.2 1 --reps 7
    step align 60 "$PY" benchmarks/alignment.py --threads 1 16 --rounds 20
    step vs_ort2 90 taskset -c 0,1 "$PY" benchmarks/layers_vs_ort.py resnet50 --threads 2 --repeat 10
    step vs_ort2_mnv2 60 taskset -c 0,1 "$PY" benchmarks/layers_vs_ort.py mobilenet_v2 --threads 2 --repeat 20
    step test_threads 150 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_conv_threads.py
} 2>&1 | tee "$OUT/log.txt"
