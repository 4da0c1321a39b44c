/* See fastread.h. Built by cffi (_build/fastread_ffi.py) as kwatermark._fastread. */
#include "fastread.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ---- librdkafka's public ABI (rdkafka.h), only what is used ---- */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;

typedef struct rd_kafka_message_s {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

typedef struct rd_kafka_topic_partition_s {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    void *opaque;
    int err;
    void *_private;
} rd_kafka_topic_partition_t;

typedef struct rd_kafka_topic_partition_list_s {
    int cnt;
    int size;
    rd_kafka_topic_partition_t *elems;
} rd_kafka_topic_partition_list_t;

typedef struct rd_kafka_metadata_broker {
    int32_t id;
    char *host;
    int port;
} rd_kafka_metadata_broker_t;

typedef struct rd_kafka_metadata_partition {
    int32_t id;
    int err;
    int32_t leader;
    int replica_cnt;
    int32_t *replicas;
    int isr_cnt;
    int32_t *isrs;
} rd_kafka_metadata_partition_t;

typedef struct rd_kafka_metadata_topic {
    char *topic;
    int partition_cnt;
    rd_kafka_metadata_partition_t *partitions;
    int err;
} rd_kafka_metadata_topic_t;

typedef struct rd_kafka_metadata {
    int broker_cnt;
    rd_kafka_metadata_broker_t *brokers;
    int topic_cnt;
    rd_kafka_metadata_topic_t *topics;
    int32_t orig_broker_id;
    char *orig_broker_name;
} rd_kafka_metadata_t;

#define RD_KAFKA_CONSUMER 1
#define RD_KAFKA_CONF_OK 0
#define RD_KAFKA_RESP_ERR_NO_ERROR 0

static struct {
    int loaded;
    const char *(*version_str)(void);
    rd_kafka_conf_t *(*conf_new)(void);
    int (*conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_set_log_cb)(rd_kafka_conf_t *,
                            void (*)(const rd_kafka_t *, int, const char *, const char *));
    void (*conf_destroy)(rd_kafka_conf_t *);
    rd_kafka_t *(*new_)(int, rd_kafka_conf_t *, char *, size_t);
    void (*destroy)(rd_kafka_t *);
    const char *(*name)(const rd_kafka_t *);
    rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
    void (*topic_destroy)(rd_kafka_topic_t *);
    rd_kafka_queue_t *(*queue_new)(rd_kafka_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    int (*consume_start_queue)(rd_kafka_topic_t *, int32_t, int64_t, rd_kafka_queue_t *);
    int (*consume_stop)(rd_kafka_topic_t *, int32_t);
    ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
    void (*message_destroy)(rd_kafka_message_t *);
    int64_t (*message_timestamp)(const rd_kafka_message_t *, int *);
    int (*message_headers)(const rd_kafka_message_t *, rd_kafka_headers_t **);
    size_t (*header_cnt)(const rd_kafka_headers_t *);
    int (*header_get_all)(const rd_kafka_headers_t *, size_t, const char **, const void **,
                          size_t *);
    const char *(*err2str)(int);
    const char *(*err2name)(int);
    int (*last_error)(void);
    rd_kafka_topic_partition_list_t *(*tpl_new)(int);
    rd_kafka_topic_partition_t *(*tpl_add)(rd_kafka_topic_partition_list_t *, const char *,
                                           int32_t);
    void (*tpl_destroy)(rd_kafka_topic_partition_list_t *);
    int (*position)(rd_kafka_t *, rd_kafka_topic_partition_list_t *);
    int (*pause_partitions)(rd_kafka_t *, rd_kafka_topic_partition_list_t *);
    int (*resume_partitions)(rd_kafka_t *, rd_kafka_topic_partition_list_t *);
    void *(*seek_partitions)(rd_kafka_t *, rd_kafka_topic_partition_list_t *, int);
    const char *(*error_string)(const void *);
    void (*error_destroy)(void *);
    rd_kafka_queue_t *(*queue_get_partition)(rd_kafka_t *, const char *, int32_t);
    void (*queue_forward)(rd_kafka_queue_t *, rd_kafka_queue_t *);
    int (*offsets_for_times)(rd_kafka_t *, rd_kafka_topic_partition_list_t *, int);
    int (*metadata)(rd_kafka_t *, int, rd_kafka_topic_t *, const rd_kafka_metadata_t **, int);
    void (*metadata_destroy)(const rd_kafka_metadata_t *);
} rk;

/* cffi's extern "Python+C": librdkafka's log lines, to Python logging. */
extern void kw_log_py(int level, const char *fac, const char *name, const char *buf);

static void log_cb(const rd_kafka_t *k, int level, const char *fac, const char *buf) {
    kw_log_py(level, fac, rk.name(k), buf);
}

#define LOOKUP(field, symbol)                                                     \
    do {                                                                          \
        *(void **)(&rk.field) = dlsym(handle, symbol);                            \
        if (!rk.field) {                                                          \
            snprintf(err, errlen, "%s has no %s", path, symbol);                  \
            return -1;                                                            \
        }                                                                         \
    } while (0)

int kw_load(const char *path, char *err, size_t errlen) {
    if (rk.loaded)
        return 0;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(err, errlen, "%s", dlerror());
        return -1;
    }
    LOOKUP(version_str, "rd_kafka_version_str");
    LOOKUP(conf_new, "rd_kafka_conf_new");
    LOOKUP(conf_set, "rd_kafka_conf_set");
    LOOKUP(conf_set_log_cb, "rd_kafka_conf_set_log_cb");
    LOOKUP(conf_destroy, "rd_kafka_conf_destroy");
    LOOKUP(new_, "rd_kafka_new");
    LOOKUP(destroy, "rd_kafka_destroy");
    LOOKUP(name, "rd_kafka_name");
    LOOKUP(topic_new, "rd_kafka_topic_new");
    LOOKUP(topic_destroy, "rd_kafka_topic_destroy");
    LOOKUP(queue_new, "rd_kafka_queue_new");
    LOOKUP(queue_destroy, "rd_kafka_queue_destroy");
    LOOKUP(consume_start_queue, "rd_kafka_consume_start_queue");
    LOOKUP(consume_stop, "rd_kafka_consume_stop");
    LOOKUP(consume_batch_queue, "rd_kafka_consume_batch_queue");
    LOOKUP(message_destroy, "rd_kafka_message_destroy");
    LOOKUP(message_timestamp, "rd_kafka_message_timestamp");
    LOOKUP(message_headers, "rd_kafka_message_headers");
    LOOKUP(header_cnt, "rd_kafka_header_cnt");
    LOOKUP(header_get_all, "rd_kafka_header_get_all");
    LOOKUP(err2str, "rd_kafka_err2str");
    LOOKUP(err2name, "rd_kafka_err2name");
    LOOKUP(last_error, "rd_kafka_last_error");
    LOOKUP(tpl_new, "rd_kafka_topic_partition_list_new");
    LOOKUP(tpl_add, "rd_kafka_topic_partition_list_add");
    LOOKUP(tpl_destroy, "rd_kafka_topic_partition_list_destroy");
    LOOKUP(position, "rd_kafka_position");
    LOOKUP(pause_partitions, "rd_kafka_pause_partitions");
    LOOKUP(resume_partitions, "rd_kafka_resume_partitions");
    LOOKUP(seek_partitions, "rd_kafka_seek_partitions");
    LOOKUP(error_string, "rd_kafka_error_string");
    LOOKUP(error_destroy, "rd_kafka_error_destroy");
    LOOKUP(queue_get_partition, "rd_kafka_queue_get_partition");
    LOOKUP(queue_forward, "rd_kafka_queue_forward");
    LOOKUP(offsets_for_times, "rd_kafka_offsets_for_times");
    LOOKUP(metadata, "rd_kafka_metadata");
    LOOKUP(metadata_destroy, "rd_kafka_metadata_destroy");
    rk.loaded = 1;
    return 0;
}

const char *kw_version(void) { return rk.version_str(); }
const char *kw_err_name(int e) { return rk.err2name(e); }
const char *kw_err_text(int e) { return rk.err2str(e); }
void kw_free(void *p) { free(p); }

/* ---- the reader ---- */

/* A partition a consumer has started, between tasks too (kw_park): librdkafka pays for every
 * partition started with a pass over every partition it knows (bench/README.md, "What
 * librdkafka does per partition at 4,096"), and for stopping them again; a paused one
 * resumes for nothing. */
enum { KW_IDLE = 0, KW_READING = 1, KW_PARKED = 2 };
/* What a partition may carry: twice its ranges' records, at least this many (past_end). */
#define KW_CARRY_MIN 64
/* The most records a parked partition fetches in vain to reach its range (catches_up): at
 * 4,096 partitions a seek costs a pass of librdkafka's broker thread over all of them, some
 * hundred records' reading. */
#define KW_CATCH_UP 256
typedef struct kw_slot {
    int state;
    int32_t leader1;             /* its leader's id + 1 when kw_metadata last asked; 0 unknown */
    int64_t end;                 /* where its last task's ranges ended (KW_PARKED) */
    int64_t limit;               /* the most messages it carries (past_end) */
    int64_t from;                /* where it was last started or sought */
    int n, cap;
    uint32_t gen;                /* the reader's gen when `lane` was set: this task's */
    int lane;                    /* its first lane in the task (lane_of) */
    rd_kafka_message_t **carry;  /* polled past `end`, in offset order: the next range's */
    int asleep;                  /* kept paused through this task: its carry holds its ranges */
    int truncated;               /* polled more than it keeps: librdkafka stands past `carry` */
    rd_kafka_queue_t *own;       /* its fetch queue, led away from the reader's while parked */
} kw_slot;

struct kw_reader {
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    int headers;
    int64_t max_records;
    int64_t max_bytes;
    int ntopics;
    int topic_cap;
    char **topic_names;
    rd_kafka_topic_t **topics;
    kw_slot **parks;             /* [topic][partition] */
    int32_t *nparks;
    int parking;                 /* this task's partitions are parked at its end (kw_park) */
    rd_kafka_topic_partition_list_t *holding;   /* carries full, to pause (hold_flush) */
    int resumed;                 /* partitions the last kw_start resumed (where they stood, or
                                  * a little behind their ranges: catches_up) */
    int slept;                   /* of those, kept paused: their carry held their ranges */
    int nlanes;
    int lane_cap;
    kw_lane *lanes;
    int started;
    rd_kafka_message_t **msgs;
    int msg_cap;
    int msg_n;
    int msg_i;
    int hint;
    uint32_t gen;       /* one a task (kw_add_lane's first lane): which slots' `lane` hold */
    int got;
    int event_lane;
    int event_err;
    int64_t event_offset;
    char event_text[512];
};

static kw_slot *park_of(kw_reader *r, int t, int32_t partition);

kw_reader *kw_open(const char **names, const char **values, int nconf, int headers,
                   int64_t max_records, int64_t max_bytes, char *err, size_t errlen) {
    rd_kafka_conf_t *conf = rk.conf_new();
    for (int i = 0; i < nconf; i++) {
        if (rk.conf_set(conf, names[i], values[i], err, errlen) != RD_KAFKA_CONF_OK) {
            rk.conf_destroy(conf);
            return NULL;
        }
    }
    rk.conf_set_log_cb(conf, log_cb);
    rd_kafka_t *k = rk.new_(RD_KAFKA_CONSUMER, conf, err, errlen);
    if (!k) {
        rk.conf_destroy(conf);
        return NULL;
    }
    kw_reader *r = calloc(1, sizeof(*r));
    r->rk = k;
    r->queue = rk.queue_new(k);
    r->headers = headers;
    r->max_records = max_records;
    r->max_bytes = max_bytes;
    r->event_lane = -1;
    return r;
}

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The calls of kw_offsets asked together: on loopback after a pause (a planning's ask, a
 * micro-batch after the last), sixteen calls of 256 one after the other took 46 ms where
 * four threads of four took 31, eight 26-33 (scratch measurements of 2026-12-02); each call
 * pays its round trip's wake-ups, which calls in flight together share. */
#define KW_OFFSETS_THREADS 4

typedef struct {
    kw_reader *r;
    const char **topics;
    const int32_t *partitions;
    int64_t *offsets;
    int32_t *errors;
    int n, chunk, first, step;
    int64_t deadline;
    int e;
} kw_offsets_job;

static void *offsets_calls(void *arg) {
    kw_offsets_job *j = arg;
    for (int first = j->first; first < j->n && !j->e; first += j->step) {
        int count = j->n - first < j->chunk ? j->n - first : j->chunk;
        int64_t left = j->deadline - monotonic_ms();
        rd_kafka_topic_partition_list_t *list = rk.tpl_new(count);
        for (int i = 0; i < count; i++)
            rk.tpl_add(list, j->topics[first + i], j->partitions[first + i])->offset =
                j->offsets[first + i];
        j->e = rk.offsets_for_times(j->r->rk, list, left < 50 ? 50 : (int)left);
        if (j->e == RD_KAFKA_RESP_ERR_NO_ERROR) {
            for (int i = 0; i < count; i++) {
                /* answered in the order asked (librdkafka updates the list in place) */
                j->offsets[first + i] = list->elems[i].offset;
                j->errors[first + i] = list->elems[i].err;
            }
        }
        rk.tpl_destroy(list);
    }
    return NULL;
}

int kw_offsets(kw_reader *r, const char **topics, const int32_t *partitions,
               int64_t *offsets, int32_t *errors, int n, int chunk, int timeout_ms) {
    if (chunk <= 0)
        chunk = n > 0 ? n : 1;
    int calls = (n + chunk - 1) / chunk;
    int nthreads = calls < KW_OFFSETS_THREADS ? calls : KW_OFFSETS_THREADS;
    if (nthreads < 1)
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    kw_offsets_job jobs[KW_OFFSETS_THREADS];
    pthread_t threads[KW_OFFSETS_THREADS];
    int running[KW_OFFSETS_THREADS] = {0};
    int64_t deadline = monotonic_ms() + timeout_ms;
    for (int k = 0; k < nthreads; k++) {
        jobs[k] = (kw_offsets_job){r, topics, partitions, offsets, errors, n, chunk,
                                   k * chunk, nthreads * chunk, deadline, 0};
        /* the first on this thread; any that cannot start, here after it */
        running[k] = k > 0 && pthread_create(&threads[k], NULL, offsets_calls, &jobs[k]) == 0;
    }
    offsets_calls(&jobs[0]);
    int e = jobs[0].e;
    for (int k = 1; k < nthreads; k++) {
        if (running[k])
            pthread_join(threads[k], NULL);
        else
            offsets_calls(&jobs[k]);
        if (!e)
            e = jobs[k].e;
    }
    return e;
}

int kw_metadata(kw_reader *r, const char *topic, int timeout_ms, int32_t *leaders, int cap,
                char *brokers, size_t blen, int *err) {
    rd_kafka_topic_t *t = rk.topic_new(r->rk, topic, NULL);
    if (!t) {
        *err = rk.last_error();
        return -1;
    }
    const rd_kafka_metadata_t *md = NULL;
    int e = rk.metadata(r->rk, 0, t, &md, timeout_ms);
    rk.topic_destroy(t);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        *err = e;
        return -1;
    }
    int count = 0;
    for (int i = 0; i < md->topic_cnt; i++) {
        const rd_kafka_metadata_topic_t *mt = &md->topics[i];
        if (strcmp(mt->topic, topic) != 0)
            continue;
        if (mt->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            e = mt->err;
            break;
        }
        int known = -1;   /* a topic of the reader's lanes: its partitions' leaders kept */
        for (int t = 0; t < r->ntopics; t++)
            if (strcmp(r->topic_names[t], topic) == 0)
                known = t;
        for (int p = 0; p < mt->partition_cnt; p++) {
            int32_t id = mt->partitions[p].id;
            if (id >= 0 && id < cap)
                leaders[id] = mt->partitions[p].leader;
            if (id >= 0 && known >= 0)
                park_of(r, known, id)->leader1 = mt->partitions[p].leader + 1;
            if (id + 1 > count)
                count = id + 1;
        }
    }
    size_t used = 0;
    if (blen)
        brokers[0] = '\0';
    for (int i = 0; i < md->broker_cnt && used < blen; i++) {
        int w = snprintf(brokers + used, blen - used, "%d %s %d\n", md->brokers[i].id,
                         md->brokers[i].host, md->brokers[i].port);
        if (w < 0 || (size_t)w >= blen - used)
            break;
        used += (size_t)w;
    }
    rk.metadata_destroy(md);
    if (e) {
        *err = e;
        return -1;
    }
    return count;
}

/* confluent-kafka's list_topics() makes a Python object for every partition of the cluster,
 * holding the GIL: 6.3 ms of the asking thread's CPU on a cluster of 8,708 partitions,
 * against 0.08 here (bench/README.md, "A pattern's topics in one call"). */
int kw_topic_counts(kw_reader *r, int timeout_ms, char *names, size_t nlen, size_t *needed,
                    int32_t *counts, int cap, int *err) {
    const rd_kafka_metadata_t *md = NULL;
    int e = rk.metadata(r->rk, 1, NULL, &md, timeout_ms);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        *err = e;
        return -1;
    }
    int n = 0, room = 1;   /* once one does not fit, none is written: the call is made again */
    size_t used = 0;
    for (int i = 0; i < md->topic_cnt; i++) {
        const rd_kafka_metadata_topic_t *mt = &md->topics[i];
        if (mt->err != RD_KAFKA_RESP_ERR_NO_ERROR)
            continue;
        size_t len = strlen(mt->topic) + 1;
        room = room && n < cap && used + len <= nlen;
        if (room) {
            memcpy(names + used, mt->topic, len);
            counts[n] = mt->partition_cnt;
        }
        used += len;
        n++;
    }
    rk.metadata_destroy(md);
    *needed = used;
    return n;
}

int kw_add_lane(kw_reader *r, const char *topic, int32_t partition, int64_t position,
                int64_t end) {
    int t;
    for (t = 0; t < r->ntopics; t++)
        if (strcmp(r->topic_names[t], topic) == 0)
            break;
    if (t == r->ntopics) {
        if (t == r->topic_cap) {
            r->topic_cap = r->topic_cap ? 2 * r->topic_cap : 8;
            r->topic_names = realloc(r->topic_names, r->topic_cap * sizeof(char *));
            r->topics = realloc(r->topics, r->topic_cap * sizeof(rd_kafka_topic_t *));
            r->parks = realloc(r->parks, r->topic_cap * sizeof(kw_slot *));
            r->nparks = realloc(r->nparks, r->topic_cap * sizeof(int32_t));
        }
        r->parks[t] = NULL;
        r->nparks[t] = 0;
        r->topic_names[t] = strdup(topic);
        r->topics[t] = rk.topic_new(r->rk, topic, NULL);
        if (!r->topics[t]) {
            free(r->topic_names[t]);
            return -1;
        }
        r->ntopics++;
    }
    if (r->nlanes == r->lane_cap) {
        r->lane_cap = r->lane_cap ? 2 * r->lane_cap : 8;
        r->lanes = realloc(r->lanes, r->lane_cap * sizeof(kw_lane));
    }
    if (r->nlanes == 0)
        r->gen++;
    kw_slot *p = park_of(r, t, partition);
    if (p->gen != r->gen) {   /* the partition's first lane */
        p->gen = r->gen;
        p->lane = r->nlanes;
    }
    kw_lane *l = &r->lanes[r->nlanes];
    memset(l, 0, sizeof(*l));
    l->topic = t;
    l->partition = partition;
    l->position = position;
    l->end = end;
    return r->nlanes++;
}

kw_lane *kw_lane_at(kw_reader *r, int i) { return &r->lanes[i]; }

static kw_slot *park_of(kw_reader *r, int t, int32_t partition) {
    if (partition >= r->nparks[t]) {
        int32_t n = r->nparks[t] ? r->nparks[t] : 64;
        while (n <= partition)
            n *= 2;
        r->parks[t] = realloc(r->parks[t], (size_t)n * sizeof(kw_slot));
        memset(r->parks[t] + r->nparks[t], 0, (size_t)(n - r->nparks[t]) * sizeof(kw_slot));
        r->nparks[t] = n;
    }
    return &r->parks[t][partition];
}

static void park_drop(kw_slot *p) {
    for (int i = 0; i < p->n; i++)
        rk.message_destroy(p->carry[i]);
    p->n = 0;
    p->truncated = 0;   /* nothing kept: it is started or sought before it reads again */
}

static int same_partition(kw_lane *a, kw_lane *b);

/* The end of the last of the partition's lanes from lane i (its first). */
static int64_t partition_end(kw_reader *r, int i) {
    while (i + 1 < r->nlanes && same_partition(&r->lanes[i], &r->lanes[i + 1]))
        i++;
    return r->lanes[i].end;
}

/* A message that no range takes: while parking, one at or past its partition's end is kept
 * for the next task's range (librdkafka counts it consumed: a resumed partition fetches
 * after it); any other is dropped. librdkafka does not count what is kept against its
 * prefetch and goes on fetching, so what a partition keeps is bounded (a stream catching
 * up, its ranges shorter than a Fetch answer, would keep more after every task): at its
 * limit the partition is paused (hold), and what the same poll handed over past it is
 * carried too. Unbounded, it kept nothing, and was sought every task: a stream catching up
 * at 4,096 partitions (ranges of 2 records, 80 in each log) took 0.6-2.5 s a task until its
 * logs' ends came within reach. One that cannot be paused (hold) keeps no more past its
 * limit (truncated: the next task seeks it). */
static void hold(kw_reader *r, kw_slot *p, int t, int32_t partition);
static void hold_flush(kw_reader *r);

static void past_end(kw_reader *r, rd_kafka_message_t *m) {
    kw_slot *p = NULL;
    int t = 0;
    for (; r->parking && t < r->ntopics; t++)
        if (r->topics[t] == m->rkt) {
            p = park_of(r, t, m->partition);
            break;
        }
    if (!p || p->state != KW_READING || m->offset < p->end) {
        rk.message_destroy(m);
        return;
    }
    if (p->truncated || (p->n >= p->limit && !p->asleep)) {
        p->truncated = 1;
        rk.message_destroy(m);
        return;
    }
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 8;
        p->carry = realloc(p->carry, (size_t)p->cap * sizeof(*p->carry));
    }
    p->carry[p->n++] = m;
    if (p->n >= p->limit && !p->asleep)
        hold(r, p, t, m->partition);
}

static void drain_own(kw_reader *r, kw_slot *p, int keep);

/* Lead a partition's fetch queue into the reader's before it starts again: one parked once
 * (its queue led away by the application, kw_park) is not led there by librdkafka's start. */
static void lead_back(kw_reader *r, kw_slot *p) {
    if (p->own) {
        drain_own(r, p, 0);   /* a stopped partition's barriers */
        rk.queue_forward(p->own, r->queue);
    }
}

/* Lead a partition's fetch queue away from the reader's before it is paused, so the pause's
 * barrier stays with it (drain_own takes it when it is led back); 0 when librdkafka does not
 * know the partition any more. The reader's queue sorts each barrier ahead of its messages. */
static int lead_away(kw_reader *r, kw_slot *p, int t, int32_t partition) {
    if (!p->own)
        p->own = rk.queue_get_partition(r->rk, r->topic_names[t], partition);
    if (!p->own)
        return 0;
    rk.queue_forward(p->own, NULL);
    return 1;
}

static int start_partition(kw_reader *r, kw_lane *l, char *err, size_t errlen) {
    kw_slot *p = park_of(r, l->topic, l->partition);
    p->from = l->position;
    lead_back(r, p);
    if (rk.consume_start_queue(r->topics[l->topic], l->partition, l->position, r->queue) ==
        -1) {
        int e = rk.last_error();
        snprintf(err, errlen, "%s", rk.err2str(e));
        return e ? e : -1;
    }
    return 0;
}

static void pending(kw_reader *r, rd_kafka_message_t *m) {
    if (r->msg_n == r->msg_cap) {
        r->msg_cap = r->msg_cap ? 2 * r->msg_cap : 1024;
        r->msgs = realloc(r->msgs, (size_t)r->msg_cap * sizeof(*r->msgs));
    }
    r->msgs[r->msg_n++] = m;
}

/* Whatever is in a partition's own fetch queue (led away from the reader's: kw_park) taken:
 * librdkafka's version barriers, which each pause, resume or start puts there, and any
 * message (to `pending`, or dropped). The reader's queue sorts such barriers ahead of its
 * messages one by one, each insert walking those already there: 4,096 partitions paused or
 * resumed with their queues led into it took 50-120 ms, mostly that walk. */
static void drain_own(kw_reader *r, kw_slot *p, int keep) {
    rd_kafka_message_t *got[64];
    ssize_t n;
    while ((n = rk.consume_batch_queue(p->own, 0, got, 64)) > 0)
        for (ssize_t i = 0; i < n; i++) {
            if (keep)
                pending(r, got[i]);
            else
                rk.message_destroy(got[i]);
        }
}

/* Whether a parked partition that stands at `resumes`, behind the range it reads from
 * `position`, goes on from there: the records between are fetched and dropped (file: before
 * the range), at most KW_CATCH_UP of them, where a seek would wake its leader's broker thread
 * for a pass over every partition the consumer knows. A partition stands behind when another
 * consumer read its last ranges: Spark hands a micro-batch's tasks to whichever Python worker
 * is free, and each worker keeps its own consumer. A task of 4,096 partitions of a stream
 * read as it is written, two records a range, on the other worker sought every one: 655 ms
 * (median) against 377 on the same worker; resumed, 431 against 396 (bench/bench_worker_swap.py,
 * bench/README.md "Tasks that change workers"). After a range its last task left unfinished
 * (`end` INT64_MAX) it is sought. */
static int catches_up(const kw_slot *p, int64_t resumes, int64_t position) {
    return p->end <= resumes && resumes < position && position - resumes <= KW_CATCH_UP;
}

/* The first lane of each partition starts the partition's consumption at its position. A
 * partition its consumer's last task parked (kw_park) is resumed: where it stopped, when its
 * range begins there, with the messages it carried filed first, or a little behind its range
 * (catches_up), its carry dropped; else sought to its range.
 * Resuming wakes no broker thread (starting or seeking does: a pass over every partition it
 * leads each), and a resumed partition is otherwise fetched only when its leader's thread
 * next looks, up to a second later: of each leader no other seek wakes, one resumed
 * partition is sought to where it resumes. The seeks are waited for: until librdkafka has
 * taken one, the partition's position is still where the last task left it, and a lane
 * moved to it (kw_skip_gaps) would skip its range. Each parked partition's fetch queue is
 * led back into the reader's only then, emptied of the barriers its pause, resume and seek
 * put there (drain_own). */
int kw_start(kw_reader *r, int park, char *err, size_t errlen) {
    rd_kafka_topic_partition_list_t *parked = rk.tpl_new(8);
    int *lane = malloc((size_t)(r->nlanes ? r->nlanes : 1) * sizeof(int));
    int e = 0;
    for (int i = 0; i < r->nlanes && !e; i++) {
        kw_lane *l = &r->lanes[i];
        if (i > 0 && same_partition(&r->lanes[i - 1], l))
            continue;
        kw_slot *p = park_of(r, l->topic, l->partition);
        p->asleep = 0;
        if (p->state == KW_PARKED) {
            lane[parked->cnt] = i;
            rk.tpl_add(parked, r->topic_names[l->topic], l->partition);
        } else if (p->state == KW_IDLE) {
            e = start_partition(r, l, err, errlen);
        }
    }
    if (!e && parked->cnt) {
        /* where each resumes: after the last message polled, or, none polled since it was
         * last started or sought, there */
        rk.position(r->rk, parked);
        for (int j = 0; j < parked->cnt; j++)
            if (parked->elems[j].offset < 0)
                parked->elems[j].offset = park_of(r, r->lanes[lane[j]].topic,
                                                  r->lanes[lane[j]].partition)->from;
        /* One that goes on where it stood and whose carry runs past its ranges reads them
         * from it and stays paused: no resume, no fetch, no pause at the task's end. At
         * 4,096 partitions of a stream whose ranges are a few records, most partitions
         * carry several tasks' records; resumed, each fetched again what it already held
         * (librdkafka's queue is outdated by the next pause), and a partition resumed among
         * thousands waited for its Fetch behind theirs. */
        rd_kafka_topic_partition_list_t *resume = rk.tpl_new(parked->cnt);
        for (int j = 0; j < parked->cnt; j++) {
            kw_lane *l = &r->lanes[lane[j]];
            kw_slot *p = park_of(r, l->topic, l->partition);
            int goes_on = p->end <= l->position && l->position <= parked->elems[j].offset;
            p->asleep = goes_on && p->n > 0 &&
                        p->carry[p->n - 1]->offset >= partition_end(r, lane[j]);
            if (!p->asleep)
                rk.tpl_add(resume, parked->elems[j].topic, parked->elems[j].partition);
        }
        if (resume->cnt && rk.resume_partitions(r->rk, resume) != 0) {
            snprintf(err, errlen, "cannot resume the partitions its last task read");
            e = -1;
        }
        rk.tpl_destroy(resume);
    }
    r->msg_i = r->msg_n = 0;
    r->resumed = 0;
    r->slept = 0;
    rd_kafka_topic_partition_list_t *sought = rk.tpl_new(8);
    /* the leaders woken so far: at most one a parked partition */
    int32_t *woken = malloc((size_t)(parked->cnt ? parked->cnt : 1) * sizeof(int32_t));
    int nwoken = 0;
    for (int pass = 0; pass < 2 && !e; pass++) {
        for (int j = 0; j < parked->cnt; j++) {
            kw_lane *l = &r->lanes[lane[j]];
            kw_slot *p = park_of(r, l->topic, l->partition);
            int64_t resumes = parked->elems[j].offset;
            int behind = !p->asleep && catches_up(p, resumes, l->position);
            int resumable = (p->end <= l->position && l->position <= resumes &&
                             !p->truncated) || behind;
            r->resumed += pass == 0 && (resumable || p->asleep);
            r->slept += pass == 0 && p->asleep;
            if (p->asleep)
                continue;   /* paused: nothing to seek, no leader to wake for it */
            if (pass == 0 && behind)
                park_drop(p);   /* carried from before its range */
            int seen = 0;
            for (int w = 0; w < nwoken && !seen; w++)
                seen = woken[w] == p->leader1;
            if (pass == 0 && !resumable) {   /* sought to its range */
                park_drop(p);
                p->from = l->position;
                rk.tpl_add(sought, r->topic_names[l->topic], l->partition)->offset = p->from;
            } else if (pass == 1 && resumable && !seen) {   /* sought to wake its leader */
                p->from = resumes;
                rk.tpl_add(sought, r->topic_names[l->topic], l->partition)->offset = resumes;
            } else {
                continue;
            }
            if (!seen)
                woken[nwoken++] = p->leader1;
        }
    }
    if (!e && sought->cnt) {
        void *failed = rk.seek_partitions(r->rk, sought, 30000);
        if (failed) {
            snprintf(err, errlen, "%s", rk.error_string(failed));
            rk.error_destroy(failed);
            e = -1;
        }
        for (int j = 0; j < sought->cnt && !e; j++)
            if (sought->elems[j].err) {
                e = sought->elems[j].err;
                snprintf(err, errlen, "%s", rk.err2str(e));
            }
    }
    rk.tpl_destroy(sought);
    free(woken);
    for (int j = 0; j < parked->cnt && !e; j++) {
        kw_lane *l = &r->lanes[lane[j]];
        kw_slot *p = park_of(r, l->topic, l->partition);
        /* the messages it carried that its ranges read, ahead of any fetched since; those
         * past its last range stay carried, in order, ahead of what past_end adds. Filed
         * again one by one, a stream catching up at 4,096 partitions (two records a range,
         * some 36 carried a partition) moved ~150,000 messages a task, 16 ms, to keep them */
        int64_t end = partition_end(r, lane[j]);
        int taken = 0;
        while (taken < p->n && p->carry[taken]->offset < end)
            pending(r, p->carry[taken++]);
        p->n -= taken;
        if (taken && p->n)
            memmove(p->carry, p->carry + taken, (size_t)p->n * sizeof(*p->carry));
        if (!p->asleep) {
            drain_own(r, p, 1);
            rk.queue_forward(p->own, r->queue);
        }
    }
    free(lane);
    rk.tpl_destroy(parked);
    if (e)
        return e;
    for (int i = 0; i < r->nlanes; i++) {
        kw_lane *l = &r->lanes[i];
        kw_slot *p = park_of(r, l->topic, l->partition);
        p->state = KW_READING;
        if (i == 0 || !same_partition(&r->lanes[i - 1], l)) {
            p->end = partition_end(r, i);
            p->limit = 2 * (p->end - l->position);
            p->limit = p->limit < KW_CARRY_MIN ? KW_CARRY_MIN : p->limit;
            /* A carry longer than that is kept (truncated, it would have to be sought): it
             * was held where it ends, at an earlier task's limit and what one poll handed
             * over past it (hold), and it only shrinks while it holds the ranges. */
        }
    }
    r->parking = park;
    r->started = 1;
    return 0;
}

int kw_resumed(kw_reader *r) { return r->resumed; }
int kw_slept(kw_reader *r) { return r->slept; }

int kw_leader(kw_reader *r, const char *topic, int32_t partition) {
    for (int t = 0; t < r->ntopics; t++)
        if (strcmp(r->topic_names[t], topic) == 0)
            return partition >= 0 && partition < r->nparks[t]
                       ? r->parks[t][partition].leader1 - 1 : -1;
    return -1;
}

/* ---- column building ---- */
static void *grow(void *p, int64_t *cap, int64_t need, size_t item) {
    if (need <= *cap)
        return p;
    int64_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    *cap = c;
    return realloc(p, (size_t)c * item);
}

static void col_reserve(kw_col *c, int64_t n) {
    if (n + 1 <= c->cap)
        return;
    int64_t cap = c->cap;
    c->offsets = grow(c->offsets, &cap, n + 1, sizeof(int32_t));
    int64_t vcap = c->cap ? (c->cap + 7) / 8 : 0;
    int64_t need = (cap + 7) / 8;
    c->valid = realloc(c->valid, need);
    memset(c->valid + vcap, 0, need - vcap);
    c->cap = cap;
    if (c->n == 0)
        c->offsets[0] = 0;
}

static void col_append(kw_col *c, const void *p, size_t len, int is_null) {
    col_reserve(c, c->n + 1);
    if (is_null) {
        c->nulls++;
    } else {
        if (len) {
            c->data = grow(c->data, &c->data_cap, c->len + (int64_t)len, 1);
            memcpy(c->data + c->len, p, len);
            c->len += len;
        }
        c->valid[c->n >> 3] |= (uint8_t)(1u << (c->n & 7));
    }
    c->n++;
    c->offsets[c->n] = (int32_t)c->len;
}

static void lane_append(kw_reader *r, kw_lane *l, rd_kafka_message_t *m) {
    if (l->n == l->cap) {
        int64_t cap = l->cap;
        l->offsets = grow(l->offsets, &cap, l->n + 1, sizeof(int64_t));
        cap = l->cap;
        l->timestamps = grow(l->timestamps, &cap, l->n + 1, sizeof(int64_t));
        cap = l->cap;
        l->types = grow(l->types, &cap, l->n + 1, sizeof(int32_t));
        l->cap = cap;
    }
    int type = 0;
    l->offsets[l->n] = m->offset;
    l->timestamps[l->n] = rk.message_timestamp(m, &type);
    l->types[l->n] = type - 1; /* librdkafka 0/1/2 -> Kafka's Java ids -1/0/1 */
    col_append(&l->key, m->key, m->key_len, m->key == NULL);
    col_append(&l->value, m->payload, m->len, m->payload == NULL);
    if (r->headers) {
        rd_kafka_headers_t *h = NULL;
        if (rk.message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR && h) {
            size_t cnt = rk.header_cnt(h);
            for (size_t i = 0; i < cnt; i++) {
                const char *name;
                const void *value;
                size_t size;
                if (rk.header_get_all(h, i, &name, &value, &size) != 0)
                    break;
                col_append(&l->hkey, name, strlen(name), 0);
                col_append(&l->hvalue, value, size, value == NULL);
            }
            /* the list's offsets index hkey; its own data stays empty */
            col_reserve(&l->hlist, l->hlist.n + 1);
            l->hlist.valid[l->hlist.n >> 3] |= (uint8_t)(1u << (l->hlist.n & 7));
        } else {
            col_reserve(&l->hlist, l->hlist.n + 1);
            l->hlist.nulls++;
        }
        l->hlist.n++;
        l->hlist.offsets[l->hlist.n] = (int32_t)l->hkey.n;
    }
    l->n++;
    l->position = m->offset + 1;
}

static int same_partition(kw_lane *a, kw_lane *b) {
    return a->topic == b->topic && a->partition == b->partition;
}

/* The lane a message of (topic, partition) goes to: the partition's first range not done. */
static int lane_of(kw_reader *r, rd_kafka_topic_t *rkt, int32_t partition) {
    /* messages come in runs of one partition: try the last lane found first; else the
     * partition's first lane, from its slot. A scan of the lanes from the first cost a
     * pass over half of them for each partition's run: at 4,096 partitions of two records
     * a range, 14 ms of a task */
    int i = -1;
    if (r->hint < r->nlanes && r->lanes[r->hint].partition == partition &&
        r->topics[r->lanes[r->hint].topic] == rkt) {
        i = r->hint;
    } else {
        for (int t = 0; t < r->ntopics && i < 0; t++)
            if (r->topics[t] == rkt && partition >= 0 && partition < r->nparks[t] &&
                r->parks[t][partition].gen == r->gen)
                i = r->parks[t][partition].lane;
        if (i < 0 || i >= r->nlanes)
            return -1;
    }
    kw_lane *l = &r->lanes[i];
    while (l->position >= l->end) {
        if (i + 1 < r->nlanes && same_partition(l, l + 1)) {
            i++;
            l++;
        } else {
            return -1;
        }
    }
    r->hint = i;
    return i;
}

/* File one message; returns the lane that took it (-1: none). */
static int file(kw_reader *r, rd_kafka_message_t *m) {
    int i = lane_of(r, m->rkt, m->partition);
    while (i >= 0) {
        kw_lane *l = &r->lanes[i];
        if (m->offset < l->position)
            return -1; /* before the range (a gap left by data loss) */
        if (m->offset < l->end) {
            lane_append(r, l, m);
            return i;
        }
        l->position = l->end;
        if (i + 1 < r->nlanes && same_partition(l, l + 1))
            i++;
        else
            return -1;
    }
    return -1;
}

static int poll_once(kw_reader *r, int want, int timeout_ms) {
    r->event_lane = -1;
    r->got = -1; /* no fetch in this call: messages of the last one were still pending */
    if (r->msg_i >= r->msg_n) {
        if (want > r->msg_cap) {
            r->msgs = realloc(r->msgs, want * sizeof(*r->msgs));
            r->msg_cap = want;
        }
        ssize_t got = rk.consume_batch_queue(r->queue, timeout_ms, r->msgs, (size_t)want);
        if (got < 0) {
            r->event_err = rk.last_error();
            snprintf(r->event_text, sizeof(r->event_text), "%s", rk.err2str(r->event_err));
            return KW_FAILED;
        }
        r->msg_n = (int)got;
        r->msg_i = 0;
        r->got = (int)got;
    }
    while (r->msg_i < r->msg_n) {
        rd_kafka_message_t *m = r->msgs[r->msg_i++];
        if (m->err) {
            int lane = lane_of(r, m->rkt, m->partition);
            if (lane >= 0) {
                r->event_lane = lane;
                r->event_err = m->err;
                r->event_offset = m->offset;
                if (m->payload)
                    snprintf(r->event_text, sizeof(r->event_text), "%.*s", (int)m->len,
                             (const char *)m->payload);
                else
                    snprintf(r->event_text, sizeof(r->event_text), "%s", rk.err2str(m->err));
                rk.message_destroy(m);
                return KW_EVENT;
            }
            rk.message_destroy(m);
            continue;
        }
        int lane = file(r, m);
        if (lane < 0) {
            past_end(r, m);
            continue;
        }
        rk.message_destroy(m);
        {
            kw_lane *l = &r->lanes[lane];
            if (l->n >= r->max_records || l->key.len + l->value.len + l->hvalue.len >= r->max_bytes) {
                r->event_lane = lane;
                return KW_FULL;
            }
        }
    }
    return KW_DRAINED;
}

int kw_poll(kw_reader *r, int want, int timeout_ms) {
    int got = poll_once(r, want, timeout_ms);
    hold_flush(r);   /* before any other call: a partition stopped unpaused is started again */
    return got;
}

int kw_got(kw_reader *r) { return r->got; }
int kw_event_lane(kw_reader *r) { return r->event_lane; }
int kw_event_err(kw_reader *r) { return r->event_err; }
int64_t kw_event_offset(kw_reader *r) { return r->event_offset; }
const char *kw_event_text(kw_reader *r) { return r->event_text; }

/* Whether a lane's partition was kept paused through the task (kw_start) or paused since its
 * ranges ended (pause_done): it fetches nothing, so a finished one needs no stopping. */
static int asleep(kw_reader *r, int lane) {
    kw_lane *l = &r->lanes[lane];
    return park_of(r, l->topic, l->partition)->asleep;
}

/* A paused partition about to be stopped (or started again): resumed first, since
 * librdkafka keeps a partition's pause through a stop and a start, so one started again
 * would fetch nothing (the resume's barrier is taken from its own queue when it is led
 * back, lead_back). */
static void pause_one(kw_reader *r, kw_lane *l, int pause) {
    rd_kafka_topic_partition_list_t *one = rk.tpl_new(1);
    rk.tpl_add(one, r->topic_names[l->topic], l->partition);
    if (pause)
        rk.pause_partitions(r->rk, one);
    else
        rk.resume_partitions(r->rk, one);
    rk.tpl_destroy(one);
}

static void wake(kw_reader *r, kw_lane *l, kw_slot *p) {
    if (!p->asleep)
        return;
    pause_one(r, l, 0);
    p->asleep = 0;
}

/* A parking task's partition whose carry is full (past_end), paused now, where the last
 * message it carries leaves it, its fetch queue led away first (as kw_park does at the task's
 * end; pausing outdates what librdkafka fetched past it and had not handed over). Left
 * fetching, a partition whose log runs on past what it may carry (a backlog read in
 * micro-batches) was fetched to its log's end while its task read the others: every record
 * past the limit parsed and dropped, and librdkafka stood past what it kept (truncated), so
 * the next task on this consumer had to seek it. Held, it resumes where its carry ends, or a
 * little behind another worker's ranges (catches_up). What the same poll had handed over
 * past the limit is carried too (librdkafka counts it consumed). Paused together at the end
 * of the poll (hold_flush). */
static void hold(kw_reader *r, kw_slot *p, int t, int32_t partition) {
    if (!lead_away(r, p, t, partition))
        return;   /* not known any more: it goes on, and drops what passes its limit */
    if (!r->holding)
        r->holding = rk.tpl_new(64);
    rk.tpl_add(r->holding, r->topic_names[t], partition);
    p->asleep = 1;
}

static void hold_flush(kw_reader *r) {
    if (r->holding) {
        rk.pause_partitions(r->rk, r->holding);
        rk.tpl_destroy(r->holding);
        r->holding = NULL;
    }
}

/* A parking task's partition whose ranges are done, paused now (after STOP_AFTER_S) as
 * kw_park pauses the others at the task's end, its fetch queue led away first (its barrier
 * stays there, drain_own): it fetches no more and stays parked for the next task, which
 * kw_park leaves as it is. Stopped instead, it was started again by the next task (a
 * pass of librdkafka's over every partition it knows, each): at 4,096 partitions such a
 * task took more than STOP_AFTER_S itself, and so did the next, task after task. */
static void pause_done(kw_reader *r, int lane) {
    while (lane > 0 && same_partition(&r->lanes[lane - 1], &r->lanes[lane]))
        lane--;
    kw_lane *l = &r->lanes[lane];
    kw_slot *p = park_of(r, l->topic, l->partition);
    if (!r->started || l->stopped || p->asleep || p->state != KW_READING)
        return;
    if (!lead_away(r, p, l->topic, l->partition))
        return;   /* not known any more: kw_park stops it */
    pause_one(r, l, 1);
    p->asleep = 1;
}

/* A finished partition of a long task: paused where the task parks (pause_done), else
 * stopped. */
static void finish_lane(kw_reader *r, int lane) {
    if (r->parking)
        pause_done(r, lane);
    else
        kw_stop_lane(r, lane);
}

/* Stop fetching a partition whose ranges are all done (the pack pauses it). */
void kw_stop_lane(kw_reader *r, int lane) {
    while (lane > 0 && same_partition(&r->lanes[lane - 1], &r->lanes[lane]))
        lane--; /* the partition's first lane keeps the flag */
    kw_lane *l = &r->lanes[lane];
    if (r->started && !l->stopped) {
        kw_slot *p = park_of(r, l->topic, l->partition);
        wake(r, l, p);
        rk.consume_stop(r->topics[l->topic], l->partition);
        l->stopped = 1;
        park_drop(p);
        p->state = KW_IDLE;
    }
}

/* Fetch a partition again from `offset`: after an out-of-range answer (librdkafka then stops
 * fetching it) the range goes on from where its records still are. */
int kw_restart_lane(kw_reader *r, int lane, int64_t offset) {
    while (lane > 0 && same_partition(&r->lanes[lane - 1], &r->lanes[lane]))
        lane--; /* the partition's first lane keeps the flag */
    kw_lane *l = &r->lanes[lane];
    kw_slot *p = park_of(r, l->topic, l->partition);
    wake(r, l, p);
    if (r->started && !l->stopped)
        rk.consume_stop(r->topics[l->topic], l->partition);
    l->stopped = 0;
    park_drop(p);
    p->state = KW_READING;
    p->from = offset;
    lead_back(r, p);
    if (rk.consume_start_queue(r->topics[l->topic], l->partition, offset, r->queue) == -1) {
        int e = rk.last_error();
        l->stopped = 1;
        return e ? e : -1;
    }
    return 0;
}

static void col_reset(kw_col *c) { memset(c, 0, sizeof(*c)); }

/* Hand the lane's buffers over to the caller (who frees them with kw_free), and start
 * new ones. */
void kw_take(kw_reader *r, int lane, kw_lane *out) {
    kw_lane *l = &r->lanes[lane];
    *out = *l;
    l->n = 0;
    l->cap = 0;
    l->offsets = NULL;
    l->timestamps = NULL;
    l->types = NULL;
    col_reset(&l->key);
    col_reset(&l->value);
    col_reset(&l->hlist);
    col_reset(&l->hkey);
    col_reset(&l->hvalue);
}

static void col_free(kw_col *c);

/* Free every buffer of a lane (or of a block taken from lanes). */
static void lane_free(kw_lane *l) {
    free(l->offsets);
    free(l->timestamps);
    free(l->types);
    col_free(&l->key);
    col_free(&l->value);
    col_free(&l->hlist);
    col_free(&l->hkey);
    col_free(&l->hvalue);
}

/* Append `src`'s elements to `dst` (sized by the caller), offsets rebased, validity copied. */
static void col_copy(kw_col *dst, const kw_col *src) {
    for (int64_t i = 0; i < src->n; i++) {
        dst->offsets[dst->n + i + 1] = (int32_t)(dst->len + src->offsets[i + 1]);
        if (src->valid[i >> 3] & (1u << (i & 7)))
            dst->valid[(dst->n + i) >> 3] |= (uint8_t)(1u << ((dst->n + i) & 7));
    }
    if (src->len)
        memcpy(dst->data + dst->len, src->data, (size_t)src->len);
    dst->n += src->n;
    dst->len += src->len;
    dst->nulls += src->nulls;
}

/* Room for `n` elements and `len` data bytes in a new column; 0, or -1 out of memory. */
static int col_alloc(kw_col *c, int64_t n, int64_t len) {
    memset(c, 0, sizeof(*c));
    if (n == 0)
        return 0;
    c->offsets = malloc((size_t)(n + 1) * sizeof(int32_t));
    c->data = len ? malloc((size_t)len) : NULL;
    c->valid = calloc((size_t)(n + 7) / 8, 1);
    if (!c->offsets || (len && !c->data) || !c->valid)
        return -1;
    c->offsets[0] = 0;
    c->cap = n;
    c->data_cap = len;
    return 0;
}

/* Empty a lane's column for its next records, keeping its buffers. */
static void col_empty(kw_col *c) {
    if (c->valid)
        memset(c->valid, 0, (size_t)(c->n + 7) / 8);
    c->n = c->len = c->nulls = 0;
}

int kw_take_lanes(kw_reader *r, const int32_t *lanes, int n, kw_lane *out, int64_t *counts) {
    int64_t rows = 0, keys = 0, values = 0, hkeys = 0, hkey_len = 0, hvalue_len = 0;
    for (int i = 0; i < n; i++) {
        kw_lane *l = &r->lanes[lanes[i]];
        rows += l->n;
        keys += l->key.len;
        values += l->value.len;
        hkeys += l->hkey.n;
        hkey_len += l->hkey.len;
        hvalue_len += l->hvalue.len;
    }
    if (rows > INT32_MAX || keys > INT32_MAX || values > INT32_MAX || hkeys > INT32_MAX ||
        hkey_len > INT32_MAX || hvalue_len > INT32_MAX)
        return -1; /* Arrow's 32-bit offsets: the caller takes fewer lanes at once */
    if (n == 1) {
        /* One range: its buffers are handed over as they are (kw_take), not copied into
         * new ones. Each of its records was copied twice before (from librdkafka's message,
         * then into the block), and the copy loop rebased every offset. */
        counts[0] = r->lanes[lanes[0]].n;
        kw_take(r, lanes[0], out);
        return 0;
    }
    memset(out, 0, sizeof(*out));
    out->offsets = malloc((size_t)(rows ? rows : 1) * sizeof(int64_t));
    out->timestamps = malloc((size_t)(rows ? rows : 1) * sizeof(int64_t));
    out->types = malloc((size_t)(rows ? rows : 1) * sizeof(int32_t));
    int failed = !out->offsets || !out->timestamps || !out->types;
    failed |= col_alloc(&out->key, rows, keys) | col_alloc(&out->value, rows, values);
    if (r->headers)
        failed |= col_alloc(&out->hlist, rows, 0) | col_alloc(&out->hkey, hkeys, hkey_len) |
                  col_alloc(&out->hvalue, hkeys, hvalue_len);
    if (failed) {
        lane_free(out);
        memset(out, 0, sizeof(*out));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        kw_lane *l = &r->lanes[lanes[i]];
        counts[i] = l->n;
        if (l->n) {
            memcpy(out->offsets + out->n, l->offsets, (size_t)l->n * sizeof(int64_t));
            memcpy(out->timestamps + out->n, l->timestamps, (size_t)l->n * sizeof(int64_t));
            memcpy(out->types + out->n, l->types, (size_t)l->n * sizeof(int32_t));
            col_copy(&out->key, &l->key);
            col_copy(&out->value, &l->value);
            if (r->headers) {
                /* the list's offsets index hkey: rebase them by the headers before */
                int64_t base = out->hkey.n;
                for (int64_t j = 0; j < l->n; j++) {
                    out->hlist.offsets[out->hlist.n + j + 1] =
                        (int32_t)(base + l->hlist.offsets[j + 1]);
                    if (l->hlist.valid[j >> 3] & (1u << (j & 7)))
                        out->hlist.valid[(out->hlist.n + j) >> 3] |=
                            (uint8_t)(1u << ((out->hlist.n + j) & 7));
                }
                out->hlist.n += l->n;
                out->hlist.nulls += l->hlist.nulls;
                col_copy(&out->hkey, &l->hkey);
                col_copy(&out->hvalue, &l->hvalue);
            }
        }
        out->n += l->n;
        l->n = 0;
        col_empty(&l->key);
        col_empty(&l->value);
        col_empty(&l->hlist);
        col_empty(&l->hkey);
        col_empty(&l->hvalue);
    }
    return 0;
}

int kw_ready(kw_reader *r, const int32_t *lanes, int n, int64_t size, int full_lane,
             int32_t *ready) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        kw_lane *l = &r->lanes[lanes[i]];
        if (l->n && (l->n >= size || lanes[i] == full_lane || l->position >= l->end))
            ready[k++] = lanes[i];
    }
    return k;
}

int kw_settle(kw_reader *r, int32_t *lanes, int n, int64_t *remaining, int stop) {
    int k = 0;
    int64_t left = 0;
    for (int i = 0; i < n; i++) {
        kw_lane *l = &r->lanes[lanes[i]];
        if (l->position < l->end) {
            left += l->end - l->position;
            lanes[k++] = lanes[i];
        }
        /* the partition's last listed lane: stop it when none of its listed lanes is open */
        int last = i + 1 == n || !same_partition(l, &r->lanes[lanes[i + 1]]);
        if (last) {
            int open = 0;
            for (int j = i; j >= 0 && same_partition(&r->lanes[lanes[j]], l); j--)
                if (r->lanes[lanes[j]].position < r->lanes[lanes[j]].end) {
                    open = 1;
                    break;
                }
            if (!open && stop && !asleep(r, lanes[i]))
                finish_lane(r, lanes[i]);
        }
    }
    *remaining = left;
    return k;
}

int kw_skip_gaps(kw_reader *r, const int32_t *lanes, int n) {
    rd_kafka_topic_partition_list_t *list = rk.tpl_new(n ? n : 1);
    for (int i = 0; i < n; i++) {
        kw_lane *l = &r->lanes[lanes[i]];
        if (i == 0 || !same_partition(l, &r->lanes[lanes[i - 1]]))
            rk.tpl_add(list, r->topic_names[l->topic], l->partition);
    }
    int e = rk.position(r->rk, list);
    int p = -1;
    for (int i = 0; i < n; i++) {
        kw_lane *l = &r->lanes[lanes[i]];
        if (i == 0 || !same_partition(l, &r->lanes[lanes[i - 1]]))
            p++;
        int64_t reported = list->elems[p].offset;
        if (reported >= 0) { /* range_end.advance: never backwards, never past the end */
            if (reported > l->position)
                l->position = reported < l->end ? reported : l->end;
        }
    }
    rk.tpl_destroy(list);
    return e;
}

void kw_stop_done(kw_reader *r) {
    for (int i = 0; i < r->nlanes; i++) {
        if (i > 0 && same_partition(&r->lanes[i - 1], &r->lanes[i]))
            continue;
        int open = 0;
        for (int j = i; j < r->nlanes && same_partition(&r->lanes[j], &r->lanes[i]); j++)
            if (r->lanes[j].position < r->lanes[j].end)
                open = 1;
        if (!open && !asleep(r, i))
            finish_lane(r, i);
    }
}

static void col_free(kw_col *c) {
    free(c->offsets);
    free(c->data);
    free(c->valid);
}

/* Stop every partition (unless `stop` is 0), drop the messages fetched and not filed, free
 * the lanes. */
static void clear(kw_reader *r, int stop) {
    while (r->msg_i < r->msg_n)
        rk.message_destroy(r->msgs[r->msg_i++]);
    r->msg_i = r->msg_n = 0;
    if (r->started && stop) {
        for (int i = 0; i < r->nlanes; i++)
            if (i == 0 || !same_partition(&r->lanes[i - 1], &r->lanes[i]))
                kw_stop_lane(r, i);
    }
    for (int i = 0; i < r->nlanes; i++)
        lane_free(&r->lanes[i]);
    r->nlanes = 0;
    r->started = 0;
    r->hint = 0;
    r->got = -1;
    r->event_lane = -1;
}

/* Stop every partition parked by an earlier task (their fetch queues lead to this queue),
 * resumed first: a parked partition is paused, and librdkafka keeps a pause through a stop
 * and a start, so one stopped paused fetched nothing when a later task started it again.
 * A worker's tasks of more and of fewer than MANY_PARTITIONS (compiled.py) partitions share
 * a consumer where their settings match (packs over many topics at thousands of
 * partitions): a task of few partitions reset it, and a later task's partitions parked
 * before stalled for kafkaConsumer.pollTimeoutMs and failed (the resume's barrier is
 * dropped with the stop's, drain_own). */
static void unpark(kw_reader *r) {
    rd_kafka_topic_partition_list_t *paused = rk.tpl_new(8);
    for (int t = 0; t < r->ntopics; t++)
        for (int32_t q = 0; q < r->nparks[t]; q++)
            if (r->parks[t][q].state == KW_PARKED)
                rk.tpl_add(paused, r->topic_names[t], q);
    if (paused->cnt)
        rk.resume_partitions(r->rk, paused);
    rk.tpl_destroy(paused);
    for (int t = 0; t < r->ntopics; t++)
        for (int32_t q = 0; q < r->nparks[t]; q++) {
            kw_slot *p = &r->parks[t][q];
            if (p->state == KW_PARKED) {
                rk.consume_stop(r->topics[t], q);
                drain_own(r, p, 0);
            }
            park_drop(p);
            p->state = KW_IDLE;
        }
}

int kw_reset(kw_reader *r) {
    clear(r, 1);
    unpark(r);
    /* Stopping a partition unforwards its fetch queue and outdates what it had fetched;
     * a new queue also leaves behind anything still in the old one. */
    rk.queue_destroy(r->queue);
    r->queue = rk.queue_new(r->rk);
    return r->queue ? 0 : -1;
}

int kw_park(kw_reader *r) {
    /* polled, not filed: the next range's */
    while (r->msg_i < r->msg_n)
        past_end(r, r->msgs[r->msg_i++]);
    hold_flush(r);
    rd_kafka_topic_partition_list_t *list = rk.tpl_new(r->nlanes ? r->nlanes : 1);
    for (int i = 0; i < r->nlanes; i++) {
        kw_lane *l = &r->lanes[i];
        kw_slot *p = park_of(r, l->topic, l->partition);
        if (l->position < l->end)
            p->end = INT64_MAX; /* a range not done: its partition starts again next time */
        if ((i > 0 && same_partition(&r->lanes[i - 1], l)) || p->state != KW_READING)
            continue;
        p->state = KW_PARKED;
        if (p->asleep) {   /* paused already (kw_start, pause_done), its queue led away */
            p->asleep = 0;
            continue;
        }
        if (!lead_away(r, p, l->topic, l->partition)) {
            /* not known any more: stopped, started again if read again */
            rk.consume_stop(r->topics[l->topic], l->partition);
            park_drop(p);
            p->state = KW_IDLE;
            continue;
        }
        rk.tpl_add(list, r->topic_names[l->topic], l->partition);
    }
    int e = list->cnt ? rk.pause_partitions(r->rk, list) : 0;
    rk.tpl_destroy(list);
    r->parking = 0;
    clear(r, 0);
    return e;
}

static void teardown(kw_reader *r, int stop) {
    if (!r)
        return;
    clear(r, stop);
    for (int t = 0; t < r->ntopics; t++) {
        for (int32_t q = 0; q < r->nparks[t]; q++) {
            park_drop(&r->parks[t][q]);
            free(r->parks[t][q].carry);
            if (r->parks[t][q].own)
                rk.queue_destroy(r->parks[t][q].own);
        }
        free(r->parks[t]);
    }
    free(r->parks);
    free(r->nparks);
    if (r->queue)
        rk.queue_destroy(r->queue);
    for (int t = 0; t < r->ntopics; t++) {
        rk.topic_destroy(r->topics[t]);
        free(r->topic_names[t]);
    }
    free(r->topics);
    free(r->topic_names);
    rk.destroy(r->rk);
    free(r->lanes);
    free(r->msgs);
    free(r);
}

void kw_close(kw_reader *r) { teardown(r, 1); }

/* librdkafka's destroy stops a consumer's partitions together: 20-30 ms for 4,096 started
 * partitions, where stopping them one by one (rd_kafka_consume_stop, each waiting for the
 * broker thread) took 180-250 ms. */
void kw_discard(kw_reader *r) { teardown(r, 0); }
