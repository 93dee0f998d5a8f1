"""caramel's laboratory: the benchmarks beside the product (not shipped in the wheel).

``python -m bench`` lists the commands; docs/BENCHMARKS.md says how to run them on a GPU machine. Every command
is a module ``bench/<name>.py`` with ``main(argv) -> int`` and shares :mod:`bench.harness`.
"""
