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
from caramel import validate  # a callable module: caramel.validate(program) and caramel.validate.validate(program, n=N)
from caramel.version import __version__

__all__ = [
    "CaramelError", "Context", "ExecutionError", "Instruction", "Mode", "Opcode", "ParseError", "Program",
    "RunOutcome", "RunResult", "Stream", "ValidationError", "load_program", "output_digest", "run_program",
    "run_reference", "validate", "run_batch", "load_keys", "save_keys", "__version__",
]
