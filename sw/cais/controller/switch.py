"""The controller's hands on the switch: its link, its register map, and writes applied in order.

Contract: every register access of the controller's parts goes through one :class:`SwitchAccess`, whose
methods are coroutines awaiting only the link's ``read``/``write``; nothing is cached here.
"""

from __future__ import annotations

from ..link import SwitchLink
from ..registers import RegisterMap, register_map

__all__ = ["SwitchAccess"]


class SwitchAccess:
    """Members
    -------
    link : SwitchLink
    params : cais.params.SwitchParams
    regs : RegisterMap
    """

    def __init__(self, link: SwitchLink):
        self.link = link
        self.params = link.params
        self.regs: RegisterMap = register_map(self.params)

    @property
    def clock_hz(self) -> float:
        return self.link.clock_hz

    async def apply(self, writes) -> None:
        """(address, value) writes, in order."""
        for addr, value in writes:
            await self.link.write(addr, value)

    async def read(self, name: str, element: int = 0) -> int:
        return await self.link.read(self.regs[name].address(element))

    async def write(self, name: str, value: int) -> None:
        await self.link.write(self.regs[name].address(), value)
