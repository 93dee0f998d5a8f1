"""caramel.plan: the dependency DAG, fusion, batching and the backend-neutral execution plan.

dag (SSA renaming, networkx graphs, DOT export), kernel (the plan's types: :class:`Kind`,
:class:`Expr`, :class:`Kernel`, :class:`ChipPlan`, :class:`Plan`), plan (lowering,
:func:`build_plan`, :func:`assign_rows`), fusion (vertical fusion, levels, batching), collectives
(communication as collectives in one global order, checked: :class:`PlanError`), streams (row
hazards, stream assignment), order (rows inside kernels, most recently written inputs first), report
(:func:`plan_report`).
"""

from caramel.plan.dag import PlanError, program_graph, resource_graph, ssa, to_dot
from caramel.plan.kernel import ChipPlan, Comm, Expr, ExprOp, Kernel, Kind, Plan, Row, ScalarSpec
from caramel.plan.plan import assign_rows, build_plan
from caramel.plan.report import plan_report, plan_stats

__all__ = [
    "ChipPlan", "Comm", "Expr", "ExprOp", "Kernel", "Kind", "Plan", "PlanError", "Row", "ScalarSpec", "assign_rows",
    "build_plan", "plan_report", "plan_stats", "program_graph", "resource_graph", "ssa", "to_dot",
]
