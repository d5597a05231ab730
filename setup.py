"""Build of zepp's one compiled part: the simulator's event loop (``zepp.sim._engine``).

It is optional: where no C compiler is found the install goes on without it and the simulator
runs the same loop in Python (``zepp.sim.engine.Engine``), with bit-identical results, only slower.
Everything else about the package is in pyproject.toml.
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[Extension("zepp.sim._engine", ["src/zepp/sim/_engine.c"], extra_compile_args=flags,
                             optional=True)])
