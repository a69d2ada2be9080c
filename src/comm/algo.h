/* Private to src/comm: the node layout of a group, the context's collective
 * layer (model, forced algorithm), and the phase machine the recursive, direct and
 * hierarchical algorithms are built from (phase.c). */
#ifndef FF_COMM_ALGO_H
#define FF_COMM_ALGO_H

#include "internal.h"

enum { FF_MAX_LOG2 = 32 };

/* A group's ranks by node. Nodes are numbered in the order of their lowest
 * group rank, ranks within a node (their "local index") by group rank. */
typedef struct ff_topo {
    int p;        /* group size */
    int n_nodes;  /* nodes the group spans */
    int per_node; /* the group's ranks on every node, or 0 if they differ */
    int my_node, my_local;
    int *node;   /* [group rank] = node index */
    int *member; /* regular only: [node * per_node + local] = group rank */
    /* for the cost model: on the busiest node, how many of its ranks send
     * off the node at once in ... */
    int ring_cross;            /* ... a ring step (r -> r+1) */
    int rd_cross[FF_MAX_LOG2]; /* ... recursive doubling with mask 2^l */
    int fold_cross;            /* ... the fold of a non-power-of-two group */
} ff_topo;

struct ff_coll_layer {
    int *node_of; /* context rank -> node index */
    int n_nodes;
    int per_node_override; /* FF_RANKS_PER_NODE, 0 if unset */
    ff_coll_model model;
    ff_algo forced; /* FF_ALGO, or FF_ALGO_AUTO */
    int a2a_window; /* all-to-all partners per round: FF_A2A_WINDOW or less */
};

/* The group's layout, built when the group was created
 * (ff_group_topo_init); NULL only without a collective layer. */
const ff_topo *ff_group_topo(ff_group *g);

/* ---- phases (phase.c) ----
 * A phase is a ring, recursive or direct all-gather or reduce-scatter among n
 * participants (group ranks peer[0..n)), where participant i's block is
 * elements [bound[i], bound[i+1]) of the phase's buffer: the schedule's
 * stage (all-gather, wire-typed) or its fp32 accumulator W (reduce-scatter,
 * in place: afterwards W's block `me` holds the sum). Blocks are contiguous
 * and in participant order, so a range of participants is a range of
 * elements; that is what lets recursive doubling work on any n: with
 * n = 2^L + rem, the first 2*rem participants pair up, the even one of each
 * pair (the "extra") hands its data to the odd one and sits out, and the
 * 2^L remaining "virtual" ranks own contiguous runs of one or two blocks. */
typedef enum {
    FF_PH_AG_RING,
    FF_PH_AG_REC,
    FF_PH_RS_RING,
    FF_PH_RS_REC,
    /* all-reduce by recursive doubling on the whole vector [bound[0],
     * bound[n]) in W: the fold in and out of a recursive phase, and every
     * virtual rank exchanges and adds the whole vector at each step */
    FF_PH_AR_REC,
    /* one exchange with every other participant, `width` partners per step
     * (round q: partners at distance qw+1 .. qw+w, sends to me+d, receives
     * from me-d): all-gather sends block me to each and receives theirs;
     * reduce-scatter sends each its block of the input (read from s->din)
     * and adds the n-1 blocks it receives into W's block me */
    FF_PH_AG_DIRECT,
    FF_PH_RS_DIRECT
} ff_phase_kind;

typedef struct {
    ff_phase_kind kind;
    int n, me;
    int *peer;     /* n group ranks */
    size_t *bound; /* n + 1 element offsets, nondecreasing */
    /* recursive phases on a non-power-of-two n: */
    int fold_in;  /* AG: the extra first sends its block to its partner */
    int fold_out; /* AG: 1 = the partner sends the extra everything but the
                   * extra's block, 2 = everything (after an all-reduce's RS,
                   * the extra owns nothing); RS: 1 = the partner sends the
                   * extra its block; AR: 1 = the whole result */
    int width;    /* direct phases: partners per step (1 .. FF_A2A_WINDOW) */
} ff_phase;

enum { FF_MAX_PHASES = 4 };

typedef struct ff_sched ff_sched;
typedef int (*ff_sched_fn)(ff_request *req, ff_sched *s);

struct ff_sched {
    ff_phase ph[FF_MAX_PHASES];
    int nph, cur, step;
    float *W; /* reduce-scatter phases: fp32 accumulator */
    /* the element offset W[0] stands for (0 but for the flat direct
     * reduce-scatter, whose W holds only the rank's block) */
    size_t w_base;
    /* If set, W holds nothing yet and the rank's contributions are read from
     * `in` (the caller's input, same offsets as W) until the first
     * reduce-scatter step has combined them: saves copying the input into W
     * (every element of W is written before it is read: see phase.c). */
    const float *in;
    void *stage;    /* all-gather phases: wire-typed (float or uint16_t) */
    void *tmp;      /* reduce-scatter receive buffer, wire-typed */
    uint16_t *sbuf; /* bf16 wire: packed send buffer of reduce-scatter phases */
    /* the receive of the step in flight, applied when it completes */
    size_t acc_off, acc_len;
    int acc_set; /* 1: W[..] = tmp, 0: W[..] += tmp */
    int acc_n;   /* blocks of acc_len in tmp to add, one after another (direct) */
    /* direct reduce-scatter phases: the rank's input, at W's offsets */
    const float *din;
    /* bf16 wire, FF_PH_AR_REC: the rank's own partial sum is rounded as the
     * partner's was, so that both ends of an exchange add the same two
     * values and hold the same bits */
    int round_own;
    ff_sched_fn before[FF_MAX_PHASES]; /* local work before phase i (or NULL) */
    ff_sched_fn finish;                /* after the last phase (or NULL) */
    /* storage for the views' arrays */
    int *ints;
    size_t *sizes;
};

/* Allocates a schedule with room for `n_ints` peers and `n_sizes` bounds,
 * attached to req->state (freed with the request). */
ff_sched *ff_sched_new(ff_request *req, size_t n_ints, size_t n_sizes);
/* Elements of the buffers the phases need (the largest receive and send of
 * any reduce-scatter phase: a direct one's blocks of a step together), for
 * sizing tmp and sbuf. */
size_t ff_phase_max_rs_msg(const ff_phase *ph);
/* The element range a participant holds complete after a reduce-scatter
 * phase without fold_out (the start of the matching all-gather phase). */
void ff_phase_owned(const ff_phase *ph, size_t *off, size_t *len);
/* Carves the request's scratch: W (w_elems floats; 0 when W is elsewhere),
 * tmp and, on the bf16 wire, sbuf (msg_elems each), and a wire-typed stage of
 * stage_elems (0: none). */
int ff_sched_carve(ff_request *req, ff_sched *s, size_t w_elems, size_t msg_elems,
                   size_t stage_elems);
/* Sets req->advance; the engine then runs the first step. */
int ff_sched_run(ff_request *req, ff_sched *s);

/* Scratch carving: bytes rounded up so that every region stays aligned. */
static inline size_t ff_align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }
static inline size_t ff_wire_size(ff_wire w) { return w == FF_WIRE_BF16 ? 2 : 4; }

static inline int ff_is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }
static inline int ff_floor_pow2(int n)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    return p;
}

#endif
