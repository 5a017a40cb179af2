"""hpc_rl's one compiled module, the experience ring's MPI calls (hpc_rl/transport/_ring.c).

Everything else is in pyproject.toml. The module is compiled and linked with the MPI compiler wrapper (``mpicc``,
or ``$MPICC``), the same one mpi4py is built with, so that both use one MPI library.
"""

import os
import shlex
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildWithMpicc(build_ext):
    def build_extensions(self):
        mpicc = shlex.split(os.environ.get("MPICC", "mpicc"))
        if not mpicc or shutil.which(mpicc[0]) is None:
            raise RuntimeError(f"hpc_rl compiles hpc_rl/transport/_ring.c with the MPI compiler wrapper, and "
                               f"{mpicc[0] if mpicc else 'MPICC'!r} is not on PATH: install or load your MPI (Debian: "
                               f"libopenmpi-dev), or set MPICC to its wrapper")
        for name in ("compiler_so", "linker_so"):
            self.compiler.set_executable(name, mpicc + getattr(self.compiler, name)[1:])
        super().build_extensions()


setup(
    ext_modules=[Extension("hpc_rl.transport._ring", ["hpc_rl/transport/_ring.c"], extra_compile_args=["-O2"])],
    cmdclass={"build_ext": BuildWithMpicc},
)
