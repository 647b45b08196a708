"""Driver and controller configuration: defaults, TOML files, keyword arguments, validation.

    cfg = Config()                                   # the defaults below
    cfg = Config.load("cais.toml", timeout_ms=0.05)  # a file's [cais] table, then keyword overrides

A bad value is refused with :class:`ConfigError`, whose message names the key and says what it must be.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from .ring import DEFAULT_WINDOW as DEFAULT_RING_WINDOW

__all__ = ["Config", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value the driver cannot use; the message names the key."""


@dataclass(frozen=True)
class Config:
    # Bytes of payload per CAIS frame; at most the switch's max_payload, a multiple of 4 (so a multiple of
    # every element size: 4, 2 and 1 bytes). A rule whose set holds less (fp32 accumulation, reproducible
    # mode) gets chunks of the largest multiple of the element size that fits (docs/driver.md).
    chunk_size: int = 256
    # "auto": the controller's score decides; "always" / "never" force the switch / the host ring.
    offload: str = "auto"
    # Offload a collective to the switch when the controller's score exceeds this (docs/driver.md).
    offload_threshold: float = 0.2
    # Retransmission timeout (simulated time): the initial one; measured round trips shorten it on the
    # switch path (never past it: cais.rto) and may lengthen it on the host ring.
    # 100 us is about four round trips of a fully loaded 4-port switch at 156.25 MHz.
    timeout_ms: float = 0.1
    # Timeouts of one chunk in a row, with no result arriving, before the collective falls back.
    retry_limit: int = 8
    # Chunks in flight per rank; also never more than the group's slot quota.
    max_pending_chunks: int = 32
    # Host ring fallback: DATA fragments (frames of up to 1,514 bytes) a rank has in flight, unacknowledged.
    ring_window: int = DEFAULT_RING_WINDOW
    # Fraction of the switch's slot memory the controller hands out; groups beyond it stay on the hosts.
    sram_usage_limit: float = 0.75
    # The controller re-evaluates its statistics and threshold this often (simulated time).
    reevaluate_interval_ms: float = 100.0
    # Slots the controller gives each group (a power of two; fewer if memory is short).
    slots_per_group: int = 32
    # Where deployed ranks reach the coordinator (cais.dist.init's default when it gets no controller
    # address; TCP, so only within one network namespace); the co-simulation runs the controller in process.
    controller_address: str = "127.0.0.1"
    controller_port: int = 7700
    # Floating-point arrays: "native" reduces fp32/fp16/bf16 in the switch's float units when its FEATURES
    # register says it has them (else, transparently, as "quantize"); "quantize" always uses host-side
    # quantization to int32 (cais.quantize). float64 is always quantized.
    float_mode: str = "native"
    # fp16/bf16 SUM: "fp32" accumulates in fp32 and rounds once to the wire format (half a set's capacity);
    # "wire" rounds to fp16/bf16 after every addition.
    accumulate: str = "fp32"
    # Results that do not depend on the order contributions arrive in: the switch folds them in ascending
    # port order (fewer bytes per chunk), the host fallback all-gathers them and folds in the same order.
    reproducible: bool = False
    # int16/int8 SUM clamps to the type's range instead of wrapping modulo 2**bits.
    saturate: bool = False
    # Set aging (switch time, ms; 0: off): a shadow set partly filled with no contribution accepted for this
    # long is reported by the switch and freed; the controller drops the ranks missing from it, and the
    # survivors redo the collective on the host ring (docs/reliability.md, "Dead ranks"). It must exceed a
    # live rank's retry horizon (cais.allreduce.retry_horizon: 25.5 ms for the defaults) and the skew of
    # the ranks' arrival at a collective. 250 ms is 10x the first and fits the switch's AGING.age
    # (16 bits of 1024 cycles: 429 ms at 156.25 MHz).
    set_age_ms: float = 250.0

    def __post_init__(self):
        def need(ok: bool, key: str, what: str):
            if not ok:
                raise ConfigError(f"{key}={getattr(self, key)!r}: {what}")

        types = {"chunk_size": int, "retry_limit": int, "max_pending_chunks": int, "ring_window": int,
                 "slots_per_group": int, "controller_port": int, "controller_address": str, "offload": str, "float_mode": str,
                 "accumulate": str, "reproducible": bool, "saturate": bool}
        names = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}
        for f in fields(self):
            value = getattr(self, f.name)
            want = types.get(f.name, float)
            if want is bool:
                ok = isinstance(value, bool)
            elif want is float:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            else:
                ok = isinstance(value, want) and not isinstance(value, bool)
            need(ok, f.name, f"must be {names[want]}")
        need(self.chunk_size >= 4 and self.chunk_size % 4 == 0, "chunk_size", "must be a positive multiple of 4")
        need(self.offload in ("auto", "always", "never"), "offload", 'must be "auto", "always" or "never"')
        need(0.0 <= self.offload_threshold <= 1.0, "offload_threshold", "must be between 0 and 1")
        need(self.timeout_ms > 0, "timeout_ms", "must be positive")
        need(self.retry_limit >= 0, "retry_limit", "must be 0 or more")
        need(self.max_pending_chunks >= 1, "max_pending_chunks", "must be at least 1")
        need(self.ring_window >= 1, "ring_window", "must be at least 1")
        need(0.0 < self.sram_usage_limit <= 1.0, "sram_usage_limit", "must be in (0, 1]")
        need(self.reevaluate_interval_ms > 0, "reevaluate_interval_ms", "must be positive")
        need(self.slots_per_group >= 1 and self.slots_per_group & (self.slots_per_group - 1) == 0,
             "slots_per_group", "must be a power of two")
        need(bool(self.controller_address), "controller_address", "must not be empty")
        need(0 < self.controller_port < 65536, "controller_port", "must be a TCP port (1..65535)")
        need(self.float_mode in ("native", "quantize"), "float_mode", 'must be "native" or "quantize"')
        need(self.accumulate in ("fp32", "wire"), "accumulate", 'must be "fp32" or "wire"')
        need(self.set_age_ms >= 0, "set_age_ms", "must be 0 (aging off) or more")

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides) -> "Config":
        """Defaults, then the ``[cais]`` table of a TOML file (if given), then keyword overrides."""
        values = {}
        if path is not None:
            try:
                with open(path, "rb") as f:
                    doc = tomllib.load(f)
            except OSError as e:
                raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{path}: not valid TOML: {e}") from None
            except RecursionError:
                raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
            table = doc.get("cais", doc)
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: [cais] must be a table of settings, not {type(table).__name__} "
                                  f"{str(table)[:40]}")
            values.update(table)
        values.update(overrides)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**values)

    def replace(self, **changes) -> "Config":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0

    @property
    def set_age_s(self) -> float:
        return self.set_age_ms / 1000.0
