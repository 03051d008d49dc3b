#!/usr/bin/env bash
# Fuzz the compiled codec built with AddressSanitizer (tox -e fuzz-asan).
#
#   tests/fuzz/asan_fuzz.sh [fuzz_native_codec.py arguments, e.g. --inputs 1000000 --seed 7]
#
# Builds the tidemq._native modules with -fsanitize=address into build/asan (the in-place build the
# editable install uses is left alone), then runs tests/fuzz/fuzz_native_codec.py on that build
# with gcc's libasan preloaded.  PYTHONMALLOC=malloc gives every bytes object a malloc block of
# its own, with red zones around it: pymalloc would pack small objects into shared arenas, where
# a read past one object lands in the next instead of in a red zone.  Exit status: the fuzzer's
# (1 on a difference), or ASan's report and abort on a bad read or write.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
CC=${CC:-gcc}
out=build/asan
rm -rf "$out"
CFLAGS="-fsanitize=address -fno-omit-frame-pointer -O1 -g" LDFLAGS="-fsanitize=address" \
    "$PY" setup.py -q build_ext --build-lib "$out/lib" --build-temp "$out/tmp"
native="$out/lib/tidemq/_native"
so=$(ls "$native"/_*.so 2>/dev/null || true)
expected=$(ls core/_native/_*.pyx | wc -l)
if [ "$(echo "$so" | grep -c '\.so$')" -ne "$expected" ]; then
    echo "asan_fuzz: the AddressSanitizer build failed (see above)" >&2
    exit 2
fi
libasan=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then
    echo "asan_fuzz: $CC has no libasan.so" >&2
    exit 2
fi
echo "asan_fuzz: $(echo $so) with $libasan" >&2
LD_PRELOAD="$libasan" PYTHONMALLOC=malloc \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=1" \
    "$PY" tests/fuzz/fuzz_native_codec.py --codec "$native" "$@"
