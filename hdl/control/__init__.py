"""The control registers: the AXI4-Lite subordinate and the register bank built from the register map
(``csr``), and the rule and MAC tables the control plane programs through it (``tables``)."""

__all__ = []
