"""Remove the package installers the base image brings (pip, setuptools, wheel and the wheels
ensurepip would install), so the running image cannot install anything.

Run once in the final stage by the base's own Python; it deletes itself too. It looks on the
interpreter's own path, so python:*-slim (under /usr/local) and Debian's python3
(dist-packages, /usr/share/python-wheels) are handled alike.
"""

import glob
import os
import shutil
import sys

PACKAGES = ("pip", "setuptools", "wheel", "pkg_resources", "_distutils_hack")
FILES = ("distutils-precedence.pth",)
WHEELS = ("/usr/share/python-wheels",)
SCRIPTS = ("/usr/bin", "/usr/local/bin")


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    print("removed", path)


def main() -> None:
    found: list[str] = []
    for entry in filter(os.path.isdir, sys.path):
        for name in PACKAGES:
            found += glob.glob(os.path.join(entry, name))
            found += glob.glob(os.path.join(entry, f"{name}-*.dist-info"))
            found += glob.glob(os.path.join(entry, f"{name}-*.egg-info"))
        found += [os.path.join(entry, f) for f in FILES if os.path.exists(os.path.join(entry, f))]
        found += glob.glob(os.path.join(entry, "ensurepip", "_bundled", "*.whl"))
    for folder in WHEELS:
        found += glob.glob(os.path.join(folder, "*.whl"))
    for folder in SCRIPTS:
        found += glob.glob(os.path.join(folder, "pip")) + glob.glob(os.path.join(folder, "pip3*"))
    for path in sorted(set(found)):
        remove(path)
    os.remove(__file__)


if __name__ == "__main__":
    main()
