"""Build-time parameters of the switch: one definition shared by the RTL, the models and the software."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .protocol import HEADERS_BYTES, MAX_FRAME_BYTES, DType, supported_dtypes

__all__ = ["SwitchParams", "ParamError", "MAX_RULES", "JUMBO"]


class ParamError(ValueError):
    """A parameter set the switch cannot be built with; the message names the parameter."""


#: Most rule-table entries a build may have. The per-rule-entry registers (SETS_IN_USE and AGED at
#: 0x300 + 8e, docs/registers.md) fill the map's last quarter, 0x300-0x3FF, at 32 entries; and the decision
#: compares every port's header with every entry in the same cycle, so its logic grows as ports x rules.
MAX_RULES = 32

#: The jumbo build (``make sim ARGS="--jumbo"``, bench_area's ``switch_jumbo``): the fields that differ from
#: the defaults. 1,024-byte payloads put the 30 header bytes at 2.8% of a full frame (10.5% at 256), so a
#: rank's bytes come within 1% of the all-reduce limit N/(2(N-1)) of a ring's; 16 slots keep each port's
#: bank at the default's bytes (16 x 2 x 1024 = 64 x 2 x 256), since 64 slots of 1 KiB sets would need 256
#: DP16KD for the banks of 4 ports, more than the LFE5U-85F has (208).
JUMBO = {"max_payload": 1024, "slots": 16}


@dataclass(frozen=True)
class SwitchParams:
    ports: int = 4             # Ethernet ports, each an AXI4-Stream ingress and egress (2..16)
    data_width: int = 64       # bits per AXI4-Stream beat (64, 128, 256 or 512)
    slots: int = 64            # aggregation slots; each has two shadow sets of max_payload bytes
    max_payload: int = 256     # largest CAIS payload per frame, bytes (a multiple of the beat width)
    rules: int = 8             # rule-table entries
    mac_entries: int = 16      # MAC-table entries for ordinary frames
    max_frame: int = MAX_FRAME_BYTES  # longest frame accepted on any port, bytes
    float_units: bool = True   # fp32/fp16/bf16 reduction lanes; without them floats are quantized on the hosts
    uplink: bool = False       # the uplink action of aggregation trees (docs/protocol.md section 13)

    def __post_init__(self):
        def need(ok, name, what):
            if not ok:
                raise ParamError(f"{name}={getattr(self, name)!r}: {what}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in (bool, "bool"):
                need(isinstance(value, bool), f.name, "must be True or False")
            else:
                need(isinstance(value, int) and not isinstance(value, bool), f.name, "must be an integer")
        need(2 <= self.ports <= 16, "ports", "must be between 2 and 16")
        need(self.data_width in (64, 128, 256, 512), "data_width", "must be 64, 128, 256 or 512")
        need(1 <= self.slots <= 65536, "slots", "must be between 1 and 65536")
        need(self.max_payload >= 256, "max_payload", "must be at least 256 bytes")
        need(self.max_payload % self.beat_bytes == 0, "max_payload",
             f"must be a multiple of the beat width ({self.beat_bytes} bytes)")
        need(self.max_payload + 30 <= self.max_frame, "max_payload", "plus the 30 header bytes must fit max_frame")
        need(1 <= self.rules <= MAX_RULES, "rules", f"must be between 1 and {MAX_RULES}")
        need(1 <= self.mac_entries <= 256, "mac_entries", "must be between 1 and 256")
        need(60 <= self.max_frame <= 9018, "max_frame", "must be between 60 and 9018 bytes")

    @property
    def beat_bytes(self) -> int:
        return self.data_width // 8

    @property
    def dtypes(self) -> tuple[DType, ...]:
        """The element types this switch reduces."""
        return supported_dtypes(self.float_units)

    @property
    def rows_per_set(self) -> int:
        """Beats of slot memory per shadow set."""
        return self.max_payload // self.beat_bytes

    @property
    def fold_latency(self) -> int:
        """F of docs/interface.md: clock edges from a result row's registered bank data to its folded row.
        The fold chain has one slot ALU per port, each 13 cycles with float units (inputs registered, the
        widening in two stages, the adder's 6 stages, the lane results registered, the narrowing's three
        stages into the output register: the shift distance, the alignment, the rounding) and 4 without
        (the inputs registered, the integer ALU in three stages), and an output register; with float units
        the final rounding of fp32 accumulators (``ResultRow``, the same three stages) adds 3. (The RTL
        checks its own latency against this.)"""
        return self.ports * (13 if self.float_units else 4) + 1 + (3 if self.float_units else 0)

    @property
    def max_frame_beats(self) -> int:
        return -(-self.max_frame // self.beat_bytes)

    @property
    def ingress_depth(self) -> int:
        """Beats buffered per ingress port: room for two longest frames, a power of two."""
        return _power_of_two_at_least(2 * self.max_frame_beats)

    @property
    def egress_depth(self) -> int:
        """Beats buffered per egress port: room for one longest frame, a power of two.

        A frame is admitted to the egress buffers only when each of its ports has room for all of it,
        so a multicast never waits mid-frame for a slow port (docs/interface.md).
        """
        return _power_of_two_at_least(self.max_frame_beats)

    @property
    def result_frame_beats(self) -> int:
        """Beats of the longest result frame: the 30 header bytes and ``max_payload`` bytes of payload."""
        return -(-(HEADERS_BYTES + self.max_payload) // self.beat_bytes)

    @property
    def result_queue_depth(self) -> int:
        """Beats buffered per egress port for result frames (the port's result queue, beside its egress
        buffer for forwarded frames): room for two longest results, a power of two.

        A result is written into the result queues of all its ports at once, when each has room for all
        of it; each port sends its results, in order, between its forwarded frames (docs/core-design.md
        section 5). Two results' room lets a port that is sending a long forwarded frame take the next
        result while it still holds one (docs/core-design.md section 6 measures the rate with it).
        """
        return _power_of_two_at_least(2 * self.result_frame_beats)

    @property
    def slot_len_bits(self) -> int:
        """Bits of a set's payload_len in the slot state (payload_len <= max_payload)."""
        return self.max_payload.bit_length()

    def as_dict(self) -> dict:
        return asdict(self)

    def slug(self) -> str:
        """A short name for build folders: only the fields that differ from the defaults."""
        default = SwitchParams()
        parts = [(k if v else f"no_{k}") if isinstance(v, bool) else f"{k}{v}"
                 for k, v in asdict(self).items() if getattr(default, k) != v]
        return "_".join(parts) or "default"


def _power_of_two_at_least(n: int) -> int:
    depth = 2
    while depth < n:
        depth *= 2
    return depth
