"""Ships ``hostcb-legacy-import.pth`` next to the package in site-packages.

The file installs hostcb's import hook for ``jax.experimental.host_callback``
at interpreter start (see ``src/hostcb/import_hook.py``).  Everything else is
in ``pyproject.toml``.
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "hostcb-legacy-import.pth"


class build_py_with_pth(build_py):
  def run(self):
    super().run()
    self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH),
                   preserve_mode=0)

  def get_outputs(self, include_bytecode=True):
    return super().get_outputs(include_bytecode) + [
        os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": build_py_with_pth})
