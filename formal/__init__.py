"""Formal proofs of the slot discipline (``make formal``): harnesses around the slot-state and decision
components with Amaranth ``Assert``/``Assume``, proved by temporal induction with Yosys' ``sat``
(:mod:`cais.formal.prove`); each assertion also has a deliberately broken variant that must fail it."""
