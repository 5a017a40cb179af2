"""hpc_rl's one compiled module, the experience ring's MPI calls (hpc_rl/transport/_ring.c).

Everything else is in pyproject.toml. The module is compiled and linked with the MPI compiler wrapper (``$MPICC``,
else ``mpicc``), the same one mpi4py is built with, so that both use one MPI library. Where no wrapper is found (a
laptop, an analysis node: the base install tier) the module is skipped with one line saying so: only the rma
transport backend needs it, and importing that backend then says how to build it (hpc_rl/transport/rma.py).
"""

import os
import shlex
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildWithMpicc(build_ext):
    def run(self):
        self.mpicc = shlex.split(os.environ.get("MPICC", "mpicc"))
        if not self.mpicc or shutil.which(self.mpicc[0]) is None:
            wrapper = self.mpicc[0] if self.mpicc else "$MPICC (empty)"
            print(f"hpc_rl: skipped the experience ring's C module (hpc_rl.transport._ring, needed by the MPI "
                  f"transport): no MPI compiler wrapper {wrapper!r} on PATH; to build it, install or load MPI "
                  f"(Debian: libopenmpi-dev) or set MPICC to its wrapper, then reinstall (pip install '.[mpi]')",
                  file=sys.stderr)
            self.extensions = []
        super().run()

    def build_extensions(self):
        for name in ("compiler_so", "linker_so"):
            self.compiler.set_executable(name, self.mpicc + getattr(self.compiler, name)[1:])
        super().build_extensions()


setup(
    ext_modules=[Extension("hpc_rl.transport._ring", ["hpc_rl/transport/_ring.c"], extra_compile_args=["-O2"])],
    cmdclass={"build_ext": BuildWithMpicc},
)
