-- Wireshark / tshark dissector for CAIS frames (docs/protocol.md) and the host ring's frames (docs/ring.md).
--
--   tshark -X lua_script:wireshark/cais.lua -r port0.pcap -V
--   wireshark -X lua_script:wireshark/cais.lua port0.pcap      (or copy it to ~/.local/lib/wireshark/plugins/)
--
-- Display filters: cais, cais.group_id == 1, cais.seq_num, cais.flags.result, cais_host.step, ...
-- The EtherTypes and code points are those of sw/cais/protocol.py; tests/test_wireshark.py decodes a pcap
-- written by cais-switch with this file and compares every field with cais.protocol's own parser.

local ETHERTYPE_CAIS = 0x88B5   -- IEEE 802 Local Experimental EtherType 1
local ETHERTYPE_HOST = 0x88B6   -- IEEE 802 Local Experimental EtherType 2

local op_types = { [0] = "ALL_REDUCE", [1] = "ALL_GATHER", [2] = "BROADCAST", [3] = "REDUCE_SCATTER" }
local dtypes = { [0] = "INT32", [1] = "INT16", [2] = "INT8", [3] = "FP32", [4] = "FP16", [5] = "BF16" }
local red_ops = { [0] = "SUM", [1] = "MAX", [2] = "MIN" }
local host_kinds = { [0] = "DATA", [1] = "ACK" }

-- ------------------------------------------------------------------ CAIS header (16 bytes)
local cais = Proto("cais", "CAIS in-network aggregation")
local f = cais.fields
f.op_type      = ProtoField.uint8("cais.op_type", "Op type", base.DEC, op_types)
f.group_id     = ProtoField.uint8("cais.group_id", "Group", base.DEC)
f.layer_id     = ProtoField.uint16("cais.layer_id", "Layer", base.DEC)
f.chunk_id     = ProtoField.uint16("cais.chunk_id", "Chunk", base.DEC)
f.total_chunks = ProtoField.uint16("cais.total_chunks", "Total chunks", base.DEC)
f.seq_num      = ProtoField.uint32("cais.seq_num", "Sequence number", base.DEC)
f.payload_len  = ProtoField.uint16("cais.payload_len", "Payload length", base.DEC)
f.dtype        = ProtoField.uint8("cais.dtype", "Element type", base.DEC, dtypes, 0xF0)
f.red_op       = ProtoField.uint8("cais.red_op", "Reduction", base.DEC, red_ops, 0x0F)
f.flags        = ProtoField.uint8("cais.flags", "Flags", base.HEX)
f.result       = ProtoField.bool("cais.flags.result", "Result", 8, nil, 0x01)
f.retransmit   = ProtoField.bool("cais.flags.retransmit", "Retransmit", 8, nil, 0x02)
f.payload      = ProtoField.bytes("cais.payload", "Payload")

local e_short = ProtoExpert.new("cais.short", "CAIS frame shorter than its header", expert.group.MALFORMED, expert.severity.ERROR)
local e_len = ProtoExpert.new("cais.payload_len.bad", "payload_len beyond the frame", expert.group.MALFORMED, expert.severity.WARN)
cais.experts = { e_short, e_len }

function cais.dissector(buf, pinfo, tree)
    pinfo.cols.protocol = "CAIS"
    local t = tree:add(cais, buf(0, math.min(16, buf:len())))
    if buf:len() < 16 then
        t:add_proto_expert_info(e_short)
        return
    end
    local op = buf(0, 1):uint()
    local plen = buf(12, 2):uint()
    local flags = buf(15, 1):uint()
    t:add(f.op_type, buf(0, 1))
    t:add(f.group_id, buf(1, 1))
    t:add(f.layer_id, buf(2, 2))
    t:add(f.chunk_id, buf(4, 2))
    t:add(f.total_chunks, buf(6, 2))
    t:add(f.seq_num, buf(8, 4))
    t:add(f.payload_len, buf(12, 2))
    t:add(f.dtype, buf(14, 1))
    t:add(f.red_op, buf(14, 1))
    local ft = t:add(f.flags, buf(15, 1))
    ft:add(f.result, buf(15, 1))
    ft:add(f.retransmit, buf(15, 1))
    local avail = buf:len() - 16
    if plen > avail then
        t:add_proto_expert_info(e_len)
        plen = avail
    end
    if plen > 0 then
        tree:add(f.payload, buf(16, plen))
    end
    local what = (bit.band(flags, 0x01) ~= 0) and "result" or "contribution"
    if op ~= 0 then what = "frame" end
    pinfo.cols.info = string.format("%s %s group %d seq %d chunk %d/%d %s %s, %d bytes",
        op_types[op] or ("op " .. op), what, buf(1, 1):uint(), buf(8, 4):uint(), buf(4, 2):uint(),
        buf(6, 2):uint(), dtypes[bit.rshift(buf(14, 1):uint(), 4)] or "?",
        red_ops[bit.band(buf(14, 1):uint(), 0x0F)] or "?", buf(12, 2):uint())
    return 16 + plen
end

-- ------------------------------------------------------------------ host ring header (16 bytes)
local host = Proto("cais_host", "CAIS host ring")
local h = host.fields
h.kind     = ProtoField.uint8("cais_host.kind", "Kind", base.DEC, host_kinds)
h.group_id = ProtoField.uint8("cais_host.group_id", "Group", base.DEC)
h.op_seq   = ProtoField.uint32("cais_host.op_seq", "Collective", base.DEC)
h.step     = ProtoField.uint16("cais_host.step", "Ring step", base.DEC)
h.frag     = ProtoField.uint16("cais_host.frag", "Fragment", base.DEC)
h.frags    = ProtoField.uint16("cais_host.frags", "Fragments", base.DEC)
h.length   = ProtoField.uint16("cais_host.length", "Payload length", base.DEC)
h.reserved = ProtoField.uint16("cais_host.reserved", "Reserved", base.HEX)
h.payload  = ProtoField.bytes("cais_host.payload", "Payload")

local e_hshort = ProtoExpert.new("cais_host.short", "host ring frame shorter than its header", expert.group.MALFORMED, expert.severity.ERROR)
host.experts = { e_hshort }

function host.dissector(buf, pinfo, tree)
    pinfo.cols.protocol = "CAIS-HOST"
    local t = tree:add(host, buf(0, math.min(16, buf:len())))
    if buf:len() < 16 then
        t:add_proto_expert_info(e_hshort)
        return
    end
    t:add(h.kind, buf(0, 1))
    t:add(h.group_id, buf(1, 1))
    t:add(h.op_seq, buf(2, 4))
    t:add(h.step, buf(6, 2))
    t:add(h.frag, buf(8, 2))
    t:add(h.frags, buf(10, 2))
    t:add(h.length, buf(12, 2))
    t:add(h.reserved, buf(14, 2))
    local len = math.min(buf(12, 2):uint(), buf:len() - 16)
    if len > 0 then
        tree:add(h.payload, buf(16, len))
    end
    pinfo.cols.info = string.format("%s group %d collective %d step %d frag %d/%d, %d bytes",
        host_kinds[buf(0, 1):uint()] or "?", buf(1, 1):uint(), buf(2, 4):uint(), buf(6, 2):uint(),
        buf(8, 2):uint(), buf(10, 2):uint(), buf(12, 2):uint())
    return 16 + len
end

local ethertype = DissectorTable.get("ethertype")
ethertype:add(ETHERTYPE_CAIS, cais)
ethertype:add(ETHERTYPE_HOST, host)
