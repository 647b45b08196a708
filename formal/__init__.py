"""Formal proofs of the slot discipline (``make formal``): harnesses around the slot-state and decision
components with Amaranth ``Assert``/``Assume``, proved by k-induction with yosys-smtbmc and Yices
(:mod:`cais.formal.prove`); each assertion also has a deliberately broken variant that must fail it."""
