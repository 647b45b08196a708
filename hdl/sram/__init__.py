"""The SRAM buffer: every block RAM of the card's aggregation state, behind one interface.

* ``buffer``: :class:`SramBuffer`, the buffer the switch core instantiates: the decision's two ports on the
  slot state (``state``, ``maint``), the reset sweep's flags, the lanes' bank writes, the fold reader's read;
* ``state``: :class:`SlotStateMemory`, one entry per slot, its read and write arbitration and its reset sweep;
* ``banks``: :class:`ContributionBanks`, one bank of payload rows per port (written by the lanes, read by
  the fold reader);
* ``slots``: the layout of a slot's state (two shadow sets) and :class:`SetUpdate`, its transition.
"""

__all__ = []
