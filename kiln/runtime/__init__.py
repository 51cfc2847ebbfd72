"""Runtime: calling compiled kernels, executables, the VM, saving and loading."""
