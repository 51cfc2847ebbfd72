"""The PyTorch importer: ``kiln.frontend.from_torch(model, (x,))``.

A ``torch.nn.Module`` is exported with ``torch.export``, decomposed to core ATen if some
operator has no converter (keeping the operators kiln converts directly), and its FX graph
converted node by node through a table keyed by ATen overload (`registry.py`), one file per
family of operators. torch is optional:
it is imported on the first call, so importing kiln never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.errors import Error

if TYPE_CHECKING:
    import numpy as np

    from kiln.ir import IRModule


def from_torch(model: Any, example_inputs: Any = None, *, params_as: str = "params",
               dynamic_shapes: Any = None) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Import a ``torch.nn.Module`` (through ``torch.export``) as a kiln module and its weights.

    The model's tensor inputs become @main's leading parameters, in order; its parameters and
    buffers the remaining ones, named after their state-dict keys (``layer1.0.conv1.weight``
    → ``%layer1_0_conv1_weight``) and returned in ``params`` (name → numpy array).
    ``params_as="constants"`` embeds them in the program instead (``params`` is then empty).
    ``dynamic_shapes`` is passed on to ``torch.export.export``; each ``torch.export.Dim``
    becomes a symbolic dimension of its name. ``model`` may also be an ``ExportedProgram``.
    One output comes back as the result, several as a tuple (nested as the model nests them).
    """
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise Error("from_torch needs PyTorch: pip install 'kiln[torch]'") from None
    from kiln.frontend.torch.importer import from_torch as run

    return run(model, example_inputs, params_as=params_as, dynamic_shapes=dynamic_shapes)


__all__ = ["from_torch"]
