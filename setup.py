"""Maps the on-disk layout to import names.

The kernel lives in ``core/`` and imports as ``tidemq``; each built-in plugin lives in
``plugins/<name>/`` and imports as ``tidemq_<name>``.  Nothing installs a bare ``core`` or
``plugins`` package.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
package_dir = {"tidemq": "core"}
for plugin in sorted((ROOT / "plugins").iterdir()):
    if (plugin / "__init__.py").is_file():
        package_dir[f"tidemq_{plugin.name}"] = f"plugins/{plugin.name}"

packages = []
for top, src in package_dir.items():
    packages.append(top)
    packages.extend(f"{top}.{sub}" for sub in find_packages(src))

setup(package_dir=package_dir, packages=packages, package_data={p: ["py.typed"] for p in package_dir})
