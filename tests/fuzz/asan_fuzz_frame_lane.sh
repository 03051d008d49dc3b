#!/usr/bin/env bash
# Fuzz the send lane's compiled wire ends built with AddressSanitizer (as asan_fuzz_lane.sh does for its prepare step).
#
#   tests/fuzz/asan_fuzz_frame_lane.sh [fuzz_frame_lane.py arguments, e.g. --inputs 1000000 --seed 7]
#
# Builds the tidemq._native modules with -fsanitize=address into build/asan-frame (the in-place build
# the editable install uses is left alone) and runs tests/fuzz/fuzz_frame_lane.py on that build of
# _frame_lane with gcc's libasan preloaded and PYTHONMALLOC=malloc (every object its own red zones).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
CC=${CC:-gcc}
out=build/asan-frame
rm -rf "$out"
CFLAGS="-fsanitize=address -fno-omit-frame-pointer -O1 -g" LDFLAGS="-fsanitize=address" \
    "$PY" setup.py -q build_ext --build-lib "$out/lib" --build-temp "$out/tmp"
native="$out/lib/tidemq/_native"
if ! ls "$native"/_frame_lane*.so >/dev/null 2>&1; then
    echo "asan_fuzz_frame_lane: the AddressSanitizer build failed (see above)" >&2
    exit 2
fi
libasan=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then
    echo "asan_fuzz_frame_lane: $CC has no libasan.so" >&2
    exit 2
fi
echo "asan_fuzz_frame_lane: $(ls "$native"/_frame_lane*.so) with $libasan" >&2
LD_PRELOAD="$libasan" PYTHONMALLOC=malloc \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1" \
    "$PY" tests/fuzz/fuzz_frame_lane.py --codec "$native" "$@"
