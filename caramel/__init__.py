"""caramel: interpreter and multi-GPU runtime for the Cinnamon limb-level FHE ISA.

The flow is one way: text -> :class:`Program` (:func:`load_program`) -> :func:`validate` ->
executor (:func:`run_reference`, or :func:`run_program` for the whole encrypt/run/decrypt chain, and
:class:`Executor` for many instances, in the shape of :mod:`concurrent.futures`; how a program runs is
one :class:`RunOptions`).

The names below are imported on first use (PEP 562 ``__getattr__``), so that ``import caramel.cli``
costs only the command line's own imports: ``caramel run --backend gpu`` starts the GPU before the
package's heavy modules (NumPy, the client, the planner) are imported.
"""

from __future__ import annotations

import importlib

from caramel.version import __version__

#: Public name -> the module that defines it (``validate`` is a callable module:
#: ``caramel.validate(program)`` and ``caramel.validate.validate(program, n=N)``).
_LAZY = {
    "RunOutcome": "caramel.api", "output_digest": "caramel.api", "run_program": "caramel.api",
    "run_batch": "caramel.batch",
    "Executor": "caramel.executor", "InstanceResult": "caramel.executor",
    "RunOptions": "caramel.options",
    "load_keys": "caramel.ckks.keystore", "save_keys": "caramel.ckks.keystore",
    "CaramelError": "caramel.errors", "ExecutionError": "caramel.errors", "ParseError": "caramel.errors",
    "ValidationError": "caramel.errors",
    "run_reference": "caramel.execute.reference",
    "RunResult": "caramel.execute.result",
    "load_program": "caramel.parse",
    "Instruction": "caramel.program", "Opcode": "caramel.program", "Program": "caramel.program",
    "Stream": "caramel.program",
    "Context": "caramel.ring", "Mode": "caramel.ring",
    "validate": None,  # the submodule itself
}

__all__ = [
    "CaramelError", "Context", "ExecutionError", "Executor", "InstanceResult", "Instruction", "Mode", "Opcode",
    "ParseError", "Program", "RunOptions", "RunOutcome", "RunResult", "Stream", "ValidationError", "load_program",
    "output_digest", "run_program", "run_reference", "validate", "run_batch", "load_keys", "save_keys", "__version__",
]


def __getattr__(name: str):
    """A public name of :data:`__all__`, imported from its module on first use and kept."""
    if name not in _LAZY:
        raise AttributeError(f"module 'caramel' has no attribute {name!r}")
    module = _LAZY[name]
    value = importlib.import_module(f"caramel.{name}") if module is None else getattr(
        importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
