"""The reduce ALU and the lanes that feed it.

* ``lane``: :class:`IngressLane`, a port's lane: each decided frame into the egress, its bank or nowhere;
* ``reduce``: :class:`ReduceALU`, the integer lanes; ``fpu``: the float units (adder, max/min, conversions);
* ``slot_alu``: :class:`SlotALU`, one combining step (integer or float) on a beat;
* ``fold``: :class:`FoldChain`, one row of every port's bank folded in ascending port order, and
  :class:`ResultRow`, the rounding of fp32 accumulators as a row leaves;
* ``completion``: :class:`JobQueue` and :class:`FoldReader`, from a completed set to its folded rows.
"""

__all__ = []
