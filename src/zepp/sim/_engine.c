/* The event loop of zepp.sim.engine in C: the same algorithm, the same floating-point
 * operations in the same order, so it gives bit-identical start and end times.
 *
 * zepp.sim.engine.Engine prepares every array (dependencies, stream keys, link indices, tiny
 * transfers) and calls run(); its Python loop (Engine._run_python) is the reference this file
 * mirrors step by step: _begin, _make_ready, _finish, _step, _Flows.next_end / advance and
 * maxmin_rates. Built as an optional extension (setup.py): where it is missing the Python loop
 * runs, with the same results. Compiled with -ffp-contract=off so that no multiply-add is fused
 * (numpy rounds each product and each sum on its own).
 *
 * Orders that decide the result:
 * - the event heap pops by (time, seq): seq is unique, so the order is total (Python's heapq on
 *   (time, seq, task, phase) tuples);
 * - a stream's ready queue pops by (prio, ready time, task), also total;
 * - flows are kept in the order they started (new flows appended in the order they became
 *   ready, retired flows removed keeping the others' order); every per-link sum adds its flows
 *   in that order, as numpy.bincount does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double time;
    int64_t seq;
    int64_t task;
    int phase; /* 0: finish, 1: start flowing */
} Event;

typedef struct {
    double prio;
    double at;
    int64_t task;
} Queued;

/* A binary min-heap's storage (see DEFINE_HEAP). */
typedef struct {
    Event *a;
    int64_t n, cap;
} EventHeap;

typedef struct {
    Queued *a;
    int64_t n, cap;
} Queue;

typedef struct {
    /* inputs */
    int64_t n, K;
    const int64_t *succ_ptr, *succ, *stream_key, *la, *lb;
    const double *prio, *dur, *fixed, *nbytes, *tiny_end, *cap;
    const uint8_t *xfer;
    int64_t *indeg;
    double quantum, rel_quantum, rate_tol;
    /* outputs */
    double *start, *end;
    /* state */
    double *ready_at;
    EventHeap heap;
    int64_t seq;
    Queue *queues;
    uint8_t *busy;
    int64_t nstreams;
    /* flows, in start order */
    int64_t F;
    int64_t *fid, *fa, *fb;
    double *frem, *frate;
    int64_t *newf;
    int64_t nnew;
    int dirty;
    double now;
    int64_t done, events;
    /* maxmin scratch */
    int64_t *cnt, *dcnt, *act;
    double *rem, *share, *sum, *m;
    uint8_t *nonloc, *frozen, *abad, *bbad;
    int64_t *widx, *wa, *wb, nflow_pos;
    int64_t *adj_ptr, *adj_len, *adj, *adj_o, *wit, *wother;
    uint64_t *hitbits;
    /* retired flows of one step */
    int64_t *ret_id;
    double *ret_tail;
    char *arena; /* holds every per-task and per-link array above (alloc_arrays) */
    int oom;
} Sim;

/* The per-task ([n]: flows, retired flows, maxmin's per-flow scratch) and per-link ([K]) arrays,
 * carved from one allocation: 8-byte elements first, then the byte flags. */
static int alloc_arrays(Sim *s, size_t N, size_t K) {
    char *p = (char *)malloc((16 * N + 10 * K + 1) * 8 + (N / 64 + 1) * 8 + 3 * N + K);
    if (!p) return -1;
    s->arena = p;
#define CARVE(field, type, count) (s->field = (type *)p, p += (count) * sizeof(type))
    CARVE(fid, int64_t, N), CARVE(fa, int64_t, N), CARVE(fb, int64_t, N), CARVE(newf, int64_t, N);
    CARVE(adj, int64_t, 2 * N), CARVE(adj_o, int64_t, 2 * N), CARVE(ret_id, int64_t, N);
    CARVE(widx, int64_t, N), CARVE(wa, int64_t, N), CARVE(wb, int64_t, N);
    CARVE(frem, double, N), CARVE(frate, double, N), CARVE(m, double, N), CARVE(ret_tail, double, N);
    CARVE(cnt, int64_t, K), CARVE(dcnt, int64_t, K), CARVE(act, int64_t, K);
    CARVE(adj_ptr, int64_t, K + 1), CARVE(adj_len, int64_t, K), CARVE(wit, int64_t, K), CARVE(wother, int64_t, K);
    CARVE(hitbits, uint64_t, N / 64 + 1);
    CARVE(rem, double, K), CARVE(share, double, K), CARVE(sum, double, K);
    CARVE(frozen, uint8_t, N), CARVE(abad, uint8_t, N), CARVE(bbad, uint8_t, N), CARVE(nonloc, uint8_t, K);
#undef CARVE
    memset(s->cnt, 0, K * sizeof(int64_t));
    return 0;
}

/* ------------------------------------------------------------------ heaps */
/* DEFINE_HEAP(NAME, HEAP, ITEM, LESS, FIRST_CAP) defines NAME_push (0, or -1 and s->oom when out
 * of memory) and NAME_pop on a HEAP of ITEMs ordered by LESS: one sift-up / sift-down for both
 * heaps below. Both orders are total, so any correct heap pops what Python's heapq pops. */
#define DEFINE_HEAP(NAME, HEAP, ITEM, LESS, FIRST_CAP)                                       \
    static int NAME##_push(Sim *s, HEAP *h, ITEM e) {                                       \
        if (h->n == h->cap) {                                                               \
            int64_t nc = h->cap ? 2 * h->cap : (FIRST_CAP);                                 \
            ITEM *a = (ITEM *)realloc(h->a, (size_t)nc * sizeof(ITEM));                     \
            if (!a) {                                                                       \
                s->oom = 1;                                                                 \
                return -1;                                                                  \
            }                                                                               \
            h->a = a;                                                                       \
            h->cap = nc;                                                                    \
        }                                                                                   \
        int64_t i = h->n++;                                                                 \
        while (i > 0) {                                                                     \
            int64_t p = (i - 1) / 2;                                                        \
            if (!LESS(&e, &h->a[p])) break;                                                 \
            h->a[i] = h->a[p];                                                              \
            i = p;                                                                          \
        }                                                                                   \
        h->a[i] = e;                                                                        \
        return 0;                                                                           \
    }                                                                                       \
    static ITEM NAME##_pop(HEAP *h) {                                                       \
        ITEM top = h->a[0];                                                                 \
        ITEM last = h->a[--h->n];                                                           \
        int64_t n = h->n, i = 0;                                                            \
        for (;;) {                                                                          \
            int64_t l = 2 * i + 1;                                                          \
            if (l >= n) break;                                                              \
            int64_t c = (l + 1 < n && LESS(&h->a[l + 1], &h->a[l])) ? l + 1 : l;           \
            if (!LESS(&h->a[c], &last)) break;                                              \
            h->a[i] = h->a[c];                                                              \
            i = c;                                                                          \
        }                                                                                   \
        if (n) h->a[i] = last;                                                              \
        return top;                                                                         \
    }

/* the event heap pops by (time, seq) */
static inline int ev_less(const Event *x, const Event *y) {
    if (x->time == y->time) return x->seq < y->seq;
    return x->time < y->time;
}

/* a stream's ready queue pops by (prio, ready time, task) */
static inline int q_less(const Queued *x, const Queued *y) {
    if (x->prio != y->prio) return x->prio < y->prio;
    if (x->at != y->at) return x->at < y->at;
    return x->task < y->task;
}

DEFINE_HEAP(ev, EventHeap, Event, ev_less, 1024)
DEFINE_HEAP(q, Queue, Queued, q_less, 16)

static int heap_push(Sim *s, double time, int64_t task, int phase) {
    Event e = {time, s->seq++, task, phase};
    return ev_push(s, &s->heap, e);
}

/* ------------------------------------------------------------------ task life cycle */
static void begin(Sim *s, int64_t t, double at) {
    s->start[t] = at;
    if (s->xfer[t]) {
        double tiny = s->tiny_end[t];
        if (tiny >= 0.0)
            heap_push(s, at + s->fixed[t] + tiny, t, 0);
        else
            heap_push(s, at + s->fixed[t], t, 1);
    } else {
        heap_push(s, at + s->dur[t], t, 0);
    }
}

static void make_ready(Sim *s, int64_t t, double at) {
    int64_t sk = s->stream_key[t];
    if (sk < 0) {
        begin(s, t, at);
    } else if (!s->busy[sk]) {
        s->busy[sk] = 1;
        begin(s, t, at);
    } else {
        Queued e = {s->prio[t], at, t};
        q_push(s, &s->queues[sk], e);
    }
}

static void finish(Sim *s, int64_t t, double at) {
    s->end[t] = at;
    s->done++;
    int64_t sk = s->stream_key[t];
    if (sk >= 0) {
        Queue *q = &s->queues[sk];
        if (q->n) {
            Queued nx = q_pop(q);
            begin(s, nx.task, at);
        } else {
            s->busy[sk] = 0;
        }
    }
    for (int64_t i = s->succ_ptr[t]; i < s->succ_ptr[t + 1]; i++) {
        int64_t x = s->succ[i];
        if (s->ready_at[x] < at) s->ready_at[x] = at;
        s->indeg[x] -= 1;
        if (s->indeg[x] == 0) make_ready(s, x, s->ready_at[x]);
    }
}

/* ------------------------------------------------------------------ max-min rates */
static inline double np_minimum(double x, double y) { return (x <= y || isnan(x)) ? x : y; }
static inline double np_maximum(double x, double y) { return (x >= y || isnan(x)) ? x : y; }

/* zepp.sim.link_sharing.maxmin_rates over the current flows, into s->frate.
 *
 * The same passes as the numpy version, the same floating-point operations in the same order.
 * Only the links the flows hold are touched. The first passes run by flow (every unfrozen flow's
 * shares and freeze test, pass_by_flow); a computation that needs more runs the rest by link
 * (pass_by_link), which is cheaper when many flows stay unfrozen for many passes: a link is a
 * local minimum exactly when none of its flows' other links has a share more than rate_tol below
 * its own, and a flow freezes exactly when one of its links is a local minimum (a flow's own link
 * being a local minimum already rules out its other link being lower). So per pass each link looks for one witness (a flow whose other link is lower; the
 * last pass's witness is tried first, since shares only grow), the flows of the local minima
 * freeze, and the frozen flows' levels are added to their links in flow order (a bitmap over the
 * flows), as bincount does. A pass costs the active links plus the flows that freeze, not every
 * unfrozen flow. */
static int has_witness(Sim *s, int64_t k, double grow) {
    const double *share = s->share;
    double sk = share[k];
    int64_t w = s->wit[k];
    if (w >= 0 && !s->frozen[w] && sk > share[s->wother[k]] * grow) return 1;
    int64_t b = s->adj_ptr[k], e = b + s->adj_len[k], j = b;
    for (int64_t i = b; i < e; i++) {
        int64_t f = s->adj[i];
        if (s->frozen[f]) continue;
        int64_t o = s->adj_o[i];
        s->adj[j] = f;
        s->adj_o[j] = o;
        j++;
        if (sk > share[o] * grow) {
            s->wit[k] = f;
            s->wother[k] = o;
            int64_t tail = e - i - 1;
            if (j <= i && tail > 0) {
                memmove(&s->adj[j], &s->adj[i + 1], (size_t)tail * sizeof(int64_t));
                memmove(&s->adj_o[j], &s->adj_o[i + 1], (size_t)tail * sizeof(int64_t));
            }
            s->adj_len[k] = j - b + tail;
            return 1;
        }
    }
    s->adj_len[k] = j - b;
    return 0;
}

/* Per-link lists of the unfrozen flows ``[left]`` (positions in idx / wa / wb) through each
 * active link, in flow order (a counting sort). */
static void build_adjacency(Sim *s, int64_t nact, int64_t left) {
    int64_t pos = 0;
    const int64_t *wa = s->wa, *wb = s->wb;
    for (int64_t q = 0; q < nact; q++) {
        int64_t k = s->act[q];
        s->adj_ptr[k] = pos;
        s->adj_len[k] = 0;
        s->wit[k] = -1;
        pos += s->cnt[k];
    }
    for (int64_t i = 0; i < left; i++) {
        int64_t a = wa[i], b = wb[i];
        int64_t pa = s->adj_ptr[a] + s->adj_len[a]++, pb = s->adj_ptr[b] + s->adj_len[b]++;
        s->adj[pa] = i;
        s->adj_o[pa] = b;
        s->adj[pb] = i;
        s->adj_o[pb] = a;
        s->frozen[i] = 0;
    }
}

/* One pass by flow: every unfrozen flow's shares and freeze test (the numpy version's loop);
 * returns -1 when no share is finite (every unfrozen flow then runs at an infinite rate). */
static int64_t pass_by_flow(Sim *s, int64_t left, double grow) {
    const double *share = s->share;
    double *m = s->m, *rate = s->frate, *sum = s->sum;
    int64_t *idx = s->widx, *wa = s->wa, *wb = s->wb, *dcnt = s->dcnt;
    uint8_t *nonloc = s->nonloc, *abad = s->abad, *bbad = s->bbad;
    int any_finite = 0;
    for (int64_t i = 0; i < left; i++) {
        double sa = share[wa[i]], sb = share[wb[i]];
        double mi = np_minimum(sa, sb);
        m[i] = mi;
        if (isfinite(mi)) any_finite = 1;
        uint8_t ab = sa > sb * grow, bb = sb > sa * grow;
        abad[i] = ab;
        bbad[i] = bb;
        if (ab) nonloc[wa[i]] = 1;
        if (bb) nonloc[wb[i]] = 1;
    }
    if (!any_finite) return -1;
    int64_t j = 0;
    for (int64_t i = 0; i < left; i++) {
        int64_t ka = wa[i], kb = wb[i];
        int hit = (!nonloc[ka] && !abad[i]) || (!nonloc[kb] && !bbad[i]);
        if (hit) {
            /* a-links and b-links are disjoint, so one sum per link adds its flows in
             * order, as bincount(a) + bincount(b) does */
            double mi = m[i];
            rate[idx[i]] = mi;
            sum[ka] += mi;
            sum[kb] += mi;
            dcnt[ka]++;
            dcnt[kb]++;
        } else {
            idx[j] = idx[i];
            wa[j] = ka;
            wb[j] = kb;
            j++;
        }
    }
    return j;
}

/* One pass by link (see has_witness): the local minima's flows freeze; their levels are added
 * to their links in flow order. Returns the flows left, or -1 when no share is finite. */
static int64_t pass_by_link(Sim *s, int64_t nact, int64_t left, double grow) {
    const double *share = s->share;
    double *m = s->m, *rate = s->frate, *sum = s->sum;
    int64_t *idx = s->widx, *wa = s->wa, *wb = s->wb, *dcnt = s->dcnt, *act = s->act;
    uint8_t *nonloc = s->nonloc, *frozen = s->frozen;
    uint64_t *hit = s->hitbits;
    int any_finite = 0;
    for (int64_t q = 0; q < nact; q++)
        if (isfinite(share[act[q]])) any_finite = 1; /* some flow's smaller share is finite */
    if (!any_finite) return -1;
    for (int64_t q = 0; q < nact; q++) nonloc[act[q]] = (uint8_t)has_witness(s, act[q], grow);
    for (int64_t q = 0; q < nact; q++) {
        int64_t k = act[q];
        if (nonloc[k]) continue;
        int64_t p0 = s->adj_ptr[k], p1 = p0 + s->adj_len[k];
        for (int64_t p = p0; p < p1; p++) {
            int64_t f = s->adj[p];
            if (frozen[f] || (hit[f >> 6] >> (f & 63) & 1)) continue;
            hit[f >> 6] |= (uint64_t)1 << (f & 63);
            double mi = np_minimum(share[wa[f]], share[wb[f]]);
            m[f] = mi;
            rate[idx[f]] = mi;
        }
        s->adj_len[k] = 0;
    }
    int64_t words = (s->nflow_pos + 63) / 64;
    for (int64_t w = 0; w < words; w++) {
        uint64_t bits = hit[w];
        if (!bits) continue;
        hit[w] = 0;
        while (bits) {
            int64_t f = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            int64_t ka = wa[f], kb = wb[f];
            double mi = m[f];
            sum[ka] += mi;
            sum[kb] += mi;
            dcnt[ka]++;
            dcnt[kb]++;
            frozen[f] = 1;
            left--;
        }
    }
    return left;
}

/* zepp.sim.link_sharing.maxmin_rates over the current flows, into s->frate (see has_witness):
 * BY_LINK_AFTER passes by flow, the rest by link. */
#define BY_LINK_AFTER 2
static void maxmin(Sim *s) {
    int64_t F = s->F, K = s->K;
    const int64_t *a = s->fa, *b = s->fb;
    const double *cap = s->cap;
    double *rate = s->frate;
    if (F == 0) return;
    int64_t *cnt = s->cnt, *act = s->act; /* cnt is all zero between calls */
    int64_t nact = 0;
    for (int64_t i = 0; i < F; i++) {
        if (!cnt[a[i]]++) act[nact++] = a[i];
        if (!cnt[b[i]]++) act[nact++] = b[i];
    }
    int64_t mx = 0;
    for (int64_t q = 0; q < nact; q++)
        if (act[q] != K - 1 && cnt[act[q]] > mx) mx = cnt[act[q]];
    if (mx <= 1 && isinf(cap[K - 1])) {
        for (int64_t i = 0; i < F; i++) rate[i] = np_minimum(cap[a[i]], cap[b[i]]);
        for (int64_t q = 0; q < nact; q++) cnt[act[q]] = 0;
        return;
    }
    double *rem = s->rem, *share = s->share, *sum = s->sum;
    int64_t *idx = s->widx, *wa = s->wa, *wb = s->wb, *dcnt = s->dcnt;
    for (int64_t q = 0; q < nact; q++) {
        int64_t k = act[q];
        rem[k] = cap[k];
        sum[k] = 0.0;
        dcnt[k] = 0;
        s->nonloc[k] = 0;
    }
    for (int64_t i = 0; i < F; i++) {
        rate[i] = 0.0;
        idx[i] = i;
        wa[i] = a[i];
        wb[i] = b[i];
    }
    double grow = 1.0 + s->rate_tol;
    int64_t left = F, passes = 0;
    int by_link = 0;
    while (left) {
        for (int64_t q = 0; q < nact; q++) {
            int64_t k = act[q];
            share[k] = rem[k] / (double)cnt[k]; /* active links have cnt > 0 */
            s->nonloc[k] = 0;
        }
        if (!by_link && passes >= BY_LINK_AFTER) {
            by_link = 1;
            s->nflow_pos = left;
            memset(s->hitbits, 0, (size_t)((left + 63) / 64) * sizeof(uint64_t));
            build_adjacency(s, nact, left);
        }
        int64_t j = by_link ? pass_by_link(s, nact, left, grow) : pass_by_flow(s, left, grow);
        passes++;
        if (j < 0) {
            if (by_link) {
                for (int64_t i = 0; i < s->nflow_pos; i++)
                    if (!s->frozen[i]) rate[idx[i]] = INFINITY;
            } else {
                for (int64_t i = 0; i < left; i++) rate[idx[i]] = INFINITY;
            }
            break;
        }
        int64_t na = 0;
        for (int64_t q = 0; q < nact; q++) {
            int64_t k = act[q];
            if (dcnt[k]) {
                rem[k] = np_maximum(rem[k] - sum[k], 0.0);
                cnt[k] -= dcnt[k];
                sum[k] = 0.0;
                dcnt[k] = 0;
            }
            if (cnt[k] > 0) act[na++] = k;
        }
        nact = na;
        left = j;
    }
    for (int64_t q = 0; q < nact; q++) cnt[act[q]] = 0; /* left by a pass with no finite share */
}

static void refresh_rates(Sim *s) {
    for (int64_t i = 0; i < s->nnew; i++) {
        int64_t t = s->newf[i];
        s->fid[s->F] = t;
        s->frem[s->F] = s->nbytes[t];
        s->fa[s->F] = s->la[t];
        s->fb[s->F] = s->lb[t];
        s->F++;
    }
    s->nnew = 0;
    maxmin(s);
    s->dirty = 0;
}

/* ------------------------------------------------------------------ the event loop */
static int step(Sim *s) {
    s->events++;
    if (s->dirty) refresh_rates(s);
    double ht = s->heap.n ? s->heap.a[0].time : INFINITY;
    double fe = INFINITY;
    if (s->F) {
        double mn = s->frem[0] / s->frate[0];
        int nan = isnan(mn);
        for (int64_t i = 1; i < s->F; i++) {
            double v = s->frem[i] / s->frate[i];
            if (isnan(v)) nan = 1;
            else if (v < mn) mn = v;
        }
        fe = s->now + (nan ? NAN : mn);
    }
    double t_next = (fe < ht) ? fe : ht; /* Python's min(heap top, next flow end) */
    if (!isfinite(t_next)) return -1;
    double rw = s->rel_quantum * t_next;
    double window = (rw > s->quantum) ? rw : s->quantum; /* Python's max(quantum, ...) */
    if (s->F) {
        double dt = t_next - s->now;
        int64_t j = 0, nret = 0;
        for (int64_t i = 0; i < s->F; i++) {
            double r = s->frem[i] - s->frate[i] * dt;
            if (r <= s->frate[i] * window + 1e-6) {
                s->ret_id[nret] = s->fid[i];
                s->ret_tail[nret] = np_maximum(r, 0.0) / s->frate[i];
                nret++;
            } else {
                s->fid[j] = s->fid[i];
                s->frem[j] = r;
                s->fa[j] = s->fa[i];
                s->fb[j] = s->fb[i];
                s->frate[j] = s->frate[i];
                j++;
            }
        }
        s->F = j;
        if (nret) {
            s->dirty = 1;
            for (int64_t i = 0; i < nret; i++) finish(s, s->ret_id[i], t_next + s->ret_tail[i]);
        }
    }
    s->now = t_next;
    while (s->heap.n) {
        const Event *top = &s->heap.a[0];
        double thr = t_next + (top->phase == 1 ? window : 0.0);
        if (!(top->time <= thr)) break;
        Event e = ev_pop(&s->heap);
        if (e.phase == 1 && s->nbytes[e.task] > 0) {
            s->newf[s->nnew++] = e.task;
            s->dirty = 1;
        } else {
            finish(s, e.task, e.time);
        }
    }
    return s->oom ? -2 : 0;
}

/* ------------------------------------------------------------------ Python entry point */
typedef struct {
    Py_buffer b;
    int held;
} Buf;

static int take(PyObject *obj, Buf *out, int writable, Py_ssize_t items, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, &out->b, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    out->held = 1;
    if (out->b.len != items * itemsize) {
        PyErr_Format(PyExc_ValueError, "zepp.sim._engine.run: %s holds %zd bytes, expected %zd", name, out->b.len,
                     items * itemsize);
        return -1;
    }
    return 0;
}

static PyObject *run(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t n, K, nstreams, nroots, nsucc;
    PyObject *o_succ_ptr, *o_succ, *o_indeg, *o_roots, *o_sk, *o_prio, *o_dur, *o_fixed, *o_nbytes, *o_xfer, *o_tiny,
        *o_la, *o_lb, *o_cap, *o_start, *o_end;
    double quantum, rel_quantum, rate_tol;
    if (!PyArg_ParseTuple(args, "nnnnnOOOOOOOOOOOOOOOOddd", &n, &K, &nstreams, &nroots, &nsucc, &o_succ_ptr, &o_succ,
                          &o_indeg, &o_roots, &o_sk, &o_prio, &o_dur, &o_fixed, &o_nbytes, &o_xfer, &o_tiny, &o_la,
                          &o_lb, &o_cap, &o_start, &o_end, &quantum, &rel_quantum, &rate_tol))
        return NULL;
    enum { NB = 16 };
    Buf bufs[NB];
    memset(bufs, 0, sizeof(bufs));
    PyObject *result = NULL;
    Sim s;
    memset(&s, 0, sizeof(s));
    if (take(o_succ_ptr, &bufs[0], 0, n + 1, 8, "succ_ptr") || take(o_succ, &bufs[1], 0, nsucc, 8, "succ") ||
        take(o_indeg, &bufs[2], 1, n, 8, "indeg") || take(o_roots, &bufs[3], 0, nroots, 8, "roots") ||
        take(o_sk, &bufs[4], 0, n, 8, "stream_key") || take(o_prio, &bufs[5], 0, n, 8, "prio") ||
        take(o_dur, &bufs[6], 0, n, 8, "dur") || take(o_fixed, &bufs[7], 0, n, 8, "fixed") ||
        take(o_nbytes, &bufs[8], 0, n, 8, "nbytes") || take(o_xfer, &bufs[9], 0, n, 1, "xfer") ||
        take(o_tiny, &bufs[10], 0, n, 8, "tiny_end") || take(o_la, &bufs[11], 0, n, 8, "la") ||
        take(o_lb, &bufs[12], 0, n, 8, "lb") || take(o_cap, &bufs[13], 0, K, 8, "cap") ||
        take(o_start, &bufs[14], 1, n, 8, "start") || take(o_end, &bufs[15], 1, n, 8, "end"))
        goto out;
    s.n = n;
    s.K = K;
    s.succ_ptr = (const int64_t *)bufs[0].b.buf;
    s.succ = (const int64_t *)bufs[1].b.buf;
    s.indeg = (int64_t *)bufs[2].b.buf;
    const int64_t *roots = (const int64_t *)bufs[3].b.buf;
    s.stream_key = (const int64_t *)bufs[4].b.buf;
    s.prio = (const double *)bufs[5].b.buf;
    s.dur = (const double *)bufs[6].b.buf;
    s.fixed = (const double *)bufs[7].b.buf;
    s.nbytes = (const double *)bufs[8].b.buf;
    s.xfer = (const uint8_t *)bufs[9].b.buf;
    s.tiny_end = (const double *)bufs[10].b.buf;
    s.la = (const int64_t *)bufs[11].b.buf;
    s.lb = (const int64_t *)bufs[12].b.buf;
    s.cap = (const double *)bufs[13].b.buf;
    s.start = (double *)bufs[14].b.buf;
    s.end = (double *)bufs[15].b.buf;
    s.quantum = quantum;
    s.rel_quantum = rel_quantum;
    s.rate_tol = rate_tol;
    s.nstreams = nstreams;
    size_t N = (size_t)(n > 0 ? n : 1), KK = (size_t)(K > 0 ? K : 1);
    s.ready_at = (double *)calloc(N, sizeof(double));
    s.queues = (Queue *)calloc((size_t)(nstreams > 0 ? nstreams : 1), sizeof(Queue));
    s.busy = (uint8_t *)calloc((size_t)(nstreams > 0 ? nstreams : 1), 1);
    if (!s.ready_at || !s.queues || !s.busy || alloc_arrays(&s, N, KK)) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t sk = s.stream_key[i];
        if (sk >= nstreams || s.succ_ptr[i] > s.succ_ptr[i + 1] || s.succ_ptr[i + 1] > nsucc ||
            (s.xfer[i] && (s.la[i] < 0 || s.la[i] >= K || s.lb[i] < 0 || s.lb[i] >= K))) {
            PyErr_Format(PyExc_ValueError, "zepp.sim._engine.run: task %zd has an index out of range", i);
            goto out;
        }
    }
    for (Py_ssize_t i = 0; i < nsucc; i++)
        if (s.succ[i] < 0 || s.succ[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "zepp.sim._engine.run: a successor out of range");
            goto out;
        }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nroots && !s.oom; i++) make_ready(&s, roots[i], 0.0);
    while (s.done < s.n && status == 0) {
        status = step(&s);
    }
    if (s.oom) status = -2;
    Py_END_ALLOW_THREADS
    if (status == -2) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("iLL", status, (long long)s.events, (long long)s.done);
out:
    for (int i = 0; i < NB; i++)
        if (bufs[i].held) PyBuffer_Release(&bufs[i].b);
    if (s.queues)
        for (int64_t i = 0; i < s.nstreams; i++) free(s.queues[i].a);
    free(s.queues);
    free(s.busy);
    free(s.heap.a);
    free(s.ready_at);
    free(s.arena);
    return result;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(n, K, nstreams, nroots, nsucc, succ_ptr, succ, indeg, roots, stream_key, prio, dur, fixed, nbytes, xfer, "
     "tiny_end, la, lb, cap, start, end, quantum, rel_quantum, rate_tol) -> (status, events, done): "
     "zepp.sim.engine.Engine's event loop (status -1: stuck)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_engine",
                                    "The compiled event loop of zepp.sim.engine (bit-identical to its Python loop).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__engine(void) { return PyModule_Create(&module); }
