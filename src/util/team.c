/* A team of threads (src/util/team.h). On OpenMP, a run is one parallel
 * region. With threads of its own, one job at a time: the caller publishes
 * it under the mutex with a new generation number, the workers wake, each
 * runs its range, and the last one done signals the caller. */
#include "team.h"

#include <pthread.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    ff_team *team;
    int index; /* 1..threads-1 */
    pthread_t thread;
} worker;

struct ff_team {
    int threads;
    int openmp; /* runs are OpenMP parallel regions; no workers */
    worker *workers;
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    unsigned long generation; /* of the job published last */
    int pending;              /* workers still running the job */
    int stop;
    /* the job */
    ff_team_fn fn;
    void *arg;
    int64_t n;
    int ranges;
};

static void range_of(const ff_team *t, int i, int64_t *begin, int64_t *end)
{
    *begin = t->n * i / t->ranges;
    *end = t->n * (i + 1) / t->ranges;
}

static void *worker_main(void *p)
{
    worker *w = p;
    ff_team *t = w->team;
    unsigned long seen = 0;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->stop && t->generation == seen)
            pthread_cond_wait(&t->start, &t->lock);
        if (t->stop)
            break;
        seen = t->generation;
        int mine = w->index < t->ranges;
        pthread_mutex_unlock(&t->lock);
        if (mine) {
            int64_t b, e;
            range_of(t, w->index, &b, &e);
            t->fn(t->arg, b, e, w->index);
        }
        pthread_mutex_lock(&t->lock);
        if (--t->pending == 0)
            pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

ff_team *ff_team_create(int threads, int openmp)
{
    if (threads < 1)
        return NULL;
    ff_team *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
#ifdef _OPENMP
    if (openmp) {
        t->threads = threads;
        t->openmp = 1;
        return t;
    }
#else
    (void)openmp;
#endif
    t->threads = 1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->start, NULL);
    pthread_cond_init(&t->done, NULL);
    if (threads > 1 && !(t->workers = calloc((size_t)threads - 1, sizeof(worker)))) {
        ff_team_destroy(t);
        return NULL;
    }
    for (int i = 1; i < threads; i++) {
        worker *w = &t->workers[i - 1];
        w->team = t;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            ff_team_destroy(t);
            return NULL;
        }
        t->threads = i + 1; /* workers started so far, for destroy */
    }
    return t;
}

void ff_team_destroy(ff_team *t)
{
    if (!t)
        return;
    if (t->openmp) {
        free(t);
        return;
    }
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_broadcast(&t->start);
    pthread_mutex_unlock(&t->lock);
    for (int i = 1; i < t->threads; i++)
        pthread_join(t->workers[i - 1].thread, NULL);
    pthread_cond_destroy(&t->start);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->lock);
    free(t->workers);
    free(t);
}

int ff_team_size(const ff_team *t) { return t ? t->threads : 1; }

const char *ff_team_kind(const ff_team *t) { return t && t->openmp ? "openmp" : "own threads"; }

#ifdef _OPENMP
/* One parallel region; range i runs on thread i, or, where OpenMP gives
 * fewer threads (a caller inside a region of its own, without nesting), on
 * thread i mod the threads given: the ranges, and so the bits, are the same. */
static void run_openmp(int ranges, int64_t n, ff_team_fn fn, void *arg)
{
#pragma omp parallel num_threads(ranges)
    {
        int given = omp_get_num_threads();
        for (int i = omp_get_thread_num(); i < ranges; i += given)
            fn(arg, n * i / ranges, n * (i + 1) / ranges, i);
    }
}
#endif

void ff_team_run(ff_team *t, int64_t n, int64_t grain, ff_team_fn fn, void *arg)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t most = (n + grain - 1) / grain;
    int ranges = t ? (most < t->threads ? (int)most : t->threads) : 1;
    if (ranges <= 1) {
        fn(arg, 0, n, 0);
        return;
    }
#ifdef _OPENMP
    if (t->openmp) {
        run_openmp(ranges, n, fn, arg);
        return;
    }
#endif
    pthread_mutex_lock(&t->lock);
    t->fn = fn;
    t->arg = arg;
    t->n = n;
    t->ranges = ranges;
    t->pending = t->threads - 1; /* every worker wakes; those beyond `ranges` idle */
    t->generation++;
    pthread_cond_broadcast(&t->start);
    pthread_mutex_unlock(&t->lock);
    int64_t b, e;
    range_of(t, 0, &b, &e);
    fn(arg, b, e, 0);
    pthread_mutex_lock(&t->lock);
    while (t->pending > 0)
        pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
}
