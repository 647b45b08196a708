"""Board support beside the switch: the MAC, RGMII, clock crossings, the UART bridge and board tops
(docs/board.md)."""
