"""Aggregation slot state: the per-set bookkeeping of SwitchML's loss-tolerant protocol, with tags."""

import enum

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SlotOutcome", "set_layout", "entry_layout", "SlotUpdate"]


class SlotOutcome(enum.IntEnum):
    """What an all-reduce contribution does to its slot set (cases of docs/protocol.md)."""
    RESEND = 0     # a: repeat to a completed set: send the stored result to the contributor alone
    FIRST = 1      # b: the set was free: store the values
    MISMATCH = 2   # c: the set holds another chunk: drop
    REPEAT = 3     # d: repeat to an incomplete set: nothing
    ADD = 4        # e: a new contributor: reduce into the values
    LENGTH_MISMATCH = 5  # the set holds this chunk with another payload_len: drop


def set_layout(ports: int, len_bits: int) -> data.StructLayout:
    return data.StructLayout({"bitmap": ports, "tag": 32, "done": 1, "length": len_bits})


def entry_layout(ports: int, len_bits: int) -> data.ArrayLayout:
    """One slot: its two shadow sets."""
    return data.ArrayLayout(set_layout(ports, len_bits), 2)


class SlotUpdate(wiring.Component):
    """The state transition of one slot for one contribution, combinational.

    Members
    -------
    state : In(entry_layout)
        The slot's two sets before the contribution.
    set : In(1); port : In(range(ports)); tag : In(32); length : In(len_bits); contributors : In(ports)
        The set the chunk maps to, the contributing (ingress) port, the chunk's seq_num and payload_len,
        and the rule's contributor ports.
    outcome : Out(SlotOutcome)
    complete : Out(1)
        This contribution completed the set: multicast the result.
    new_state : Out(entry_layout)
        The slot after the contribution (equal to ``state`` for MISMATCH and LENGTH_MISMATCH).
    in_use_delta : Out(signed(3))
        Change in the number of non-empty sets of this slot.
    """

    def __init__(self, ports: int, len_bits: int):
        self.ports = ports
        super().__init__({
            "state": In(entry_layout(ports, len_bits)), "set": In(1), "port": In(range(ports)), "tag": In(32),
            "length": In(len_bits), "contributors": In(ports),
            "outcome": Out(SlotOutcome), "complete": Out(1), "new_state": Out(entry_layout(ports, len_bits)),
            "in_use_delta": Out(data.signed(3)),
        })

    def elaborate(self, platform):
        m = Module()
        me = Signal(self.ports)
        m.d.comb += me.eq(1 << self.port)
        cur = self.state[self.set]
        other = self.state[~self.set]
        new_cur = self.new_state[self.set]
        new_other = self.new_state[~self.set]

        same_length = cur.length == self.length
        m.d.comb += self.new_state.eq(self.state)
        with m.If(cur.done & (cur.tag == self.tag)):
            m.d.comb += self.outcome.eq(Mux(same_length, SlotOutcome.RESEND, SlotOutcome.LENGTH_MISMATCH))
        with m.Elif(cur.bitmap == 0):
            m.d.comb += [
                self.outcome.eq(SlotOutcome.FIRST),
                new_cur.bitmap.eq(me), new_cur.tag.eq(self.tag), new_cur.length.eq(self.length),
                new_cur.done.eq(me == self.contributors), self.complete.eq(me == self.contributors),
            ]
        with m.Elif(cur.tag != self.tag):
            m.d.comb += self.outcome.eq(SlotOutcome.MISMATCH)
        with m.Elif(~same_length):
            m.d.comb += self.outcome.eq(SlotOutcome.LENGTH_MISMATCH)
        with m.Elif((cur.bitmap & me).any()):
            m.d.comb += self.outcome.eq(SlotOutcome.REPEAT)
        with m.Else():
            done = (cur.bitmap | me) == self.contributors
            m.d.comb += [
                self.outcome.eq(SlotOutcome.ADD),
                new_cur.bitmap.eq(cur.bitmap | me), new_cur.done.eq(done), self.complete.eq(done),
            ]
        # The implicit acknowledgement: a port that contributes to one set has its result of the other.
        with m.If((self.outcome != SlotOutcome.MISMATCH) & (self.outcome != SlotOutcome.LENGTH_MISMATCH)):
            m.d.comb += new_other.bitmap.eq(other.bitmap & ~me)

        def used(entry):
            return (entry[0].bitmap != 0) + (entry[1].bitmap != 0)
        m.d.comb += self.in_use_delta.eq(used(self.new_state) - used(self.state))
        return m
