/* libFuzzer target for sp_envelope_decode (envelope.h): every event read from the bus goes
 * through it. Built with -DSPACE_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt); scripts/test.sh
 * runs it for a bounded time from the seeds in tests/fuzz/corpus/envelope_fuzz.
 *
 * Beyond "no crash, no leak, no undefined behaviour" it checks the contract:
 * - a failure is one of the documented codes with a NUL-terminated reason;
 * - a decoded envelope validates, has a subject, and encodes again within SP_ENVELOPE_MAX to
 *   bytes that decode to an envelope of the same type and id. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_envelope_t *env = NULL;
    char reason[SP_REASON_MAX];
    reason[0] = '\0';
    int rc = sp_envelope_decode(data, size, &env, reason);
    if (rc < 0) {
        if (env ||
            (rc != SP_ETOOBIG && rc != SP_EDECODE && rc != SP_ESCHEMA && rc != SP_ETYPE &&
             rc != SP_EVERSION) ||
            memchr(reason, '\0', sizeof(reason)) == NULL)
            abort();
        return 0;
    }
    char why[SP_REASON_MAX], subject[256];
    if (sp_envelope_validate(env, why) != 0 ||
        sp_envelope_subject(env, NULL, subject, sizeof(subject)) < 0)
        abort();
    uint8_t *buf = NULL;
    size_t len = 0;
    if (sp_envelope_encode(env, &buf, &len) != 0 || len > SP_ENVELOPE_MAX)
        abort();
    sp_envelope_t *back = NULL;
    if (sp_envelope_decode(buf, len, &back, why) != 0 || strcmp(back->type, env->type) != 0 ||
        strcmp(back->event_id, env->event_id) != 0)
        abort();
    sp_envelope_free(back);
    free(buf);
    sp_envelope_free(env);
    return 0;
}
