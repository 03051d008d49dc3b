"""Maps the on-disk layout to import names, and builds the compiled codec.

The kernel lives in ``core/`` and imports as ``tidemq``; each built-in plugin lives in
``plugins/<name>/`` and imports as ``tidemq_<name>``.  Nothing installs a bare ``core`` or
``plugins`` package.

``core/_native/_*.pyx`` are compiled to ``tidemq._native._*`` (one module per family of the record
codec, see ``tidemq._native``) with Cython (a build requirement, from PyPI) and the machine's C
compiler.  Where that is not possible (no compiler,
no Python headers, no Cython) the install still succeeds, with one warning, and tidemq runs its
pure-Python codec: ``tidemq._native.DESCRIPTION`` (``tidemq --version``) says which one runs.
``CFLAGS``/``LDFLAGS`` reach the compiler as usual (``tox -e fuzz-asan`` builds with
AddressSanitizer that way).
"""

import os
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

ROOT = Path(__file__).parent
package_dir = {"tidemq": "core"}
for plugin in sorted((ROOT / "plugins").iterdir()):
    if (plugin / "__init__.py").is_file():
        package_dir[f"tidemq_{plugin.name}"] = f"plugins/{plugin.name}"

packages = []
for top, src in package_dir.items():
    packages.append(top)
    packages.extend(f"{top}.{sub}" for sub in find_packages(src))

package_data = {p: ["py.typed"] for p in package_dir}
package_data["tidemq._native"] = ["*.pyi", "*.pyx", "*.pxi"]
package_data["tidemq_flush"] = ["py.typed", "*.pyi", "*.pyx"]
package_data["tidemq_spark"] = ["py.typed", "*.pyi", "*.pyx"]
package_data["tidemq_store_mmap"] = ["py.typed", "*.pyx"]
package_data["tidemq_console"] = ["py.typed", "templates/*.html", "static/*"]

#: What a missing or failing compiler raises (spawn errors, a missing Python.h, a link failure).
_BUILD_ERRORS = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)
_FALLBACK = "tidemq will run its pure-Python codec (tidemq._native.DESCRIPTION says so)"


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """``build_ext`` that leaves the pure-Python codec in place when the C build fails.

    One warning for the whole build, whatever failed; the install goes on without the module.
    """

    _warned = False

    def run(self) -> None:
        try:
            super().run()
        except _BUILD_ERRORS as exc:
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as exc:
            self._skip(exc)

    def copy_extensions_to_source(self) -> None:
        # Unlink, then copy: a new file rather than the loaded one rewritten in place, which would
        # crash (SIGBUS) every running process that has the old module mapped.
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace, regular = self._get_inplace_equivalent(build_py, ext)
            if os.path.exists(regular) and os.path.exists(inplace):
                os.unlink(inplace)
        super().copy_extensions_to_source()

    def _skip(self, exc: BaseException) -> None:
        if not OptionalBuildExt._warned:
            OptionalBuildExt._warned = True
            _warn(f"the compiled codec (tidemq._native) was not built: {exc}; {_FALLBACK}")


def native_extensions() -> list[Extension]:
    # optional: when it is not built, nothing is copied next to the sources (and nothing fails).
    # The record codec, one module per family (tidemq._native.MODULES); they include _*.pxi.
    # Each includes every shared helper, used or not: no warning for the unused ones.
    quiet = [] if sys.platform == "win32" else ["-Wno-unused-function"]
    codec = [
        Extension(
            f"tidemq._native.{path.stem}",
            [f"core/_native/{path.name}"],
            optional=True,
            extra_compile_args=quiet,
        )
        for path in sorted((ROOT / "core" / "_native").glob("_*.pyx"))
    ]
    # The hash index's key hashing and IndexFile insertion (tidemq_index_hash.native loads it).
    index = Extension("tidemq_index_hash._native", ["plugins/index_hash/_native.pyx"], optional=True)
    # The Spark sources' column builder (tidemq_spark.schema falls back to its Python reference).
    spark = Extension("tidemq_spark._columns", ["plugins/spark/_columns.pyx"], optional=True)
    # The duplicate window's key table (tidemq.broker.dedup_table falls back to its Python reference).
    dedup = Extension("tidemq.broker._dedup_table", ["core/broker/_dedup_table.pyx"], optional=True)
    # The native gRPC server's HPACK decoder (tidemq_transport_grpc.h2_frames falls back to hpack's).
    hpack = Extension("tidemq_transport_grpc._hpack", ["plugins/transport_grpc/_hpack.pyx"], optional=True)
    # The sync flush policy's round worker (tidemq_flush.native_rounds falls back to its flush thread).
    flush = Extension("tidemq_flush._round", ["plugins/flush/_round.pyx"], optional=True)
    # The mmap store's put of a call's groups (tidemq_store_mmap.group_put falls back to its Python reference).
    group_put = Extension(
        "tidemq_store_mmap._group_put", ["plugins/store_mmap/_group_put.pyx"], optional=True
    )
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn(f"Cython is not installed, so the compiled codec is not built; {_FALLBACK}")
        return []
    # Generated C goes under build/ (ignored); a .pyx newer than its .c is translated again.
    extensions = cythonize(
        [*codec, index, spark, dedup, hpack, flush, group_put],
        build_dir="build/cython",
        quiet=True,
        language_level=3,
    )
    for built in extensions:  # cythonize's copies do not keep the flag
        built.optional = True
    return extensions


# ---- gRPC stubs (tidemq_transport_grpc): generated at build time, never checked in -------------
GRPC_PROTO = ROOT / "plugins" / "transport_grpc" / "tidemq_rocketmq_v2.proto"
package_data["tidemq_transport_grpc"] = ["py.typed", "*.proto", "*.pyi", "*.pyx"]


class BuildPyWithGrpcStubs(build_py):
    """``build_py`` that first runs grpcio-tools' protoc (a build requirement) over the gRPC
    transport's ``.proto``, writing ``tidemq_rocketmq_v2_pb2.py``/``.pyi`` beside it.  Without
    grpcio-tools the build goes on with one warning; the plugin then says so when selected."""

    def run(self) -> None:
        try:
            from grpc_tools import protoc  # type: ignore[import-untyped]
        except ImportError:
            _warn("grpcio-tools is not installed: the gRPC transport's stubs are not generated")
        else:
            import importlib.resources

            includes = str(importlib.resources.files("grpc_tools") / "_proto")
            src = str(GRPC_PROTO.parent)
            argv = ["protoc", f"-I{src}", f"-I{includes}", f"--python_out={src}", f"--pyi_out={src}"]
            if protoc.main([*argv, str(GRPC_PROTO)]) != 0:
                raise SystemExit(f"protoc failed on {GRPC_PROTO}")
        super().run()


setup(
    package_dir=package_dir,
    packages=packages,
    package_data=package_data,
    ext_modules=native_extensions(),
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithGrpcStubs},
)
