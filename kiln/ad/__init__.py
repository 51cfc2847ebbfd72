"""Automatic differentiation: `grad`, in Relay's higher-order mode or DLVM's first-order mode.

See docs/autodiff.md. ``kiln.ad.grad(fn, mod=mod)`` returns a typed Function computing
``(value, (gradient for each parameter differentiated, ...))``.
"""

from kiln.ad.grad import grad

__all__ = ["grad"]
