"""caramel: interpreter and multi-GPU runtime for the Cinnamon limb-level FHE ISA.

The flow is one way: text -> :class:`Program` (:func:`load_program`) -> :func:`validate` ->
executor (:func:`run_reference`, or :func:`run_program` for the whole encrypt/run/decrypt chain).
"""

from caramel.api import RunOutcome, output_digest, run_program
from caramel.batch import run_batch
from caramel.ckks.keystore import load_keys, save_keys
from caramel.errors import CaramelError, ExecutionError, ParseError, ValidationError
from caramel.execute.reference import run_reference
from caramel.execute.result import RunResult
from caramel.parse import load_program
from caramel.program import Instruction, Opcode, Program, Stream
from caramel.ring import Context, Mode

from caramel.version import __version__


def validate(program: Program, *, limit: int = 50, n: int | None = None) -> None:
    """Static checks of ``program``; raises :class:`ValidationError` listing every problem found.
    ``n``: the ring degree the program was compiled for (rotation steps must then lie below N/2)."""
    from caramel.validate import validate as _validate

    _validate(program, limit=limit, n=n)


# The module caramel.validate is callable (the function above), so that both caramel.validate(program)
# and caramel.validate.validate(program, n=N) work, whichever import ran first.
validate = __import__("importlib").import_module("caramel.validate")  # noqa: F811


__all__ = [
    "CaramelError", "Context", "ExecutionError", "Instruction", "Mode", "Opcode", "ParseError", "Program",
    "RunOutcome", "RunResult", "Stream", "ValidationError", "load_program", "output_digest", "run_program",
    "run_reference", "validate",
]
__all__ += ["run_batch"]
__all__ += ["load_keys", "save_keys"]
