/* The machine profile file: one schema, one module (src/plan/profile.c).
 * Not installed.
 *
 * A profile is one JSON object (docs/planner.md, "Machine profiles", has
 * every key). Every reader and writer of it goes through this module:
 *   the planner       ff_profile_parse / ff_profile_load / ff_profile_to_json
 *                     (include/fourfold/plan.h): the planner's view;
 *   the collectives   ff_coll_model_read (include/fourfold/comm.h, for
 *                     FF_PROFILE): load + ff_profile_doc_coll_model;
 *   the bench         `bench profile` builds a document and saves it;
 *                     `bench tune` loads one, replaces its picks, saves it.
 *
 * ff_profile_doc holds everything a file can say: the planner's keys, the
 * collective model's (both regimes, reduce_Bps), the measured picks with
 * their informational keys, the "fit" provenance object (kept as its JSON
 * text) and members with keys this version does not know (kept verbatim),
 * and which keys were present, so load -> write -> load gives the same
 * document. The parser is strict and checks every key it knows (type,
 * range, each at most once; picks as ff_coll_model_ok requires; a second
 * regime complete); messages name the file, the line and the key. */
#ifndef FF_PLAN_PROFILE_H
#define FF_PLAN_PROFILE_H

#include <stddef.h>

#include "fourfold/comm.h"
#include "fourfold/plan.h"

/* The keys of the object, in the order the writer writes them. */
typedef enum {
    FF_PK_FORMAT,         /* "fourfold-profile" */
    FF_PK_VERSION,        /* 1 */
    FF_PK_NAME,           /* string */
    FF_PK_RANKS_PER_NODE, /* the planner's keys (docs/planner.md) */
    FF_PK_CORES_PER_NODE,
    FF_PK_MEMORY_BYTES,
    FF_PK_GEMM_FLOPS,
    FF_PK_PEAK_FLOPS,
    FF_PK_ALPHA_INTRA, /* these four: the planner's and the collective model's */
    FF_PK_BETA_INTRA,
    FF_PK_ALPHA_INTER,
    FF_PK_BETA_INTER,
    FF_PK_INTRA_BW, /* list */
    FF_PK_MEM_BPS,
    FF_PK_GEMM_HALF_DIM,
    FF_PK_GEMM_CALL_S,
    FF_PK_INTRA_OVERLAP,
    FF_PK_ATTENTION_FUSED,
    FF_PK_PRECISION,  /* "fp32" or "bf16-mixed" (stored as FF_PLAN_FP32 or FF_PLAN_BF16_MIXED) */
    FF_PK_REDUCE_BPS, /* the collective model's own (docs/collectives.md) */
    FF_PK_SMALL_MAX_INTRA,
    FF_PK_ALPHA_INTRA_SMALL,
    FF_PK_BETA_INTRA_SMALL,
    FF_PK_SMALL_MAX_INTER,
    FF_PK_ALPHA_INTER_SMALL,
    FF_PK_BETA_INTER_SMALL,
    FF_PK_FIT,   /* object: `bench profile`'s provenance, kept as text */
    FF_PK_PICKS, /* list: `bench tune`'s measured picks */
    FF_PK_COUNT
} ff_profile_key;

/* The key's name in the file ("alpha_intra_s"), or NULL. */
const char *ff_profile_key_name(ff_profile_key k);

/* One entry of "picks": the rule AUTO applies, and two keys for the
 * reader that `bench tune` writes. */
typedef struct {
    ff_coll_pick_rule rule; /* coll, nodes, per_node, min_B, max_B, algo */
    int model_algo;         /* "model_algo": the model's choice (ff_algo); -1 if absent */
    int sizes;              /* "sizes": measured sizes the pick merges; 0 if absent */
} ff_profile_pick;

typedef struct {
    unsigned char has[FF_PK_COUNT]; /* 1: the key is present */
    double num[FF_PK_COUNT];        /* the number keys' values (0 where absent) */
    char name[64];                  /* "name"; parsed without one: the file's base name */
    int n_intra_bw;
    ff_intra_bw intra_bw[FF_PROFILE_MAX_BW];
    int n_picks;
    ff_profile_pick picks[FF_COLL_MAX_PICKS];
    char *fit;        /* "fit": the object's JSON text as read or built; NULL if absent */
    char *extra;      /* members of unknown keys, verbatim, ",\n "-separated; NULL if none */
    char source[256]; /* the file the document was read from, for messages */
} ff_profile_doc;

/* What the caller needs of a file, beyond the format and valid keys. */
typedef enum {
    FF_PROFILE_FOR_COLL = 0,   /* nothing: absent keys keep the model's values */
    FF_PROFILE_FOR_PLANNER = 1 /* the planner's required keys, "version" among them */
} ff_profile_need;

/* An empty document (no key but "format"); free with ff_profile_doc_free. */
void ff_profile_doc_init(ff_profile_doc *d);
void ff_profile_doc_free(ff_profile_doc *d);

/* Parses `len` bytes of text; `source` names it in messages. On success
 * *d is a document (free it), otherwise an empty one. FF_ECORRUPT for
 * malformed JSON, FF_EINVAL for a missing, repeated, mistyped or
 * out-of-range key (in a pick too), FF_ENOMEM. */
int ff_profile_doc_parse(const char *text, size_t len, const char *source, ff_profile_need need,
                         ff_profile_doc *d, char *err, size_t err_len);
/* Reads the file (at most 1 MiB) and parses it; FF_EIO if unreadable. */
int ff_profile_doc_load(const char *path, ff_profile_need need, ff_profile_doc *d, char *err,
                        size_t err_len);

/* The planner's view, with the defaults of docs/planner.md for the optional
 * keys; FF_EINVAL if a required key is absent. */
int ff_profile_doc_machine(const ff_profile_doc *d, ff_profile *out, char *err, size_t err_len);
/* A document of the planner's keys of p (every one present). */
void ff_profile_doc_from_machine(ff_profile_doc *d, const ff_profile *p);
/* Merges the collective model's keys into *m: a key that is absent keeps
 * *m's value, except that a level without small_max gets one regime; a
 * reduce_Bps of 0 (the fit could not resolve the additions) keeps *m's;
 * the picks are the document's (none without "picks"). *m is unchanged on
 * error (FF_EINVAL: the result fails ff_coll_model_ok). */
int ff_profile_doc_coll_model(const ff_profile_doc *d, ff_coll_model *m, char *err, size_t err_len);

/* Setters for writers: a number key (marked present), the name, one more
 * intra_bw entry (FF_EINVAL beyond FF_PROFILE_MAX_BW), the picks (replacing
 * any; FF_EINVAL beyond FF_COLL_MAX_PICKS). Values are checked when saved. */
void ff_profile_doc_set(ff_profile_doc *d, ff_profile_key k, double v);
void ff_profile_doc_set_name(ff_profile_doc *d, const char *name);
int ff_profile_doc_add_intra_bw(ff_profile_doc *d, int inner, int size, double Bps);
int ff_profile_doc_set_picks(ff_profile_doc *d, const ff_profile_pick *picks, int n);

/* The "fit" object `bench profile` writes: how the model was measured. */
typedef struct {
    int measured, samples;   /* the level was measured; samples fitted */
    double rms_rel, max_rel; /* relative residuals */
} ff_profile_fit_level;
typedef struct {
    const char *method, *date, *host, *gemm_shape;
    int ranks, nodes, iters;
    ff_profile_fit_level level[2]; /* "intra", "inter" */
    int curve_shapes;              /* shapes the GEMM curve was fitted to (0: none) */
    double curve_median_rel, curve_max_rel;
} ff_profile_fit;
/* Sets "fit" to that object; FF_ENOMEM. */
int ff_profile_doc_set_fit(ff_profile_doc *d, const ff_profile_fit *f);

/* The GEMM curve fitted to measured rates (src/plan/gemm_fit.c;
 * docs/planner.md, "Calibrating the GEMM curve"; bench/gemm_shape_fit.py
 * does the same from a table): shapes[i] = {m, n, k, FLOP/s of one call}.
 * The h (gemm_half_dim) and time per call (gemm_call_s) whose predicted
 * rates (the planner's, plan_gemm_time) have the least squared log error,
 * searched on a grid (h = 0, 2, ..., 2000; the call 0 to 30 us in steps of
 * 0.25 us). The large-shape rate (gemm_flops): with anchor < 0, *rate as
 * given; with 0 <= anchor < n, for each candidate the rate that predicts
 * shapes[anchor] exactly, the best one returned in *rate (the curve only
 * approaches it: a measured large shape is below it). The fitted rates in
 * fitted[n], the median and largest relative error in *median and *max
 * (each if not NULL). FF_EINVAL for no shapes, a side below 1, a rate not
 * finite and positive, or no candidate that fits; FF_ENOMEM. */
int ff_profile_fit_gemm(const double (*shapes)[4], int n, int anchor, double *rate,
                        double *half_dim, double *call_s, double *fitted, double *median,
                        double *max);

/* The whole file (keys in ff_profile_key order, a few per line, picks one
 * per line; numbers in the shortest form that reads back exactly), NUL-
 * terminated, malloc'd; its length in *len (if len). NULL if out of memory. */
char *ff_profile_doc_to_json(const ff_profile_doc *d, size_t *len);
/* Writes it to path atomically (util/file.h) after checking that it parses
 * back (a value out of range is refused here, not written); FF_EINVAL,
 * FF_EIO, FF_ENOMEM with a message. */
int ff_profile_doc_save(const char *path, const ff_profile_doc *d, char *err, size_t err_len);

#endif
