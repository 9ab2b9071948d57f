/* space-replay subcommands. Each returns the process exit code. */
#ifndef SPACE_REPLAY_H
#define SPACE_REPLAY_H

#include <libpq-fe.h>
#include <stdbool.h>

typedef struct {
    char *pg_url;
    bool json;
    char *sandbox;
    int64_t page;
} replay_config_t;

/* Exit codes: 0 chain intact, 1 usage or database error, 2 chain broken. */
int replay_verify(PGconn *db, const replay_config_t *cfg);
int replay_timeline(PGconn *db, const replay_config_t *cfg);

#endif
