// The C++ side of cais.sim.links.verilator: the exported switch (Verilated as Vswitch) with its wires.
//
// Python hands whole frames and register accesses across a C ABI (ctypes) and takes back whole frames
// with their cycle stamps; the clock loop, the per-port frame queues, the idle and back-pressure
// patterns and the AXI4-Lite master run here, so nothing crosses the boundary per cycle. Nor per frame:
// frames go in as a batch with the call that runs the clock (cais_run) and come out in two contiguous
// buffers (bytes, and four words of stamps per frame) that Python reads in place, through a status block
// of 64-bit words (STATUS_FIELDS) that every entry point leaves up to date, with no call of its own.
//
// Every per-cycle rule below mirrors cais.sim.links.wires (the Python engine the cocotb and amaranth.sim
// links run): the same stimulus gives the same frames in the same cycles on every link, and a test
// checks it. Cycle c is the clock edge that takes the link's cycle count from c to c + 1; a handshake
// is stamped with the c of the edge that completes it.
//
// ports.h, generated per build, defines CAIS_PORTS, CAIS_BEAT_BYTES and bind_ports() (the addresses and
// sizes of every AXI4-Stream signal of the top, whose names carry the port number).

#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <string>
#include <vector>

#include "Vswitch.h"
#include "verilated.h"
#if VM_TRACE
#include "verilated_vcd_c.h"
#endif

struct StreamWires {
    void* s_tdata; size_t s_tdata_size; void* s_tkeep; size_t s_tkeep_size;
    CData* s_tlast; CData* s_tuser; CData* s_tvalid; CData* s_tready;
    void* m_tdata; size_t m_tdata_size; void* m_tkeep; size_t m_tkeep_size;
    CData* m_tlast; CData* m_tvalid; CData* m_tready;
};

#include "ports.h"

namespace {

constexpr int P = CAIS_PORTS;
constexpr size_t B = CAIS_BEAT_BYTES;

// The pause patterns: a pure function of (seed, stream, port, cycle), so that every link draws the
// same pauses whatever it does between cycles. Mirrors cais.sim.links.wires.splitmix64 / pause_key.
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
enum Stream : uint64_t { IDLE = 0, BACKPRESSURE = 1 };
inline uint64_t pause_key(uint64_t seed, uint64_t stream, uint64_t port) {
    return splitmix64(seed ^ splitmix64((stream << 32) | port));
}
inline bool pause(uint64_t key, uint64_t threshold, uint64_t cycle) {
    return threshold && (splitmix64(key + cycle) >> 11) < threshold;
}

struct TxFrame {
    std::vector<uint8_t> data;
    bool bad_keep;                            // last beat's tkeep moved up a lane (a framing error)
    bool bad_fcs;                             // tuser high on the last beat (the MAC saw a bad FCS)
    uint64_t not_before;                      // its first beat is not shown before this cycle
};

struct Port {
    std::deque<TxFrame> queue;                // frames waiting for the ingress
    std::vector<uint8_t> frame;               // the frame being sent (empty: none)
    bool bad_keep = false, bad_fcs = false;
    size_t offset = 0;                        // byte offset of its next beat
    uint64_t tx_first = 0;                    // cycle its first beat was taken
    bool showing = false;                     // a beat is on s_axis (tvalid high)
    uint64_t idle_key = 0, idle_threshold = 0, bp_key = 0, bp_threshold = 0;
    uint64_t hold_until = 0;                  // the sink keeps tready low while cycle < hold_until
    bool ready = true;                        // tready driven this cycle
    std::vector<uint8_t> rx;                  // the egress frame being received
    uint64_t rx_first = 0;
};

enum class Bus { IDLE, WRITE_ADDR_DATA, WRITE_RESP, READ_ADDR, READ_DATA, DONE };

// The status block Python reads in place (cais.sim.links.verilator builds its view from STATUS_FIELDS):
// one 64-bit word each, in this order. Python writes only the two *_taken words.
#define CAIS_STATUS(X)                                                                                     \
    X(cycle)         /* the link's cycle count */                                                         \
    X(sending)       /* frames queued for, or on the way into, an ingress port */                         \
    X(error)         /* 1: a protocol violation was seen on an egress (cais_error says which) */          \
    X(read_accepted) /* cycle of the last read's address handshake */                                     \
    X(rx_frames)     /* frames that left the switch, oldest first, not yet dropped */                     \
    X(rx_bytes)      /* their bytes, back to back at rx_data */                                           \
    X(rx_data)       /* address of those bytes */                                                         \
    X(rx_meta)       /* address of four words per frame: port, first beat's cycle, last's, length */      \
    X(rx_taken)      /* (Python) the first rx_taken frames are read: dropped before the next cycle */     \
    X(tx_frames)     /* frames the ingress took, oldest first */                                          \
    X(tx_meta)       /* address of three words per frame: port, first beat's cycle, last's */            \
    X(tx_taken)      /* (Python) the first tx_taken of them are read */
#define CAIS_FIELD_INDEX(name) S_##name,
#define CAIS_FIELD_NAME(name) #name " "
enum StatusField { CAIS_STATUS(CAIS_FIELD_INDEX) STATUS_WORDS };
const char STATUS_FIELDS[] = CAIS_STATUS(CAIS_FIELD_NAME);
constexpr size_t RX_META = 4, TX_META = 3;    // words per frame in rx_meta / tx_meta

struct Harness {
    VerilatedContext* context;
    Vswitch* top;
    StreamWires wires[P];
    Port ports[P];
    uint64_t seed = 0;
    uint64_t cycle = 0;                       // the link's cycle count (0 after reset and the sweep)
    uint64_t time = 0;                        // half-periods simulated, for the waveform
    uint64_t sending = 0;                     // frames queued or partly sent, all ports
    std::vector<uint8_t> rx_data;             // frames that left the switch, back to back
    std::vector<uint64_t> rx_meta;            // RX_META words per frame (see CAIS_STATUS)
    std::vector<uint64_t> tx_meta;            // TX_META words per frame the ingress took
    uint64_t* status;                         // the status block (STATUS_WORDS words, the caller's memory)
    std::string error;                        // the first protocol violation seen on an egress
    // AXI4-Lite master
    Bus bus = Bus::IDLE;
    bool aw_done = false, w_done = false;
    uint32_t bus_data = 0, bus_resp = 0;
    uint64_t read_accepted = 0;               // cycle of the last read's address handshake
#if VM_TRACE
    VerilatedVcdC* trace = nullptr;
#endif

    Harness(uint64_t seed_, uint64_t* status_) : seed(seed_), status(status_) {
        std::memset(status, 0, STATUS_WORDS * sizeof(uint64_t));
        context = new VerilatedContext;
        top = new Vswitch{context};
        bind_ports(top, wires);
        set_patterns_all(0, 0);
        for (int p = 0; p < P; ++p) *wires[p].m_tready = 1;
    }
    ~Harness() {
#if VM_TRACE
        if (trace) { trace->close(); delete trace; }
#endif
        top->final();
        delete top;
        delete context;
    }

    void set_patterns_all(uint64_t idle, uint64_t bp) {
        for (int p = 0; p < P; ++p) set_pattern(p, idle, bp);
    }
    void set_pattern(int p, uint64_t idle_threshold, uint64_t bp_threshold) {
        ports[p].idle_key = pause_key(seed, IDLE, p);
        ports[p].bp_key = pause_key(seed, BACKPRESSURE, p);
        ports[p].idle_threshold = idle_threshold;
        ports[p].bp_threshold = bp_threshold;
    }

    void dump() {
#if VM_TRACE
        if (trace) trace->dump(time);
#endif
        ++time;
    }

    // One clock cycle: drive, settle, sample (the values before the edge), edge, update.
    void step() {
        for (int p = 0; p < P; ++p) drive_port(p);
        drive_bus();
        top->clk = 0;
        top->eval();
        dump();
        bool s_ready[P], m_valid[P];
        for (int p = 0; p < P; ++p) {
            s_ready[p] = *wires[p].s_tready;
            m_valid[p] = *wires[p].m_tvalid;
            if (m_valid[p] && ports[p].ready) take_beat(p);
        }
        sample_bus();
        top->clk = 1;
        top->eval();
        dump();
        for (int p = 0; p < P; ++p) {
            Port& port = ports[p];
            if (port.showing && s_ready[p]) {
                port.showing = false;
                if (port.offset == 0) port.tx_first = cycle;
                port.offset += B;
                if (port.offset >= port.frame.size()) {
                    tx_meta.insert(tx_meta.end(), {static_cast<uint64_t>(p), port.tx_first, cycle});
                    port.frame.clear();
                    port.offset = 0;
                    --sending;
                }
            }
        }
        ++cycle;
    }

    void drive_port(int p) {
        Port& port = ports[p];
        StreamWires& w = wires[p];
        if (!port.showing) {
            if (port.frame.empty() && !port.queue.empty() && port.queue.front().not_before <= cycle) {
                port.frame = std::move(port.queue.front().data);
                port.bad_keep = port.queue.front().bad_keep;
                port.bad_fcs = port.queue.front().bad_fcs;
                port.queue.pop_front();
                port.offset = 0;
            }
            if (!port.frame.empty() && !pause(port.idle_key, port.idle_threshold, cycle)) {
                size_t n = std::min(B, port.frame.size() - port.offset);
                bool last = port.offset + B >= port.frame.size();
                size_t shift = last && port.bad_keep ? 1 : 0;   // mirrors cais.sim.traffic.beats_of
                uint8_t beat[B];
                std::memset(beat, 0, B);
                std::memcpy(beat + shift, port.frame.data() + port.offset, n);
                std::memset(w.s_tdata, 0, w.s_tdata_size);
                std::memcpy(w.s_tdata, beat, B);
                uint64_t keep = (n >= 64 ? ~0ULL : ((1ULL << n) - 1)) << shift;
                std::memset(w.s_tkeep, 0, w.s_tkeep_size);
                std::memcpy(w.s_tkeep, &keep, w.s_tkeep_size < 8 ? w.s_tkeep_size : 8);
                *w.s_tlast = last;
                *w.s_tuser = last && port.bad_fcs;
                *w.s_tvalid = 1;
                port.showing = true;
            } else {
                *w.s_tvalid = 0;
            }
        }
        port.ready = cycle >= port.hold_until && !pause(port.bp_key, port.bp_threshold, cycle);
        *w.m_tready = port.ready;
    }

    void take_beat(int p) {
        Port& port = ports[p];
        StreamWires& w = wires[p];
        uint64_t keep = 0;
        std::memcpy(&keep, w.m_tkeep, w.m_tkeep_size < 8 ? w.m_tkeep_size : 8);
        bool last = *w.m_tlast;
        size_t n = __builtin_popcountll(keep);
        uint64_t full = B >= 64 ? ~0ULL : ((1ULL << B) - 1);
        bool contiguous = n > 0 && (n == 64 ? keep == ~0ULL : keep == ((1ULL << n) - 1));
        if ((!contiguous || (!last && keep != full)) && error.empty())
            error = "egress port " + std::to_string(p) + ": bad tkeep 0x" + hex(keep) + " on a " +
                    (last ? "last" : "middle") + " beat at cycle " + std::to_string(cycle);
        if (port.rx.empty()) port.rx_first = cycle;
        const uint8_t* data = static_cast<const uint8_t*>(w.m_tdata);
        port.rx.insert(port.rx.end(), data, data + (n < B ? n : B));
        if (last) {
            rx_data.insert(rx_data.end(), port.rx.begin(), port.rx.end());
            rx_meta.insert(rx_meta.end(), {static_cast<uint64_t>(p), port.rx_first, cycle, port.rx.size()});
            port.rx.clear();
        }
    }

    void queue_frame(int p, const uint8_t* data, uint64_t len, uint64_t flags, uint64_t not_before) {
        ports[p].queue.push_back(TxFrame{std::vector<uint8_t>(data, data + len), (flags & 1) != 0,
                                         (flags & 2) != 0, not_before});
        ++sending;
    }

    // Entry: drop the frames Python has read. Exit: publish the state in the status block.
    void begin() {
        if (uint64_t n = status[S_rx_taken]) {
            uint64_t bytes = 0;
            for (uint64_t i = 0; i < n; ++i) bytes += rx_meta[i * RX_META + 3];
            rx_data.erase(rx_data.begin(), rx_data.begin() + bytes);
            rx_meta.erase(rx_meta.begin(), rx_meta.begin() + n * RX_META);
            status[S_rx_taken] = 0;
        }
        if (uint64_t n = status[S_tx_taken]) {
            tx_meta.erase(tx_meta.begin(), tx_meta.begin() + n * TX_META);
            status[S_tx_taken] = 0;
        }
    }
    void publish() {
        status[S_cycle] = cycle;
        status[S_sending] = sending;
        status[S_error] = !error.empty();
        status[S_read_accepted] = read_accepted;
        status[S_rx_frames] = rx_meta.size() / RX_META;
        status[S_rx_bytes] = rx_data.size();
        status[S_rx_data] = reinterpret_cast<uint64_t>(rx_data.data());
        status[S_rx_meta] = reinterpret_cast<uint64_t>(rx_meta.data());
        status[S_tx_frames] = tx_meta.size() / TX_META;
        status[S_tx_meta] = reinterpret_cast<uint64_t>(tx_meta.data());
    }

    static std::string hex(uint64_t v) {
        char text[20];
        std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(v));
        return text;
    }

    // AXI4-Lite master, one access at a time (mirrors cais.sim.links.wires.AxiLiteMaster).
    void drive_bus() {
        top->s_axil_awvalid = bus == Bus::WRITE_ADDR_DATA && !aw_done;
        top->s_axil_wvalid = bus == Bus::WRITE_ADDR_DATA && !w_done;
        top->s_axil_bready = bus == Bus::WRITE_ADDR_DATA || bus == Bus::WRITE_RESP;
        top->s_axil_arvalid = bus == Bus::READ_ADDR;
        top->s_axil_rready = bus == Bus::READ_ADDR || bus == Bus::READ_DATA;
    }
    void sample_bus() {
        switch (bus) {
        case Bus::WRITE_ADDR_DATA:
            aw_done |= top->s_axil_awready != 0;
            w_done |= top->s_axil_wready != 0;
            if (aw_done && w_done) bus = Bus::WRITE_RESP;
            break;
        case Bus::WRITE_RESP:
            if (top->s_axil_bvalid) { bus_resp = top->s_axil_bresp; bus = Bus::DONE; }
            break;
        case Bus::READ_ADDR:
            if (top->s_axil_arready) { read_accepted = cycle; bus = Bus::READ_DATA; }
            break;
        case Bus::READ_DATA:
            if (top->s_axil_rvalid) { bus_data = top->s_axil_rdata; bus_resp = top->s_axil_rresp; bus = Bus::DONE; }
            break;
        default:
            break;
        }
    }
    void finish_access() {
        while (bus != Bus::DONE) step();
        bus = Bus::IDLE;
    }
};

}  // namespace

extern "C" {

int cais_ports() { return P; }
int cais_beat_bytes() { return static_cast<int>(B); }
const char* cais_status_fields() { return STATUS_FIELDS; }

// `status`: the caller's memory for the status block (STATUS_WORDS words), written until cais_free.
void* cais_new(uint64_t seed, uint64_t* status) {
    Harness* h = new Harness(seed, status);
    h->publish();
    return h;
}
void cais_free(void* h) { delete static_cast<Harness*>(h); }

// Forget every queued and partial frame, hold reset for `reset_cycles`, release it, run
// `settle_cycles` (the slot-state sweep); cycle := 0.
void cais_reset(void* hv, uint64_t reset_cycles, uint64_t settle_cycles) {
    Harness* h = static_cast<Harness*>(hv);
    h->begin();
    for (int p = 0; p < P; ++p) {
        Port& port = h->ports[p];
        port.queue.clear();
        port.frame.clear();
        port.offset = 0;
        port.showing = false;
        *h->wires[p].s_tvalid = 0;
    }
    h->sending = 0;
    h->tx_meta.clear();
    h->top->rst = 1;
    for (uint64_t i = 0; i < reset_cycles; ++i) h->step();
    // The egress registers still show their beat in the first reset cycle and a ready sink takes it: the
    // head of a frame reset cut short, forgotten with every frame received before (as wires.py's _reset).
    for (int p = 0; p < P; ++p) h->ports[p].rx.clear();
    h->rx_data.clear();
    h->rx_meta.clear();
    h->top->rst = 0;
    for (uint64_t i = 0; i < settle_cycles; ++i) h->step();
    h->cycle = 0;
    h->publish();
}

// Thresholds: pause when the 53-bit draw is below them (probability * 2**53); 0 never pauses.
void cais_set_pattern(void* hv, int port, uint64_t idle_threshold, uint64_t bp_threshold) {
    static_cast<Harness*>(hv)->set_pattern(port, idle_threshold, bp_threshold);
}
// Hold port's sink tready low until cycle `until` (0: release now; ~0: until released).
void cais_set_hold(void* hv, int port, uint64_t until) { static_cast<Harness*>(hv)->ports[port].hold_until = until; }

// Queue `n` frames, in order, behind each port's earlier ones: their bytes back to back in `data`, and four
// words each in `meta`: port, length, flags (1: bad_keep, the last beat's tkeep moved up a lane; 2: bad_fcs,
// tuser high on the last beat), not_before (the first beat is not shown before this cycle).
static void queue_batch(Harness* h, const uint8_t* data, const uint64_t* meta, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i, meta += 4) {
        h->queue_frame(static_cast<int>(meta[0]), data, meta[1], meta[2], meta[3]);
        data += meta[1];
    }
}

void cais_send(void* hv, const uint8_t* data, const uint64_t* meta, uint64_t n) {
    Harness* h = static_cast<Harness*>(hv);
    h->begin();
    queue_batch(h, data, meta, n);
    h->publish();
}

// Queue `n` frames (as cais_send), then run `cycles` cycles, or (stop_on_frame) until the end of the first
// cycle in which a frame finished leaving the switch; return the cycles run.
uint64_t cais_run(void* hv, uint64_t cycles, int stop_on_frame, const uint8_t* data, const uint64_t* meta,
                  uint64_t n) {
    Harness* h = static_cast<Harness*>(hv);
    h->begin();
    queue_batch(h, data, meta, n);
    size_t before = h->rx_meta.size();
    uint64_t ran = cycles;
    for (uint64_t i = 1; i <= cycles; ++i) {
        h->step();
        if (stop_on_frame && h->rx_meta.size() != before) { ran = i; break; }
    }
    h->publish();
    return ran;
}

// The bare clock loop of the same model (no wire touched), for the benchmark's comparison.
void cais_bare_clock(void* hv, uint64_t cycles) {
    Harness* h = static_cast<Harness*>(hv);
    for (uint64_t i = 0; i < cycles; ++i) {
        h->top->clk = 0;
        h->top->eval();
        h->top->clk = 1;
        h->top->eval();
    }
}

const char* cais_error(void* hv) { return static_cast<Harness*>(hv)->error.c_str(); }

// Register accesses: run the AXI4-Lite master to the end of the access (traffic keeps moving).
uint32_t cais_write(void* hv, uint32_t addr, uint32_t value) {
    Harness* h = static_cast<Harness*>(hv);
    h->begin();
    h->top->s_axil_awaddr = addr;
    h->top->s_axil_wdata = value;
    h->top->s_axil_wstrb = 0xF;
    h->aw_done = h->w_done = false;
    h->bus = Bus::WRITE_ADDR_DATA;
    h->finish_access();
    h->publish();
    return h->bus_resp;
}
uint32_t cais_read(void* hv, uint32_t addr, uint32_t* resp) {
    Harness* h = static_cast<Harness*>(hv);
    h->begin();
    h->top->s_axil_araddr = addr;
    h->bus = Bus::READ_ADDR;
    h->finish_access();
    h->publish();
    *resp = h->bus_resp;
    return h->bus_data;
}

int cais_trace_open(void* hv, const char* path) {
#if VM_TRACE
    Harness* h = static_cast<Harness*>(hv);
    Verilated::traceEverOn(true);
    h->trace = new VerilatedVcdC;
    h->top->trace(h->trace, 99);
    h->trace->open(path);
    return 1;
#else
    (void)hv; (void)path;
    return 0;
#endif
}

}  // extern "C"
