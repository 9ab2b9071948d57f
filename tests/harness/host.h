/* A worker host in a network namespace of its own (issue 18): several workers on one machine
 * that look like several machines to the bus. A host is
 *
 *   - a netns `space-h-<8 hex>` the test owns, joined to the machine by a veth pair
 *     `sph<8 hex>` (machine side) / `eth0` (inside) on a /30 of 10.201.0.0/16: the machine side
 *     is .1, the host .2, its default route. The worker's sandboxes take their /30s from
 *     10.200.0.0/16 (its --net-prefix) inside the host's own namespace, so the two plans never
 *     meet;
 *   - a space-worker (and a space-egressd beside it when the stack runs one) started inside
 *     that namespace with its own id `<SPACE_ID>-h<n>`, identity (credentials and a NATS user of
 *     its own, made by `space identity add`), state directory `$SPACE_HOME/host-<n>` (its btrfs
 *     volume, runsc root, snapshot cache) and firewall table (in its namespace);
 *   - reaching NATS the way another machine would, by address: the client ports of every
 *     nats-server node, and nothing else of the machine's loopback, are forwarded from the
 *     machine side's address to 127.0.0.1 (an nftables table `sph<8 hex>` with a DNAT rule
 *     and route_localnet on the veth; docs/operations.md). PostgreSQL, which a worker only
 *     reads from, stays on its unix socket (a file path crosses network namespaces).
 *
 * Logs: $SPACE_HOME/log/host-<n>-worker.log, host-<n>-egressd.log. A host the test could not
 * remove (killed at its timeout) is removed by the stack's fixtures (hosts-down.sh, from its
 * record $SPACE_HOME/run/host-<n>.state). */
#ifndef SPACE_TEST_HOST_H
#define SPACE_TEST_HOST_H

#include <stdbool.h>

typedef struct sp_test_host sp_test_host_t;

/* Makes host n (1..16) and starts its daemons with the worker's extra arguments (NULL-ended,
 * may be NULL); waits until the worker heartbeats. Fails the test when it cannot. */
sp_test_host_t *sp_test_host_start(int n, const char *const *worker_args);
const char *sp_test_host_id(const sp_test_host_t *h);    /* the worker's id */
const char *sp_test_host_dir(const sp_test_host_t *h);   /* its state directory */
const char *sp_test_host_cache(const sp_test_host_t *h); /* its snapshot cache */
const char *sp_test_host_log(const sp_test_host_t *h);   /* its worker's log */
/* Waits (60 s at most) until the host's worker heartbeats (within the last 3 s, offering
 * template tiny) or, want false, no longer does; then also until the scheduler counts it gone
 * (three missed heartbeats) and places nothing more on it. Fails at once, naming its log, when
 * the worker exited while it should come up. */
void sp_test_host_wait_live(const sp_test_host_t *h, bool want);
/* The host is gone at once, as a machine whose power failed: its daemons and its sandboxes'
 * processes (every runsc process of its runsc root) are SIGKILLed and its network (namespace,
 * veth, forwarding) removed. What it left on disk stays, for sp_test_host_back or
 * sp_test_host_free. */
void sp_test_host_gone(sp_test_host_t *h);
/* Its daemons stop cleanly (SIGTERM, waited for), its sandboxes and network stay. */
void sp_test_host_stop(sp_test_host_t *h);
/* The host comes back after sp_test_host_gone or sp_test_host_stop: its network made again if
 * it was gone, its daemons started on what it left on disk; waits until the worker
 * heartbeats. */
void sp_test_host_back(sp_test_host_t *h);
/* sp_test_host_back if its worker does not run (a test that failed between a stop and a back
 * must not leave the next test a host down); nothing otherwise. */
void sp_test_host_up(sp_test_host_t *h);
/* Stops what runs (SIGTERM), releases what the worker made (space-worker --teardown inside the
 * host's namespace), removes the namespace, veth, forwarding table and state directory, and
 * checks that none of them is left (for a test's teardown: returns -1 instead of failing).
 * h is freed; NULL is a no-op. */
int sp_test_host_free(sp_test_host_t *h);

#endif
