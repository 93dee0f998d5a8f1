"""caramel.execute: running programs and plans, split by concern.

reference (the oracle: ring/, program, memory, result only), memory (the input-image check),
result (:class:`RunResult`), timing, placement (chips on devices, per-device programs), runner
(:class:`DeviceRun`, the one chip runner), fabric/ (collectives: threads, nccl), drive (one device
inline, host threads under the watchdog), cuda_graph (stream launcher, graph capture and replay on
one or G GPUs), pipeline and gpu_pipeline (resident lanes that run many instances: the rows an
instance writes, on NumPy, through any runner, on one GPU overlapped), distributed (process mode).
:class:`caramel.executor.Executor` picks among them.
"""
