"""caramel: interpreter and multi-GPU runtime for the Cinnamon limb-level FHE ISA."""

from caramel.errors import CaramelError, ParseError, ValidationError
from caramel.program import Instruction, Opcode, Program, Stream

__version__ = "0.1.0"

__all__ = ["CaramelError", "Instruction", "Opcode", "ParseError", "Program", "Stream", "ValidationError"]
