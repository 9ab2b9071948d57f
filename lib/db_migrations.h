/* Internal to lib/db.c and its tests: the ordered migration list. */
#ifndef SPACE_DB_MIGRATIONS_H
#define SPACE_DB_MIGRATIONS_H

#include <stddef.h>

typedef struct {
    int version;
    const char *name;
    const char *sql;
} sp_db_migration_t;

extern const sp_db_migration_t sp_db_migrations[];
extern const size_t sp_db_n_migrations;

#endif
