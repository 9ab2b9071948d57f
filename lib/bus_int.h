/* Inside the bus (bus.c), shared with the modules built on the same connection (objstore.c).
 * Not a public header: daemons use bus.h. */
#ifndef SPACE_BUS_INT_H
#define SPACE_BUS_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include <nats/nats.h>

#include "bus.h"

struct sp_bus {
    natsConnection *nc;
    jsCtx *js;
    int64_t timeout_ms;
    int64_t dup_window_ms;
    int64_t stream_max_age_s, stream_max_bytes; /* SP_BUS_STREAM's limits; <= 0: none */
    int stream_replicas;                        /* of every stream this connection creates */
    /* Async publishes the server refused since the last sp_bus_publish_async_complete;
     * incremented on a cnats thread. */
    atomic_int async_failed;
    /* Reconnections so far (sp_bus_reconnects); incremented on a cnats thread. */
    atomic_uint_fast64_t reconnects;
    /* The NKey seed file, read on each (re)connect to sign the server's nonce; the seed is
     * in memory only for the signature. */
    char *nkey_seed_file;
    /* Where this connection's inboxes live ("_INBOX" or the identity's, natsauth.c): the only
     * subjects besides its own that it may subscribe to, so a pushed durable delivers there. */
    char *inbox_prefix;
};

/* Maps a cnats status (and the JetStream error code, when the server sent one) to our codes
 * (SP_ENOTFOUND, SP_ETIMEOUT, SP_ETOOBIG, SP_EBUS, ...) and logs the cnats text at debug. */
int sp__bus_status(natsStatus s, jsErrCode jerr, const char *what);

#endif
