/* kwatermark's compiled read path (DESIGN §19): librdkafka's messages copied straight into
 * Arrow-layout buffers, one call per batch of messages, no Python object per record.
 *
 * librdkafka is not linked at build time: kw_load() dlopen()s the library the installed
 * confluent-kafka wheel ships (its file name carries a hash that changes every release) and
 * looks up the dozen functions below, which are librdkafka's stable public C ABI (rdkafka.h);
 * only what this file uses is declared here. */
#ifndef KW_FASTREAD_H
#define KW_FASTREAD_H

#include <stddef.h>
#include <stdint.h>

/* One growing Arrow binary/string column: int32 offsets, data, validity bitmap. */
typedef struct kw_col {
    int32_t *offsets;
    uint8_t *data;
    uint8_t *valid;
    int64_t n;          /* elements */
    int64_t cap;        /* element capacity (offsets hold cap + 1) */
    int64_t len;        /* data bytes */
    int64_t data_cap;
    int64_t nulls;
} kw_col;

/* One planned range [start, end) of a partition being read. A partition's ranges (sub-ranges
 * of one pack) are consecutive lanes, in offset order. */
typedef struct kw_lane {
    int32_t topic;       /* index into the reader's topics */
    int32_t partition;
    int32_t stopped;     /* its partition's fetching stopped (kw_stop_lane) */
    int64_t position;    /* offset after the last record taken, or where skips moved it */
    int64_t end;
    int64_t n;           /* records taken, not yet handed over */
    int64_t cap;         /* record capacity of offsets/timestamps/types */
    int64_t *offsets;
    int64_t *timestamps;
    int32_t *types;
    kw_col key;
    kw_col value;
    /* headers: list<struct<key: string, value: binary>>; a record without headers is null */
    kw_col hlist;        /* offsets index hkey/hvalue; data unused */
    kw_col hkey;
    kw_col hvalue;
} kw_lane;

/* What kw_poll stopped for. */
#define KW_DRAINED 0     /* every message fetched was filed */
#define KW_FULL 1        /* lane `event_lane` holds max_records or max_bytes */
#define KW_EVENT 2       /* a message carried an error: event_* say which */
#define KW_FAILED 3      /* the consume call itself failed: event_err, event_text */

typedef struct kw_reader kw_reader;

int kw_load(const char *path, char *err, size_t errlen);
const char *kw_version(void);
kw_reader *kw_open(const char **names, const char **values, int nconf, int headers,
                   int64_t max_records, int64_t max_bytes, char *err, size_t errlen);
/* rd_kafka_offsets_for_times over n partitions in calls of at most `chunk` (all when <= 0),
 * on up to four threads at once, within timeout_ms in all: librdkafka's handling of one
 * ListOffsets grows faster than its partitions. One call from Python: the GIL is released
 * throughout. Each offset is replaced by its answer, each error set; a call that fails
 * returns its error (the first, in partition order, where several fail; a failed call's
 * partitions, and those of calls not made after it, keep what they were asked with). */
int kw_offsets(kw_reader *r, const char **topics, const int32_t *partitions,
               int64_t *offsets, int32_t *errors, int n, int chunk, int timeout_ms);
/* Ask the brokers for `topic`'s metadata (this also refreshes librdkafka's cached leaders and
 * leader epochs): each partition's leader into leaders[partition] (for partitions < cap),
 * the brokers as "id host port\n" lines into `brokers`. Returns the partition count, or -1
 * with the librdkafka error code in *err (librdkafka's own codes are negative, the
 * brokers' positive: a code negated into the answer read a timeout, -185, as 185
 * partitions). */
int kw_metadata(kw_reader *r, const char *topic, int timeout_ms, int32_t *leaders, int cap,
                char *brokers, size_t blen, int *err);
/* Every topic the brokers know and its partition count, from one metadata request for the
 * whole cluster (a subscribePattern's topics): the names of the topics without an error into
 * `names`, each ending with a NUL (at most nlen bytes), their counts into counts[] (at most
 * cap). Returns how many topics there are, and sets *needed to the bytes their names take:
 * more than cap or nlen hold, and the call is to be made again with room. -1, the
 * librdkafka error code in *err, when the request fails. */
int kw_topic_counts(kw_reader *r, int timeout_ms, char *names, size_t nlen, size_t *needed,
                    int32_t *counts, int cap, int *err);
int kw_add_lane(kw_reader *r, const char *topic, int32_t partition, int64_t position,
                int64_t end);
/* The lane's address: valid until the next kw_add_lane (which may move every lane). */
kw_lane *kw_lane_at(kw_reader *r, int i);
/* Start fetching the lanes' partitions; with `park`, the task ends with kw_park. */
int kw_start(kw_reader *r, int park, char *err, size_t errlen);
/* How many partitions the last kw_start resumed where its last task left them (kw_park). */
int kw_resumed(kw_reader *r);
int kw_slept(kw_reader *r);
/* `topic`'s `partition`'s leader as the reader's last kw_metadata of the topic said (the one
 * kw_start wakes), or -1: not asked, or no leader then. */
int kw_leader(kw_reader *r, const char *topic, int32_t partition);
int kw_poll(kw_reader *r, int want, int timeout_ms);
int kw_got(kw_reader *r);
int kw_event_lane(kw_reader *r);
int kw_event_err(kw_reader *r);
int64_t kw_event_offset(kw_reader *r);
const char *kw_event_text(kw_reader *r);
const char *kw_err_name(int err);
const char *kw_err_text(int err);
void kw_stop_lane(kw_reader *r, int lane);
/* Fetch the lane's partition again from `offset` (stopped or not); 0, else an error code. */
int kw_restart_lane(kw_reader *r, int lane, int64_t offset);
void kw_take(kw_reader *r, int lane, kw_lane *out);
/* The records of `n` lanes, one after another, as one set of buffers the caller frees with
 * kw_free; counts[i] = the records of lanes[i]. The lanes keep their buffers, emptied, for
 * their next records; one lane alone hands over its own buffers (kw_take). Returns 0, or
 * -1 (nothing taken) when the records would overflow Arrow's 32-bit offsets or memory runs
 * out. */
int kw_take_lanes(kw_reader *r, const int32_t *lanes, int n, kw_lane *out, int64_t *counts);
/* Of the `n` lanes listed (a partition's lanes consecutive, in offset order), those to hand
 * over now into `ready`, returning their count: lanes holding records that hold `size` of
 * them, are done (position at end), or are `full_lane` (kw_poll's KW_FULL; -1: none). */
int kw_ready(kw_reader *r, const int32_t *lanes, int n, int64_t size, int full_lane,
             int32_t *ready);
/* Keep the listed lanes not done at the front of `lanes` (in order), returning their count;
 * if `stop`, stop each partition none of whose listed lanes is open any more (kw_stop_lane;
 * a task that parks pauses it instead, and it stays parked);
 * *remaining = the offsets the open lanes have left to read. */
int kw_settle(kw_reader *r, int32_t *lanes, int n, int64_t *remaining, int stop);
/* Stop every partition none of whose lanes is open (those kw_settle left fetching); a task
 * that parks pauses them instead. */
void kw_stop_done(kw_reader *r);
/* After a poll that came back short: each listed lane to its partition's position, which
 * librdkafka moves past transaction markers and filtered records, never backwards and never
 * past the lane's end (range_end.advance); one position query for all their partitions. */
int kw_skip_gaps(kw_reader *r, const int32_t *lanes, int n);
void kw_free(void *p);
/* Ready the reader for another task's ranges: every partition stopped, every lane and
 * every message not yet taken dropped, a new queue; the librdkafka handle stays, with its
 * broker connections, topics and metadata (a Python worker's next task, DESIGN §19). */
int kw_reset(kw_reader *r);
/* Ready the reader for another task's ranges keeping its partitions, every range done:
 * each is paused where it stands, with the messages polled past its ranges kept for the
 * next; the next task resumes those its ranges begin at (kw_start) and starts the others,
 * where librdkafka pays a pass over every partition it knows for each partition started,
 * and again to stop it (bench/README.md, "What librdkafka does per partition at 4,096").
 * kw_reset stops them. Returns 0, else librdkafka's error. */
int kw_park(kw_reader *r);
/* Stop every partition, then destroy the consumer. */
void kw_close(kw_reader *r);
/* Destroy the consumer with its partitions still fetching: librdkafka stops them together,
 * far faster than one by one when there are thousands. */
void kw_discard(kw_reader *r);

#endif
