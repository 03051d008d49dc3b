#!/usr/bin/env bash
# Fuzz the native gRPC server's compiled HPACK decoder built with AddressSanitizer.
#
#   tests/fuzz/asan_fuzz_hpack.sh [fuzz_hpack.py arguments, e.g. --inputs 1000000 --seed 7]
#
# As asan_fuzz.sh: the extensions are built with -fsanitize=address into build/asan-hpack (the
# in-place build is left alone), then tests/fuzz/fuzz_hpack.py runs on that build's
# tidemq_transport_grpc/_hpack with gcc's libasan preloaded and PYTHONMALLOC=malloc (each bytes
# object in a malloc block of its own, with red zones).  Exit status: the fuzzer's (1 on a
# difference from the hpack package), or ASan's report and abort on a bad read or write.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
CC=${CC:-gcc}
out=build/asan-hpack
rm -rf "$out"
CFLAGS="-fsanitize=address -fno-omit-frame-pointer -O1 -g" LDFLAGS="-fsanitize=address" \
    "$PY" setup.py -q build_ext --build-lib "$out/lib" --build-temp "$out/tmp"
so=$(ls "$out"/lib/tidemq_transport_grpc/_hpack*.so 2>/dev/null || true)
if [ -z "$so" ]; then
    echo "asan_fuzz_hpack: the AddressSanitizer build failed (see above)" >&2
    exit 2
fi
libasan=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then
    echo "asan_fuzz_hpack: $CC has no libasan.so" >&2
    exit 2
fi
echo "asan_fuzz_hpack: $so with $libasan" >&2
LD_PRELOAD="$libasan" PYTHONMALLOC=malloc \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1" \
    "$PY" tests/fuzz/fuzz_hpack.py --module "$so" "$@"
