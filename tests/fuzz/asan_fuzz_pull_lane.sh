#!/usr/bin/env bash
# Fuzz the pull lane's compiled walk built with AddressSanitizer (as asan_fuzz.sh does for the codec).
#
#   tests/fuzz/asan_fuzz_pull_lane.sh [fuzz_pull_lane.py arguments, e.g. --inputs 1000000 --seed 7]
#
# Builds the tidemq._native modules with -fsanitize=address into build/asan-pull-lane (the in-place build
# the editable install uses is left alone) and runs tests/fuzz/fuzz_pull_lane.py on that build of
# _pull_lane with gcc's libasan preloaded and PYTHONMALLOC=malloc (every object its own red zones).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
CC=${CC:-gcc}
out=build/asan-pull-lane
rm -rf "$out"
CFLAGS="-fsanitize=address -fno-omit-frame-pointer -O1 -g" LDFLAGS="-fsanitize=address" \
    "$PY" setup.py -q build_ext --build-lib "$out/lib" --build-temp "$out/tmp"
native="$out/lib/tidemq/_native"
if ! ls "$native"/_pull_lane*.so >/dev/null 2>&1; then
    echo "asan_fuzz_pull_lane: the AddressSanitizer build failed (see above)" >&2
    exit 2
fi
libasan=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then
    echo "asan_fuzz_pull_lane: $CC has no libasan.so" >&2
    exit 2
fi
echo "asan_fuzz_pull_lane: $(ls "$native"/_pull_lane*.so) with $libasan" >&2
LD_PRELOAD="$libasan" PYTHONMALLOC=malloc \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1" \
    "$PY" tests/fuzz/fuzz_pull_lane.py --codec "$native" "$@"
