"""Build of dlslime-torch.

Two steps, both inside build_ext so that `pip install -e .` and
`python setup.py build_ext --inplace` do the same thing:

1. the C core, libdlslime.so, with CMake + Ninja (the root CMakeLists.txt),
   copied into the dlslime_torch package;
2. the Python extensions, each linked against that one libdlslime.so with
   rpath $ORIGIN, so every extension in the process shares one core:
   dlslime_torch._C (C, CPython API) and dlslime_torch._shim (C++, the
   torch.distributed backend, built with torch.utils.cpp_extension and
   Ninja).

Metadata lives in pyproject.toml.  torch is imported only to build the
shim; without torch the package builds _C alone and says so (the backend
then reports itself unavailable at run time).
"""

import filecmp
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "dlslime_torch"
CORE_LIBRARY = "libdlslime.so"
# The core's build directory; shared with scripts/run_tests.sh, which
# builds the C tests in the same place.
CORE_BUILD_DIR = os.path.join(ROOT, os.environ.get("DLSLIME_BUILD_DIR", "build"))

# The extensions' object files, wherever build_ext is run from (the name
# setuptools itself gives it under build_base, below).
OBJECT_DIR = os.path.join(CORE_BUILD_DIR, "setuptools",
                          f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")
# Same warning discipline as the core (CMakeLists.txt).
C_FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
           "-fvisibility=hidden"]
# $ORIGIN: the extension finds libdlslime.so beside itself in the package,
# wherever the package is installed.
RPATH_ORIGIN = ["-Wl,-rpath,$ORIGIN"]
# The shim's own warning discipline; torch's headers are included as
# system headers (see dlslime_shim_extension) so their warnings stay out.
CXX_FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]

try:
    from torch.utils import cpp_extension as torch_cpp_extension
except ImportError:  # building without torch: _C only
    torch_cpp_extension = None


class BuildError(RuntimeError):
    pass


def _relative(path):
    return os.path.relpath(path, ROOT)


def _run(cmd):
    print("+ " + " ".join(cmd), flush=True)
    try:
        subprocess.run(cmd, check=True)
    except FileNotFoundError as exc:
        raise BuildError(
            f"'{cmd[0]}' was not found; install it (Debian: apt-get install "
            f"cmake ninja-build gcc) or run scripts/setup.sh") from exc
    except subprocess.CalledProcessError as exc:
        raise BuildError(
            f"building the C core failed: '{' '.join(cmd)}' exited with "
            f"{exc.returncode} (see the compiler output above)") from exc


def _cache_value(cache_file, key):
    """Value of KEY:TYPE=VALUE in a CMakeCache.txt, or None."""
    with open(cache_file, encoding="utf-8") as f:
        for line in f:
            name, sep, value = line.partition("=")
            if sep and name.split(":")[0] == key:
                return value.strip()
    return None


def build_core():
    """Configures (once) and builds libdlslime.so; returns its path.

    An existing build directory is reused as configured, so that running
    the C tests in it and installing the package do not fight over its
    options.  A sanitizer build cannot be loaded into a normal Python
    process, so such a directory is refused rather than used.
    """
    cache = os.path.join(CORE_BUILD_DIR, "CMakeCache.txt")
    if os.path.exists(cache):
        if (_cache_value(cache, "DLSLIME_SANITIZE") or "OFF").upper() in ("ON", "1", "TRUE", "YES"):
            raise BuildError(
                f"{CORE_BUILD_DIR} is configured with DLSLIME_SANITIZE=ON; an "
                f"ASan library cannot be loaded by python. Use another "
                f"DLSLIME_BUILD_DIR or remove that directory.")
    else:
        _run(["cmake", "-S", ROOT, "-B", CORE_BUILD_DIR, "-G", "Ninja",
              "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
              "-DDLSLIME_TESTS=OFF", "-DDLSLIME_BENCH=OFF"])
    _run(["cmake", "--build", CORE_BUILD_DIR, "--target", "dlslime"])
    library = os.path.join(CORE_BUILD_DIR, CORE_LIBRARY)
    if not os.path.exists(library):
        raise BuildError(f"the core build finished but {library} is missing")
    return library


def dlslime_c_extension():
    """dlslime_torch._C: the CPython-API binding of the C core."""
    sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "python", "*.c")))
    headers = (glob.glob(os.path.join(ROOT, "csrc", "python", "*.h"))
               + glob.glob(os.path.join(ROOT, "csrc", "include", "dlslime", "*.h")))
    return Extension(
        f"{PACKAGE}._C",
        sources=[_relative(s) for s in sources],
        depends=[_relative(h) for h in headers],
        include_dirs=[os.path.join(ROOT, "csrc", "include"),
                      os.path.join(ROOT, "csrc", "python")],
        library_dirs=[CORE_BUILD_DIR],
        libraries=["dlslime"],
        extra_compile_args=C_FLAGS,
        extra_link_args=RPATH_ORIGIN,
    )


def dlslime_shim_extension():
    """dlslime_torch._shim: the c10d::Backend of the "dlslime" backend."""
    sources = sorted(glob.glob(os.path.join(ROOT, "shim", "*.cpp")))
    headers = (glob.glob(os.path.join(ROOT, "shim", "*.h"))
               + glob.glob(os.path.join(ROOT, "csrc", "include", "dlslime", "*.h"))
               + [os.path.join(ROOT, "csrc", "python", "tensor_api.h")])
    ext = torch_cpp_extension.CppExtension(
        f"{PACKAGE}._shim",
        sources=[_relative(s) for s in sources],
        depends=[_relative(h) for h in headers],
        # csrc/python for tensor_api.h, the table the shim lends _C
        include_dirs=[os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc", "python")],
        library_dirs=[CORE_BUILD_DIR],
        libraries=["dlslime"],
        extra_compile_args=list(CXX_FLAGS),
        extra_link_args=RPATH_ORIGIN,
    )
    torch_includes = set(torch_cpp_extension.include_paths())
    ext.include_dirs = [d for d in ext.include_dirs if d not in torch_includes]
    for d in torch_cpp_extension.include_paths():
        ext.extra_compile_args += ["-isystem", d]
    return ext


_BuildExtBase = (torch_cpp_extension.BuildExtension.with_options(use_ninja=True)
                 if torch_cpp_extension else build_ext)


class BuildCoreThenExtensions(_BuildExtBase):
    """build_ext that first builds libdlslime.so and puts it in the package.

    With torch, it is torch's BuildExtension (Ninja) for the shim; _C is
    C, which torch's Ninja path would compile as C++, so _C goes through
    setuptools' own compiler (build_extension below).
    """

    def finalize_options(self):
        super().finalize_options()
        # pip's editable build hands build_ext a throw-away directory for
        # its objects, so the next build (scripts/run_tests.sh's
        # build_ext --inplace) compiled the shim again from scratch
        # (minutes): every build keeps them in the one build tree, where
        # Ninja recompiles only what changed.
        self.build_temp = OBJECT_DIR

    def run(self):
        try:
            for ext in self.extensions:
                if not ext.sources:
                    raise BuildError(
                        f"extension {ext.name} has no sources (expected "
                        f"csrc/python/*.c); the checkout is incomplete")
            library = build_core()
        except BuildError as exc:
            sys.stderr.write(f"\nerror: {exc}\n\n")
            raise SystemExit(1) from None
        # The regular build tree (used for wheels) and, for editable and
        # --inplace builds, the source package, which is what gets imported.
        targets = [os.path.join(self.build_lib, PACKAGE)]
        if self.inplace or getattr(self, "editable_mode", False):
            targets.append(os.path.join(ROOT, PACKAGE))
        for directory in targets:
            os.makedirs(directory, exist_ok=True)
            self._copy_if_changed(library, os.path.join(directory, CORE_LIBRARY))
        # Relink against a new core, so that a symbol the core dropped
        # fails here at build time rather than at import.
        for ext in self.extensions:
            if library not in ext.depends:
                ext.depends.append(library)
        super().run()

    @staticmethod
    def _copy_if_changed(src, dst):
        # By content, not mtime: the copy may come from another build
        # directory (DLSLIME_BUILD_DIR) with older timestamps.
        if os.path.exists(dst) and filecmp.cmp(src, dst, shallow=False):
            return
        # Copy to a temporary name and rename, so that a process that has
        # the old library mapped keeps a consistent file.
        tmp = dst + ".tmp"
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)

    def build_extension(self, ext):
        if torch_cpp_extension is None or ext.name != f"{PACKAGE}._C":
            return super().build_extension(ext)
        # torch's BuildExtension replaced compile() on this compiler
        # instance; the class's own compile() is setuptools' C path.
        patched = self.compiler.__dict__.pop("compile", None)
        try:
            return super().build_extension(ext)
        finally:
            if patched is not None:
                self.compiler.compile = patched

    def get_outputs(self):
        outputs = super().get_outputs()
        outputs.append(os.path.join(self.build_lib, PACKAGE, CORE_LIBRARY))
        return outputs


if sysconfig.get_platform().split("-")[0] != "linux":
    sys.exit("dlslime-torch builds on Linux only")

if torch_cpp_extension is None:
    sys.stderr.write("note: torch is not installed; building dlslime_torch._C "
                     "only (no torch.distributed backend)\n")

setup(
    ext_modules=[dlslime_c_extension()]
    + ([dlslime_shim_extension()] if torch_cpp_extension else []),
    cmdclass={"build_ext": BuildCoreThenExtensions},
    # Keep setuptools' objects apart from the CMake tree, inside the same
    # build directory (DLSLIME_BUILD_DIR), so that two checkouts' builds
    # with different build directories do not share object files.
    options={"build": {"build_base": os.path.join(CORE_BUILD_DIR, "setuptools")}},
)
