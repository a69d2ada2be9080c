/* A one-way delay line for bench/cluster.sh, for kernels without netem:
 * every packet that iptables hands to NFQUEUE QUEUE is held DELAY_US
 * microseconds from its arrival, then accepted.
 *
 *   usage: ff_delayline QUEUE DELAY_US [SPIN_US]
 *
 * Only the packets' metadata come up to user space (NFQNL_COPY_META), GSO
 * packets whole (NFQA_CFG_F_GSO): the payload never leaves the kernel. Every
 * packet waits the same time, so packets leave in the order they came and
 * one batch verdict (NFQNL_MSG_VERDICT_BATCH: every id up to this one)
 * releases all that are due. A packet's arrival is the kernel's receive
 * timestamp, which an SO_TIMESTAMP socket switches on for the host, else the
 * time it was read. Timers oversleep (20-70 us on a VM), so the line wakes
 * SPIN_US (default 30) before a packet is due and polls the clock from there,
 * and asks for SCHED_FIFO where it may. Prints "delayline: ready" on stderr
 * once bound; runs until SIGTERM or SIGINT. Speaks nfnetlink itself, so it
 * needs no library beyond libc.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* packets held at most; the kernel's queue is as long, so it drops first */
enum { RING = 1 << 14 };

typedef struct {
    uint32_t id;
    int64_t due_ns; /* CLOCK_MONOTONIC */
} held_packet;

typedef struct {
    int fd;
    uint16_t queue;
    int64_t delay_ns;
    held_packet ring[RING];
    size_t head, count;
} delay_line;

static volatile sig_atomic_t stop;

static void on_signal(int sig) { stop = sig; }

static int64_t now_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Starts a nfnetlink queue message of kind MSG in BUF. */
static struct nlmsghdr *msg_start(uint32_t *buf, size_t size, uint16_t msg, uint16_t queue,
                                  uint16_t flags)
{
    memset(buf, 0, size);
    struct nlmsghdr *nlh = (struct nlmsghdr *)buf;
    nlh->nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
    nlh->nlmsg_type = (uint16_t)((NFNL_SUBSYS_QUEUE << 8) | msg);
    nlh->nlmsg_flags = (uint16_t)(NLM_F_REQUEST | flags);
    struct nfgenmsg *g = NLMSG_DATA(nlh);
    g->nfgen_family = AF_UNSPEC;
    g->version = NFNETLINK_V0;
    g->res_id = htobe16(queue);
    return nlh;
}

/* Appends attribute TYPE of LEN bytes to the message NLH. */
static void attr_put(struct nlmsghdr *nlh, uint16_t type, const void *data, size_t len)
{
    struct nlattr *a = (struct nlattr *)((char *)nlh + NLMSG_ALIGN(nlh->nlmsg_len));
    a->nla_type = type;
    a->nla_len = (uint16_t)(NLA_HDRLEN + len);
    memcpy((char *)a + NLA_HDRLEN, data, len);
    nlh->nlmsg_len = NLMSG_ALIGN(nlh->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

/* Sends a configuration message and waits for the kernel's answer. */
static int request(int fd, struct nlmsghdr *nlh, const char *what)
{
    if (send(fd, nlh, nlh->nlmsg_len, 0) < 0) {
        fprintf(stderr, "delayline: %s: %s\n", what, strerror(errno));
        return -1;
    }
    uint32_t buf[1024];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
        fprintf(stderr, "delayline: %s: %s\n", what, strerror(errno));
        return -1;
    }
    struct nlmsghdr *ack = (struct nlmsghdr *)buf;
    if (NLMSG_OK(ack, (size_t)n) && ack->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = NLMSG_DATA(ack);
        if (e->error != 0) {
            fprintf(stderr, "delayline: %s: %s\n", what, strerror(-e->error));
            return -1;
        }
    }
    return 0;
}

/* Binds queue L->queue: metadata only, GSO packets whole, RING packets. */
static int bind_queue(delay_line *l)
{
    uint32_t buf[64];
    struct nlmsghdr *nlh = msg_start(buf, sizeof buf, NFQNL_MSG_CONFIG, l->queue, NLM_F_ACK);
    struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND, .pf = htobe16(AF_INET)};
    attr_put(nlh, NFQA_CFG_CMD, &cmd, sizeof cmd);
    if (request(l->fd, nlh, "binding the queue") != 0)
        return -1;
    nlh = msg_start(buf, sizeof buf, NFQNL_MSG_CONFIG, l->queue, NLM_F_ACK);
    struct nfqnl_msg_config_params params = {.copy_range = 0, .copy_mode = NFQNL_COPY_META};
    attr_put(nlh, NFQA_CFG_PARAMS, &params, sizeof params);
    uint32_t maxlen = htobe32(RING), flags = htobe32(NFQA_CFG_F_GSO);
    attr_put(nlh, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
    attr_put(nlh, NFQA_CFG_FLAGS, &flags, sizeof flags);
    attr_put(nlh, NFQA_CFG_MASK, &flags, sizeof flags);
    return request(l->fd, nlh, "configuring the queue");
}

/* Accepts every held packet up to and including ID. */
static void release_upto(delay_line *l, uint32_t id)
{
    uint32_t buf[16];
    struct nlmsghdr *nlh = msg_start(buf, sizeof buf, NFQNL_MSG_VERDICT_BATCH, l->queue, 0);
    struct nfqnl_msg_verdict_hdr v = {.verdict = htobe32(NF_ACCEPT), .id = htobe32(id)};
    attr_put(nlh, NFQA_VERDICT_HDR, &v, sizeof v);
    if (send(l->fd, nlh, nlh->nlmsg_len, 0) < 0)
        fprintf(stderr, "delayline: verdict: %s\n", strerror(errno));
}

/* Records one queued packet, from the attributes of its message, read at
 * READ_NS (CLOCK_MONOTONIC) and READ_REAL_NS (CLOCK_REALTIME, the clock of
 * the kernel's timestamps): a packet's age is measured on the latter and
 * its due time kept on the former, which no clock setting moves. */
static void hold(delay_line *l, const struct nlmsghdr *nlh, int64_t read_ns, int64_t read_real_ns)
{
    const struct nfqnl_msg_packet_hdr *ph = NULL;
    int64_t age = 0;
    int len = (int)nlh->nlmsg_len - (int)NLMSG_LENGTH(sizeof(struct nfgenmsg));
    const struct nlattr *a = (const struct nlattr *)((const char *)NLMSG_DATA(nlh) +
                                                     NLMSG_ALIGN(sizeof(struct nfgenmsg)));
    while (len >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= len) {
        const void *payload = (const char *)a + NLA_HDRLEN;
        int type = a->nla_type & NLA_TYPE_MASK;
        if (type == NFQA_PACKET_HDR) {
            ph = payload;
        } else if (type == NFQA_TIMESTAMP) {
            const struct nfqnl_msg_packet_timestamp *ts = payload;
            int64_t t = (int64_t)be64toh(ts->sec) * 1000000000 + (int64_t)be64toh(ts->usec) * 1000;
            /* a timestamp of another clock (a departure time) is no arrival */
            if (t <= read_real_ns && read_real_ns - t < 1000000000)
                age = read_real_ns - t;
        }
        len -= NLA_ALIGN(a->nla_len);
        a = (const struct nlattr *)((const char *)a + NLA_ALIGN(a->nla_len));
    }
    if (ph == NULL)
        return;
    uint32_t id = be32toh(ph->packet_id);
    if (l->count == RING) { /* cannot happen while the kernel's queue is as long */
        release_upto(l, id);
        return;
    }
    l->ring[(l->head + l->count) % RING] = (held_packet){id, read_ns - age + l->delay_ns};
    l->count++;
}

/* Reads every message waiting on the socket. */
static void drain(delay_line *l)
{
    static uint32_t buf[1 << 14];
    for (;;) {
        ssize_t n = recv(l->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0)
            return; /* EAGAIN: nothing more; ENOBUFS: the kernel dropped, TCP resends */
        int64_t t = now_ns(CLOCK_MONOTONIC), t_real = now_ns(CLOCK_REALTIME);
        size_t left = (size_t)n;
        for (const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf; NLMSG_OK(nlh, left);
             nlh = NLMSG_NEXT(nlh, left)) {
            if (nlh->nlmsg_type == ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
                hold(l, nlh, t, t_real);
        }
    }
}

static int run(delay_line *l, int64_t spin_ns)
{
    struct pollfd pfd = {.fd = l->fd, .events = POLLIN};
    while (!stop) {
        int64_t now = now_ns(CLOCK_MONOTONIC);
        size_t due = 0;
        while (due < l->count && l->ring[(l->head + due) % RING].due_ns <= now)
            due++;
        if (due > 0) {
            release_upto(l, l->ring[(l->head + due - 1) % RING].id);
            l->head = (l->head + due) % RING;
            l->count -= due;
        }
        int64_t wait = l->count ? l->ring[l->head].due_ns - now - spin_ns : -1;
        if (l->count == 0 || wait > 0) { /* sleep until a packet comes or one is nearly due */
            struct timespec ts = {wait / 1000000000, wait % 1000000000};
            if (ppoll(&pfd, 1, l->count ? &ts : NULL, NULL) < 0 && errno != EINTR) {
                fprintf(stderr, "delayline: poll: %s\n", strerror(errno));
                return 1;
            }
        }
        drain(l);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s QUEUE DELAY_US [SPIN_US]\n", argv[0]);
        return 2;
    }
    long queue = strtol(argv[1], NULL, 10), delay_us = strtol(argv[2], NULL, 10);
    long spin_us = argc > 3 ? strtol(argv[3], NULL, 10) : 30;
    if (queue < 0 || queue > 65535 || delay_us < 0 || spin_us < 0) {
        fprintf(stderr, "delayline: QUEUE 0-65535, DELAY_US and SPIN_US >= 0\n");
        return 2;
    }
    static delay_line line;
    line.queue = (uint16_t)queue;
    line.delay_ns = delay_us * 1000;
    line.fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    struct sockaddr_nl addr = {.nl_family = AF_NETLINK};
    if (line.fd < 0 || bind(line.fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        fprintf(stderr, "delayline: netlink socket: %s\n", strerror(errno));
        return 1;
    }
    int on = 1, rcvbuf = 8 << 20;
    /* receive timestamps for the host (any socket but a unix one switches them on) */
    setsockopt(line.fd, SOL_SOCKET, SO_TIMESTAMP, &on, sizeof on);
    setsockopt(line.fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
    setsockopt(line.fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof on);
    if (bind_queue(&line) != 0)
        return 1;
    struct sched_param prio = {.sched_priority = 10};
    sched_setscheduler(0, SCHED_FIFO, &prio); /* best effort: wakes in time more often */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "delayline: ready, queue %ld, %ld us\n", queue, delay_us);
    return run(&line, spin_us * 1000);
}
