"""The CKKS client side of caramel: encoding, keys, encryption, binding to manifests, checks.

Modules (one concept each): :mod:`~caramel.ckks.encoding` (slot <-> coefficient FFT encoding),
:mod:`~caramel.ckks.sampling` (random polynomials), :mod:`~caramel.ckks.rns` (residues <-> integers),
:mod:`~caramel.ckks.arith` (the client's arithmetic, host and GPU behind one interface),
:mod:`~caramel.ckks.device` (which of them runs), :mod:`~caramel.ckks.keys` (secrets and evaluation
keys, ISA.md 5.3), :mod:`~caramel.ckks.plaintext` (plaintexts and scalars), :mod:`~caramel.ckks.encrypt`
(ciphertexts), :mod:`~caramel.ckks.bind` (memory image and outputs), :mod:`~caramel.ckks.expr`
(safe expression evaluator), :mod:`~caramel.ckks.check` (check files).

Every function takes the ring context (``caramel.ring.Context``) as a parameter and uses only its
public API (``n``, ``primes``, ``q``, ``ntt``, ``intt``, ``ntt_table``, ``galois_element``,
``conjugation_element``, ``permutation``, ``automorphism``, ``crt``).
"""

from caramel.ckks.bind import (
    InputKind,
    InputNeed,
    OutputNeed,
    Requirements,
    TermSource,
    bind_inputs,
    input_mems,
    read_outputs,
    requirements,
    write_outputs,
)
from caramel.ckks.check import (
    CHECKS_DIR,
    CheckError,
    CheckReport,
    CheckSpec,
    OutputResult,
    PreparedCheck,
    check_path,
    evaluate_check,
    family_of,
    fit_problems,
    load_check,
    output_scales,
    parse_check,
    prepare_check,
    run_check,
)
from caramel.ckks.encoding import apply_galois, decode, encode, encode_float, rotate_slots, slot_exponents
from caramel.ckks.encrypt import Ciphertext, decrypt, decrypt_values, encrypt, encrypt_values
from caramel.ckks.expr import ExprError
from caramel.ckks.keys import (
    DENSE_TERNARY,
    EPHEMERAL_DEFAULT,
    EvalKey,
    SecretDist,
    SecretKey,
    Secrets,
    extension_modulus,
    generate_evalkey,
    key_secrets,
    sparse,
)
from caramel.ckks.plaintext import Plaintext, Scalar, encode_plaintext, encode_scalar, plaintext_from_coeffs
from caramel.ckks.rns import centre, from_residues, to_ntt, to_residues

__all__ = [
    "CHECKS_DIR",
    "CheckError",
    "CheckReport",
    "CheckSpec",
    "Ciphertext",
    "DENSE_TERNARY",
    "EPHEMERAL_DEFAULT",
    "EvalKey",
    "ExprError",
    "InputKind",
    "InputNeed",
    "OutputNeed",
    "OutputResult",
    "Plaintext",
    "PreparedCheck",
    "Requirements",
    "Scalar",
    "SecretDist",
    "SecretKey",
    "Secrets",
    "TermSource",
    "apply_galois",
    "bind_inputs",
    "centre",
    "check_path",
    "decode",
    "decrypt",
    "decrypt_values",
    "encode",
    "encode_float",
    "encode_plaintext",
    "encode_scalar",
    "encrypt",
    "encrypt_values",
    "evaluate_check",
    "extension_modulus",
    "family_of",
    "fit_problems",
    "from_residues",
    "generate_evalkey",
    "input_mems",
    "key_secrets",
    "load_check",
    "output_scales",
    "parse_check",
    "plaintext_from_coeffs",
    "prepare_check",
    "read_outputs",
    "requirements",
    "rotate_slots",
    "run_check",
    "slot_exponents",
    "sparse",
    "to_ntt",
    "to_residues",
    "write_outputs",
]
