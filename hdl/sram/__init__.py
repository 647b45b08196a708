"""The SRAM buffer: every block RAM of the card's aggregation state.

* ``banks``: :class:`ContributionBanks`, one bank of payload rows per port (written by the lanes, read by
  the fold reader);
* ``slots``: the layout of a slot's state (two shadow sets) and :class:`SetUpdate`, its transition.
"""

__all__ = []
