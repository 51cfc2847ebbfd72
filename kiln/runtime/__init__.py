"""Executables: building (kiln.build), the VM, kernels, saving and loading (kiln.load)."""

from kiln.runtime.artifact import load
from kiln.runtime.build import Executable, ExecutableStats, build
from kiln.runtime.executor import register_executor
from kiln.runtime.native import NativeExecutor
from kiln.runtime.vm import VM, VMClosure

__all__ = ["VM", "Executable", "ExecutableStats", "NativeExecutor", "VMClosure", "build",
           "load", "register_executor"]
